#include "dplan/planner/calibrate.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
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

}  // namespace

CalibrationRun read_calibration_run(const std::string& run_file) {
  const json run = read_json_file(run_file);
  CalibrationRun r;
  r.file = run_file;
  if (!run.is_object() || !run.contains("plan") || !run.contains("step_time_s"))
    throw InputError(run_file + ": not a run.json written by dplan run (no \"plan\" or \"step_time_s\")");
  r.measured_step_s = run["step_time_s"].value("median", 0.0);
  if (!(r.measured_step_s > 0)) throw InputError(run_file + ": /step_time_s/median must be a positive number");
  if (run.contains("phases_s") && run["phases_s"].is_object()) {
    const json& ph = run["phases_s"];
    for (const char* key : {"forward", "backward", "optimizer"}) r.measured_compute_s += ph.value(key, 0.0);
  }
  r.plan_file = run["plan"].get<std::string>();
  if (!fs::exists(r.plan_file)) {
    const fs::path beside = fs::path(run_file).parent_path() / fs::path(r.plan_file).filename();
    if (!fs::exists(beside))
      throw InputError(run_file + ": the plan it ran, " + r.plan_file + ", is neither there nor beside the run.json");
    r.plan_file = beside.string();
  }
  const json plan = read_json_file(r.plan_file);
  for (const char* key : {"model", "training", "parallel"})
    if (!plan.contains(key)) throw InputError(r.plan_file + ": missing \"" + key + "\"; is this a plan written by dplan -o?");
  r.model = costmodel::model_from_json(plan["model"], r.plan_file, "/model");
  r.training = costmodel::training_from_json(plan["training"], r.plan_file, "/training");
  r.parallel = costmodel::parallel_from_json(plan["parallel"], r.plan_file, "/parallel");
  r.layout = plan["model"].dump() + plan["training"].dump() + plan["parallel"].dump();
  if (plan.contains("overlap")) {
    const json& o = plan["overlap"];
    r.overlap.grad_reduce = o.value("grad_reduce", r.overlap.grad_reduce);
    r.overlap.param_gather = o.value("param_gather", r.overlap.param_gather);
    r.overlap.tp_comm = o.value("tp_comm", r.overlap.tp_comm);
  }
  return r;
}

double predicted_step_s(const ClusterSpec& cluster, const CalibrationRun& run) {
  return predicted_time(cluster, run).step_time_s;
}

Calibration calibrate(const ClusterSpec& base, const std::vector<CalibrationRun>& runs) {
  // Compute: the sustained fraction of the GEMM rate; the memory-bound work's rate too, unless the
  // GPU's GEMMs were measured (then memory-bound work is measured as well, and a small share).
  // With a measured table the fraction is the runs' pace over the probe's, which may exceed 1.
  const double most = base.gpu.matmul_measured.empty() ? 1.0 : 2.0;
  std::vector<detail::ClusterParameter> params = {
      {"gpu.sustained_fraction", [](ClusterSpec& c) -> double& { return c.gpu.sustained_fraction; }, {1e-3, most}}};
  if (base.gpu.matmul_measured.empty())
    params.push_back(
        {"gpu.memory_efficiency", [](ClusterSpec& c) -> double& { return c.gpu.memory_efficiency; }, {1e-3, 1.0}});
  bool intra = false, inter = false, overlappable = false;
  for (const auto& r : runs) {
    const int world = r.parallel.world_size();
    intra = intra || world > 1;
    inter = inter || world > base.gpus_per_node;
    const int dp = r.parallel.dp * r.parallel.cp;
    const bool sharded = r.parallel.zero_stage >= 1 || r.parallel.distributed_optimizer;
    overlappable = overlappable || r.parallel.cp > 1 ||
                   (dp > 1 && (r.parallel.zero_stage >= 3 || r.overlap.grad_reduce || (sharded && r.overlap.param_gather)));
  }
  // Communication, per tier the runs use: a tier with measured collectives scales those timings
  // (they are the measurement; training's differ by a factor); otherwise its efficiency and latency.
  if (intra && !base.intra_node.measured.empty()) {
    params.push_back({"intra_node.measured_scale", [](ClusterSpec& c) -> double& { return c.intra_node.measured_scale; },
                      {0.1, 10.0}});
  } else if (intra) {
    params.push_back({"intra_node.efficiency", [](ClusterSpec& c) -> double& { return c.intra_node.efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"intra_node.latency", [](ClusterSpec& c) -> double& { return c.intra_node.latency_s; }, {1e-8, 1e-2}});
  }
  if (inter) {
    params.push_back({"inter_node.efficiency", [](ClusterSpec& c) -> double& { return c.nic_efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"inter_node.latency", [](ClusterSpec& c) -> double& { return c.inter_node_latency_s; }, {1e-8, 1e-2}});
  }
  // Overlap, when some run has communication that could hide under compute.
  if (overlappable)
    params.push_back({"comm_overlap", [](ClusterSpec& c) -> double& { return c.comm_overlap_fraction; }, {1e-3, 1.0}});
  // Repeats of one layout measure it more precisely but determine nothing more: count layouts.
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
  return cal;
}

}  // namespace dplan::planner
