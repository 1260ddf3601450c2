// A benchmark, not a test: the closed loop on this machine and the probe's measurements, through
// the real binaries. Its figures depend on how fast and how steady the machine is, so it lives
// here and not in the test suite; bench/run.sh runs it (`build/bench/machine_bench`).
//
// "[accuracy]": `dplan probe` measures the machine, the cost model predicts nine layouts of
// gpt-small (dp, tp, pp, sequence parallel, ZeRO 1-3, on 1, 2 and 4 ranks of a 2-core machine)
// from that profile alone, `dplan run` measures them, and `dplan calibrate` fits the profile to
// three layouts' runs and predicts three others.
//  - Probe alone: at least six of the nine within 20 % of the measured step time.
//  - Calibrated on dp 2, tp 2 and pp 2 x dp 2 ZeRO-3: tp 2 x dp 2, dp 4 ZeRO-2 and tp 2 x pp 2 with
//    sequence parallel within 10 %.
// This machine's pace moves by tens of percent over seconds (a single-thread loop alone ran at
// 3,200 to 4,960 iterations/s within 20 s), so the measurement is interleaved: every layout runs
// once in each of three rounds and its step time is the median of its 9 measured steps, and the
// probe's GEMMs are the medians of three passes of their own. A prediction can only be as good as
// the machine is steady: the probe runs again at the end, and when its GEMMs' pace moved by more
// than 10 % in between, or the layouts' steps spread by more than 10 % (see below), the bounds are
// reported, not asserted; every prediction from the probe alone is always held within a factor of
// 2.5. The tables are printed either way. tests/planner/recorded_accuracy_test.cpp checks the same
// bounds, always, against one recorded session of this machine.
//
// "[probe]": `dplan probe` on local ranks writes the measurements and profiles that --cluster reads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "process.h"

namespace {
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;

// The machine's pace moves by tens of percent over seconds to minutes, so each layout is measured
// in kRounds short runs, one per round, every round running every layout in turn: each layout's
// steps are spread over the whole measurement and see the same mix of fast and slow moments as the
// others (interleaving, the standard defence of a benchmark against drift).
constexpr int kRounds = 3;
constexpr int kSteps = 5;   // per run; the first kWarmup are left out
constexpr int kWarmup = 2;  // so each layout's step time is the median of 9 steps from 3 runs

struct Case {
  std::string name;
  std::vector<std::string> flags;  // dplan estimate's layout flags
  int gpus = 1;
  std::string plan = {};
  std::vector<std::string> runs = {};  // one run.json per round
  double measured_s = 0;               // the median of the measured steps of all its runs
  double spread = 0;                   // (p90 - p10) / median of those steps
};

std::vector<Case> layouts() {
  return {{"single", {"--tp", "1", "--pp", "1", "--dp", "1"}, 1},
          {"dp2", {"--tp", "1", "--pp", "1", "--dp", "2", "--zero", "1"}, 2},
          {"tp2", {"--tp", "2", "--pp", "1", "--dp", "1"}, 2},
          {"pp2", {"--tp", "1", "--pp", "2", "--dp", "1"}, 2},
          {"dp4-zero2", {"--tp", "1", "--pp", "1", "--dp", "4", "--zero", "2"}, 4},
          {"tp2-dp2", {"--tp", "2", "--pp", "1", "--dp", "2", "--zero", "1"}, 4},
          {"pp2-dp2-zero3", {"--tp", "1", "--pp", "2", "--dp", "2", "--zero", "3"}, 4},
          {"tp2-pp2-sp", {"--tp", "2", "--pp", "2", "--dp", "1", "--sp"}, 4},
          {"dp2-zero3", {"--tp", "1", "--pp", "1", "--dp", "2", "--zero", "3"}, 2}};
}

// Plans the layout on `profile` into `plan` and returns the predicted step time.
double predict(const Case& c, const std::string& profile, const std::string& plan) {
  std::vector<std::string> args = {"estimate", "--model", "gpt-small", "--cluster", profile, "--gpus",
                                   std::to_string(c.gpus), "--mbs", "1", "--global-batch", "8", "--precision", "fp32",
                                   "-o", plan};
  args.insert(args.end(), c.flags.begin(), c.flags.end());
  Result r = run_program(DPLAN_BINARY, args);
  INFO(c.name << ": " << r.err);
  REQUIRE(r.status == 0);
  return json::parse(read_file(plan)).at("prediction").at("step_time_s").get<double>();
}

void run_once(Case& c, const fs::path& dir) {
  const std::string run = (dir / ("run-" + c.name + "-" + std::to_string(c.runs.size() + 1) + ".json")).string();
  Result r = run_program(DPLAN_BINARY, {"run", c.plan, "--steps", std::to_string(kSteps), "--warmup",
                                        std::to_string(kWarmup), "--quiet", "-o", run});
  INFO(c.name << ": " << r.err);
  REQUIRE(r.status == 0);
  c.runs.push_back(run);
}

double quantile(std::vector<double> v, double q) {  // linear between order statistics
  std::sort(v.begin(), v.end());
  const double x = q * (v.size() - 1);
  const size_t i = static_cast<size_t>(x);
  return i + 1 < v.size() ? v[i] + (x - i) * (v[i + 1] - v[i]) : v.back();
}

// The measured steps of all the layout's runs, pooled.
void summarize(Case& c) {
  std::vector<double> steps;
  for (const std::string& run : c.runs) {
    const json measured = json::parse(read_file(run));
    for (const json& s : measured.at("steps"))
      if (!s.at("warmup").get<bool>()) steps.push_back(s.at("time_s").get<double>());
  }
  REQUIRE(steps.size() == size_t(kRounds * (kSteps - kWarmup)));
  c.measured_s = quantile(steps, 0.5);
  c.spread = (quantile(steps, 0.9) - quantile(steps, 0.1)) / c.measured_s;
}

double error(double predicted_s, double measured_s) { return predicted_s / measured_s - 1; }

// `dplan probe` of this machine with two local ranks into `profile`, which must succeed.
Result probe(const std::string& profile) {
  Result r = run_program(DPLAN_BINARY, {"probe", "--cluster", "local-cpu", "--ranks", "2", "-o", profile});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  return r;
}

}  // namespace

TEST_CASE("probe, predict, run, calibrate: the cost model against measured step times on this machine",
          "[accuracy]") {
  TempDir dir;
  const std::string profile = (dir.path() / "machine.json").string();
  Result r = probe(profile);

  std::vector<Case> cases = layouts();
  std::vector<double> predicted;
  for (Case& c : cases) {
    c.plan = (dir.path() / ("plan-" + c.name + ".json")).string();
    predicted.push_back(predict(c, profile, c.plan));
  }
  for (int round = 0; round < kRounds; ++round)
    for (Case& c : cases) run_once(c, dir.path());
  int within_20 = 0;
  std::vector<double> errors;
  for (size_t i = 0; i < cases.size(); ++i) {
    summarize(cases[i]);
    errors.push_back(error(predicted[i], cases[i].measured_s));
  }
  // "vs median": the error against the layouts' median error, (1 + e) / (1 + median) - 1: what is
  // left when the probe's pace and the runs' differ alike for every layout (the machine, not the
  // model, moved in between).
  const double median_error = quantile(errors, 0.5);
  std::printf("%-16s %10s %10s %8s %8s %10s   (probe alone)\n", "layout", "pred (ms)", "meas (ms)", "error", "spread",
              "vs median");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const double e = errors[i];
    within_20 += std::abs(e) <= 0.20;
    std::printf("%-16s %10.1f %10.1f %+7.1f%% %7.1f%% %+9.1f%%\n", c.name.c_str(), predicted[i] * 1e3, c.measured_s * 1e3,
                100 * e, 100 * c.spread, 100 * ((1 + e) / (1 + median_error) - 1));
  }
  std::fflush(stdout);

  // Calibrate on three layouts whose communication differs in kind (all their runs), predict three others.
  auto by_name = [&](const std::string& name) -> Case& {
    return *std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name == name; });
  };
  const std::string calibrated = (dir.path() / "calibrated.json").string();
  std::vector<std::string> args = {"calibrate"};
  for (const std::string name : {"dp2", "tp2", "pp2-dp2-zero3"})
    args.insert(args.end(), by_name(name).runs.begin(), by_name(name).runs.end());
  args.insert(args.end(), {"--profile", profile, "-o", calibrated});
  r = run_program(DPLAN_BINARY, args);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  std::printf("%-16s %10s %10s %8s   (calibrated on dp2, tp2, pp2-dp2-zero3)\n", "layout", "pred (ms)", "meas (ms)",
              "error");
  int calibrated_within_10 = 0;
  std::string misses;
  for (const std::string name : {"tp2-dp2", "dp4-zero2", "tp2-pp2-sp"}) {
    const Case& c = by_name(name);
    const double p = predict(c, calibrated, (dir.path() / ("calibrated-" + name + ".json")).string());
    const double e = error(p, c.measured_s);
    std::printf("%-16s %10.1f %10.1f %+7.1f%%\n", name.c_str(), p * 1e3, c.measured_s * 1e3, 100 * e);
    if (std::abs(e) <= 0.10) ++calibrated_within_10;
    else misses += " " + name;
  }
  std::fflush(stdout);

  // Did the machine hold its pace? The median ratio of the GEMM times of a second probe to the first.
  const std::string again = (dir.path() / "again.json").string();
  probe(again);
  const json first = json::parse(read_file((dir.path() / "machine-probe.json").string())).at("gemm");
  const json second = json::parse(read_file((dir.path() / "again-probe.json").string())).at("gemm");
  REQUIRE(first.size() == second.size());
  std::vector<double> ratios;
  for (size_t i = 0; i < first.size(); ++i)
    ratios.push_back(second[i].at("time_s").get<double>() / first[i].at("time_s").get<double>());
  const double drift = quantile(ratios, 0.5) - 1;
  std::printf("machine pace: the GEMMs of a second probe took %+.1f %% of the first's time\n", 100 * drift);
  // And the runs? The median over the layouts of their steps' spread. The median of n = 9 steps has
  // a standard error of about 1.25 sigma / sqrt(n), and p90 - p10 spans 2.56 sigma of a normal, so
  // a spread of 10 % leaves each measured step time about 1.6 % uncertain. The calibrated bound
  // compares a layout against a fit to three others, each measured that precisely; at a spread of
  // 15.6 % a run here missed it by 7 % on a layout whose own steps spread by 27 %.
  std::vector<double> spreads;
  for (const Case& c : cases) spreads.push_back(c.spread);
  const double spread = quantile(spreads, 0.5);
  std::printf("run steadiness: median step-time spread (p90 - p10) / median %.1f %%\n", 100 * spread);
  std::fflush(stdout);
  // Always: probe alone, every prediction within a factor of 2.5 of its measurement (the shipped
  // placeholder profile is off by 5x; a broken probe or time model lands far outside).
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].name << ": predicted " << predicted[i] << " s from the probe, measured " << cases[i].measured_s << " s");
    CHECK(std::abs(std::log(predicted[i] / cases[i].measured_s)) <= std::log(2.5));
  }
  if (std::abs(drift) > 0.10 || spread > 0.10) {
    WARN("this machine did not hold its pace (probe drift " << 100 * drift << " %, step spread " << 100 * spread
                                                            << " %): " << within_20
                                         << " of 9 layouts within 20 % from the probe alone, " << calibrated_within_10
                                         << " of 3 within 10 % after calibration; bounds not asserted");
    return;
  }
  INFO(within_20 << " of 9 layouts within 20 % from the probe alone");
  CHECK(within_20 >= 6);
  INFO("outside 10 % after calibration:" << misses);
  CHECK(calibrated_within_10 == 3);
}

TEST_CASE("dplan probe measures this machine with local ranks and writes profiles that --cluster reads",
          "[probe]") {
  TempDir dir;
  const std::string out = (dir.path() / "machine.json").string();
  Result r = probe(out);
  CHECK_THAT(r.out, Contains("measuring this machine with 2 local ranks"));
  CHECK_THAT(r.out, Contains("fitted GPU cpu-core"));
  CHECK_THAT(r.out, Contains("fitted intra_node of local-cpu"));
  // The measurements: LibTorch GEMMs over a layer's shapes, the copy bandwidth, Gloo collectives.
  json probe = json::parse(read_file((dir.path() / "machine-probe.json").string()));
  CHECK(probe["generator"] == "dplan-cpu-probe");
  CHECK(probe["device"]["count"] == 2);
  CHECK(probe["gemm"].size() >= 30);
  for (const auto& g : probe["gemm"]) CHECK(g["flops_per_s"].get<double>() > 1e6);
  CHECK(probe["memory"]["bytes_per_s"].get<double>() > 1e8);
  REQUIRE(probe["nccl_tests_files"].size() == 3);  // all-reduce, all-gather, send/recv
  CHECK_THAT(read_file((dir.path() / "machine-probe-all_reduce_perf.txt").string()), Contains("#  Rank 1 Group"));
  CHECK_THAT(read_file((dir.path() / "machine-probe-sendrecv_perf.txt").string()), Contains("#  Rank 1 Group"));
  // Training's GEMMs in all three roles and the executor's own attention, the element-wise
  // kernels, a lone rank against both, and the overlap.
  std::set<std::string> ops;
  for (const auto& g : probe["gemm"]) ops.insert(g["op"].get<std::string>());
  CHECK(ops == std::set<std::string>{"forward", "dgrad", "wgrad", "batched", "attention_forward", "attention_backward"});
  CHECK(probe["memory"]["elementwise_bytes_per_s"].get<double>() > 1e8);
  CHECK(probe["lone_rank"]["speedup"].get<double>() > 0);
  // Spread over the probe: three GEMM passes, each with five lone-rank pairs.
  CHECK(probe["gemm_rounds"].get<int>() == 3);
  CHECK(probe["lone_rank"]["pairs"].get<int>() == 15);
  CHECK(probe["overlap"]["samples"].get<int>() == 3);  // one per GEMM pass, combined by their means
  CHECK(probe["overlap"]["fraction"].get<double>() >= 0);
  CHECK(probe["overlap"]["fraction"].get<double>() <= 1);
  // The written cluster names its measured GPU, keeps the measurements, and plans with them.
  const std::string text = read_file(out);
  CHECK_THAT(text, Contains("machine-gpu.json"));
  const json cluster = json::parse(text)["cluster"];
  CHECK(cluster["intra_node"]["measured"].size() == 3 * 8);  // 4 KiB .. 64 MiB, every collective
  CHECK(cluster.contains("comm_overlap"));
  CHECK(cluster.contains("lone_rank_speedup"));
  CHECK(json::parse(read_file((dir.path() / "machine-gpu.json").string()))["gpu"]["matmul"]["measured"].size() ==
        probe["gemm"].size());
  r = run_program(DPLAN_BINARY, {"estimate", "--model", "gpt-tiny", "--cluster", out, "--gpus", "2", "--dp", "2",
                                 "--global-batch", "8", "--precision", "fp32"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Contains("local-cpu-measured"));
  // Without -o there is nowhere to put the measurements.
  r = run_program(DPLAN_BINARY, {"probe", "--cluster", "local-cpu"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("-o"));
}
