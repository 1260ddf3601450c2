// Engines' training logs as measurements (planner/include/dplan/planner/engine_logs.h): each
// format told by content, --format forcing and refusing, truncated and foreign files refused, a
// log's values against a plan's prediction, and dplan compare / dplan calibrate on logs.
// The logs in tests/data/logs/ were built from the engines' logging code, not printed by the
// engines (tests/data/logs/README.md names the files and versions); the values below are the ones
// written in those logs, and every expected figure is computed from them here.
#include <algorithm>
#include <cmath>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <pthread.h>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/calibrate.h"
#include "dplan/planner/compare.h"
#include "dplan/planner/engine_logs.h"
#include "process.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::planner;
using Catch::Matchers::Contains;
using dplan::testing::read_file;
using dplan::testing::require_one_error_line;
using dplan::testing::run_program;
using dplan::testing::TempDir;

namespace {

const std::string kLogs = std::string(DPLAN_VALIDATION_DIR) + "/logs/";
const std::string kPlan = kLogs + "plan-tp2-pp2-dp2.json";   // llama-3-8b, dgx-h100, tp 2 pp 2 dp 2, gb 32, seq 4096
const std::string kZero3 = kLogs + "plan-dp8-zero3.json";    // llama-3-8b, dgx-h100, dp 8 ZeRO-3, mbs 2, gb 32
const std::string kMegatron = kLogs + "megatron-core_v0.15.0.log";
const std::string kTitan = kLogs + "torchtitan-v0.2.2.log";
const std::string kTitanHead = kLogs + "torchtitan-head.log";
const std::string kDeepSpeed = kLogs + "deepspeed-v0.19.5.log";
const std::string kForeign = kLogs + "foreign.log";
// Printed by DeepSpeed 0.19.8 itself (CPU, two ranks), and the plan of its layout.
const std::string kDeepSpeedCpu = kLogs + "deepspeed-0.19.8-cpu.log";
const std::string kTinyDp2 = kLogs + "plan-gpt-tiny-dp2.json";
const std::string kRunJson = std::string(DPLAN_VALIDATION_DIR) + "/compare/run.json";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double rel(double predicted, double measured) { return (predicted - measured) / measured; }

EngineLog parse(const std::string& path, std::optional<LogFormat> forced = std::nullopt) {
  return parse_engine_log(read_file(path), path, forced);
}

std::string parse_error(const std::string& text, std::optional<LogFormat> forced = std::nullopt) {
  try {
    parse_engine_log(text, "x.log", forced);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return "";
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

struct Predicted {
  double step_s, tokens_per_s, mfu, peak_bytes_largest_stage;
};
Predicted predicted(const std::string& plan_path) {
  const json p = read_json_file(plan_path);
  const json& pr = p["prediction"];
  double peak = 0;
  for (const auto& s : pr["memory"]["stages"])
    peak = std::max(peak, s["total_bytes"].get<double>() - s["reserve_bytes"].get<double>());
  return {pr["step_time_s"], pr["tokens_per_s"], pr["mfu"], peak};
}

constexpr double kBytesPerGiB = 1024.0 * 1024 * 1024;
constexpr double kTokensPerStep = 32.0 * 4096;  // both plans: global batch 32 x sequence 4096

}  // namespace

TEST_CASE("engine logs: each format is told by its content", "[engine_logs]") {
  CHECK(detect_log_format(read_file(kMegatron)) == LogFormat{Engine::megatron});
  CHECK(detect_log_format(read_file(kTitan)) == LogFormat{Engine::torchtitan});
  CHECK(detect_log_format(read_file(kTitanHead)) == LogFormat{Engine::torchtitan});
  CHECK(detect_log_format(read_file(kDeepSpeed)) == LogFormat{Engine::deepspeed});
  CHECK(detect_log_format(read_file(kRunJson)) == LogFormat::run);
  CHECK(detect_log_format(read_file(kForeign)) == std::nullopt);
  CHECK(detect_log_format("") == std::nullopt);
  // The names --format takes, and a wrong one refused with the choices.
  for (LogFormat f : {LogFormat::run, LogFormat{Engine::megatron}, LogFormat{Engine::torchtitan}, LogFormat{Engine::deepspeed}})
    CHECK(log_format_from_string(to_string(f)) == f);
  CHECK_THROWS_WITH(log_format_from_string("titan"),
                    Contains("--format: unknown format titan; valid: megatron, torchtitan, deepspeed or run"));
}

TEST_CASE("engine logs: Megatron-LM iteration lines against a plan", "[engine_logs]") {
  const EngineLog log = parse(kMegatron);
  CHECK(log.format == LogFormat{Engine::megatron});
  // The iteration lines: every 10 iterations, elapsed time per iteration (ms) as written.
  const std::vector<double> ms = {2950.3, 2260.8, 2180.4, 2195.9, 2170.2, 2188.6, 2201.3};
  REQUIRE(log.steps.size() == ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    CHECK(log.steps[i].step == static_cast<long long>(10 * (i + 1)));
    CHECK(log.steps[i].warmup == (i < 2));
    CHECK(*log.steps[i].time_s == Approx(ms[i] / 1e3));
  }
  CHECK(*log.steps[2].loss == Approx(8.91));
  CHECK(log.global_batch == 32);
  CHECK(log.tp == 2);
  CHECK(log.pp == 2);
  CHECK(log.world_size == 8);
  // report_memory's largest max allocated (MB = 2^20 bytes) over ranks 0, 1, 4 and 5.
  CHECK(*log.peak_memory_bytes == Approx(40960.25 * 1024 * 1024));

  const costmodel::Plan plan = costmodel::read_plan(kPlan);
  const Comparison c = compare_plan_and_log(plan, kPlan, log);
  const Predicted p = predicted(kPlan);
  const double measured_s = median({2180.4, 2195.9, 2170.2, 2188.6, 2201.3}) / 1e3;  // after the 2 warm-up lines
  CHECK(c.format == LogFormat{Engine::megatron});
  CHECK(c.measured_steps == 5);
  CHECK_FALSE(c.step_time_from_rate);
  CHECK(c.step_time_s.measured == Approx(measured_s));
  CHECK(*c.step_time_s.rel_error() == Approx(rel(p.step_s, measured_s)));
  CHECK(*c.tokens_per_s.rel_error() == Approx(rel(p.tokens_per_s, kTokensPerStep / measured_s)));
  // Throughput per GPU as written in the same five lines, against MFU x the H100's bf16 peak.
  std::vector<double> tflops;
  for (size_t i = 2; i < log.steps.size(); ++i) tflops.push_back(*log.steps[i].tflops_per_gpu);
  REQUIRE(c.tflops_per_gpu);
  CHECK(c.tflops_per_gpu->measured == Approx(median(tflops)));
  CHECK(*c.tflops_per_gpu->rel_error() == Approx(rel(p.mfu * 989.0, median(tflops))));
  CHECK_FALSE(c.mfu);  // Megatron-LM logs no MFU
  REQUIRE(c.peak_memory_bytes);
  CHECK(*c.peak_memory_bytes->rel_error() == Approx(rel(p.peak_bytes_largest_stage, 40960.25 * 1024 * 1024)));
  CHECK(c.memory.empty());
  for (const auto& phase : c.phases) CHECK_FALSE(phase.measured);
}

TEST_CASE("engine logs: torchtitan step lines (tps per GPU) against a plan", "[engine_logs]") {
  const EngineLog log = parse(kTitan);
  CHECK(log.format == LogFormat{Engine::torchtitan});
  REQUIRE(log.steps.size() == 6);
  CHECK(log.steps[0].step == 1);
  CHECK(log.steps[5].step == 50);
  CHECK(log.global_batch == 32);
  CHECK(log.seq_len == 4096);
  // tps as written (thousands separators), tokens per second per GPU: x world size 8 is global.
  const std::vector<double> tps = {7513, 7488, 7531, 7470};  // steps 20..50, after warm-up (steps 1 and 10)
  std::vector<double> step_s;
  for (double t : tps) step_s.push_back(kTokensPerStep / (t * 8));
  const Comparison c = compare_plan_and_log(costmodel::read_plan(kPlan), kPlan, log);
  const Predicted p = predicted(kPlan);
  CHECK(c.step_time_from_rate);
  CHECK(c.step_time_s.measured == Approx(median(step_s)));
  CHECK(*c.step_time_s.rel_error() == Approx(rel(p.step_s, median(step_s))));
  CHECK(*c.tokens_per_s.rel_error() == Approx(rel(p.tokens_per_s, kTokensPerStep / median(step_s))));
  REQUIRE(c.mfu);
  std::vector<double> mfu;
  for (size_t i = 2; i < log.steps.size(); ++i) mfu.push_back(*log.steps[i].mfu_percent / 100);
  CHECK(*c.mfu->rel_error() == Approx(rel(p.mfu, median(mfu))));
  REQUIRE(c.peak_memory_bytes);
  CHECK(c.peak_memory_bytes->measured == Approx(39.82 * kBytesPerGiB));  // the largest max reserved written
  CHECK(c.peak_memory_what == "max reserved");

  // HEAD: "tokens per train step", and mfu N/A: no MFU compared.
  const EngineLog head = parse(kTitanHead);
  CHECK(head.tokens_per_step == 131072);
  const Comparison h = compare_plan_and_log(costmodel::read_plan(kPlan), kPlan, head);
  CHECK_FALSE(h.mfu);
  CHECK(h.step_time_s.measured == Approx(median(step_s)));
}

TEST_CASE("engine logs: DeepSpeed throughput and wall-clock timers against a plan", "[engine_logs]") {
  const EngineLog log = parse(kDeepSpeed);
  CHECK(log.format == LogFormat{Engine::deepspeed});
  // ThroughputTimer lines at global steps 4, 6, 8 (twice: two ranks), 10, 12: one entry per step.
  REQUIRE(log.steps.size() == 5);
  CHECK(log.steps[2].step == 8);
  CHECK(*log.steps[2].samples_per_s == Approx(20.35));  // the slower of the two ranks
  CHECK(log.global_batch == 32);
  CHECK(log.micro_batch == 2);
  const Comparison c = compare_plan_and_log(costmodel::read_plan(kZero3), kZero3, log);
  const Predicted p = predicted(kZero3);
  const double measured_s = median({32 / 20.35, 32 / 20.52, 32 / 20.47});  // CurrSamplesPerSec of steps 8, 10, 12
  CHECK(c.step_time_s.measured == Approx(measured_s));
  CHECK(*c.step_time_s.rel_error() == Approx(rel(p.step_s, measured_s)));
  CHECK_FALSE(c.tflops_per_gpu);
  CHECK(c.peak_memory_bytes->measured == Approx(52.80 * kBytesPerGiB));
  // The timers of global steps 3 to 12 (the first two lines are warm-up), ms as written.
  std::vector<double> fwd, inner, step;
  for (double d : {3.0, -2.0, 1.0, 0.0, 2.5, -1.0, 4.0, 1.5, -0.5, 2.0}) {
    fwd.push_back((500.1 + d) / 1e3);
    inner.push_back((1001.0 + d) / 1e3);
    step.push_back((20.1 + d / 10) / 1e3);
  }
  for (const auto& phase : c.phases) {
    INFO(phase.name);
    if (phase.name == "forward") CHECK(phase.value.measured == Approx(median(fwd)));
    else if (phase.name == "backward") CHECK(phase.value.measured == Approx(median(inner)));
    else if (phase.name == "optimizer") CHECK(phase.value.measured == Approx(median(step)));
    else if (phase.name == "dp_comm") CHECK(phase.value.measured == Approx(0.0443));
    else CHECK_FALSE(phase.measured);
  }
}

TEST_CASE("engine logs: a log DeepSpeed printed itself against its plan", "[engine_logs]") {
  const std::string text = read_file(kDeepSpeedCpu);
  CHECK(detect_log_format(text) == LogFormat{Engine::deepspeed});
  // The rates as printed, read here by a plain scan of "CurrSamplesPerSec=" (steps 4, 6, ..., 20).
  std::vector<double> rates;
  for (size_t at = text.find("CurrSamplesPerSec="); at != std::string::npos;
       at = text.find("CurrSamplesPerSec=", at + 1))
    rates.push_back(std::strtod(text.c_str() + at + 18, nullptr));
  REQUIRE(rates.size() == 9);
  const EngineLog log = parse_engine_log(text, kDeepSpeedCpu);
  REQUIRE(log.steps.size() == rates.size());
  CHECK(log.steps.front().step == 4);
  CHECK(log.global_batch == 4);
  CHECK(log.micro_batch == 2);
  CHECK(log.dp == 2);
  std::vector<double> step_s;
  for (size_t i = 2; i < rates.size(); ++i) step_s.push_back(4 / rates[i]);  // train_batch_size / rate
  const Comparison c = compare_plan_and_log(costmodel::read_plan(kTinyDp2), kTinyDp2, log);
  CHECK(c.measured_steps == 7);
  CHECK(c.step_time_s.measured == Approx(median(step_s)));
  CHECK(*c.step_time_s.rel_error() == Approx(rel(predicted(kTinyDp2).step_s, median(step_s))));
  CHECK(*c.tokens_per_s.rel_error() == Approx(rel(predicted(kTinyDp2).tokens_per_s, 4 * 128 / median(step_s))));
  // wall_clock_breakdown was on: forward, backward, dp comm and optimizer are measured.
  int measured = 0;
  for (const auto& phase : c.phases) measured += phase.measured;
  CHECK(measured == 4);
  // On a cluster of CPU cores DeepSpeed's memory figure is resident memory: not compared.
  CHECK(!c.peak_memory_bytes);
  CHECK_THAT(c.memory_not_comparable, Contains("resident memory"));
  // Against another layout's plan: the train_batch_size it states (4) contradicts the plan's 32.
  CHECK_THROWS_WITH(compare_plan_and_log(costmodel::read_plan(kZero3), kZero3, log),
                    Contains("states global batch size 4, " + kZero3 + " plans 32"));
}

TEST_CASE("engine logs: --format forces a format and a log of another engine is refused", "[engine_logs]") {
  CHECK(parse(kMegatron, LogFormat{Engine::megatron}).steps.size() == 7);
  CHECK_THAT(parse_error(read_file(kMegatron), LogFormat{Engine::torchtitan}),
             Contains("x.log: no torchtitan step line (torchtitan/components/metrics.py) in it (--format torchtitan); "
                      "it reads as a Megatron-LM log: --format megatron"));
  CHECK_THAT(parse_error(read_file(kTitan), LogFormat{Engine::deepspeed}), Contains("it reads as a torchtitan log: --format torchtitan"));
  CHECK_THAT(parse_error(read_file(kDeepSpeed), LogFormat{Engine::megatron}), Contains("it reads as a DeepSpeed log: --format deepspeed"));
  CHECK_THAT(parse_error(read_file(kRunJson), LogFormat{Engine::megatron}), Contains("it reads as a run.json: --format run"));
  CHECK_THAT(parse_error(read_file(kForeign), LogFormat{Engine::megatron}), Contains("neither a run.json nor a training log"));
}

TEST_CASE("engine logs: empty, truncated and foreign logs are refused", "[engine_logs]") {
  const std::string text = read_file(kMegatron);
  const size_t first = text.find("] iteration ");
  const size_t second = text.find("] iteration ", first + 1);
  REQUIRE(second != std::string::npos);
  // Cut inside the first iteration line: no complete step line.
  CHECK_THAT(parse_error(text.substr(0, first + 120)),
             Contains("x.log: a Megatron-LM log with no complete iteration line"));
  // Cut inside the third: two complete lines, both warm-up.
  const size_t third = text.find("] iteration ", second + 1);
  CHECK_THAT(parse_error(text.substr(0, third + 60)),
             Contains("x.log: 2 complete Megatron-LM step lines, all warm-up (the first 2 logged steps are left out)"));
  // A cut last line is left out; the complete ones count.
  CHECK(parse_engine_log(text.substr(0, text.rfind("] iteration ") + 150), "x.log").steps.size() == 6);
  // A megabyte-long line is no step line (and no trouble); a step number past 2^53 is none either.
  CHECK(parse_engine_log(std::string(1 << 20, '|') + "\n" + text, "x.log").steps.size() == 7);
  CHECK(parse_engine_log(replace_all(text, "iteration       70/", "iteration 99999999999999999999999/"), "x.log")
            .steps.size() == 6);
  const std::string titan = read_file(kTitan);
  CHECK_THAT(parse_error(titan.substr(0, titan.find("tflops:"))), Contains("a torchtitan log with no complete step line"));
  CHECK_THAT(parse_error(""), Contains("x.log: empty; expected a run.json or a training log"));
  CHECK_THAT(parse_error("\n \n"), Contains("x.log: empty"));
  CHECK(parse_error(read_file(kForeign)) ==
        "x.log: neither a run.json nor a training log dplan reads (Megatron-LM iteration lines, torchtitan step lines, "
        "DeepSpeed ThroughputTimer lines); --format megatron|torchtitan|deepspeed|run forces one");
}

TEST_CASE("engine logs: a log whose layout contradicts the plan is refused", "[engine_logs]") {
  const costmodel::Plan plan = costmodel::read_plan(kPlan);
  auto error_of = [&](const std::string& text, const costmodel::Plan& against) -> std::string {
    try {
      compare_plan_and_log(against, "plan.json", parse_engine_log(text, "x.log"));
    } catch (const InputError& e) {
      return e.what();
    }
    FAIL("no InputError");
    return "";
  };
  CHECK_THAT(error_of(replace_all(read_file(kMegatron), "global batch size:    32", "global batch size:    64"), plan),
             Contains("x.log and plan.json do not belong together: the Megatron-LM log states global batch size 64, "
                      "plan.json plans 32"));
  CHECK_THAT(error_of(read_file(kMegatron), costmodel::read_plan(kZero3)),
             Contains("states micro batch size 1, plan.json plans 2"));
  CHECK_THAT(error_of(replace_all(read_file(kTitan), "global batch size 32", "global batch size 16"), plan),
             Contains("the torchtitan log states global batch size 16, plan.json plans 32"));
  CHECK_THAT(error_of(replace_all(read_file(kTitanHead), "131072 tokens per train step", "65536 tokens per train step"), plan),
             Contains("states tokens per train step 65536, plan.json plans 131072"));
  // DeepSpeed's world_size is its data-parallel size: 4 against the plan's dp 8.
  CHECK_THAT(error_of(replace_all(read_file(kDeepSpeed), "  steps_per_print", "  world_size ................... 4.0\n  steps_per_print"),
                      costmodel::read_plan(kZero3)),
             Contains("the DeepSpeed log states data parallel size 4, plan.json plans 8"));
  CHECK_THAT(error_of(replace_all(read_file(kDeepSpeed), "train_batch_size ............. 32", "train_batch_size ............. 64"),
                      costmodel::read_plan(kZero3)),
             Contains("the DeepSpeed log states global batch size 64, plan.json plans 32"));
  // A batch size ramp-up within one Megatron-LM log.
  std::string text = read_file(kMegatron);
  const size_t last = text.rfind("global batch size:    32");
  text.replace(last, 24, "global batch size:    16");
  CHECK_THAT(error_of(text, plan), Contains("the global batch size changes from 32 to 16 at iteration 70"));
}

TEST_CASE("dplan compare reads engine logs and says which it read", "[engine_logs][cli]") {
  for (const auto& [plan, log, format] : std::vector<std::array<std::string, 3>>{
           {kPlan, kMegatron, "megatron"}, {kPlan, kTitan, "torchtitan"}, {kPlan, kTitanHead, "torchtitan"},
           {kZero3, kDeepSpeed, "deepspeed"}, {kTinyDp2, kDeepSpeedCpu, "deepspeed"}}) {
    auto r = run_program(DPLAN_BINARY, {"compare", plan, log});
    INFO(log << "\n" << r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.empty());
    CHECK_THAT(r.out, Contains("read as --format " + format + ": "));
    CHECK_THAT(r.out, Contains("not measured"));
    // Forcing the format it has changes nothing.
    CHECK(run_program(DPLAN_BINARY, {"compare", plan, log, "--format", format}).out == r.out);
  }
  auto r = run_program(DPLAN_BINARY, {"compare", kPlan, kMegatron, "--json"});
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j["format"] == "megatron");
  const double measured_s = median({2180.4, 2195.9, 2170.2, 2188.6, 2201.3}) / 1e3;
  CHECK(j["step_time_s"]["measured"].get<double>() == Approx(measured_s));
  CHECK(j["step_time_s"]["rel_error"].get<double>() == Approx(rel(predicted(kPlan).step_s, measured_s)));
  CHECK(j["phases"]["forward"]["measured"].is_null());
  CHECK(j["phases"]["forward"]["rel_error"].is_null());
  CHECK(j["memory"].empty());
  CHECK(j["peak_memory_bytes"]["measured"].get<double>() == Approx(40960.25 * 1024 * 1024));
  CHECK(j.contains("tflops_per_gpu"));
  CHECK_FALSE(j.contains("mfu"));
  // A run.json still compares as before, and says so.
  r = run_program(DPLAN_BINARY, {"compare", std::string(DPLAN_VALIDATION_DIR) + "/compare/plan.json", kRunJson});
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Contains("read as --format run: dplan run (run.json)"));
}

TEST_CASE("dplan compare: bad logs give one error line and exit status 2", "[engine_logs][cli]") {
  TempDir dir;
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, kForeign})),
             Contains("foreign.log: neither a run.json nor a training log dplan reads"));
  const std::string truncated = read_file(kMegatron).substr(0, read_file(kMegatron).find("] iteration ") + 100);
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, dir.write("cut.log", truncated)})),
             Contains("cut.log: a Megatron-LM log with no complete iteration line"));
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, dir.write("empty.log", "")})),
             Contains("empty.log: empty"));
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, kMegatron, "--format", "deepspeed"})),
             Contains("it reads as a Megatron-LM log: --format megatron"));
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, kMegatron, "--format", "run"})),
             Contains("not a run.json (--format run); it reads as a Megatron-LM log: --format megatron"));
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlan, kMegatron, "--format", "nemo"})),
             Contains("--format: unknown format nemo; valid: megatron, torchtitan, deepspeed or run"));
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kZero3, kMegatron})),
             Contains("do not belong together"));
}

namespace {
// torchtitan step lines (the v0.2.2 layout of torchtitan/components/metrics.py MetricsProcessor.log,
// without colours) whose tps gives `step_s` for `tokens_per_step` on `world` GPUs: what a machine
// that takes step_s per step would log. Built here, not printed by torchtitan.
std::string titan_log(double step_s, double tokens_per_step, int world) {
  // f"{round(tps):,}": the rounded rate with thousands separators.
  const std::string digits = std::to_string(std::llround(tokens_per_step / (step_s * world)));
  std::string tps;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) tps += ',';
    tps += digits[i];
  }
  std::string out;
  for (int step : {1, 10, 20, 30, 40}) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "[titan] 2026-01-10 13:00:00,000 - root - INFO - step: %2d  loss: %8.5f  grad_norm: %7.4f  "
                  "memory: %5.2fGiB(%.2f%%)  tps: %s  tflops: %.2f  mfu: %.2f%%\n",
                  step, 5.0, 1.0, 0.5, 2.0, tps.c_str(), 0.01, 1.0);
    out += line;
  }
  return out;
}
}  // namespace

namespace {
// gpt-small's training in the calibration cases: 4 sequences of 32 tokens, fp32.
costmodel::TrainingSpec small_training() {
  costmodel::TrainingSpec training;
  training.seq_len = 32;
  training.global_batch = 4;
  training.precision = costmodel::Precision::fp32;
  return training;
}

// Six layouts of up to four ranks (tp, pp, dp), as many as calibrate needs for its parameters.
std::vector<costmodel::ParallelConfig> six_layouts() {
  std::vector<costmodel::ParallelConfig> layouts;
  for (auto [tp, pp, dp] : std::vector<std::array<int, 3>>{{1, 1, 1}, {1, 1, 4}, {4, 1, 1}, {1, 2, 1}, {2, 1, 2}, {1, 2, 2}}) {
    costmodel::ParallelConfig layout;
    layout.tp = tp;
    layout.pp = pp;
    layout.dp = dp;
    layouts.push_back(layout);
  }
  return layouts;
}
}  // namespace

TEST_CASE("dplan calibrate fits a profile to engine logs (step time only)", "[engine_logs][calibrate][cli]") {
  // Six plans of gpt-small on local-cpu, and for each a torchtitan log of the step time that
  // `truth` predicts: the fit must find the truth's matmul rate again, from the logs alone.
  const costmodel::ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  costmodel::ClusterSpec truth = base;
  truth.gpu.sustained_fraction = 0.12;
  truth.intra_node.efficiency_fraction = 0.4;
  const costmodel::ModelSpec model = dplan::testing::store().load_model("gpt-small");
  const costmodel::TrainingSpec training = small_training();
  TempDir dir;
  std::vector<std::string> args = {"calibrate"};
  std::vector<std::string> plans;
  std::vector<CalibrationRun> runs;
  int i = 0;
  for (const costmodel::ParallelConfig& layout : six_layouts()) {
    costmodel::OverlapOptions overlap;
    overlap.grad_reduce = false;
    const std::string plan = dir.write("plan" + std::to_string(i) + ".json",
                                       to_json(costmodel::make_plan(model, truth, training, layout, overlap, {}, {})).dump());
    CalibrationRun probe;
    probe.model = model;
    probe.training = training;
    probe.parallel = layout;
    probe.overlap = overlap;
    const double step_s = predicted_step_s(truth, probe);
    const std::string log = dir.write("titan" + std::to_string(i) + ".log", titan_log(step_s, 4 * 32, layout.world_size()));
    runs.push_back(read_calibration_log(log, plan));
    CHECK(runs.back().format == LogFormat{Engine::torchtitan});
    CHECK(runs.back().measured_step_s == Approx(step_s).epsilon(0.01));  // tps is rounded to a whole token
    CHECK(runs.back().measured_compute_s == 0);  // no phases from a log
    args.push_back(log);
    plans.push_back(plan);
    ++i;
  }
  const Calibration cal = calibrate(base, runs);
  CHECK(cal.rms_log_error_after < 0.02);
  CHECK(cal.cluster.gpu.sustained_fraction == Approx(0.12).epsilon(0.05));

  // Through the binary: one --plan per log, in order.
  std::vector<std::string> cli = args;
  for (const auto& p : plans) cli.insert(cli.end(), {"--plan", p});
  cli.insert(cli.end(), {"--profile", "local-cpu"});
  auto r = run_program(DPLAN_BINARY, cli);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Contains("calibrated local-cpu on 6 runs"));
  CHECK_THAT(r.out, Contains("6 engine logs: the step time only"));
  CHECK_THAT(r.out, Contains("titan5.log"));
  // No --plan, or a count that fits neither rule: one line, exit 2.
  std::vector<std::string> no_plan = args;
  no_plan.insert(no_plan.end(), {"--profile", "local-cpu"});
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, no_plan)),
             Contains("titan0.log: an engine log does not name the plan it ran; give it with --plan PLAN"));
  std::vector<std::string> two_plans = no_plan;
  two_plans.insert(two_plans.end(), {"--plan", plans[0], "--plan", plans[1]});
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, two_plans)),
             Contains("--plan: 2 plans for 6 engine logs"));
  // A log against the wrong plan (another world size changes nothing the log states, but a
  // Megatron-LM log states its batch): refused by measure_log's checks.
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"calibrate", kMegatron, "--plan", kZero3, "--profile",
                                                               "dgx-h100"})),
             Contains("do not belong together"));
}

// --- issue 33: reading a log is linear in its size and bounded in stack; nonsense is refused -----

namespace {
// The Megatron-LM fixture's argument dump, iteration and memory lines, and `extra` after them.
std::string megatron_with(const std::string& extra) { return read_file(kMegatron) + extra; }

// report_memory's line for rank 0 with `prefix` between "[Rank 0]" and the fields.
std::string memory_line(const std::string& prefix, const std::string& max_allocated_mb) {
  return "[Rank 0] " + prefix + "(after 70 iterations) memory (MB) | allocated: 1000.0 | max allocated: " +
         max_allocated_mb + " | reserved: 43008.0 | max reserved: 43008.0\n";
}

// Runs `body` on a thread whose stack is `stack_bytes` (glibc's default is 8 MiB); returns what it
// caught, or "" when it returned.
std::string on_small_stack(size_t stack_bytes, std::function<void()> body) {
  struct Call {
    std::function<void()> body;
    std::string error;
  } call{std::move(body), {}};
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, stack_bytes) == 0);
  pthread_t thread;
  auto run = [](void* p) -> void* {
    Call& c = *static_cast<Call*>(p);
    try {
      c.body();
    } catch (const std::exception& e) {
      c.error = e.what();
    }
    return nullptr;
  };
  REQUIRE(pthread_create(&thread, &attr, run, &call) == 0);
  REQUIRE(pthread_join(thread, nullptr) == 0);
  pthread_attr_destroy(&attr);
  return call.error;
}
}  // namespace

TEST_CASE("engine logs: a Megatron-LM log of megabytes of repeated rank prefixes is read in one pass",
          "[engine_logs]") {
  // Each line repeats "[Rank 0] " 1,800 times before report_memory's fields, cut after
  // "allocated:" (what the old "[Rank R].*memory (MB)" pattern backtracked over, quadratically in
  // the line's length: minutes for this log). 4 MB of them, then one complete line of the same kind.
  const std::string prefixes = [] {
    std::string p;
    for (int i = 0; i < 1800; ++i) p += "[Rank 0] ";
    return p;
  }();
  std::string extra;
  const std::string cut = "[Rank 0] " + prefixes + "(after 70 iterations) memory (MB) | allocated: 1.0\n";
  while (extra.size() < (4u << 20)) extra += cut;
  extra += memory_line(prefixes, "50000.5");
  const EngineLog log = parse_engine_log(megatron_with(extra), "x.log");
  CHECK(log.steps.size() == 7);
  REQUIRE(log.peak_memory_bytes);
  CHECK(*log.peak_memory_bytes == 50000.5 * 1024 * 1024);
}

TEST_CASE("engine logs: 16 KB and 1 MB lines are read on a 256 KiB stack", "[engine_logs]") {
  // std::regex's matcher recursed once per character of ".*": 4-6 MB of stack for a 16 KB line.
  const std::string kb16 = memory_line(std::string(16000, 'x') + " ", "50000.0");
  const std::string mb1 = memory_line(std::string(1 << 20, 'y') + " ", "60000.0");
  std::optional<double> peak16, peak1m;
  const std::string error = on_small_stack(256 << 10, [&] {
    peak16 = parse_engine_log(megatron_with(kb16), "x.log").peak_memory_bytes;
    peak1m = parse_engine_log(megatron_with(kb16 + mb1), "x.log").peak_memory_bytes;
  });
  CHECK(error.empty());
  CHECK(peak16 == 50000.0 * 1024 * 1024);
  CHECK(peak1m == 60000.0 * 1024 * 1024);  // a 1 MB line is read, not left out
}

TEST_CASE("engine logs: a figure outside its physical range is refused naming the file and line and value",
          "[engine_logs]") {
  const std::string megatron = read_file(kMegatron);
  // The line number of the first line holding `what` in `text`.
  auto line_of = [](const std::string& text, const std::string& what) {
    return std::to_string(std::count(text.begin(), text.begin() + static_cast<long>(text.find(what)), '\n') + 1);
  };
  const std::string first_memory = "max allocated: 40960.25";
  CHECK(parse_error(replace_all(megatron, first_memory, "max allocated: 1e308")) ==
        "x.log:" + line_of(megatron, first_memory) +
            ": max allocated (MB): 1e308 is not a GPU's memory (0 to 1e+14 bytes); a log that states it is refused");
  const std::string first_time = "elapsed time per iteration (ms): 2950.3";
  const std::string tiny = replace_all(megatron, first_time, "elapsed time per iteration (ms): 1e-320");
  CHECK_THAT(parse_error(tiny), Contains("x.log:" + line_of(megatron, first_time) +
                                         ": elapsed time per iteration (ms): 1e-320 is not a step time (1e-06 to "
                                         "1e+06 s)"));
  CHECK_THAT(parse_error(replace_all(megatron, first_time, "elapsed time per iteration (ms): -2950.3")),
             Contains("-2950.3 is not a step time"));
  CHECK_THAT(parse_error(replace_all(megatron, first_time, "elapsed time per iteration (ms): nan")),
             Contains("nan is not a step time"));
  CHECK_THAT(parse_error(replace_all(megatron, "lm loss: 1.084000E+01", "lm loss: inf")),
             Contains("lm loss: inf is not a loss (a finite number)"));
  CHECK_THAT(parse_error(replace_all(megatron, "(TFLOP/s/GPU): 298.7", "(TFLOP/s/GPU): 2e6")),
             Contains("2e6 is not a GPU's TFLOP/s (0 to 1e+06 TFLOP/s)"));

  const std::string titan = read_file(kTitan);
  CHECK_THAT(parse_error(replace_all(titan, "mfu: 40.64%", "mfu: 99999.9%")),
             Contains("x.log:" + line_of(titan, "mfu: 40.64%") + ": mfu (%): 99999.9 is not an MFU (0 to 100 %)"));
  CHECK_THAT(parse_error(replace_all(titan, "tps: 7,513", "tps: 0")), Contains("tps: 0 is not a rate (above 0"));

  const std::string deepspeed = read_file(kDeepSpeed);
  CHECK_THAT(parse_error(replace_all(deepspeed, "| fwd: 1210.50", "| fwd: -1210.50")),
             Contains("x.log:" + line_of(deepspeed, "| fwd: 1210.50") +
                      ": fwd (ms): -1210.50 is not a phase time (0 to 1e+06 s)"));
  const std::string samples = deepspeed.substr(deepspeed.find("CurrSamplesPerSec=") + 18, 4);
  CHECK_THAT(parse_error(replace_all(deepspeed, "CurrSamplesPerSec=" + samples, "CurrSamplesPerSec=-1")),
             Contains("x.log:19: CurrSamplesPerSec: -1 is not a rate (above 0 and at most 1e+12 per s)"));
}

TEST_CASE("engine logs: a rate that gives an impossible step time for the plan is refused", "[engine_logs]") {
  // 1.28e11 tokens/s per GPU is a rate, but 128 tokens per step at it take 1 ns: no step is that short.
  TempDir dir;
  const costmodel::Plan plan = costmodel::read_plan(kTinyDp2);
  const std::string log = dir.write("fast.log", titan_log(1e-9, 4 * 128, 2));
  try {
    measure_log(parse(log), plan, kTinyDp2);
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Contains("fast.log:3: step 20's rate gives a step time of 1e-09 s for"));
    CHECK_THAT(std::string(e.what()), Contains("512 tokens over 2 GPUs per step (1e-06 to 1e+06 s)"));
  }
}

TEST_CASE("dplan compare and dplan calibrate refuse a log of nonsense figures in one line with exit 2 and write nothing",
          "[engine_logs][calibrate][cli]") {
  TempDir dir;
  const std::string megatron = read_file(kMegatron);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {dir.write("mem.log", replace_all(megatron, "max allocated: 40960.25", "max allocated: 1e308")), "1e308"},
      {dir.write("fast.log", replace_all(megatron, "(ms): 2950.3", "(ms): 1e-320")), "1e-320"},
      {dir.write("neg.log", replace_all(read_file(kDeepSpeed), "| fwd: 1210.50", "| fwd: -1210.50")), "-1210.50"},
      {dir.write("mfu.log", replace_all(read_file(kTitan), "mfu: 40.64%", "mfu: 99999.9%")), "99999.9"}};
  for (const auto& [log, value] : bad) {
    const std::string plan = log.ends_with("neg.log") ? kZero3 : kPlan;
    INFO(log);
    CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", plan, log})), Contains(value));
    const std::string out = (dir.path() / "out.json").string();
    CHECK_THAT(require_one_error_line(
                   run_program(DPLAN_BINARY, {"calibrate", log, "--plan", plan, "--profile", "dgx-h100", "-o", out})),
               Contains(value));
    CHECK(!std::filesystem::exists(out));
  }
}

TEST_CASE("dplan calibrate on logs of a 1e-300 ms step writes no profile and exits 2", "[engine_logs][calibrate][cli]") {
  // Six plans of gpt-small on local-cpu, and for each a Megatron-LM log (no argument dump, so any
  // layout fits) whose every step took 1e-300 ms: enough layouts for the fit, which once pinned
  // every efficiency at 1 and the latency at 0.01 us and wrote that profile.
  const costmodel::ClusterSpec cluster = dplan::testing::store().load_cluster("local-cpu");
  const costmodel::ModelSpec model = dplan::testing::store().load_model("gpt-small");
  const costmodel::TrainingSpec training = small_training();
  std::string log_text;
  for (int step : {10, 20, 30, 40})
    log_text += " [2026-01-10 12:00:00] iteration       " + std::to_string(step) +
                "/      40 | consumed samples:          40 | elapsed time per iteration (ms): 1e-300 | "
                "global batch size:     4 | lm loss: 5.0 |\n";
  TempDir dir;
  const std::string log = dir.write("fast.log", log_text);
  std::vector<std::string> args = {"calibrate"};
  std::vector<std::string> plans;
  int i = 0;
  for (const costmodel::ParallelConfig& layout : six_layouts()) {
    plans.push_back(dir.write("plan" + std::to_string(i++) + ".json",
                              to_json(costmodel::make_plan(model, cluster, training, layout, {}, {}, {})).dump()));
    args.push_back(log);
  }
  for (const auto& p : plans) args.insert(args.end(), {"--plan", p});
  const std::string out = (dir.path() / "poisoned.json").string();
  args.insert(args.end(), {"--profile", "local-cpu", "-o", out});
  CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, args)),
             Contains("fast.log:1: elapsed time per iteration (ms): 1e-300 is not a step time"));
  CHECK(!std::filesystem::exists(out));
  CHECK(!std::filesystem::exists(dir.path() / "poisoned-gpu.json"));
}
