// Why MFU is low: the gap between peak and predicted throughput as named losses, and the few
// changes that recover the most, each checked by re-estimating the changed plan. One owner of the
// decomposition: `dplan explain`, the default report and their --json output all call these.
//
// The decomposition (every term seconds per step on the critical path):
//   step_time_s = ideal_s                                   model FLOPs / (GPUs x dense peak) = mfu x step
//               + gemm efficiency   (gemm_s - ideal_s)      matrix multiplies below peak
//               + non-GEMM work     (forward_s + backward_s - gemm_s - comm_contention_s)
//                                                           norms, activations, softmax, loss
//               + comm_contention_s                         compute slowed by hidden communication
//               + recompute_s
//               + exposed tp_comm_s, cp_comm_s, ep_comm_s, pp_p2p_s
//               + data parallel     (dp_comm_s + param_gather_s)
//               + pp_bubble_s
//               + optimizer         (optimizer_s + offload_s)
//               + overhead_s                               per-step fixed costs
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/time.h"
#include "dplan/planner/profiles.h"

namespace dplan::planner {

struct Loss {
  std::string key;    // JSON key: "gemm_efficiency", "non_gemm", "recompute", "tp_comm", ...
  std::string name;   // "GEMM efficiency", "non-GEMM work", ...
  double seconds = 0; // per step; gemm_efficiency may be negative when GEMMs beat the dense peak
  double share = 0;   // of step_time_s
};

struct MfuBreakdown {
  double step_time_s = 0;
  double ideal_s = 0;              // mfu x step_time_s
  double mfu = 0;
  std::vector<Loss> losses;        // fixed order (the contract above); ideal_s + sum = step_time_s
  double losses_s() const;
};

// The one decomposition of a TimeBreakdown.
MfuBreakdown explain_time(const costmodel::TimeBreakdown& time);

// What an estimate needs: everything `dplan estimate` takes, as a plan.json holds it.
struct PlanCase {
  costmodel::ModelSpec model;
  costmodel::ClusterSpec cluster;
  costmodel::TrainingSpec training;
  costmodel::ParallelConfig parallel;
  costmodel::OverlapOptions overlap;
  double headroom_fraction = costmodel::kDefaultHeadroomFraction;
};

// The cluster a plan.json was predicted for: the profile of its name (/cluster/name) in `store`,
// as it is today (the copy a plan embeds is a record, not a profile). Throws InputError naming
// `file` when the plan names no cluster the store has.
costmodel::ClusterSpec plan_cluster(const costmodel::Plan& plan, const std::string& file, const ProfileStore& store);

struct Estimated {
  costmodel::MemoryEstimate memory;
  costmodel::TimeBreakdown time;
};
// validate (throws InputError for a layout the rules refuse), estimate_memory with the case's
// headroom, estimate_time.
Estimated estimate_case(const PlanCase& plan);
// The same on a network already built for the plan's cluster and world size (Network caches
// routes: suggest_changes prices every change on one).
Estimated estimate_case(const PlanCase& plan, const costmodel::Network& network);

// One change to a plan with its re-estimated result.
struct Suggestion {
  std::string kind;            // "micro-batch", "vpp", "tp-comm-overlap", "sp", "recompute", "sharding", ...
  std::string what;            // "more micro-batches: micro-batch 1 (was 2), 64 per pipeline (was 32)"
  std::string flags;           // the changed `dplan estimate` flags: "--mbs 1"
  PlanCase changed;
  double step_time_s = 0;      // re-estimated
  double tokens_per_s = 0;     // re-estimated
  double gain = 0;             // tokens_per_s / the plan's - 1 (a throughput gain)
  double peak_bytes = 0;       // re-estimated worst stage
  bool same_math = true;       // false: the change alters training (a larger global batch)
};

// Candidate changes (micro-batch size, vpp, TP communication overlap with sequence parallel,
// sequence parallel, less recompute, overlap of gradient reduction and parameter gathers, the
// distributed optimizer or ZeRO 1, no offload), each re-estimated; those that are valid, still
// fit with the plan's headroom and are at least 0.1 % faster, best first, only the best of each
// kind, at most `max_count`. A change of the training itself (a doubled global batch) follows
// them, at most one.
std::vector<Suggestion> suggest_changes(const PlanCase& plan, const costmodel::TimeBreakdown& time,
                                        size_t max_count = 5);

// The flags that make `dplan estimate` evaluate `plan` (model and cluster by name).
std::string estimate_flags(const PlanCase& plan);

// Report text: the losses, then the suggestions with their flags. With the plan, a bubble is
// explained by its terms (pp, vpp, micro-batches per pipeline: the count m, not the micro-batch size).
std::string explain_table(const MfuBreakdown& breakdown, const std::vector<Suggestion>& suggestions,
                          const PlanCase* plan = nullptr);

json to_json(const MfuBreakdown& breakdown);
json to_json(const Suggestion& suggestion);

}  // namespace dplan::planner
