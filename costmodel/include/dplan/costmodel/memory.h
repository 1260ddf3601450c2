// Memory per GPU for one layout, per pipeline stage (the worst stage decides fit): model states
// (weights, gradients, optimizer) under ZeRO / the distributed optimizer, activations derived
// from the layer's structure and the schedule's micro-batches in flight, logits, buffers and the
// framework reserve; optimizer offload reported as host memory.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Bytes per parameter of each model state for mixed-precision AdamW (ZeRO paper, Sec. 3.1:
// 2 + 2 + K with K = 12: fp32 master weights, momentum and variance). fp32 training keeps no
// master copy (K = 8); fp8 adds a 1-byte fp8 copy of the weights (Transformer Engine).
struct BytesPerParam {
  double weights = 0, grads = 0, optimizer = 0;
};
BytesPerParam bytes_per_param(const TrainingSpec& training);
// Bytes of AdamW's momentum and variance per parameter: fp32, or bf16 with --bf16-adam-moments
// (TrainingSpec::bf16_adam_moments). Memory and checkpoint sizes both count them so.
double adam_moment_bytes(const TrainingSpec& training);
// Whether the gradients a GPU holds, accumulates and steps are fp32: fp32 training, --fp32-grads,
// or an engine that keeps bf16 training's in fp32 (EngineMechanics::bf16_grads_in_fp32) unless told
// --grad-reduce-in-bf16. The one owner of that choice: memory, the Megatron export's flag and the
// executor's gradient dtype follow it.
bool gradients_in_fp32(const TrainingSpec& training);
// The bytes per gradient the data-parallel collectives move, as the time model prices them: 4 with
// --fp32-grads or fp32 training, else 2. An engine that keeps bf16 gradients in fp32
// (EngineMechanics::bf16_grads_in_fp32, Megatron-LM) holds and steps them in fp32 (bytes_per_param)
// but its fp32 reduce is not priced yet: with it, the Megatron-Core README's weak-scaling runs came
// out up to 37 % slow (docs/cost-model.md, "What the time model counts").
double gradient_reduce_bytes(const TrainingSpec& training);

// Model-state bytes of `num_params` parameters on one GPU, sharded over `shard_ranks` data-parallel
// ranks as the ZeRO stage says (Rajbhandari et al. 2020, Sec. 5: P_os = 2Ψ + 2Ψ + KΨ/Nd,
// P_os+g = 2Ψ + (2+K)Ψ/Nd, P_os+g+p = (2+2+K)Ψ/Nd). The distributed optimizer shards like stage 1.
// Offloaded optimizer states count as host bytes instead of GPU bytes.
struct ModelStateBytes {
  double weights_bytes = 0, grads_bytes = 0, optimizer_bytes = 0, host_optimizer_bytes = 0;
  double total_gpu_bytes() const { return weights_bytes + grads_bytes + optimizer_bytes; }
};
ModelStateBytes model_state_bytes(double num_params, int shard_ranks, const TrainingSpec& training,
                                  const ParallelConfig& parallel);

// Parameters one GPU of each pipeline stage holds before ZeRO sharding (counts, not bytes), the
// one count memory, checkpoint sizes (checkpoint_cost.h) and the search share: its layers (the
// mean layer times their number), the vocabulary-parallel embedding of `vocab_size` rows and any
// learned positions on the first stage, the final norm and LM head (and any MTP modules) on the last. Dense parameters
// are split over tp where Megatron splits them and replicated over dp*cp; experts are split over
// ep and etp and replicated over edp (ParallelConfig::expert_dp). Indexed by stage.
// REQUIRES: as assign_chunks.
struct StageParams {
  int num_layers = 0;
  double dense = 0;                  // per GPU, the tied head copy included
  double dense_tp_replicated = 0;    // of dense: held whole by every tp rank (norms, row-parallel
                                     // biases, the router, learned positions, MLA's down projections)
  double expert = 0;                 // per GPU: its E/ep experts, each split over etp
  double expert_etp_replicated = 0;  // of expert: held whole by every etp rank (the experts' fc2 bias)
  double embedding_copy = 0;         // of dense: the last stage's copy of the embedding, a tied head's
                                     // or the MTP modules' input (pp > 1)
};
std::vector<StageParams> stage_params(const ModelSpec& model, const ParallelConfig& parallel, int vocab_size);

// Activation bytes that one transformer layer keeps for backward, for one micro-batch on one GPU,
// itemised so the tests can check each against Korthikanti et al. 2022 (Table 2, Eq. 1-6).
struct LayerActivations {
  double attention_bytes = 0;   // norm input, QKV input, Q K V, scores/softmax/dropout, out-proj input, dropout mask
  double mlp_bytes = 0;         // norm input, fc1 input, activation input/output, dropout mask (x top-k for MoE)
  // Of mlp_bytes, what the routed experts keep for the tokens this rank receives (their inputs,
  // inner activations and the combine's saved outputs): it grows with routing imbalance.
  double routed_expert_bytes = 0;
  double total() const { return attention_bytes + mlp_bytes; }
};
LayerActivations activations_per_layer(const ModelSpec& model, const TrainingSpec& training,
                                       const ParallelConfig& parallel);

// What recompute leaves stored per layer (the full set without recompute; selective drops the
// attention core's s^2 tensors; full keeps only the layer input) for one micro-batch.
double stored_activation_bytes_per_layer(const ModelSpec& model, const TrainingSpec& training,
                                         const ParallelConfig& parallel);

// The token dispatcher's buffers while an MoE layer runs (forward or backward, one layer at a
// time): the k copies of the rank's tokens permuted for the all-to-all and the copies it receives
// (Megatron-Core's MoEAlltoAllTokenDispatcher: permute, all-to-all, sort_chunks_by_idxs), at the
// expected, balanced count: 2 k T etp/tp tokens of h. 0 for dense models.
double moe_dispatch_bytes(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel);

// Dropless routing bounds nothing: one rank's experts may receive more than their share. At worst
// every token of the ep group sends it min(k, E/ep) copies, ep min(k, E/ep)/k times the expected
// count; the routed experts' stored activations grow by that factor.
double moe_worst_case_imbalance(const ModelSpec& model, const ParallelConfig& parallel);

// The transient working set of backward on top of what is stored: the gradients of a backward
// GEMM, the LM head's on the last stage (`last_stage`), a layer's fc2 otherwise.
double backward_working_set_bytes(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel,
                                  bool last_stage);

// The communicators one rank runs NCCL over, each a group of more than one rank: tensor, context,
// the gradients' data-parallel group (dp x cp), pipeline send and receive, expert, and expert
// data-parallel groups (Megatron-Core's process groups; PyTorch creates a communicator on a group's
// first collective).
int nccl_communicators(const ParallelConfig& parallel);
// What a rank's device holds outside the caching allocator: the profile's framework reserve (CUDA
// context, cuBLAS and cuDNN workspaces; measured on one H100 rank) and NCCL's buffers for each
// communicator (GpuSpec::nccl_buffers_per_communicator_bytes, derived from NCCL's defaults).
double outside_allocator_bytes(const GpuSpec& gpu, const ParallelConfig& parallel);

struct StageMemory {
  int stage = 0;
  int num_layers = 0;
  double num_params = 0;             // parameters held by one GPU of this stage before ZeRO sharding
  double expert_params = 0;          // of num_params, the MoE experts' (sharded over expert dp, not dp*cp)
  double microbatches_in_flight = 0;
  double weights_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;      // stored activations of all in-flight micro-batches (+ recompute working set)
  double logits_bytes = 0;           // LM-head logits and loss (last stage)
  double buffers_bytes = 0;          // gradient buckets, ZeRO-3 gathered layers, pipeline send/recv buffers
  double reserve_bytes = 0;          // outside the allocator: the profile's reserve and NCCL's buffers (outside_allocator_bytes)
  double host_bytes = 0;             // offloaded optimizer states, per GPU, in host memory
  // Not in the total: what the stage's stored activations would add if every MoE layer's experts
  // received the worst case of dropless routing (moe_worst_case_imbalance) instead of their share.
  double moe_worst_case_extra_bytes = 0;
  double other_bytes() const { return logits_bytes + buffers_bytes + reserve_bytes; }
  double total_bytes() const {
    return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes + other_bytes();
  }
};

// The largest of a stage's components and its name ("weights", "gradients", "optimizer states",
// "activations", "logits, buffers and reserve"), for saying why a layout does not fit.
struct LargestPart {
  double bytes = 0;
  const char* name = "";
};
LargestPart largest_part(const StageMemory& stage);

// The fraction of the device's memory a plan leaves free, beyond what it holds outside the allocator
// (outside_allocator_bytes: the CUDA context, the libraries' workspaces, NCCL's buffers): the
// caching allocator's fragmentation, reserved but unallocated. Measured on one H100 (scripts/gpu-check.sh's
// training steps, dplan's executor, PyTorch 2.11) as the allocator's reserved peak over its
// allocated peak: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which Megatron-Core
// recommends "to prevent memory fragmentation" (megatron/core/transformer/moe/README.md at
// NVIDIA/Megatron-LM@d98e8a64dd), 0.7 % dense, 1.1 % with full recompute, 4.4 % MoE; without it
// 4.7-28 %. So 5 % covers a run with expandable segments; without them, or with optimizer offload
// (32 % measured, its staging copies), give --headroom 0.15 to 0.3. docs/cli.md, "Memory headroom".
inline constexpr double kDefaultHeadroomFraction = 0.05;
// The largest --headroom accepted: beyond it no layout of any model fits.
inline constexpr double kMaxHeadroomFraction = 0.9;

struct MemoryEstimate {
  std::vector<StageMemory> stages;
  int worst_stage = 0;
  double peak_bytes = 0;             // total of the worst stage
  double capacity_bytes = 0;         // the GPU's HBM
  double headroom_fraction = 0;      // of capacity_bytes, kept free: a stage fits in usable_bytes()
  double usable_bytes() const { return capacity_bytes * (1 - headroom_fraction); }
  double host_bytes_per_node = 0;    // offload: what a node's host memory must hold
  double host_capacity_bytes = 0;
  bool fits = false;
};

// Why an estimate does not fit, a line per stage over the usable bytes and one for host memory
// (empty when it fits). Formatted on demand: the search rejects most layouts and needs only
// `fits` and largest_part.
std::vector<std::string> memory_problems(const MemoryEstimate& estimate);

// REQUIRES: validate(model, cluster, training, parallel, parallel.world_size()) passed, and
// 0 <= headroom_fraction <= kMaxHeadroomFraction.
MemoryEstimate estimate_memory(const ModelSpec& model, const ClusterSpec& cluster,
                               const TrainingSpec& training, const ParallelConfig& parallel,
                               double headroom_fraction = kDefaultHeadroomFraction);

json to_json(const MemoryEstimate& memory);

}  // namespace dplan::costmodel
