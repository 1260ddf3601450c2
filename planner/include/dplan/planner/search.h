// The search over parallel layouts: every valid (tp, pp, dp, cp, ep, virtual stages, micro-batch,
// ZeRO stage or distributed optimizer, recompute, sequence parallel, offload) for a GPU count and
// global batch. Layouts that do not fit are dropped and counted by reason; the rest are ranked by
// step time (or, asked, by time to train with failures: RankBy::goodput), exact ties going to the
// simpler layout (fewer parallel dimensions and tricks).
// The cost model is a parameter, so tests can hand in a toy one.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/time.h"

namespace dplan::planner {

struct Evaluation {
  bool fits = false;
  std::string reject_reason;      // when it does not fit: a short category ("activations exceed HBM")
  double step_time_s = 0;         // also for a near miss (below), so the report can say what it would gain
  double peak_bytes = 0;
  // Rejected for device memory: the worst stage's bytes beyond what the headroom leaves usable, the
  // GPU's HBM, and the component that decided it (its largest part). A near miss, at most
  // kNearMissFraction beyond the usable bytes, is priced too (step_time_s, time).
  double miss_bytes = 0, usable_bytes = 0, capacity_bytes = 0;
  std::string largest_part;
  double largest_part_bytes = 0;
  // The cost model's whole answer for a layout that fits (dplan_cost_function fills them; a toy
  // cost model may leave them empty): what the report prints of the winner, never recomputed.
  // search() keeps `memory` only for the winner (ranked[0]) and the layouts exactly tied with it.
  costmodel::MemoryEstimate memory;
  costmodel::TimeBreakdown time;
  // Time to train the tokens with failures and checkpoints (costmodel::goodput), filled when the
  // cost function is asked to (dplan_cost_function's goodput); 0 otherwise.
  double time_to_train_with_failures_s = 0;
};
using CostFunction = std::function<Evaluation(const costmodel::ParallelConfig&)>;

// What the user fixed of the search (dplan --tp 4,8 --zero 1 ...): each non-empty list holds the
// only values that dimension takes; an empty one leaves it free. `zero` lists ZeRO stages, the
// distributed optimizer counting as stage 1 (its sharding is ZeRO-1's); `vpp` 1 is a schedule
// without model chunks.
struct LayoutConstraints {
  std::vector<int> tp, pp, dp, cp, ep, vpp, zero, mbs;
  std::vector<costmodel::Recompute> recompute;
  bool empty() const;
  bool admits(const costmodel::ParallelConfig& p) const;  // every dimension it fixes
  // The dimensions it fixes and their values, "tp 4,8 · zero 1"; "" when empty.
  std::string describe() const;
  // For each dimension it fixes, the values `layouts` take of it: "tp takes 1, 2, 4, 8".
  std::string values_taken(const std::vector<costmodel::ParallelConfig>& layouts) const;
};

struct SearchSpace {
  int gpus = 0;
  int max_cp = 16;                             // context parallel sizes tried: powers of 2 up to this
  std::vector<int> micro_batches = {1, 2, 4, 8};
  int max_vpp = 8;
  bool allow_offload = true;
  int max_zero_stage = 3;                      // ZeRO stages tried: 0..this
  bool allow_distributed_optimizer = true;
  bool allow_recompute = true;                 // selective and full
  bool allow_expert_parallel = true;
  // The MoE communication every MoE layout gets (--moe-dispatcher, --overlap-ep-comm): DeepEP
  // wherever ep*etp > 1, the EP overlap wherever Megatron-Core accepts it (check_moe_comm: ep > 1,
  // pp 1 or interleaved, no full recompute, 16-bit); the other layouts keep the defaults.
  costmodel::MoeDispatcher moe_dispatcher = costmodel::MoeDispatcher::alltoall;
  bool overlap_ep_comm = false;
  LayoutConstraints constraints;  // the user's (enumerate_layouts keeps only the layouts it admits)

  // Only what `dplan run` executes (costmodel::executor_refusal, the one definition): each
  // dimension the executor refuses for this model is closed (today only context parallel, for a
  // model with attention dropout: the ring has no dropout). Throws InputError with the executor's
  // reason when it runs no layout of this model (latent attention, q/k norms, sliding windows,
  // shared experts, ...). The one-argument form knows no model: a dense model without dropout.
  static SearchSpace runnable_by_executor(int gpus, const costmodel::ModelSpec& model,
                                          const costmodel::TrainingSpec& training);
  static SearchSpace runnable_by_executor(int gpus);
};

struct Candidate {
  costmodel::ParallelConfig parallel;
  Evaluation evaluation;
  int complexity = 0;
};

// A layout rejected for memory by at most this fraction of the usable bytes is still priced, so
// the report can name the fastest of them (SearchResult::near_misses).
inline constexpr double kNearMissFraction = 0.12;

struct SearchResult {
  std::vector<Candidate> ranked;                 // best first, at most top_k
  std::vector<Candidate> pareto;                 // memory vs step time frontier, fastest first
  std::map<std::string, long> rejected;          // reason -> count
  // The fastest layouts rejected for device memory by at most kNearMissFraction (priced by a cost
  // function that prices near misses, as dplan_cost_function does), fastest first, at most
  // kNearMissesKept; only those faster than the best that fits.
  std::vector<Candidate> near_misses;
  long evaluated = 0;
  long feasible = 0;
};

inline constexpr size_t kNearMissesKept = 8;

// Global batch (sequences) closest to `tokens` tokens, at least 1.
int global_batch_for_tokens(double tokens, int seq_len);

// The global batch when none is given (--global-batch): one owner for the rule, its two constants
// below. Dedicated devices (every GPU cluster, cores_per_node 0): about kDefaultBatchTokens tokens,
// unrounded (global_batch_for_tokens). A machine whose cores are the devices (local-cpu,
// cores_per_node > 0): 4M tokens of gpt-tiny is a 2-minute predicted step there and several
// times that measured, so `dplan scale` ran for hours; instead the largest batch of micro_batch *
// dp * 2^k sequences whose predicted step on `layout` stays within kCpuStepTarget_s, at least
// micro_batch * dp and never above the GPU default. `layout` is the layout it is sized on (its
// global batch is ignored; the world is its tp * pp * dp * cp); the search passes
// data_parallel_layout(gpus), the layout it starts from.
int default_global_batch(const costmodel::ModelSpec& model, const costmodel::ClusterSpec& cluster,
                         const costmodel::TrainingSpec& training, const costmodel::ParallelConfig& layout,
                         const costmodel::OverlapOptions& overlap = {});
// About 4M tokens per optimizer step: LLaMA's pre-training batch at every size (Touvron et al.
// 2023, "LLaMA: Open and Efficient Foundation Language Models", table 2: batch size 4M); GPT-3
// 175B's was 3.2M (Brown et al. 2020, table 2.1).
inline constexpr double kDefaultBatchTokens = 4194304;
// A predicted step of one second on shared CPU cores: with the shipped, never-probed local-cpu
// profile predictions are 5-13x too fast for gpt-tiny (docs/profiles.md's dplan scale table,
// docs/compare.md), so a measured step of seconds; with a probed profile, one second. A 10-step
// run at three sizes (dplan scale's default) then takes a few minutes, not hours.
inline constexpr double kCpuStepTarget_s = 1.0;
// tp, pp, cp 1 and dp = gpus, micro-batch 1, nothing sharded or recomputed: DDP.
costmodel::ParallelConfig data_parallel_layout(int gpus);

// How many "things" a layout turns on (tp, pp, cp, ep > 1, an etp other than tp, sharding,
// recompute, SP, offload, interleaving): the users' rule is start with DDP, add sharding, then model parallelism.
int layout_complexity(const costmodel::ParallelConfig& parallel);

// The most layouts one search evaluates (a few microseconds each on one core: docs/cost-model.md,
// "Search speed"): a space beyond it is refused with a message rather than searched at length. The
// largest spaces of the sizes dplan accepts (--gpus up to kMaxGpus) hold about a tenth of it (70B
// on 720720 GPUs: 98,496 layouts).
inline constexpr size_t kMaxLayouts = 1'000'000;

// All layouts of `space.gpus` GPUs in `space` that follow the layout rules (check_layout in
// costmodel/training.h, which validate() enforces), in a fixed order: tp, cp, pp, (ep, etp) with
// etp = tp then 1 for a mixture of experts, micro-batch,
// schedule, ZeRO stage, recompute, sequence parallel, offload, each ascending.
// Throws InputError when there are more than kMaxLayouts.
std::vector<costmodel::ParallelConfig> enumerate_layouts(const costmodel::ModelSpec& model,
                                                         const costmodel::TrainingSpec& training,
                                                         const SearchSpace& space);

// What the search ranks by (--rank-by): step time (the default), or the time to train with
// failures and checkpoints (Evaluation::time_to_train_with_failures_s).
enum class RankBy { step_time, goodput };
RankBy rank_by_from_string(const std::string& s);  // "step-time" or "goodput"; throws InputError listing them

// Evaluates every layout with `cost` and ranks the feasible ones by `rank_by`. Throws InputError
// if the space is empty (no valid layout at all).
SearchResult search(const std::vector<costmodel::ParallelConfig>& layouts, const CostFunction& cost, int top_k,
                    RankBy rank_by = RankBy::step_time);

// What the cost function needs to price failures (RankBy::goodput): the failure model and the
// tokens to train.
struct GoodputInputs {
  costmodel::FailureModel failures;
  double tokens = 0;
};

// The dplan cost model as a CostFunction: memory first (cheap), time only for layouts that fit,
// fitting meaning the worst stage leaves `headroom_fraction` of HBM free (costmodel::estimate_memory).
// With `goodput`, each layout that fits also gets its time to train with failures (checkpoint_cost
// and goodput, costmodel/checkpoint_cost.h); the cluster must then have a storage block (InputError
// otherwise, at the first layout that fits). `model` and `network` are read by reference and must
// outlive it unchanged: it makes the priced device once and keeps the last few layer times
// (docs/cost-model.md, "Search speed").
CostFunction dplan_cost_function(const costmodel::ModelSpec& model, const costmodel::Network& network,
                                 const costmodel::TrainingSpec& training, const costmodel::OverlapOptions& overlap,
                                 double headroom_fraction = costmodel::kDefaultHeadroomFraction,
                                 std::optional<GoodputInputs> goodput = std::nullopt);

}  // namespace dplan::planner
