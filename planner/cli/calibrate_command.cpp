#include "calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/profile_edit.h"
#include "dplan/planner/calibrate.h"
#include "profile_files.h"

namespace dplan::cli {
namespace {
using costmodel::ClusterSpec;

std::string layout_text(const costmodel::ParallelConfig& p) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "tp %d pp %d dp %d%s", p.tp, p.pp, p.dp,
                p.zero_stage ? (" zero " + std::to_string(p.zero_stage)).c_str() : "");
  return buf;
}

double figure(const ClusterSpec& c, const std::string& name) {
  if (name == "gpu.sustained_fraction") return c.gpu.sustained_fraction;
  if (name == "gpu.memory_efficiency") return c.gpu.memory_efficiency;
  if (name == "intra_node.efficiency") return c.intra_node.efficiency_fraction;
  if (name == "intra_node.latency") return c.intra_node.latency_s * 1e6;
  if (name == "intra_node.measured_scale") return c.intra_node.measured_scale;
  if (name == "inter_node.efficiency") return c.nic_efficiency_fraction;
  if (name == "comm_overlap") return c.comm_overlap_fraction;
  if (name == "storage.node_write") return c.storage.node_write_bytes_per_s / 1e9;  // GB/s
  return c.inter_node_latency_s * 1e6;  // inter_node.latency
}

}  // namespace

void add_calibrate_options(CLI::App& command, CalibrateArgs& a) {
  command.add_option("runs", a.runs,
                     "run.json files written by dplan run (each names the plan it ran) or engines' training logs "
                     "(Megatron-LM, torchtitan, DeepSpeed: give their plans with --plan)")
      ->required();
  command.add_option("--plan", a.plans,
                     "the plan an engine log ran: once for all logs, or once per log in the order of the logs");
  command.add_option("--format", a.format,
                     "what every run file is: megatron, torchtitan, deepspeed or run (default: told by content)");
  command.add_option("--profile", a.profile, "the cluster profile to start from (name or path)")->required();
  command.add_option("--name", a.name, "name of the written profile (default: <profile>-calibrated)");
  command.add_option("-o,--output", a.output, "write the calibrated cluster profile here (JSON, for --cluster)");
  command.add_flag("--force", a.force, "let -o replace existing files dplan did not write (never an input)");
}

namespace {

// The runs as the calibration reads them, and how many of them are engine logs.
struct CalibrationInput {
  std::vector<planner::CalibrationRun> runs;
  size_t logs = 0;
};

// Reads every run file: a run.json names its plan, an engine log takes one from --plan (once for
// all logs, or once per log in order). Throws InputError where --plan does not match the logs.
CalibrationInput read_runs(const CalibrateArgs& a) {
  std::optional<planner::LogFormat> forced;
  if (!a.format.empty()) forced = planner::log_format_from_string(a.format);
  // Which files are engine logs (they name no plan: --plan gives it).
  std::vector<planner::LogFormat> formats;
  CalibrationInput in;
  for (const auto& f : a.runs) {
    formats.push_back(planner::measurement_format(read_text_file(f), f, forced));
    in.logs += formats.back() != planner::LogFormat::run;
  }
  if (in.logs == 0 && !a.plans.empty())
    throw InputError("--plan: no engine log among the runs; a run.json names the plan it ran");
  if (in.logs > 0 && a.plans.empty())
    throw InputError(a.runs[std::find_if(formats.begin(), formats.end(),
                                         [](planner::LogFormat f) { return f != planner::LogFormat::run; }) -
                            formats.begin()] +
                     ": an engine log does not name the plan it ran; give it with --plan PLAN (once for all logs, "
                     "or once per log in order)");
  if (in.logs > 0 && a.plans.size() != 1 && a.plans.size() != in.logs)
    throw InputError("--plan: " + std::to_string(a.plans.size()) + " plans for " + std::to_string(in.logs) +
                     " engine logs; give one for all logs, or one per log in order");
  size_t log_index = 0;
  for (size_t i = 0; i < a.runs.size(); ++i) {
    if (formats[i] == planner::LogFormat::run) {
      in.runs.push_back(planner::read_calibration_run(a.runs[i]));
    } else {
      const std::string& plan = a.plans.size() == 1 ? a.plans.front() : a.plans[log_index];
      ++log_index;
      in.runs.push_back(planner::read_calibration_log(a.runs[i], plan, formats[i]));
    }
  }
  return in;
}

// The fitted figures, before and after, and each run's step time measured and predicted.
void print_calibration(const ClusterSpec& base, const planner::Calibration& cal, const CalibrationInput& in) {
  const std::vector<planner::CalibrationRun>& runs = in.runs;
  const size_t logs = in.logs;
  bool phases = false;
  for (const auto& r : runs) phases = phases || r.measured_compute_s > 0;
  std::printf("calibrated %s on %zu runs by least squares on log step time%s:\n", base.name.c_str(), runs.size(),
              phases ? " and log compute time (forward + backward + optimizer)" : "");
  if (logs > 0)
    std::printf("(%zu engine log%s: the step time only, the median after the first %d logged steps; no phases)\n", logs,
                logs == 1 ? "" : "s", planner::kWarmupLogLines);
  for (const auto& p : cal.parameters)
    std::printf("  %-24s %12.4g -> %.4g%s\n", p.c_str(), figure(base, p), figure(cal.cluster, p),
                p.ends_with("latency") ? " us" : p.starts_with("storage") ? " GB/s (from the checkpoint saves' write times)" : "");
  std::printf("\n%-28s %-18s %13s %13s %8s %13s %8s\n", "run", "layout", "measured (ms)", "before (ms)", "error",
              "after (ms)", "error");
  for (size_t i = 0; i < runs.size(); ++i)
    std::printf("%-28s %-18s %13.2f %13.2f %+7.1f%% %13.2f %+7.1f%%\n", runs[i].file.c_str(),
                layout_text(runs[i].parallel).c_str(), runs[i].measured_step_s * 1e3, cal.before_s[i] * 1e3,
                100 * (cal.before_s[i] / runs[i].measured_step_s - 1), cal.after_s[i] * 1e3,
                100 * (cal.after_s[i] / runs[i].measured_step_s - 1));
  std::printf("rms log error: %.3f before, %.3f after\n", cal.rms_log_error_before, cal.rms_log_error_after);
}

// Puts the fitted cluster figures into the cluster profile's JSON, in the profile's units
// (to_json, the one writer of profile figures), each figure's source naming the fit.
void put_cluster_figures(json& cluster, const json& fitted, const std::vector<std::string>& parameters,
                         const std::string& source, const std::string& fitted_on) {
  for (const auto& p : parameters) {
    if (p == "intra_node.measured_scale") {
      costmodel::put_figures(cluster, costmodel::pick_figures(fitted, {"intra_node.measured_scale"}));
    } else if (p.starts_with("intra_node")) {
      costmodel::put_figures(cluster, costmodel::pick_figures(fitted, {"intra_node.efficiency", "intra_node.latency_us"}));
    } else if (p == "comm_overlap") {
      cluster["comm_overlap"] = {{"fraction", fitted.at("comm_overlap").at("fraction")},
                                 {"source", source + (cluster.contains("comm_overlap")
                                                          ? cluster["comm_overlap"].value("source", std::string())
                                                          : std::string("default: full overlap"))}};
    } else if (p == "storage.node_write") {
      json storage = fitted.at("storage");
      storage["source"] = "calibrated by dplan calibrate from the checkpoint saves' write times of " + fitted_on +
                          (cluster.contains("storage") ? "; before: " + cluster["storage"].value("source", std::string())
                                                       : std::string("; reads assumed as fast as writes (no read measured)"));
      cluster["storage"] = storage;
    } else if (p.starts_with("inter_node")) {
      costmodel::put_figures(cluster, costmodel::pick_figures(fitted, {"inter_node.efficiency", "inter_node.latency_us"}));
    }
  }
  for (const char* tier : {"intra_node", "inter_node"}) {
    bool fitted_tier = false;
    for (const auto& p : parameters) fitted_tier = fitted_tier || p.starts_with(tier);
    if (fitted_tier) cluster[tier]["source"] = source + cluster[tier].value("source", std::string());
  }
}

// Writes the calibrated cluster profile and its GPU profile to a.output.
void write_calibrated_profiles(const CalibrateArgs& a, const planner::ProfileStore& store, const ClusterSpec& base,
                               const planner::Calibration& cal, const std::vector<planner::CalibrationRun>& runs) {
  std::string fitted_on;
  for (const auto& r : runs) fitted_on += (fitted_on.empty() ? "" : ", ") + r.file;
  char summary[160];
  std::snprintf(summary, sizeof summary, " (rms log error of the step time %.3f before, %.3f after); the rest: ",
                cal.rms_log_error_before, cal.rms_log_error_after);
  const std::string source = "calibrated by dplan calibrate on " + fitted_on + summary;

  const std::string cluster_path = store.cluster_path(a.profile);
  json profile = read_json_file(cluster_path);
  json& cluster = profile.at("cluster");
  cluster["name"] = a.name.empty() ? base.name + "-calibrated" : a.name;
  const json fitted = costmodel::to_json(cal.cluster);
  put_cluster_figures(cluster, fitted, cal.parameters, source, fitted_on);
  json gpu_file = read_json_file(gpu_file_of(cluster_path, store));
  json& gpu = gpu_file.at("gpu");
  gpu["name"] = cluster["name"].get<std::string>() + "-gpu";
  costmodel::put_figures(gpu, costmodel::pick_figures(fitted.at("gpu"), {"sustained_fraction", "memory_efficiency"}));
  for (const auto& p : cal.parameters)
    if (p.starts_with("gpu.")) gpu["sources"][p.substr(4)] = source + gpu["sources"].value(p.substr(4), std::string());
  write_profiles(profile, gpu_file, a.output, a.force, store);
}

}  // namespace

int run_calibrate(const CalibrateArgs& a, const planner::ProfileStore& store) {
  const ClusterSpec base = store.load_cluster(a.profile);
  const CalibrationInput in = read_runs(a);
  const planner::Calibration cal = planner::calibrate(base, in.runs);
  print_calibration(base, cal, in);
  if (a.output.empty()) {
    std::printf("(no -o: the calibrated profile is not written)\n");
    return 0;
  }
  write_calibrated_profiles(a, store, base, cal, in.runs);
  return 0;
}

}  // namespace dplan::cli
