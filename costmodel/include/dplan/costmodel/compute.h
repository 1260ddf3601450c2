// Compute time on one GPU: FLOPs of each matrix multiply of a transformer layer (after tensor,
// context and expert parallel splitting), their achieved speed from the GPU profile (wave
// quantization, roofline against HBM, per-kernel overhead), and the memory-bound element-wise
// work (norms, activations, dropout, softmax, residuals, loss, optimizer) at achieved HBM bandwidth.
#pragma once

#include <array>
#include <optional>
#include <string_view>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Forward FLOPs of one layer for `tokens` tokens of `seq_len`-long sequences, whole layer (not split).
// QKV 2Th(q+2kv), scores 2Tsq and values 2Tsq (full s^2, as Narayanan et al. 2021 Eq. 3 counts),
// output 2Tqh, MLP 4Thf (GELU) or 6Thf (gated), x top-k for MoE plus the router 2ThE.
// With q = h, kv = h, f = 4h this is 24Th^2 + 4Ts h, Megatron's per-layer forward count.
struct LayerFlops {
  double qkv = 0, attention = 0, out_proj = 0, mlp = 0, router = 0;
  double total() const { return qkv + attention + out_proj + mlp + router; }
};
LayerFlops layer_forward_flops(const ModelSpec& model, double tokens, double seq_len);

// What torchtitan's op-level selective recompute (SelectiveRecompute::op_policy, engine.h) reruns
// of a layer's matrix multiplies, as shares of each: every second one in forward order, so k of
// q, k, v; the output projection; the MLP's second up projection (SwiGLU's w3) or its down
// projection (GELU's fc2). Its element-wise ops are rerun too; the attention kernel is not.
struct OpPolicyShares {
  double qkv = 0, out_proj = 0, mlp = 0;
};
OpPolicyShares op_policy_recompute_shares(const ModelSpec& model);

// What Megatron-LM's selective recompute replays of a layer's forward, per module of
// TrainingSpec::recompute_modules (activations.cpp counts what each drops), as shares of each part:
// the attention core (core_attn), the q/k/v projections' FLOPs (MLA's up projections, mla_up_proj),
// MoE layers' routed experts with their router and their shared experts (moe; shared_experts), the
// dense layers' MLP (mlp), and of the mean layer's forward collectives: tensor parallel (the MLP's
// one of its two, under mlp or moe) and the MoE dispatch and combine (moe). Element-wise work goes
// with its module (layer_times).
struct MegatronRecomputeShares {
  double attention = 0, qkv = 0, routed_mlp = 0, shared_mlp = 0, dense_mlp = 0, tp_comm = 0, ep_comm = 0;
};
MegatronRecomputeShares megatron_recompute_shares(const ModelSpec& model, RecomputeModules modules);

// Shares of the forward's tensor-parallel collectives, context-parallel ring and MoE dispatch and
// combine that recompute replays: 1 under full recompute; under Megatron's selective
// megatron_recompute_shares' (the ring with the attention core); else 0.
struct RecomputedComm {
  double tp = 0, cp = 0, ep = 0;
};
RecomputedComm recomputed_comm(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel);

// FLOPs that recompute replays for `tokens` tokens of `seq_len`-long sequences, every layer: the
// forward under full recompute, the parts selective recompute reruns (op_policy_recompute_shares,
// megatron_recompute_shares). HFU counts them.
double recompute_flops(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel,
                       double tokens, double seq_len);

// Forward FLOPs of the LM head (2ThV).
double head_forward_flops(const ModelSpec& model, double tokens, double vocab);

// The parts of a step's matrix-multiply FLOPs that one rank runs: what the executor counts
// (run.json "flops", docs/run-json.md) and rank_step_flops predicts. mlp is a dense layer's MLP and
// an MoE layer's shared experts (with Qwen2-MoE's gate); experts the routed experts; router the
// MoE router; head the LM head (and the MTP modules' heads); mtp_proj the MTP modules' eh_proj. The
// attention core counts the query-key pairs it attends. An MTP module's layer counts as a layer.
enum class FlopPart { qkv, attention, out_proj, mlp, experts, router, head, mtp_proj };
inline constexpr int kNumFlopParts = 8;
using FlopsByPart = std::array<double, kNumFlopParts>;
const char* to_string(FlopPart part);
std::optional<FlopPart> flop_part_from_string(std::string_view name);

// One rank's matrix-multiply FLOPs per optimizer step: the forward of every micro-batch, and what
// recompute replays before backward (backward's GEMMs, 2x each forward one, are not listed). At
// the per-rank shapes layer_times prices (tensor, sequence, context and expert parallel splits;
// MLA's down projections and the router replicated over tp on the tokens each rank holds), for
// the model's `layers` this rank holds (global indices: each its own MLP kind and window) and the
// LM head where `lm_head`, with the MTP modules beside it (ModelSpec::mtp_layers: each a layer
// numbered after the model's, its eh_proj and the head again). Routed experts at balanced routing (the mean over the ranks: a rank's
// own count follows its tokens' choices); the attention core at the causal half of
// layer_forward_flops' full s^2 for blockwise kernels (exact causal attention attends s(s+1)/2
// pairs, 1/s more), every score for eager attention, windowed layers at their window only where
// the kernel is blockwise (eager attention computes every score and masks).
struct RankStepFlops {
  FlopsByPart forward{}, recompute{};
  bool operator==(const RankStepFlops&) const = default;
};
RankStepFlops rank_step_flops(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel,
                              const std::vector<int>& layers, bool lm_head);

// Model FLOPs of one optimizer step (forward + backward = 3x forward, no recompute): the MFU
// numerator (Chowdhery et al. 2022, App. B; Narayanan et al. 2021 Eq. 3 without the recompute pass).
double model_flops_per_step(const ModelSpec& model, const TrainingSpec& training);  // MTP modules included

// Time of one GEMM (m x k) * (k x n), `batch` of them, on `gpu` at `precision`,
// as `op` of training. From the curve: the larger of the compute time at max
// efficiency scaled by wave quantization (128x128 output tiles over sm_count
// SMs; NVIDIA "Matrix Multiplication Background", tile/wave quantization) and
// the time to move its operands through HBM, plus the kernel overhead. When the
// GPU profile holds measured GEMMs of this precision (dplan probe), the
// achieved rate is interpolated from them instead (measured_gemm_flops_per_s);
// both are scaled by sustained_fraction.
double gemm_time_s(const GpuSpec& gpu, Precision precision, double m, double n, double k, double batch = 1,
                   GemmOp op = GemmOp::forward);

// Achieved FLOP/s of the GEMM from the profile's measured ones of the same
// precision: log rate weighted by inverse squared distance over the 4 nearest
// in (log2 m, log2 n, log2 k, log2 batch), another op counting as one doubling
// of distance (an exact match is its measurement). 0 when the profile has none
// of this precision.
double measured_gemm_flops_per_s(const GpuSpec& gpu, Precision precision, double m, double n, double k, double batch,
                                 GemmOp op);

// A linear layer Y[T, out] = X[T, in] W[out, in]^T: its forward GEMM, and
// backward's input and weight gradients (GemmOp).
struct LinearTimes {
  double forward_s = 0, backward_s = 0;
};
// `batch` independent such layers of the same shape run as one batched (grouped) GEMM each way,
// as MoE experts do (Megatron's --moe-grouped-gemm).
LinearTimes linear_times(const GpuSpec& gpu, Precision precision, double tokens, double out, double in,
                         double batch = 1);

// Time to stream `bytes` through HBM at the achieved bandwidth (memory-bound kernels).
double memory_time_s(const GpuSpec& gpu, double bytes);

// Per micro-batch, one layer, one GPU of the layout.
struct LayerTimes {
  double forward_s = 0;            // GEMMs + element-wise, forward
  double backward_s = 0;           // dgrad + wgrad GEMMs + element-wise, backward
  double recompute_s = 0;          // what recompute replays before backward
  double attention_core_s = 0;     // forward of the attention core (overlaps context-parallel exchange)
  double gemm_forward_s = 0;       // the matrix multiplies (attention core included) inside forward_s
  double gemm_backward_s = 0;      // and inside backward_s
  double mlp_forward_s = 0;        // the MLP's GEMMs (experts, router, shared experts) inside gemm_forward_s
  double mlp_backward_s = 0;       // and inside gemm_backward_s
};
LayerTimes layer_times(const ModelSpec& model, const GpuSpec& gpu, const TrainingSpec& training,
                       const ParallelConfig& parallel);

// Embedding lookup (first stage) and LM head + cross-entropy (last stage), per micro-batch.
struct EdgeTimes {
  double embedding_forward_s = 0, embedding_backward_s = 0;
  double head_forward_s = 0, head_backward_s = 0;
  double head_gemm_forward_s = 0, head_gemm_backward_s = 0;  // the LM head's GEMMs inside those
};
EdgeTimes edge_times(const ModelSpec& model, const GpuSpec& gpu, const TrainingSpec& training,
                     const ParallelConfig& parallel);

// One micro-batch's gradients added into the gradient buffer by a pass of their own, over
// `num_params` local parameters: what Megatron does with --no-gradient-accumulation-fusion (its
// DDP's backward hook, main_grad.add_(grad)), 0 with the fusion (the weight-gradient GEMM
// accumulates into main_grad in its epilogue).
double unfused_accumulation_s(const GpuSpec& gpu, const TrainingSpec& training, const ParallelConfig& parallel,
                              double num_params);
// Whether the weight-gradient GEMMs add into the gradient buffer themselves: the plan's
// gradient_accumulation_fusion, except under Megatron-FSDP (--engine megatron with ZeRO 2 or 3),
// which runs without the fusion (export_megatron.cpp passes --no-gradient-accumulation-fusion).
bool gradient_accumulation_fused(const TrainingSpec& training, const ParallelConfig& parallel);

// AdamW step over `num_params` local parameters: memory-bound, reading and writing fp32 master
// weights, momentum, variance, the gradient and the 16-bit weights.
double optimizer_step_s(const GpuSpec& gpu, const TrainingSpec& training, double num_params);

}  // namespace dplan::costmodel
