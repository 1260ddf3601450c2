// `dplan calibrate RUN.json... --profile CLUSTER -o CLUSTER2`: the profile's efficiency figures
// fitted to measured step times. Each run.json (written by dplan run) names the plan it ran; the
// plan gives the model, training spec, layout and overlap switches, and the cost model predicts
// that layout's step time on the candidate profile. Least squares on log step time over the runs
// fits, by coordinate descent (planner/src/fit.h):
//   - compute: the GPU's sustained_fraction (its matmul rate over a whole step) and its
//     memory_efficiency (element-wise kernels);
//   - each link tier some run communicates over: its efficiency and per-hop latency (intra-node;
//     the NICs when a run spans nodes).
// Fewer runs than parameters is refused: the fit would be underdetermined.
// An engine's training log (engine_logs.h) counts as a run of the plan given beside it: its step
// time (median after warm-up) is all it gives the fit; it adds no compute-time target, as no engine
// log measures forward + backward + optimizer compute alone (docs/compare.md).
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/time.h"
#include "dplan/planner/engine_logs.h"

namespace dplan::planner {

struct CalibrationRun {
  std::string file;         // the run.json or engine log
  LogFormat format = LogFormat::run;
  std::string plan_file;    // the plan it ran
  std::string layout;       // the plan's model, training and parallel layout; repeats of one share it
  costmodel::ModelSpec model;
  costmodel::TrainingSpec training;
  costmodel::ParallelConfig parallel;
  costmodel::OverlapOptions overlap;
  double measured_step_s = 0;  // the run's median step time
  // Forward + backward + recompute + optimizer, the mean over ranks ("phases_s"); 0 when
  // the run.json has no phases. Fitted beside the step time: it tells compute from communication.
  double measured_compute_s = 0;
  // Each checkpoint save the run.json records (docs/run-json.md "checkpoints"): the busiest node's
  // state bytes (weights, master weights, AdamW moments: what checkpoint_cost.h predicts) over the
  // save's write time, the per-node write bandwidth that save achieved. Empty for engine logs.
  std::vector<double> node_write_bytes_per_s;
};

// Reads run.json and the plan it names ("plan": as given to dplan run; a relative path that does
// not exist from here is looked for beside the run.json). Throws InputError naming what is wrong.
CalibrationRun read_calibration_run(const std::string& run_file);

// An engine log as a run of `plan_file` (measure_log's checks and refusals apply; `format` forces
// the log's format). measured_compute_s stays 0.
CalibrationRun read_calibration_log(const std::string& log_file, const std::string& plan_file,
                                    std::optional<LogFormat> format = std::nullopt);

// The cost model's step time for a run on `cluster`.
double predicted_step_s(const costmodel::ClusterSpec& cluster, const CalibrationRun& run);

struct Calibration {
  costmodel::ClusterSpec cluster;       // the fitted profile
  std::vector<std::string> parameters;  // e.g. "gpu.sustained_fraction", "intra_node.latency"
  std::vector<double> before_s, after_s;  // per run
  double rms_log_error_before = 0, rms_log_error_after = 0;
};

// Besides the least-squares fit: when some run.json recorded checkpoint saves, the storage's
// per-node write bandwidth is the median of their node_write_bytes_per_s (so the cost model's
// write time, the busiest node's bytes over it, reproduces the median save), parameter
// "storage.node_write". On a cluster that is one machine's cores the aggregate is that node's; a profile without a
// storage block gets one, reads assumed as fast as writes (the save measures no read).
Calibration calibrate(const costmodel::ClusterSpec& base, const std::vector<CalibrationRun>& runs);

}  // namespace dplan::planner
