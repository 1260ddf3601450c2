#include "dplan/planner/calibrate.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "fit.h"

namespace dplan::planner {
namespace {
namespace fs = std::filesystem;
using costmodel::ClusterSpec;

std::vector<double> measured_steps(const std::vector<CalibrationRun>& runs) {
  std::vector<double> out;
  for (const auto& r : runs) out.push_back(r.measured_step_s);
  return out;
}

std::vector<double> predictions(const ClusterSpec& c, const std::vector<CalibrationRun>& runs) {
  std::vector<double> out;
  for (const auto& r : runs) out.push_back(predicted_step_s(c, r));
  return out;
}

costmodel::TimeBreakdown predicted_time(const ClusterSpec& cluster, const CalibrationRun& run) {
  costmodel::Network network(cluster, run.parallel.world_size());
  return costmodel::estimate_time(run.model, network, run.training, run.parallel, run.overlap);
}

double compute_s(const costmodel::TimeBreakdown& t) { return t.forward_s + t.backward_s + t.recompute_s + t.optimizer_s; }

// What the fit matches: every run's step time, and its compute time where the run measured phases.
struct Targets {
  std::vector<double> measured;
  std::vector<double> model(const ClusterSpec& c, const std::vector<CalibrationRun>& runs) const {
    std::vector<double> out;
    for (const auto& r : runs) {
      const costmodel::TimeBreakdown t = predicted_time(c, r);
      out.push_back(t.step_time_s);
      if (r.measured_compute_s > 0) out.push_back(compute_s(t));
    }
    return out;
  }
  explicit Targets(const std::vector<CalibrationRun>& runs) {
    for (const auto& r : runs) {
      measured.push_back(r.measured_step_s);
      if (r.measured_compute_s > 0) measured.push_back(r.measured_compute_s);
    }
  }
};

void set_plan(CalibrationRun& r, const costmodel::Plan& plan) {
  r.model = plan.model;
  r.training = plan.training;
  r.parallel = plan.parallel;
  r.overlap = plan.overlap;
  r.layout = to_json(plan.model).dump() + to_json(plan.training).dump() + to_json(plan.parallel).dump();
}

}  // namespace

CalibrationRun read_calibration_run(const std::string& run_file) {
  const costmodel::RunRecord run = costmodel::read_run_record(run_file);
  CalibrationRun r;
  r.file = run_file;
  r.measured_step_s = run.step_time.median_s;
  if (!in_range(r.measured_step_s, kLoggedStepTime)) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", r.measured_step_s);
    throw InputError(run_file + ": /step_time_s/median " + seconds + " is not " + kLoggedStepTime.what + " (" +
                     range_text(kLoggedStepTime) + ")");
  }
  // Format 1 timed recompute inside backward and had no recompute of its own (measured_phases).
  using costmodel::Phase;
  for (Phase p : {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer}) {
    auto phase = run.phases_s.find(costmodel::to_string(p));
    r.measured_compute_s += phase == run.phases_s.end() ? 0.0 : phase->second;
  }
  r.plan_file = run.plan;
  if (!fs::exists(r.plan_file)) {
    const fs::path beside = fs::path(run_file).parent_path() / fs::path(r.plan_file).filename();
    if (!fs::exists(beside))
      throw InputError(run_file + ": the plan it ran, " + r.plan_file + ", is neither there nor beside the run.json");
    r.plan_file = beside.string();
  }
  const costmodel::Plan plan = costmodel::read_plan(r.plan_file);
  set_plan(r, plan);
  if (run.checkpoints) {
    for (const costmodel::CheckpointSave& save : run.checkpoints->saves) {
      if (!(save.write_s > 0) || save.state_bytes_by_rank.size() != plan.ranks.size()) continue;
      std::map<int, double> node_bytes;
      for (size_t rank = 0; rank < plan.ranks.size(); ++rank)
        node_bytes[plan.ranks[rank].node] += static_cast<double>(save.state_bytes_by_rank[rank]);
      double busiest = 0;
      for (const auto& [node, bytes] : node_bytes) busiest = std::max(busiest, bytes);
      if (busiest > 0) r.node_write_bytes_per_s.push_back(busiest / save.write_s);
    }
  }
  return r;
}

CalibrationRun read_calibration_log(const std::string& log_file, const std::string& plan_file,
                                    std::optional<LogFormat> format) {
  const costmodel::Plan plan = costmodel::read_plan(plan_file);
  const EngineLog log = parse_engine_log(read_text_file(log_file), log_file, format);
  const LogMeasurement measured = measure_log(log, plan, plan_file);
  CalibrationRun r;
  r.file = log_file;
  r.format = log.format;
  r.plan_file = plan_file;
  r.measured_step_s = measured.step_time_s;  // positive: measure_log refuses a step without a rate
  set_plan(r, plan);
  return r;
}

double predicted_step_s(const ClusterSpec& cluster, const CalibrationRun& run) {
  return predicted_time(cluster, run).step_time_s;
}

namespace {

// What the runs exercise: which link tiers, and whether any has communication that could hide
// under compute.
struct RunsUse {
  bool intra_node = false, inter_node = false, overlappable = false;
};

RunsUse runs_use(const ClusterSpec& base, const std::vector<CalibrationRun>& runs) {
  RunsUse use;
  for (const auto& r : runs) {
    const int world = r.parallel.world_size();
    use.intra_node = use.intra_node || world > 1;
    use.inter_node = use.inter_node || world > base.gpus_per_node;
    const int dp = r.parallel.dp * r.parallel.cp;
    const bool sharded = r.parallel.zero_stage >= 1 || r.parallel.distributed_optimizer;
    use.overlappable = use.overlappable || r.parallel.cp > 1 ||
                       (dp > 1 && (r.parallel.zero_stage >= 3 || r.overlap.grad_reduce || (sharded && r.overlap.param_gather)));
  }
  return use;
}

// The profile's parameters the runs determine, each with its bounds.
std::vector<detail::ClusterParameter> fitted_parameters(const ClusterSpec& base, const std::vector<CalibrationRun>& runs) {
  // Compute: the sustained fraction of the GEMM rate; the memory-bound work's rate too, unless the
  // GPU's GEMMs were measured (then memory-bound work is measured as well, and a small share).
  // With a measured table the fraction is the runs' pace over the probe's, which may exceed 1.
  const double most = base.gpu.matmul_measured.empty() ? 1.0 : 2.0;
  std::vector<detail::ClusterParameter> params = {
      {"gpu.sustained_fraction", [](ClusterSpec& c) -> double& { return c.gpu.sustained_fraction; }, {1e-3, most}}};
  if (base.gpu.matmul_measured.empty())
    params.push_back(
        {"gpu.memory_efficiency", [](ClusterSpec& c) -> double& { return c.gpu.memory_efficiency; }, {1e-3, 1.0}});
  const RunsUse use = runs_use(base, runs);
  // Communication, per tier the runs use: a tier with measured collectives scales those timings
  // (they are the measurement; training's differ by a factor); otherwise its efficiency and latency.
  if (use.intra_node && !base.intra_node.measured.empty()) {
    params.push_back({"intra_node.measured_scale", [](ClusterSpec& c) -> double& { return c.intra_node.measured_scale; },
                      {0.1, 10.0}});
  } else if (use.intra_node) {
    params.push_back({"intra_node.efficiency", [](ClusterSpec& c) -> double& { return c.intra_node.efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"intra_node.latency", [](ClusterSpec& c) -> double& { return c.intra_node.latency_s; }, {1e-8, 1e-2}});
  }
  if (use.inter_node) {
    params.push_back({"inter_node.efficiency", [](ClusterSpec& c) -> double& { return c.nic_efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"inter_node.latency", [](ClusterSpec& c) -> double& { return c.inter_node_latency_s; }, {1e-8, 1e-2}});
  }
  // Overlap, when some run has communication that could hide under compute.
  if (use.overlappable)
    params.push_back({"comm_overlap", [](ClusterSpec& c) -> double& { return c.comm_overlap_fraction; }, {1e-3, 1.0}});
  return params;
}

// Repeats of one layout measure it more precisely but determine nothing more: throws InputError
// when the runs hold fewer layouts than `params`.
void require_enough_layouts(const std::vector<detail::ClusterParameter>& params,
                            const std::vector<CalibrationRun>& runs) {
  std::set<std::string> layouts;
  for (const auto& r : runs) layouts.insert(r.layout.empty() ? "file:" + r.file : r.layout);
  if (layouts.size() < params.size()) {
    std::string names;
    for (const auto& p : params) names += (names.empty() ? "" : ", ") + p.name;
    throw InputError(std::to_string(layouts.size()) + " layout" + (layouts.size() == 1 ? "" : "s") +
                     (layouts.size() < runs.size() ? " (in " + std::to_string(runs.size()) + " runs)" : "") +
                     " cannot determine " +
                     std::to_string(params.size()) + " parameters (" + names +
                     "): a fit with fewer measurements than unknowns matches any data and predicts nothing; give at least " +
                     std::to_string(params.size()) + " runs of different layouts");
  }
}

// Storage: the median save's per-node write bandwidth (see calibrate.h), where the runs saved.
void calibrate_storage(Calibration& cal, const std::vector<CalibrationRun>& runs) {
  std::vector<double> write_rates;
  for (const auto& r : runs) write_rates.insert(write_rates.end(), r.node_write_bytes_per_s.begin(), r.node_write_bytes_per_s.end());
  if (write_rates.empty()) return;
  std::sort(write_rates.begin(), write_rates.end());
  const size_t n = write_rates.size();
  const double node_write = n % 2 ? write_rates[n / 2] : 0.5 * (write_rates[n / 2 - 1] + write_rates[n / 2]);
  costmodel::StorageSpec& storage = cal.cluster.storage;
  if (!storage.given()) {
    storage.node_read_bytes_per_s = storage.aggregate_read_bytes_per_s = node_write;
    storage.aggregate_write_bytes_per_s = node_write;
  }
  storage.node_write_bytes_per_s = node_write;
  // A cluster that is one shared machine's cores (cores_per_node) has one node: its disk is the aggregate.
  const bool one_machine = cal.cluster.cores_per_node > 0;
  if (one_machine || storage.aggregate_write_bytes_per_s < node_write) storage.aggregate_write_bytes_per_s = node_write;
  if (storage.aggregate_read_bytes_per_s < storage.node_read_bytes_per_s)
    storage.aggregate_read_bytes_per_s = storage.node_read_bytes_per_s;
  cal.parameters.push_back("storage.node_write");
}

}  // namespace

Calibration calibrate(const ClusterSpec& base, const std::vector<CalibrationRun>& runs) {
  const std::vector<detail::ClusterParameter> params = fitted_parameters(base, runs);
  require_enough_layouts(params, runs);
  Calibration cal;
  const Targets targets(runs);
  cal.before_s = predictions(base, runs);
  const ClusterSpec c = detail::fit_cluster(base, params, [&](const ClusterSpec& trial) {
    return detail::rms_log_error(targets.model(trial, runs), targets.measured);
  });
  const std::vector<double> measured = measured_steps(runs);
  for (const auto& p : params) cal.parameters.push_back(p.name);
  cal.after_s = predictions(c, runs);
  cal.rms_log_error_before = detail::rms_log_error(cal.before_s, measured);
  cal.rms_log_error_after = detail::rms_log_error(cal.after_s, measured);
  cal.cluster = c;
  calibrate_storage(cal, runs);
  return cal;
}

}  // namespace dplan::planner
