#include "dplan/planner/calibrate.h"

#include <cmath>
#include <filesystem>
#include <functional>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "fit.h"

namespace dplan::planner {
namespace {
namespace fs = std::filesystem;
using costmodel::ClusterSpec;

struct Param {
  std::string name;
  std::function<double&(ClusterSpec&)> ref;
  detail::Bounds bounds;
};

double rms_log_error(const std::vector<double>& predicted, const std::vector<CalibrationRun>& runs) {
  double sum = 0;
  for (size_t i = 0; i < runs.size(); ++i) sum += std::pow(std::log(predicted[i] / runs[i].measured_step_s), 2);
  return std::sqrt(sum / runs.size());
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
  std::vector<Param> params = {
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
                      {1e-3, 2.0}});
    params.push_back({"intra_node.latency", [](ClusterSpec& c) -> double& { return c.intra_node.latency_s; }, {1e-8, 1e-2}});
  }
  if (inter) {
    params.push_back({"inter_node.efficiency", [](ClusterSpec& c) -> double& { return c.nic_efficiency_fraction; },
                      {1e-3, 2.0}});
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
  cal.before_s = predictions(base, runs);
  std::vector<double> start;
  std::vector<detail::Bounds> bounds;
  ClusterSpec c = base;
  for (const auto& p : params) {
    start.push_back(p.ref(c));
    bounds.push_back(p.bounds);
    cal.parameters.push_back(p.name);
  }
  const std::vector<double> x = detail::minimize_in_box(
      [&](const std::vector<double>& v) {
        ClusterSpec trial = base;
        for (size_t i = 0; i < params.size(); ++i) params[i].ref(trial) = v[i];
        return rms_log_error(predictions(trial, runs), runs);
      },
      start, bounds);
  for (size_t i = 0; i < params.size(); ++i) params[i].ref(c) = x[i];
  cal.after_s = predictions(c, runs);
  cal.rms_log_error_before = rms_log_error(cal.before_s, runs);
  cal.rms_log_error_after = rms_log_error(cal.after_s, runs);
  cal.cluster = c;
  return cal;
}

}  // namespace dplan::planner
