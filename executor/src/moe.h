// A Mixtral-style mixture-of-experts MLP (Jiang et al. 2024, arXiv 2401.04088; Hugging Face
// MixtralSparseMoeBlock): a router linear h -> E, softmax over the E experts, the top-k kept and
// their weights renormalised to sum 1 (where the model says: Qwen-MoE's norm_topk_prob), each
// expert a SwiGLU MLP of the model's ffn_hidden_size, the token's output the weighted sum of its k
// experts' outputs. gpt-oss's (GptOssMLP) is the same with biases on the router and the experts'
// matrices and its clamped SwiGLU (ModelSpec::swiglu_limit): its softmax over the top-k logits is
// the renormalised top-k of the softmax over all. DeepSeek's routes by sigmoid scores with a
// correction bias or by softmax, among its best expert groups, and scales the weights
// (ModelSpec::moe_router_score, moe_groups, moe_routed_scaling). No capacity
// factor: every routed copy is processed (dropless, as the cost model prices it).
//
// Expert parallel runs as Megatron-Core's alltoall token dispatcher with MoE parallel folding
// (MoEAlltoAllTokenDispatcher; Liu et al. 2025, arXiv 2504.14960), what
// costmodel/src/time_phases.cpp expert_parallel_comm_s prices: a rank enters with its T/tp tokens
// (the sequence-parallel shard; without sequence parallel each tp rank takes its 1/tp of the
// replicated tokens and the outputs are summed back over tp), exchanges per-expert counts over its
// ep group, sends each token's k copies to the ep ranks holding their experts (an all-to-all with
// variable splits), with etp > 1 all-gathers the received tokens over etp, runs its E/ep experts
// (column / row split over etp), reduce-scatters the partial outputs over etp, and sends them back
// with the reverse all-to-all. Communication is charged to the ep_comm phase.
//
// The load-balancing loss is Switch Transformer's (Fedus et al. 2021, arXiv 2101.03961, eq. 4:
// E * sum_e f_e P_e) per sequence, as Megatron's seq_aux_loss and DeepSeek-V2's sequence-wise
// balance loss compute it: f_e = tokens of the sequence routed to e / (s k), P_e = mean router
// probability of e over the sequence, both summed over the ranks that split the sequence (tp, cp),
// so that it is one function whatever the layout. It enters the gradient (Megatron's
// MoEAuxLossAutoScaler) with the token loss's scaling, as the mean over the global batch's
// sequences times the coefficient; the reported loss is the token loss alone, as Megatron reports
// lm loss and load_balancing_loss apart.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "dplan/costmodel/model.h"

namespace dplan::executor {

struct ParallelContext;  // gpt.h


// One MoE layer's weights on this rank: the router (every rank holds all of it) and its ep rank's
// E/ep experts, each this etp rank's slice (gate, up: rows; down: columns of ffn_hidden_size).
struct MoeWeights {
  at::Tensor router;                        // [E, h]
  at::Tensor router_bias;                   // [E] (gpt-oss), or undefined
  int first_expert = 0;                     // global id of local expert 0
  std::vector<at::Tensor> gate, up, down;   // [F/etp, h], [F/etp, h], [h, F/etp]
  // gpt-oss's expert biases (ModelSpec::mlp_bias), else empty: gate and up [F/etp], down [h]
  // whole on every etp rank (each adds 1/etp of it to its partial output; the gradient passes whole).
  std::vector<at::Tensor> gate_b, up_b, down_b;
};

// Routed copies this rank's tokens made, and copies its experts received, summed over every
// micro-batch of the run: over all ranks the two sums are equal (dropless: no capacity factor).
struct MoeCounts {
  int64_t routed = 0, processed = 0;
};

// `out` unchanged forward; backward also starts `loss`'s backward with gradient 1 (a scalar already
// scaled like the token loss): an auxiliary loss in the gradient and out of the value reported
// (Megatron's MoEAuxLossAutoScaler and MTPLossAutoScaler: the balance loss, the MTP modules').
at::Tensor attach_loss(const at::Tensor& out, const at::Tensor& loss);

// x: what the MLP gets ([b, s/tp, h] under sequence parallel, else [b, s, h]); returns the same
// shape. aux_scale: what multiplies the sum over this micro-batch's sequences of the load-balancing
// loss (the token loss's loss_scale times seq_len, so the gradient is coef x its global-batch mean).
at::Tensor moe_mlp(const costmodel::ModelSpec& model, const MoeWeights& w, const at::Tensor& x, int seq_len,
                   double aux_scale, ParallelContext& ctx, MoeCounts& counts);

}  // namespace dplan::executor
