// The published runs the cost model is checked and fitted against (the validation files:
// published.json, public2.json, public3.json), read into plan inputs with the engine each source
// ran; the pairs of layouts of one workload whose published order a planner must keep; and the one
// routine that fits the cost model's fitted figures (properties of a GPU or of an engine, never of
// a run) to them, with leave-one-source-out cross-validation (docs/cost-model.md, "Checked against
// the published runs").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dplan/costmodel/network.h"

#include "dplan/planner/plan.h"
#include "dplan/planner/profiles.h"

namespace dplan::planner {

struct PublishedRun {
  std::string id;
  std::string source;  // the publication or code base the run comes from (one fold of the cross-validation)
  std::string file;    // the validation file it was read from
  PlanInputs inputs;   // model, cluster, training (the engine the source ran included), layout, overlap
  int gpus = 0;
  double target_step_s = 0;  // the iteration time derived from the published figure
  // The cluster's links routed once (predicted_step_s fills it): fits vary GPU and engine figures,
  // never a link's, so every trial reuses it.
  mutable std::shared_ptr<const costmodel::Network> network;
};

// Reads a validation file in either form: published.json's ({"runs": [...]}: Narayanan et al.
// 2021, Table 1) or public2/public3's (a list of runs with an HF-style model, or null and the model
// in `extra_models`, {"models": {id: model}}). Each run's engine is the one its source names
// (validation.cpp says which, and where the source says so).
std::vector<PublishedRun> read_published_runs(const std::string& path, const ProfileStore& store,
                                              const std::string& extra_models_path = "");

// The run's step time as dplan predicts it (estimate_time on its inputs).
double predicted_step_s(const PublishedRun& run);

// Two published layouts of one workload (same model, GPU, GPU count, global batch and sequence
// length) whose published step times differ by at least `min_difference` (a fraction of the
// faster): the order a planner has to reproduce. `faster` and `slower` index `runs`.
struct LayoutPair {
  size_t faster = 0, slower = 0;
};
std::vector<LayoutPair> same_workload_pairs(const std::vector<PublishedRun>& runs, double min_difference = 0.03);

// A fitted figure of the cost model: a field of one GPU profile or of one engine's mechanics.
enum class FittedField {
  sustained_fraction,             // GPU: of the matmul maximum, over a step
  memory_efficiency,              // GPU: achieved / datasheet HBM bandwidth, element-wise work
  attention_backward_efficiency,  // GPU: the flash-attention backward's fraction of peak
  gemm_scale,                     // engine: its GEMMs' and attention's pace against the profile's
  elementwise_scale,              // engine: its element-wise work's pace against the profile's
  per_rank_s,                     // engine: per rank and collective of its ZeRO-3, where it has any
  prefetch_overlap,               // engine: the part of its ZeRO-3 traffic compute can hide
};
struct FittedParameter {
  FittedField field;
  std::string owner;  // the GPU profile's name ("h100-sxm5-80gb") or the engine's ("deepspeed")
  double lo = 0, hi = 0;
  bool applies_to(const PublishedRun& run) const;
  double value(const PublishedRun& run) const;  // the run's current value of the figure
  void set(PublishedRun& run, double value) const;
  std::string name() const;  // "h100-sxm5-80gb sustained_fraction"
};

// The figures the shipped profiles and engine table were fitted with (docs/cost-model.md).
std::vector<FittedParameter> shipped_fitted_parameters();

// Mean |predicted / published - 1| over `runs`.
double mean_abs_error(const std::vector<PublishedRun>& runs);

// The values of `params` that minimise the mean absolute error over `runs`, by coordinate descent
// (fit.h's minimize_in_box: a coarse scan and Brent's method per figure, on its logarithm),
// searched from their prior values. A parameter that applies to none of the runs keeps its prior:
// the engine scales 1 (Megatron's kernels), the GPU figures the profile's own.
struct FitResult {
  std::vector<double> values;  // one per parameter, in order
  double mean_abs_error = 0;   // over the runs fitted on
};
FitResult fit_parameters(std::vector<PublishedRun> runs, const std::vector<FittedParameter>& params, int sweeps = 30);

// `runs` with the parameters set to `values` where they apply.
std::vector<PublishedRun> with_parameters(std::vector<PublishedRun> runs, const std::vector<FittedParameter>& params,
                                          const std::vector<double>& values);

// Leave-one-source-out: for each source, the mean absolute error of its runs in-sample (fitted on
// every run) and out-of-sample (fitted without that source's runs).
struct SourceFold {
  std::string source;
  int runs = 0;
  double in_sample_error = 0, out_of_sample_error = 0;
  std::vector<double> out_of_sample_values;  // the parameters fitted without this source
};
std::vector<SourceFold> leave_one_source_out(const std::vector<PublishedRun>& runs,
                                             const std::vector<FittedParameter>& params, int sweeps = 30);

}  // namespace dplan::planner
