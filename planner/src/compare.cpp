#include "dplan/planner/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/hardware.h"

namespace dplan::planner {
namespace {

// Measured memory component <- the predicted stage components it covers. run-json.md ("memory"):
// weights, gradients, optimizer are exact tensor bytes; activations is the peak of everything
// else allocated during a step (saved activations, temporaries, received tensors), so the
// predicted logits (the loss's temporaries) belong to it; buffers are communication buffers;
// peak is the allocator's high-water mark. The predicted peak is total_bytes - reserve_bytes: the
// reserve models framework overhead (CUDA context, allocator fragmentation) that the executor's
// counting allocator never sees.
struct MemoryMapping {
  const char* measured;
  std::vector<const char*> predicted;
};
const std::vector<MemoryMapping> kMemoryMappings = {
    {"weights", {"weights_bytes"}},
    {"gradients", {"grads_bytes"}},
    {"optimizer", {"optimizer_bytes"}},
    {"activations", {"activations_bytes", "logits_bytes"}},
    {"buffers", {"buffers_bytes"}},
    {"peak", {"total_bytes"}},  // minus reserve_bytes, below
};

// The predicted seconds of `phase` and of the phases a measurement holds inside it
// (costmodel::measured_phases). Plans written before the overhead phase existed predicted none.
double predicted_phase_s(ObjectReader& predicted_time, costmodel::Phase phase,
                         const std::vector<costmodel::Phase>& includes) {
  double predicted = 0;
  for (costmodel::Phase p : includes) predicted += predicted_phase_s(predicted_time, p, {});
  const char* name = costmodel::to_string(phase);
  if (phase == costmodel::Phase::overhead && !predicted_time.has(name)) return predicted;
  return predicted + predicted_time.non_negative_number(name);
}

std::vector<std::string> names(const std::vector<costmodel::Phase>& phases) {
  std::vector<std::string> out;
  for (costmodel::Phase p : phases) out.push_back(costmodel::to_string(p));
  return out;
}

struct Layout {
  long long tp = 1, pp = 1, dp = 1, cp = 1;
  bool operator==(const Layout&) const = default;
  std::string describe() const {
    return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " cp " +
           std::to_string(cp);
  }
};

}  // namespace

std::optional<double> relative_error(double predicted, double measured) {
  if (measured == 0) return std::nullopt;
  return (predicted - measured) / measured;
}

Comparison compare_plan_and_run(const json& plan_json, const std::string& plan_file, const json& run_json,
                                const std::string& run_file) {
  return compare_plan_and_run(costmodel::plan_from_json(plan_json, plan_file), plan_file,
                              costmodel::run_record_from_json(run_json, run_file), run_file);
}

Comparison compare_plan_and_run(const costmodel::Plan& plan, const std::string& plan_file,
                                const costmodel::RunRecord& run, const std::string& run_file) {
  const Layout planned{plan.parallel.tp, plan.parallel.pp, plan.parallel.dp, plan.parallel.cp};
  const Layout measured_layout{run.layout.tp, run.layout.pp, run.layout.dp, run.layout.cp};
  if (!(planned == measured_layout))
    throw InputError(plan_file + " and " + run_file + " do not belong together: " + plan_file + " plans " +
                     planned.describe() + ", " + run_file + " ran " + measured_layout.describe() +
                     "; compare a run with the plan it ran");

  Comparison c;
  c.tp = static_cast<int>(planned.tp);
  c.pp = static_cast<int>(planned.pp);
  c.dp = static_cast<int>(planned.dp);
  c.cp = static_cast<int>(planned.cp);
  c.ep = plan.parallel.ep;
  c.vpp = plan.parallel.schedule == costmodel::Schedule::interleaved ? plan.parallel.vpp : 1;

  // The prediction is read key by key; it carries more than compare needs (no finish()).
  ObjectReader prediction(plan.prediction, plan_file, "/prediction");
  // run-json.md: step_time_s.median over the steps that are not warm-up; tokens_per_s is global
  // tokens per step / that median.
  if (!(run.step_time.median_s > 0))
    throw InputError(run_file + ": /step_time_s/median: expected a positive number, got " +
                     describe_json_value(run.step_time.median_s));
  c.step_time_s = {prediction.positive_number("step_time_s"), run.step_time.median_s};
  c.measured_steps = run.step_time.count;
  c.tokens_per_s = {prediction.positive_number("tokens_per_s"), run.tokens_per_s};

  // One vocabulary (costmodel/phases.h): each measured phase beside its prediction.
  ObjectReader predicted_time = prediction.object("time");
  for (const costmodel::MeasuredPhase& m : costmodel::measured_phases(run, run_file))
    c.phases.push_back({costmodel::to_string(m.phase), {predicted_phase_s(predicted_time, m.phase, m.includes), m.seconds},
                        true, names(m.includes)});

  // Memory per stage: run-json.md keys "memory" by rank and maps ranks to stages with
  // "stage_of_rank"; a stage's measurement is its worst rank, as the plan's stage figure is what
  // each of its GPUs must hold.
  const json& predicted_stages = prediction.object("memory").raw("stages");
  if (!predicted_stages.is_array() || static_cast<long long>(predicted_stages.size()) != planned.pp)
    throw InputError(plan_file + ": /prediction/memory/stages: expected a list of " + std::to_string(planned.pp) +
                     " stages (pp), got " + describe_json_value(predicted_stages));
  for (int stage = 0; stage < planned.pp; ++stage) {
    ObjectReader predicted(predicted_stages[stage], plan_file, "/prediction/memory/stages/" + std::to_string(stage));
    StageMemoryComparison s;
    s.stage = stage;
    s.predicted_reserve_bytes = predicted.non_negative_number("reserve_bytes");
    for (size_t r = 0; r < run.stage_of_rank.size(); ++r)
      if (run.stage_of_rank[r] == stage) s.ranks.push_back(static_cast<int>(r));
    for (const auto& m : kMemoryMappings) {
      double predicted_bytes = 0;
      for (const char* p : m.predicted) predicted_bytes += predicted.non_negative_number(p);
      if (std::string(m.measured) == "peak") predicted_bytes -= s.predicted_reserve_bytes;
      double measured_bytes = 0;
      for (int rank : s.ranks) {
        const std::map<std::string, long long>& components = run.memory_bytes.at(rank);
        auto it = components.find(m.measured);
        if (it == components.end())
          throw InputError(run_file + ": /memory/" + std::to_string(rank) + ": missing key \"" +
                           std::string(m.measured) + "\"");
        measured_bytes = std::max(measured_bytes, static_cast<double>(it->second));
      }
      s.components.push_back({m.measured, {predicted_bytes, measured_bytes}, true, {}});
    }
    // Host memory of an offloaded optimizer (costmodel StageMemory::host_bytes: fp32 weights,
    // moments and gradient copy) <- run-json.md's host_optimizer + host_master + host_gradients;
    // shown only when either side has it (plans and runs without offload have none).
    const double predicted_host = predicted.has("host_bytes") ? predicted.non_negative_number("host_bytes") : 0;
    double measured_host = 0;
    bool ran_offloaded = false;
    for (int rank : s.ranks) {
      const std::map<std::string, long long>& components = run.memory_bytes.at(rank);
      double host = 0;
      for (const char* part : {"host_optimizer", "host_master", "host_gradients"}) {
        auto it = components.find(part);
        if (it == components.end()) continue;
        ran_offloaded = true;
        host += static_cast<double>(it->second);
      }
      measured_host = std::max(measured_host, host);
    }
    if (predicted_host > 0 || ran_offloaded) s.components.push_back({"host", {predicted_host, measured_host}, true, {}});
    c.memory.push_back(std::move(s));
  }

  // FLOPs per rank: re-derived from the plan's model, layout and stage (rank_step_flops).
  for (const auto& [rank, counted] : run.flops_by_rank) {
    RankFlopsComparison f;
    f.rank = rank;
    f.stage = run.stage_of_rank.at(rank);
    const costmodel::PlanStage& stage = plan.stages.at(f.stage);
    std::vector<int> layers;
    for (const costmodel::PlanChunk& chunk : stage.chunks)
      for (int i = 0; i < chunk.num_layers; ++i) layers.push_back(chunk.first_layer + i);
    const costmodel::RankStepFlops predicted =
        costmodel::rank_step_flops(plan.model, plan.training, plan.parallel, layers, stage.lm_head);
    for (int i = 0; i < costmodel::kNumFlopParts; ++i) {
      const std::string part = costmodel::to_string(static_cast<costmodel::FlopPart>(i));
      f.forward.push_back({part, {predicted.forward[i], counted.forward[i]}, true, {}});
      f.recompute.push_back({part, {predicted.recompute[i], counted.recompute[i]}, true, {}});
    }
    c.flops.push_back(std::move(f));
  }
  return c;
}

Comparison compare_plan_and_log(const costmodel::Plan& plan, const std::string& plan_file, const EngineLog& log) {
  const LogMeasurement measured = measure_log(log, plan, plan_file);
  Comparison c;
  c.tp = plan.parallel.tp;
  c.pp = plan.parallel.pp;
  c.dp = plan.parallel.dp;
  c.cp = plan.parallel.cp;
  c.ep = plan.parallel.ep;
  c.vpp = plan.parallel.schedule == costmodel::Schedule::interleaved ? plan.parallel.vpp : 1;
  c.format = log.format;
  c.measured_by = measured.description;
  c.step_time_from_rate = measured.step_time_from_rate;

  ObjectReader prediction(plan.prediction, plan_file, "/prediction");
  c.step_time_s = {prediction.positive_number("step_time_s"), measured.step_time_s};
  c.measured_steps = measured.measured_steps;
  c.tokens_per_s = {prediction.positive_number("tokens_per_s"), measured.tokens_per_s};
  // Phases: only those the engine timed (DeepSpeed's wall-clock breakdown); the rest not measured.
  ObjectReader predicted_time = prediction.object("time");
  for (const costmodel::PhaseInfo& info : costmodel::phase_table()) {
    NamedComparison n{info.name, {predicted_phase_s(predicted_time, info.phase, {}), 0}, false, {}};
    if (auto it = measured.phases_s.find(info.name); it != measured.phases_s.end()) {
      n.value.measured = it->second;
      n.measured = true;
    }
    c.phases.push_back(n);
  }
  const double predicted_mfu = prediction.non_negative_number("mfu");
  if (measured.mfu) c.mfu = ComparedValue{predicted_mfu, *measured.mfu};
  if (measured.tflops_per_gpu) {
    // The plan's GPU peak for its precision (plan.json "cluster", to_json(ClusterSpec)), in TFLOP/s.
    ObjectReader peaks =
        ObjectReader(plan.cluster, plan_file, "/cluster").object("gpu").object("peak_tflops");
    const double peak_tflops = peaks.positive_number(costmodel::to_string(plan.training.precision));
    c.tflops_per_gpu = ComparedValue{predicted_mfu * peak_tflops, *measured.tflops_per_gpu};
  }
  // Memory: one peak per GPU, the largest the log reports, against the stage with the largest
  // predicted peak less its reserve (the same as compare_plan_and_run's peak row).
  if (measured.peak_memory_bytes) {
    const json& stages = prediction.object("memory").raw("stages");
    if (!stages.is_array() || stages.empty())
      throw InputError(plan_file + ": /prediction/memory/stages: expected a list of stages, got " +
                       describe_json_value(stages));
    double largest = -1;
    for (size_t stage = 0; stage < stages.size(); ++stage) {
      ObjectReader s(stages[stage], plan_file, "/prediction/memory/stages/" + std::to_string(stage));
      const double peak = s.non_negative_number("total_bytes") - s.non_negative_number("reserve_bytes");
      if (peak > largest) {
        largest = peak;
        c.peak_memory_stage = static_cast<int>(stage);
      }
    }
    c.peak_memory_bytes = ComparedValue{largest, *measured.peak_memory_bytes};
    c.peak_memory_what = measured.peak_memory_what;
  }
  c.memory_not_comparable = measured.memory_not_comparable;
  return c;
}

Comparison compare_files(const std::string& plan_path, const std::string& run_path, std::optional<LogFormat> format) {
  const costmodel::Plan plan = costmodel::read_plan(plan_path);
  const std::string text = read_text_file(run_path);
  if (measurement_format(text, run_path, format) == LogFormat::run)
    return compare_plan_and_run(plan, plan_path, costmodel::run_record_from_json(parse_json_text(text, run_path), run_path),
                                run_path);
  return compare_plan_and_log(plan, plan_path, parse_engine_log(text, run_path, format));
}

namespace {
json value_json(const ComparedValue& v, bool measured = true) {
  if (!measured) return {{"predicted", v.predicted}, {"measured", nullptr}, {"rel_error", nullptr}};
  std::optional<double> e = v.rel_error();
  return {{"predicted", v.predicted}, {"measured", v.measured}, {"rel_error", e ? json(*e) : json(nullptr)}};
}
}  // namespace

json to_json(const Comparison& c) {
  json phases = json::object();
  for (const auto& p : c.phases) {
    phases[p.name] = value_json(p.value, p.measured);
    if (!p.includes.empty()) phases[p.name]["includes"] = p.includes;
  }
  json memory = json::array();
  for (const auto& s : c.memory) {
    json stage = {{"stage", s.stage}};
    for (const auto& m : s.components) stage[m.name] = value_json(m.value);
    memory.push_back(stage);
  }
  json flops = json::array();
  for (const auto& f : c.flops) {
    json row = {{"rank", f.rank}, {"stage", f.stage}, {"forward", json::object()}, {"recompute", json::object()}};
    for (const auto& x : f.forward) row["forward"][x.name] = value_json(x.value);
    for (const auto& x : f.recompute) row["recompute"][x.name] = value_json(x.value);
    flops.push_back(row);
  }
  json out = {{"format", to_string(c.format)},
              {"measured_by", c.measured_by},
              {"step_time_s", value_json(c.step_time_s)},
              {"tokens_per_s", value_json(c.tokens_per_s)},
              {"phases", phases},
              {"memory", memory}};
  if (!c.flops.empty()) out["flops"] = flops;
  if (c.tflops_per_gpu) out["tflops_per_gpu"] = value_json(*c.tflops_per_gpu);
  if (c.mfu) out["mfu"] = value_json(*c.mfu);
  if (c.peak_memory_bytes) {
    out["peak_memory_bytes"] = value_json(*c.peak_memory_bytes);
    out["peak_memory_bytes"]["stage"] = c.peak_memory_stage;
  }
  return out;
}

}  // namespace dplan::planner
