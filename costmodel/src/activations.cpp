// Activation memory of one transformer layer, derived tensor by tensor from the layer's
// structure. With 16-bit activations, 1-byte dropout masks, a 4h GELU MLP, standard attention and
// no parallelism it reduces to Korthikanti et al. 2022 (arXiv 2205.05198) Eq. 1:
//   s*b*h*(34 + 5*a*s/h)  =  attention 11sbh + 5as^2b  +  MLP 19sbh  +  two norms 4sbh,
// and with tensor / sequence parallel to their Eq. 2-6. Generalised here to GQA, gated MLPs,
// flash attention, context parallel, MoE and fp32 / fp8 activations.
#include <algorithm>

#include "dplan/costmodel/memory.h"

namespace dplan::costmodel {
namespace {

// b=micro_batch s=local sequence (seq/cp) s_kv=keys each query sees h=hidden a=heads/t
// t=tp sp=sequence-parallel divisor for tensors replicated across tp without SP.
struct Shape {
  double b, s, s_kv, h, t, sp, heads_local, q_local, kv_local, f_local;
  double act;   // bytes per stored activation element (2 for 16-bit, 4 for fp32)
  double gemm;  // bytes per stored GEMM input (1 with fp8 Transformer Engine, else act:
                // EngineMechanics::fp8_keeps_16bit_operands)
};

Shape shape_of(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  Shape x{};
  x.b = p.micro_batch;
  x.s = double(t.seq_len) / p.cp;
  x.s_kv = t.seq_len;
  x.h = m.hidden_size;
  x.t = p.tp;
  x.sp = p.sequence_parallel ? p.tp : 1;
  x.heads_local = double(m.num_heads) / p.tp;
  x.q_local = double(m.q_dim()) / p.tp;
  x.kv_local = double(m.kv_dim()) / p.tp;
  x.f_local = double(m.ffn_hidden_size) / p.tp;
  x.act = activation_bytes(t.precision);
  x.gemm = t.precision == Precision::fp8 && !t.engine.fp8_keeps_16bit_operands ? 1.0 : x.act;
  return x;
}

double norm_bytes(const ModelSpec& m, const Shape& x) {
  // Norm input (act bytes) + fp32 statistics: LayerNorm mean and rstd, RMSNorm rstd.
  double stats = (m.norm == NormKind::layernorm ? 8.0 : 4.0) * x.s * x.b;
  return (x.act * x.s * x.b * x.h + stats) / x.sp;
}

// The attention core's s^2 tensors (standard attention only): softmax output, and with
// attention dropout its 1-byte mask and its output (Korthikanti's 5as^2b).
double attention_core_quadratic_bytes(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p,
                                       const Shape& x) {
  if (blockwise_attention(t, p)) return 0.0;
  double scores = x.heads_local * x.s * x.s_kv * x.b;
  double bytes = x.act * scores;
  if (m.attention_dropout > 0) bytes += 1.0 * scores + x.act * scores;
  return bytes;
}

// torchtitan's op-level selective checkpointing (EngineMechanics::selective, op_policy) keeps the
// layer's input and the outputs of the ops it must save: the attention kernel's (its output and
// fp32 log-sum-exp), every reduce-scatter's (sequence-parallel tensor parallel), and the first,
// third, ... matrix multiply of the forward (q, v; the MLP's first up projection and, gated, its
// down projection; a GELU MLP's fc1). Everything else is recomputed from them in backward.
double op_policy_stored_bytes(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p, const Shape& x) {
  const double tokens = x.s * x.b;
  double bytes = x.act * tokens * x.h / x.sp;                                   // the layer's input
  bytes += x.act * tokens * (x.q_local + x.kv_local);                           // mm 1 (q) and 3 (v)
  bytes += x.act * tokens * x.q_local + 4.0 * x.heads_local * tokens;           // attention output, lse
  if (!blockwise_attention(t, p)) bytes += attention_core_quadratic_bytes(m, t, p, x);  // eager: its softmax
  if (x.t > 1) bytes += 2 * x.act * tokens * x.h / x.sp;                        // two reduce-scatters
  // The MLP's saved products: gated, up (f) and down (h, `h_share` of it on this rank); else fc1 (f).
  // Experts as activations_per_layer counts them: k copies, f/tp inner columns, etp/tp of the h wide.
  auto mlp = [&](double f_local, double h_share) {
    if (f_local <= 0) return 0.0;  // no shared expert
    return x.act * tokens * (f_local + (m.mlp == MlpKind::gelu ? 0.0 : x.h * h_share));
  };
  if (m.is_moe()) {
    const double moe = m.moe_layer_fraction();
    bytes += moe * (m.experts_per_token * mlp(x.f_local, double(p.expert_tp()) / p.tp) +
                    mlp(m.shared_expert_ffn_size / x.t, 1.0));
    bytes += (1 - moe) * mlp(m.dense_ffn_hidden_size / x.t, 1.0);
  } else {
    bytes += mlp(x.f_local, 1.0);
  }
  return bytes;
}

// The MLP's inner activations (activations_per_layer): the activation function's input (gate and
// up with a gated MLP) and its output, the input of the down projection.
double mlp_inner_bytes(const ModelSpec& m, const Shape& x, double f_local) {
  const double tokens = x.s * x.b;
  return (m.mlp == MlpKind::gelu ? 1.0 : 2.0) * x.act * tokens * f_local + x.gemm * tokens * f_local;
}

// What Megatron-LM's selective recompute drops from a layer's stored set, per module of
// TrainingSpec::recompute_modules, as activations_per_layer counts it (Transformer Engine's layer
// spec at core_v0.15.0: a dense layer's norms are fused into the linear layers after them, so only an
// MoE layer's pre-MLP norm and MLA's input norm are modules of their own):
//  - core_attn: the core's s^2 tensors (Korthikanti Eq. 3 / 6) and flash attention's log-sum-exp;
//    q, k, v stay as the checkpoint's inputs, the output as the output projection's;
//  - layernorm: the output of those separate norms (MoE layers' router input, MLA's projection input);
//  - mla_up_proj: q, k and v after the up projections and the rotary embedding;
//  - mlp: a dense layer's MLP, fused norm included, down to the checkpoint's input;
//  - moe: an MoE layer's router, dispatch, experts, combine and shared experts, likewise;
//  - moe_act: the routed experts' activation outputs (their down projection's input);
//  - shared_experts: the shared experts' inner activations.
double megatron_recompute_dropped_bytes(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p,
                                        const Shape& x, const LayerActivations& all) {
  const RecomputeModules& r = t.recompute_modules;
  const double tokens = x.s * x.b;
  const double input = x.act * tokens * x.h / x.sp;  // a checkpoint's input, the hidden state
  const double gemm_input = x.gemm * tokens * x.h / x.sp;
  const double moe = m.is_moe() ? m.moe_layer_fraction() : 0.0;
  double bytes = 0;
  if (r.has(RecomputeModule::core_attn)) {
    bytes += attention_core_quadratic_bytes(m, t, p, x);
    if (blockwise_attention(t, p)) bytes += 4.0 * x.heads_local * tokens;
  }
  if (r.has(RecomputeModule::layernorm)) {
    if (!r.has(RecomputeModule::moe)) bytes += moe * gemm_input;
    if (m.is_mla()) bytes += gemm_input;
  }
  if (r.has(RecomputeModule::mla_up_proj) && m.is_mla()) {
    const double kv = blockwise_attention(t, p) ? x.kv_local : x.q_local;
    bytes += x.act * tokens * (x.q_local + 2 * kv);
  }
  if (r.has(RecomputeModule::mlp)) {
    // The dense MLP's stored set is the fused norm, fc1's input and the inner activations.
    const double dense_ffn = m.is_moe() ? m.dense_ffn_hidden_size : m.ffn_hidden_size;
    const double dense = norm_bytes(m, x) + gemm_input + mlp_inner_bytes(m, x, dense_ffn / x.t);
    bytes += (1 - moe) * std::max(0.0, dense - input);
  }
  if (m.is_moe()) {
    if (r.has(RecomputeModule::moe)) {
      // Everything of the MoE layer's MLP part past its own norm, less the checkpoint's input.
      const double dense_part = (1 - moe) * mlp_inner_bytes(m, x, m.dense_ffn_hidden_size / x.t);
      const double moe_part = all.mlp_bytes - norm_bytes(m, x) - dense_part;
      bytes += std::max(0.0, moe_part - moe * input);
    } else {
      if (r.has(RecomputeModule::moe_act))
        bytes += moe * m.experts_per_token * x.gemm * tokens * x.f_local;
      if (r.has(RecomputeModule::shared_experts))
        bytes += moe * mlp_inner_bytes(m, x, m.shared_expert_ffn_size / x.t);
    }
  }
  return bytes;
}

}  // namespace

LayerActivations activations_per_layer(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  const Shape x = shape_of(m, t, p);
  const double tokens = x.s * x.b;
  LayerActivations a;

  // Attention: norm, QKV input (stored sequence-sharded with SP and re-gathered in backward).
  a.attention_bytes = norm_bytes(m, x) + x.gemm * tokens * x.h / x.sp;
  a.attention_bytes += x.act * tokens * x.q_local;  // Q
  if (!blockwise_attention(t, p)) {
    // Eager attention expands grouped K and V to every head before the matmuls that save them.
    a.attention_bytes += 2 * x.act * tokens * x.q_local;
  } else {
    // Flash attention saves K, V at kv-head width and a fp32 log-sum-exp per head and query;
    // dropout is regenerated from the RNG state, no mask is stored (Dao et al. 2022). The
    // context-parallel ring saves the same for this rank's s/cp tokens (Transformer Engine's
    // AttnFuncWithCPAndKVP2P saves q, kv, out and the log-sum-exp; executor/src/ring_attention.h):
    // the K,V blocks received from the other cp ranks live only during their ring step, as do
    // the partial outputs merged into the output, so nothing more is stored per layer.
    a.attention_bytes += 2 * x.act * tokens * x.kv_local + 4.0 * x.heads_local * tokens;
  }
  a.attention_bytes += attention_core_quadratic_bytes(m, t, p, x);
  // Qwen3's q/k norms: an RMSNorm over each head saves its input, q and k, which are views of the
  // fused QKV output, so that stays alive whole (its q, k and v rows; Megatron-Core's q_layernorm
  // and k_layernorm on the split of mixed_qkv keep it the same way), and an fp32 rstd per head and
  // token. Measured on the executor: qwen3-tiny's activations were 17-21 % over the prediction
  // without this term (tests/executor/executor_test.cpp, memory).
  if (m.qk_norm)
    a.attention_bytes += x.act * tokens * (x.q_local + 2 * x.kv_local) + 4.0 * tokens * (x.heads_local + m.num_kv_heads / x.t);
  // MLA: the q and kv latents, inputs of the up projections (replicated over tp).
  if (m.is_mla()) a.attention_bytes += x.gemm * tokens * (m.q_lora_rank + m.kv_lora_rank);
  a.attention_bytes += x.gemm * tokens * m.attn_out_dim() / x.t;           // output projection input
  if (m.hidden_dropout > 0) a.attention_bytes += 1.0 * tokens * x.h / x.sp;  // dropout mask

  // MLP: norm, fc1 input, the activation's input and output (fc2 input), dropout mask.
  auto inner = [&](double f_local) { return mlp_inner_bytes(m, x, f_local); };
  a.mlp_bytes = norm_bytes(m, x);
  if (m.is_moe()) {
    // Every token visits top-k experts: k copies of the expert input and of the expert's inner
    // activations; the router keeps fp32 probabilities per expert. With MoE parallel folding a
    // rank's experts see etp/tp of the tokens' copies (gathered over etp, compute.cpp), each with
    // f/etp inner columns: the inner part is k*tokens*f/tp whatever etp, the input k*tokens*h*etp/tp.
    // Shared experts are a dense MLP on the router's input. Dense layers of an MoE model count by
    // their share (the mean layer, as layer_params).
    double k = m.experts_per_token, moe = m.moe_layer_fraction();
    a.mlp_bytes += x.gemm * tokens * x.h / x.sp;               // router / dispatch input
    a.mlp_bytes += moe * 4.0 * tokens * m.num_experts / x.sp;  // router probabilities
    a.routed_expert_bytes = moe * k * (x.gemm * tokens * x.h * p.expert_tp() / p.tp + inner(x.f_local));
    // The combine: the k expert outputs of each of the rank's T/tp tokens, back from the all-to-all,
    // which the multiplication by the routing weights saves (Megatron's moe_unpermute with probs;
    // executor/src/moe.cpp).
    a.routed_expert_bytes += moe * k * x.act * tokens * x.h / p.tp;
    a.mlp_bytes += a.routed_expert_bytes + moe * inner(m.shared_expert_ffn_size / x.t);
    a.mlp_bytes += (1 - moe) * inner(m.dense_ffn_hidden_size / x.t);
  } else {
    a.mlp_bytes += x.gemm * tokens * x.h / x.sp + inner(x.f_local);
  }
  if (m.hidden_dropout > 0) a.mlp_bytes += 1.0 * tokens * x.h / x.sp;
  return a;
}

double stored_activation_bytes_per_layer(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  const Shape x = shape_of(m, t, p);
  switch (p.recompute) {
    case Recompute::full:
      // Only the layer input survives (Korthikanti Table 2: 2sbh; sequence-sharded with SP).
      return x.act * x.s * x.b * x.h / x.sp;
    case Recompute::selective: {
      if (t.engine.selective == SelectiveRecompute::op_policy) return op_policy_stored_bytes(m, t, p, x);
      const LayerActivations all = activations_per_layer(m, t, p);
      return all.total() - megatron_recompute_dropped_bytes(m, t, p, x, all);
    }
    case Recompute::none:
      break;
  }
  return activations_per_layer(m, t, p).total();
}

double moe_dispatch_bytes(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  if (!m.is_moe()) return 0.0;
  const Shape x = shape_of(m, t, p);
  return 2 * m.experts_per_token * x.act * x.s * x.b * x.h * p.expert_tp() / p.tp;
}

double moe_worst_case_imbalance(const ModelSpec& m, const ParallelConfig& p) {
  if (!m.is_moe()) return 1.0;
  const double k = m.experts_per_token, local_experts = double(m.num_experts) / p.ep;
  return std::max(1.0, p.ep * std::min(k, local_experts) / k);
}

// Backward starts when stored activations are at their peak, and its first GEMM Y = X W^T then
// holds both of its gradients at once: dX = dY W (tokens x in) and dW = dY^T X (out x in), which
// autograd materialises before AccumulateGrad adds it into .grad (Megatron's
// --gradient-accumulation-fusion writes it into the main grad instead; PyTorch eager and the
// executor do not). Its output is stored activation memory already. Under sequence parallel one
// more full-sequence [tokens, h] tensor is live: fc2's output gradient all-gathered, or the LM
// head's input gathered again (Megatron's sequence-parallel linear). On the last stage that GEMM
// is the LM head; with 16-bit activations the logits' fp32 gradient is cast back to 16 bits first
// (its dY). fc2's set comes later there, after the logits are freed: memory.cpp weighs the two.
double backward_working_set_bytes(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p, bool last_stage) {
  const Shape x = shape_of(m, t, p);
  const double tokens = x.s * x.b;
  const double gathered = x.sp > 1 ? x.act * tokens * x.h : 0.0;
  if (!last_stage) return x.act * (tokens * x.f_local + x.h * x.f_local) + gathered;  // fc2: dX [t, F/tp], dW [h, F/tp]
  const double vocab_local = padded_vocab(m, t, p.tp) / p.tp;
  const double head_dy = x.act < 4 ? x.act * tokens * vocab_local : 0.0;
  return x.act * (tokens * x.h + vocab_local * x.h) + gathered + head_dy;  // dX [t, h], dW [V/tp, h]
}

}  // namespace dplan::costmodel
