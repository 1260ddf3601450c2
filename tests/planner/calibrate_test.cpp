// dplan calibrate: a profile's efficiency figures fitted to measured step times.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/planner/calibrate.h"
#include "process.h"
#include "test_profiles.h"

namespace {
using namespace dplan;
using namespace dplan::planner;
using costmodel::ClusterSpec;
using costmodel::ParallelConfig;
using dplan::testing::read_file;
using dplan::testing::run_program;
using dplan::testing::TempDir;

// A run.json of `layout` that ran `plan` with this median step time and nothing else measured.
nlohmann::json synthetic_run(const std::string& plan, const ParallelConfig& layout, double step_s) {
  costmodel::RunRecord run;
  run.plan = plan;
  run.layout.tp = layout.tp;
  run.layout.pp = layout.pp;
  run.layout.dp = layout.dp;
  run.config = run.environment = nlohmann::json::object();
  run.phases_by_rank_s = nlohmann::json::array();
  run.step_time = {.median_s = step_s, .mean_s = step_s, .min_s = step_s, .max_s = step_s, .p10_s = step_s,
                   .p90_s = step_s, .stdev_s = 0, .count = 1};
  for (int r = 0; r < layout.world_size(); ++r) {
    run.stage_of_rank.push_back(r / (layout.tp * layout.dp));  // tp fastest, then dp, then pp
    run.memory_bytes[r] = {};
    run.weights_hash_by_rank.push_back("0");
  }
  return to_json(run);
}

// Plans of gpt-small on local-cpu, and run.json files whose median step time is what `truth`
// predicts for them: what a machine that behaves exactly as `truth` would have measured. Short
// sequences and gradient reduction not overlapped keep communication a good share of the step,
// so that the runs determine its figures.
std::vector<std::string> synthetic_runs(const TempDir& dir, const ClusterSpec& truth,
                                        const std::vector<ParallelConfig>& layouts) {
  const costmodel::ModelSpec model = dplan::testing::store().load_model("gpt-small");
  costmodel::TrainingSpec training;
  training.seq_len = 32;
  training.global_batch = 4;
  training.precision = costmodel::Precision::fp32;
  std::vector<std::string> files;
  for (size_t i = 0; i < layouts.size(); ++i) {
    costmodel::OverlapOptions overlap;
    overlap.grad_reduce = false;
    const std::string plan =
        dir.write("plan" + std::to_string(i) + ".json",
                  to_json(costmodel::make_plan(model, truth, training, layouts[i], overlap, {}, {})).dump());
    CalibrationRun run = read_calibration_run(dir.write("probe-run.json", synthetic_run(plan, layouts[i], 1.0).dump()));
    const double step_s = predicted_step_s(truth, run);
    files.push_back(dir.write("run" + std::to_string(i) + ".json", synthetic_run(plan, layouts[i], step_s).dump()));
  }
  return files;
}

// Layouts whose communication differs in kind: large dp all-reduces (bandwidth), many small tp
// all-reduces (latency), pipeline sends, on 1 to 4 ranks.
std::vector<ParallelConfig> six_layouts() {
  std::vector<ParallelConfig> out;
  for (auto [tp, pp, dp] : std::vector<std::array<int, 3>>{{1, 1, 1}, {1, 1, 4}, {4, 1, 1}, {1, 2, 1}, {2, 1, 2}, {1, 2, 2}}) {
    ParallelConfig p;
    p.tp = tp;
    p.pp = pp;
    p.dp = dp;
    p.micro_batch = 1;
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_CASE("calibration on synthetic runs recovers their step times, the matmul rate, and predicts unseen layouts",
          "[calibrate]") {
  const ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  ClusterSpec truth = base;
  truth.gpu.sustained_fraction = 0.1;
  truth.gpu.memory_efficiency = 0.2;
  truth.intra_node.efficiency_fraction = 0.3;
  truth.intra_node.latency_s = 100e-6;
  TempDir dir;
  std::vector<CalibrationRun> runs;
  for (const auto& f : synthetic_runs(dir, truth, six_layouts())) runs.push_back(read_calibration_run(f));
  Calibration cal = calibrate(base, runs);
  CHECK(cal.parameters.size() == 4);
  CHECK(cal.rms_log_error_before > 0.5);
  CHECK(cal.rms_log_error_after < 0.01);
  for (size_t i = 0; i < runs.size(); ++i) CHECK(cal.after_s[i] == Approx(runs[i].measured_step_s).epsilon(0.01));
  // The matmul rate dominates these steps and comes back; element-wise efficiency and the link's
  // efficiency against its latency are only loosely determined by six step times (other
  // combinations give the same times), so what is checked is that the fit predicts layouts it has
  // not seen as the truth does.
  CHECK(cal.cluster.gpu.sustained_fraction == Approx(0.1).epsilon(0.05));
  ParallelConfig tp2pp2, pp4;
  tp2pp2.tp = tp2pp2.pp = 2;
  pp4.pp = 4;
  for (const auto& f : synthetic_runs(dir, truth, {tp2pp2, pp4})) {
    const CalibrationRun unseen = read_calibration_run(f);
    CHECK(predicted_step_s(cal.cluster, unseen) == Approx(unseen.measured_step_s).epsilon(0.03));
  }
}

TEST_CASE("calibration refuses fewer layouts than parameters, and runs it cannot read", "[calibrate]") {
  const ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  TempDir dir;
  std::vector<ParallelConfig> three = six_layouts();
  three.resize(3);
  std::vector<CalibrationRun> runs;
  for (const auto& f : synthetic_runs(dir, base, three)) runs.push_back(read_calibration_run(f));
  CHECK_THROWS_WITH(calibrate(base, runs), Catch::Contains("3 layouts cannot determine 4 parameters"));
  // Repeats of one layout are more measurements of it, not more layouts: four runs of three layouts
  // still cannot determine four parameters.
  runs.push_back(runs[1]);
  runs.back().file += ".again";
  CHECK_THROWS_WITH(calibrate(base, runs), Catch::Contains("3 layouts (in 4 runs) cannot determine 4 parameters"));
  runs.pop_back();
  // A single-rank run only: no communication to fit, so compute alone (2 parameters) needs 2 runs.
  runs.resize(1);
  CHECK_THROWS_WITH(calibrate(base, runs), Catch::Contains("1 layout cannot determine 2 parameters"));
  CHECK_THROWS_WITH(read_calibration_run(dir.write("x.json", "{}")), Catch::Contains("x.json: not a run.json"));
  CHECK_THROWS_WITH(read_calibration_run(dir.write("y.json", synthetic_run("gone.json", three[0], 1.0).dump())),
                    Catch::Contains("gone.json"));
}

TEST_CASE("dplan calibrate prints every run before and after and writes the profile with the runs it used",
          "[calibrate][cli]") {
  const ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  ClusterSpec truth = base;
  truth.gpu.sustained_fraction = 0.12;
  truth.intra_node.efficiency_fraction = 0.4;
  TempDir dir;
  std::vector<std::string> args = {"calibrate"};
  for (const auto& f : synthetic_runs(dir, truth, six_layouts())) args.push_back(f);
  const std::string out = (dir.path() / "calibrated.json").string();
  args.insert(args.end(), {"--profile", "local-cpu", "-o", out});
  auto r = run_program(DPLAN_BINARY, args);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("calibrated local-cpu on 6 runs"));
  CHECK_THAT(r.out, Catch::Contains("run5.json"));
  const ClusterSpec fitted = dplan::testing::store().load_cluster(out);
  CHECK(fitted.name == "local-cpu-calibrated");
  CHECK(fitted.gpu.sustained_fraction == Approx(0.12).epsilon(0.05));
  CHECK_THAT(read_file(out), Catch::Contains("calibrated by dplan calibrate on"));
  CHECK_THAT(read_file((dir.path() / "calibrated-gpu.json").string()), Catch::Contains("run0.json"));
  r = run_program(DPLAN_BINARY, {"calibrate", (dir.path() / "missing.json").string(), "--profile", "local-cpu"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("missing.json"));
}

TEST_CASE("dplan calibrate fits the storage write bandwidth to the checkpoint saves a run.json records",
          "[calibrate][cli]") {
  const ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  ClusterSpec truth = base;
  truth.gpu.sustained_fraction = 0.12;
  TempDir dir;
  std::vector<std::string> runs = synthetic_runs(dir, truth, six_layouts());
  // Two runs saved checkpoints: run1 (dp 4, one node of local-cpu) three times, run4 (tp 2 dp 2) once.
  // Per save: the busiest node's state bytes (all ranks are on node 0 here) over its write time.
  const std::vector<std::pair<size_t, std::vector<std::pair<long long, double>>>> saved = {
      {1, {{1000000, 0.010}, {1000000, 0.020}, {1000000, 0.040}}}, {4, {{3000000, 0.025}}}};
  std::vector<double> rates;
  for (const auto& [index, saves] : saved) {
    costmodel::RunRecord run = costmodel::read_run_record(runs[index]);
    costmodel::RunCheckpoints block;
    block.dir = "ckpt";
    const int world = static_cast<int>(run.stage_of_rank.size());
    for (size_t i = 0; i < saves.size(); ++i) {
      costmodel::CheckpointSave save;
      save.step = static_cast<int>(i + 1);
      save.write_s = saves[i].second;
      save.blocking_s = 0.001;
      for (int r = 0; r < world; ++r) {
        save.state_bytes_by_rank.push_back(saves[i].first / world);
        save.file_bytes_by_rank.push_back(saves[i].first / world + 1000);
      }
      rates.push_back(static_cast<double>(saves[i].first / world * world) / saves[i].second);
      block.saves.push_back(save);
    }
    run.checkpoints = block;
    dir.write(std::filesystem::path(runs[index]).filename().string(), to_json(run).dump());
  }
  std::sort(rates.begin(), rates.end());  // 4 saves: the median is the mean of the middle two
  const double expected_bytes_per_s = 0.5 * (rates[1] + rates[2]);
  std::vector<std::string> args = {"calibrate"};
  args.insert(args.end(), runs.begin(), runs.end());
  const std::string out = (dir.path() / "calibrated.json").string();
  args.insert(args.end(), {"--profile", "local-cpu", "-o", out});
  const auto r = run_program(DPLAN_BINARY, args);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("storage.node_write"));
  const ClusterSpec fitted = dplan::testing::store().load_cluster(out);
  CHECK(fitted.storage.node_write_bytes_per_s == Approx(expected_bytes_per_s));
  // local-cpu is one machine: its disk is the aggregate.
  CHECK(fitted.storage.aggregate_write_bytes_per_s == Approx(expected_bytes_per_s));
  CHECK(fitted.storage.node_read_bytes_per_s == base.storage.node_read_bytes_per_s);
  CHECK_THAT(read_file(out), Catch::Contains("checkpoint saves' write times"));
  // Without saves nothing about storage is fitted.
  std::vector<std::string> plain = {"calibrate"};
  for (size_t i = 0; i < runs.size(); ++i)
    if (i != 1 && i != 4) plain.push_back(runs[i]);
  plain.insert(plain.end(), {"--profile", "local-cpu"});
  const auto p = run_program(DPLAN_BINARY, plain);
  INFO(p.out << p.err);
  REQUIRE(p.status == 0);
  CHECK_THAT(p.out, !Catch::Contains("storage"));
}

TEST_CASE("calibration refuses a run.json whose median step time is no step time", "[calibrate]") {
  // 1e-300 s passed "positive" and pinned the fit at its bounds (every efficiency 1).
  const ClusterSpec base = dplan::testing::store().load_cluster("local-cpu");
  TempDir dir;
  const std::string measured = synthetic_runs(dir, base, {six_layouts().front()}).front();
  const std::string plan_file = costmodel::read_run_record(measured).plan;
  const std::string run = dir.write("fast.json", synthetic_run(plan_file, six_layouts().front(), 1e-300).dump());
  try {
    read_calibration_run(run);
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("fast.json: /step_time_s/median 1e-300 is not a step time (1e-06 to 1e+06 s)"));
  }
}
