// The phases of one training step, each a closed form over the layout (estimate_time in time.cpp
// composes them): communication per layer and micro-batch (tensor, context, expert parallel,
// ZeRO-3 gathers), compute per pipeline stage and micro-batch, the pipeline's bubble and
// send/recv, the data-parallel gradient reduction, parameter gather and tied-embedding all-reduce,
// the optimizer step, and the summary (step time, tokens/s, MFU, HFU). Ranks that share cores
// enter only through CoreSharing (core_sharing.h).
#pragma once

#include <optional>

#include <vector>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/core_sharing.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/time.h"

namespace dplan::costmodel {

// Exposed part of `comm_s` that overlaps `window_s` of compute, never below `floor_s` (the part
// that cannot start before the window ends, e.g. the last gradient bucket). `overlap_fraction` is
// the cluster's comm_overlap: the fraction of the window that actually hides communication.
double exposed_s(double comm_s, double window_s, double floor_s, double overlap_fraction);

// Tokens of one micro-batch on one GPU: micro_batch * seq_len / cp.
double tokens_per_microbatch(const TrainingSpec& training, const ParallelConfig& parallel);

// Tensor-parallel collectives, per micro-batch.
struct TensorParallelComm {
  double layer_forward_s = 0;  // one layer's forward pair
  double layer_s = 0;          // one layer's forward, backward and (full recompute) replay
  double edge_s = 0;           // one at the embedding output or the LM-head input
};
TensorParallelComm tensor_parallel_comm(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                                        const ParallelConfig& parallel);

// Context-parallel ring exchange, per layer and micro-batch, after hiding under the attention core.
struct ContextParallelComm {
  double layer_s = 0;          // exposed, forward + backward (+ replay)
  double layer_forward_s = 0;  // exposed, forward
  double hidden_layer_s = 0;   // hidden under the attention core
};
ContextParallelComm context_parallel_comm(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                                          const ParallelConfig& parallel, const LayerTimes& layer,
                                          double overlap_fraction);

// One MoE layer's forward dispatch (tokens to their experts) and combine (back), per micro-batch,
// with the plan's dispatcher (ParallelConfig::moe_dispatcher): the alltoall dispatcher's all-to-all
// over ep (with etp > 1 also the etp all-gather before the experts and reduce-scatter after), or
// DeepEP's kernels (deepep_transfer_s). The backward runs each again on the gradients.
struct DispatchCombine {
  double dispatch_s = 0, combine_s = 0;
};
DispatchCombine moe_dispatch_combine(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                                     const ParallelConfig& parallel);

// DeepEP's published figures (deepseek-ai/DeepEP@0297fc8017 docs/legacy.md, V1 normal kernels on
// H800): intranode EP8 dispatch reached 153 GB/s of the H800's 200 GB/s NVLink line rate per
// direction. The SMs its kernels take while they run: Megatron-Core's --moe-deepep-num-sms
// default (core_v0.14.0 arguments.py: 20), DeepSeek-V3's own split (arXiv 2412.19437 Sec. 3.2.2:
// "only 20 SMs" of the H800's 132 for communication).
inline constexpr double kDeepepNvlinkFraction = 153.0 / 200.0;
inline constexpr double kDeepepSms = 20;

// One DeepEP dispatch (or combine: the same bytes) of one MoE layer and micro-batch over the etp x ep
// group: a token once to each node and each rank that holds one of its experts, RDMA across nodes
// and NVLink inside them, the slower of the two pipelined stages (time_phases.cpp). 0 for a dense
// model or ep*etp 1.
double deepep_transfer_s(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                         const ParallelConfig& parallel);

// Expert-parallel dispatch and combine of one (mean) layer and micro-batch, forward and backward
// (and full recompute's replay), before any overlap hides them.
double expert_parallel_comm_s(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                              const ParallelConfig& parallel);

// Megatron-Core's EP overlap: what one (mean) layer hides when its forward of one micro-batch runs
// beside its backward of another (the four transfers, each behind the compute beside it; at most
// the four, 2 (dispatch + combine)). `overlap_fraction` as exposed_s's.
double ep_overlap_pair_hidden_s(const ModelSpec& model, const DispatchCombine& transfers, const LayerTimes& layer,
                                double overlap_fraction);

// The share of pipeline stage `stage`'s forward steps (micro-batches times model chunks) that the
// EP overlap pairs with a backward: all but Megatron-Core's warm-up forwards (and so as many
// cool-down backwards); 0 without parallel.overlap_ep_comm.
double ep_overlap_paired_fraction(const TrainingSpec& training, const ParallelConfig& parallel, int stage);

// ZeRO-3 parameter gathers and gradient reduce-scatters, per layer and micro-batch.
struct Zero3Comm {
  double layer_s = 0;          // exposed, forward + backward
  double layer_forward_s = 0;  // exposed, forward
  double first_s = 0;          // the first layer's gather, never prefetched
  double hidden_layer_s = 0;   // hidden under the layer's compute
};
Zero3Comm zero3_comm(const ModelSpec& model, const Network& network, const GpuSpec& gpu, const TrainingSpec& training,
                     const ParallelConfig& parallel, const MemoryEstimate& memory, const LayerTimes& layer,
                     double overlap_fraction);

// The communication inside one micro-batch's layers.
struct LayerComm {
  TensorParallelComm tp;
  ContextParallelComm cp;
  double ep_s = 0;
  Zero3Comm zero3;
  double ep_pair_hidden_s = 0;  // ep_overlap_pair_hidden_s (0 without the EP overlap)
};

// One pipeline stage's time per micro-batch: compute and the exposed communication inside it.
// One model chunk's part of a stage's micro-batch.
struct ChunkTime {
  double forward_s = 0;   // its part of forward_s + forward_comm_s
  double backward_s = 0;  // its part of the rest of total_s()
  double edge_s = 0;      // of these, what is not its layers' (embedding, LM head and their tp
                          // collectives, ZeRO-3's first gather)
  int layers = 0;         // its transformer layers (with the MTP modules' on the loss chunk)
};

struct StageTime {
  double forward_s = 0, backward_s = 0, recompute_s = 0;
  double tp_s = 0, cp_s = 0, ep_s = 0, zero3_s = 0;
  double hidden_s = 0;        // communication hidden under compute
  double ep_hidden_s = 0;     // of which expert-parallel dispatch and combine (the EP overlap)
  double forward_comm_s = 0;  // the part of tp + cp + ep + zero3 in the forward pass
  double gemm_s = 0;          // the matrix multiplies inside forward_s + backward_s
  // Per model chunk (one unless interleaved or dualpipe), in order: pipeline_time prices uneven
  // chunks with them. (One vector of them, not one per figure: the search prices every stage of
  // every layout that fits.)
  std::vector<ChunkTime> chunks;
  double total_s() const { return forward_s + backward_s + recompute_s + tp_s + cp_s + ep_s + zero3_s; }
};
std::vector<StageTime> stage_times(const ModelSpec& model, const GpuSpec& gpu, const TrainingSpec& training,
                                   const ParallelConfig& parallel, const LayerTimes& layer, const LayerComm& comm,
                                   const OverlapOptions& overlap);
// The same into `out`, whose storage and its stages' chunk vectors are reused (estimate_time keeps
// one per thread, so that pricing a layout allocates nothing here).
void stage_times(const ModelSpec& model, const GpuSpec& gpu, const TrainingSpec& training,
                 const ParallelConfig& parallel, const LayerTimes& layer, const LayerComm& comm,
                 const OverlapOptions& overlap, std::vector<StageTime>& out);

// The fill-and-drain slot of a pipeline whose chunks hold different layer counts (see
// pipeline_time): the longest chunk's time, its stage's embedding and LM head spread over the
// stage's chunks; nullopt where every chunk holds the same count (the closed form's slot).
std::optional<double> uneven_chunk_slot_s(const std::vector<StageTime>& stages);

// The stage with the longest micro-batch (the first of equals): it sets the pipeline's pace.
int critical_stage(const std::vector<StageTime>& stages);

// The pipeline's bubble and send/recv per step (0 with pp 1), and the pace the critical stage's
// phases ran at (1 but where ranks share cores and the schedule is played out).
struct PipelineTime {
  double bubble_s = 0, p2p_s = 0;
  double p2p_hidden_s = 0;  // send/recv hidden under the next chunk's compute (interleaved)
  double pace = 1;
};
PipelineTime pipeline_time(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                           const ParallelConfig& parallel, const std::vector<StageTime>& stages, int critical,
                           const CoreSharing& sharing);

// Bytes of gradients per data-parallel bucket (one collective each).
double gradient_bucket_bytes(const TrainingSpec& training, const ParallelConfig& parallel);

// Data-parallel communication after the last micro-batch's backward, per step: the gradient
// reduction and the sharded optimizer's parameter all-gather, each exposed and hidden, and the
// tied embedding's all-reduce between the first and last stage.
struct DataParallelComm {
  double grad_reduce_s = 0, grad_reduce_hidden_s = 0;
  double param_gather_s = 0, param_gather_hidden_s = 0;
  double tied_embedding_s = 0;
  double mirror_grad_s = 0;  // dualpipe: the two copies of each stage's gradients summed (exposed part)
};
DataParallelComm data_parallel_comm(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                                    const ParallelConfig& parallel, const MemoryEstimate& memory,
                                    const StageTime& critical, const OverlapOptions& overlap);

// The optimizer step on the device, or offloaded: the host's step and the PCIe traffic.
struct OptimizerTime {
  double optimizer_s = 0, offload_s = 0;
};
OptimizerTime optimizer_time(const GpuSpec& gpu, const ClusterSpec& cluster, const TrainingSpec& training,
                             const ParallelConfig& parallel, const MemoryEstimate& memory);

// The per-step fixed work outside the phases (gradient buffer zeroing, gradient norm and its
// all-reduce, the loss's data-parallel all-reduce): TimeBreakdown::overhead_s.
double step_overhead_s(const Network& network, const GpuSpec& gpu, const TrainingSpec& training,
                       const ParallelConfig& parallel, const MemoryEstimate& memory);

// Fills step_time_s, tokens_per_s, bubble_fraction, mfu and hfu from the phases in `time`.
void summarize(TimeBreakdown& time, const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
               const ParallelConfig& parallel);

}  // namespace dplan::costmodel
