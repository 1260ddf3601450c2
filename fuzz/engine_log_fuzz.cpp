// Fuzz target: engines' training logs (planner::parse_engine_log, text: Megatron-LM, torchtitan,
// DeepSpeed), as `dplan compare PLAN LOG` and `dplan calibrate LOG --plan PLAN` read them. What it
// returns must keep engine_logs.h's promise: every figure inside its LoggedFigure range, and, put
// into the terms of a stored plan of the fixture logs' layout (measure_log), a step time inside
// kLoggedStepTime, finite positive tokens/s and an MFU of at most 1.
#include <cmath>

#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engine_logs.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;
using planner::in_range;

namespace {
// The plans tests/data/logs' logs ran: the DeepSpeed log's, and the Megatron-LM and torchtitan logs'.
const costmodel::Plan& plan_for(planner::LogFormat format) {
  static const costmodel::Plan zero3 = costmodel::read_plan(std::string(DPLAN_SOURCE_DIR) + "/tests/data/logs/plan-dp8-zero3.json");
  static const costmodel::Plan tp2pp2 = costmodel::read_plan(std::string(DPLAN_SOURCE_DIR) + "/tests/data/logs/plan-tp2-pp2-dp2.json");
  return format == planner::LogFormat{planner::Engine::deepspeed} ? zero3 : tp2pp2;
}

void check(const std::optional<double>& v, const planner::LoggedFigure& figure, const char* what) {
  if (v && !in_range(*v, figure)) fuzz::finding(std::string("parse_engine_log: ") + what + " " + std::to_string(*v));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const planner::EngineLog log = planner::parse_engine_log(fuzz::text_of(data, size), "engine.log");
    if (static_cast<long long>(log.steps.size()) <= planner::kWarmupLogLines)
      fuzz::finding("parse_engine_log: " + std::to_string(log.steps.size()) + " steps");
    for (const planner::LogStep& s : log.steps) {
      check(s.time_s, planner::kLoggedStepTime, "step time");
      check(s.tokens_per_s_per_gpu, planner::kLoggedRate, "tokens/s per GPU");
      check(s.samples_per_s, planner::kLoggedRate, "samples/s");
      check(s.tflops_per_gpu, planner::kLoggedTflops, "TFLOP/s");
      check(s.mfu_percent, planner::kLoggedMfu, "MFU %");
      check(s.loss, planner::kLoggedLoss, "loss");
      check(s.peak_memory_bytes, planner::kLoggedMemory, "memory");
    }
    check(log.peak_memory_bytes, planner::kLoggedMemory, "memory");
    for (const auto& [phase, seconds] : log.phases_s) check(seconds, planner::kLoggedPhaseTime, phase.c_str());
    const planner::LogMeasurement m = planner::measure_log(log, plan_for(log.format), "plan.json");
    if (!in_range(m.step_time_s, planner::kLoggedStepTime) || !std::isfinite(m.tokens_per_s) || !(m.tokens_per_s > 0) ||
        (m.mfu && !(*m.mfu >= 0 && *m.mfu <= 1)))
      fuzz::finding("measure_log: step " + std::to_string(m.step_time_s) + " s, " + std::to_string(m.tokens_per_s) +
                    " tokens/s, mfu " + std::to_string(m.mfu.value_or(0)));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_lines)
