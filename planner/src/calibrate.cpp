#include "dplan/planner/calibrate.h"

#include <cmath>
#include <filesystem>

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

}  // namespace

CalibrationRun read_calibration_run(const std::string& run_file) {
  const json run = read_json_file(run_file);
  CalibrationRun r;
  r.file = run_file;
  if (!run.is_object() || !run.contains("plan") || !run.contains("step_time_s"))
    throw InputError(run_file + ": not a run.json written by dplan run (no \"plan\" or \"step_time_s\")");
  r.measured_step_s = run["step_time_s"].value("median", 0.0);
  if (!(r.measured_step_s > 0)) throw InputError(run_file + ": /step_time_s/median must be a positive number");
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
  if (plan.contains("overlap")) {
    const json& o = plan["overlap"];
    r.overlap.grad_reduce = o.value("grad_reduce", r.overlap.grad_reduce);
    r.overlap.param_gather = o.value("param_gather", r.overlap.param_gather);
    r.overlap.tp_comm = o.value("tp_comm", r.overlap.tp_comm);
  }
  return r;
}

double predicted_step_s(const ClusterSpec& cluster, const CalibrationRun& run) {
  costmodel::Network network(cluster, run.parallel.world_size());
  return costmodel::estimate_time(run.model, network, run.training, run.parallel, run.overlap).step_time_s;
}

Calibration calibrate(const ClusterSpec& base, const std::vector<CalibrationRun>& runs) {
  std::vector<detail::ClusterParameter> params = {
      {"gpu.sustained_fraction", [](ClusterSpec& c) -> double& { return c.gpu.sustained_fraction; }, {1e-3, 1.0}},
      {"gpu.memory_efficiency", [](ClusterSpec& c) -> double& { return c.gpu.memory_efficiency; }, {1e-3, 1.0}}};
  bool intra = false, inter = false;
  for (const auto& r : runs) {
    const int world = r.parallel.world_size();
    intra = intra || world > 1;
    inter = inter || world > base.gpus_per_node;
  }
  if (intra) {
    params.push_back({"intra_node.efficiency", [](ClusterSpec& c) -> double& { return c.intra_node.efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"intra_node.latency", [](ClusterSpec& c) -> double& { return c.intra_node.latency_s; }, {1e-8, 1e-2}});
  }
  if (inter) {
    params.push_back({"inter_node.efficiency", [](ClusterSpec& c) -> double& { return c.nic_efficiency_fraction; },
                      {1e-3, 1.0}});
    params.push_back({"inter_node.latency", [](ClusterSpec& c) -> double& { return c.inter_node_latency_s; }, {1e-8, 1e-2}});
  }
  if (runs.size() < params.size()) {
    std::string names;
    for (const auto& p : params) names += (names.empty() ? "" : ", ") + p.name;
    throw InputError(std::to_string(runs.size()) + " run" + (runs.size() == 1 ? "" : "s") + " cannot determine " +
                     std::to_string(params.size()) + " parameters (" + names +
                     "): a fit with fewer measurements than unknowns matches any data and predicts nothing; give at least " +
                     std::to_string(params.size()) + " runs of different layouts");
  }
  Calibration cal;
  const std::vector<double> measured = measured_steps(runs);
  cal.before_s = predictions(base, runs);
  const ClusterSpec c = detail::fit_cluster(
      base, params, [&](const ClusterSpec& trial) { return detail::rms_log_error(predictions(trial, runs), measured); });
  for (const auto& p : params) cal.parameters.push_back(p.name);
  cal.after_s = predictions(c, runs);
  cal.rms_log_error_before = detail::rms_log_error(cal.before_s, measured);
  cal.rms_log_error_after = detail::rms_log_error(cal.after_s, measured);
  cal.cluster = c;
  return cal;
}

}  // namespace dplan::planner
