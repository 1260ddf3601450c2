#include "dplan/costmodel/compute.h"

#include "dplan/costmodel/memory.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace dplan::costmodel {

namespace {

// Sliding-window attention (ModelSpec::sliding_layers, where the window is shorter than the
// sequence: window_binds): the keys a windowed layer's query attends to in the full-s^2 convention
// of layer_forward_flops (the causal half is taken off where it is skipped): a causal window of w
// keys over s queries does sum_i min(i, w) ~= s*w - w^2/2 score products, that share of the causal
// s^2/2, so 2w - w^2/s keys; and the share of the layers that are windowed.
double windowed_keys(const ModelSpec& m, double seq_len) {
  const double w = m.sliding_window;
  return 2 * w - w * w / seq_len;
}
double sliding_share(const ModelSpec& m) { return double(m.num_sliding_layers()) / m.num_layers; }

// Keys each query attends to on average over the layers (s where no window is shorter).
double mean_attended_keys(const ModelSpec& m, double seq_len) {
  if (!m.window_binds(seq_len)) return seq_len;
  return (1 - sliding_share(m)) * seq_len + sliding_share(m) * windowed_keys(m, seq_len);
}

// Forward FLOPs of one MLP of width f over `tokens` tokens: 4Thf plain, 6Thf gated.
double mlp_flops(const ModelSpec& m, double tokens, double f) {
  return (m.mlp == MlpKind::gated ? 6.0 : 4.0) * tokens * m.hidden_size * f;
}

}  // namespace

LayerFlops layer_forward_flops(const ModelSpec& m, double tokens, double seq_len) {
  const double h = m.hidden_size, q = m.q_dim(), kv = m.kv_dim(), heads = m.num_heads;
  const double v = m.attn_out_dim();
  LayerFlops x;
  if (m.is_mla()) {
    // MLA (layer_params): q down and up (or one q projection), kv down to the latent and the
    // rotary key, kv up to every head's key and value.
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, rope = m.qk_rope_head_dim;
    const double nope = m.head_dim - rope;
    const double q_proj = rq > 0 ? h * rq + rq * q : h * q;
    x.qkv = 2 * tokens * (q_proj + h * (rkv + rope) + rkv * heads * (nope + v / heads));
  } else {
    x.qkv = 2 * tokens * h * (q + 2 * kv);
  }
  // QK^T over the query/key width and PV over the value width, for every key attended.
  const double keys = mean_attended_keys(m, seq_len);
  x.attention = 2 * tokens * keys * q + 2 * tokens * keys * v;
  x.out_proj = 2 * tokens * v * h;
  // Models with dense and MoE layers: the mean layer (dense and MoE layers weighted by count).
  const double moe = m.moe_layer_fraction();
  if (m.is_moe()) {
    double moe_mlp = m.experts_per_token * mlp_flops(m, tokens, m.ffn_hidden_size) +
                     mlp_flops(m, tokens, m.shared_expert_ffn_size);
    double dense_mlp = mlp_flops(m, tokens, m.dense_ffn_hidden_size);
    x.mlp = moe * moe_mlp + (1 - moe) * dense_mlp;
    x.router = moe * 2 * tokens * h * m.num_experts;
  } else {
    x.mlp = mlp_flops(m, tokens, m.ffn_hidden_size);
  }
  return x;
}

double head_forward_flops(const ModelSpec& m, double tokens, double vocab) { return 2 * tokens * m.hidden_size * vocab; }

double model_flops_per_step(const ModelSpec& m, const TrainingSpec& t) {
  const double tokens = double(t.global_batch) * t.seq_len, h = m.hidden_size;
  const double layer = layer_forward_flops(m, tokens, t.seq_len).total();
  const double head = head_forward_flops(m, tokens, m.vocab_size);
  // MTP modules, as Megatron-LM counts them (core_v0.15.0 training.py num_floating_point_operations):
  // each a layer (the mean layer here), its 2h x h projection and a head of its own.
  const double mtp = layer + 2 * tokens * 2 * h * h + head;
  return 3 * (m.num_layers * layer + head + m.mtp_layers * mtp);
}

double measured_gemm_flops_per_s(const GpuSpec& gpu, Precision precision, double m, double n, double k, double batch,
                                 GemmOp op) {
  constexpr int kNearest = 4;
  std::array<std::pair<double, double>, kNearest> best;  // (squared distance, log rate), nearest first
  best.fill({std::numeric_limits<double>::infinity(), 0.0});
  const double q[4] = {std::log2(m), std::log2(n), std::log2(k), std::log2(batch)};
  bool any = false;
  for (const MeasuredGemm& x : gpu.matmul_measured) {
    if (x.precision != precision) continue;
    if ((is_whole_attention(op) || is_whole_attention(x.op)) && x.op != op) continue;
    any = true;
    const double p[4] = {std::log2(x.m), std::log2(x.n), std::log2(x.k), std::log2(x.batch)};
    double d2 = x.op == op ? 0.0 : 1.0;
    for (int i = 0; i < 4; ++i) d2 += (q[i] - p[i]) * (q[i] - p[i]);
    if (d2 >= best[kNearest - 1].first) continue;
    best[kNearest - 1] = {d2, std::log(2 * x.m * x.n * x.k * x.batch / x.time_s)};
    std::sort(best.begin(), best.end());
  }
  if (!any) return 0.0;
  if (best[0].first == 0) return std::exp(best[0].second);
  double weights = 0, sum = 0;
  for (const auto& [d2, log_rate] : best) {
    if (!std::isfinite(d2)) break;
    weights += 1 / d2;
    sum += log_rate / d2;
  }
  return std::exp(sum / weights);
}

double gemm_time_s(const GpuSpec& gpu, Precision precision, double m, double n, double k, double batch, GemmOp op) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0.0;
  const double flops = 2 * m * n * k * batch;
  if (!gpu.matmul_measured.empty()) {
    const double rate = measured_gemm_flops_per_s(gpu, precision, m, n, k, batch, op);
    if (rate > 0) return flops / (rate * gpu.sustained_fraction);
  }
  // Wave quantization: output tiles of 128x128 spread over the SMs in whole waves.
  const double tiles = std::ceil(m / 128) * std::ceil(n / 128) * batch;
  const double waves = std::ceil(tiles / gpu.sm_count);
  const double wave_efficiency = tiles / (waves * gpu.sm_count);
  const double max_efficiency = precision == Precision::fp8 && gpu.fp8_matmul_max_efficiency > 0
                                    ? gpu.fp8_matmul_max_efficiency
                                    : gpu.matmul_max_efficiency;
  const double compute_s =
      flops / (peak_flops_per_s(gpu, precision) * max_efficiency * gpu.sustained_fraction * wave_efficiency);
  // FP8 GEMMs read 1-byte inputs but write their output in 16 bits: Transformer Engine's FP8 GEMMs
  // return the activations' type (transformer_engine/pytorch/cpp_extensions/gemm.py, out_dtype),
  // and DeepGEMM writes BF16 (its README).
  const double in_bytes = precision == Precision::fp32 ? 4.0 : precision == Precision::fp8 ? 1.0 : 2.0;
  const double out_bytes = precision == Precision::fp32 ? 4.0 : 2.0;
  const double bytes = batch * (in_bytes * (m * k + k * n) + out_bytes * m * n);
  return std::max(compute_s, memory_time_s(gpu, bytes)) + gpu.kernel_overhead_s;
}

LinearTimes linear_times(const GpuSpec& gpu, Precision precision, double tokens, double out, double in,
                         double batch) {
  return {gemm_time_s(gpu, precision, tokens, out, in, batch, GemmOp::forward),
          gemm_time_s(gpu, precision, tokens, in, out, batch, GemmOp::dgrad) +
              gemm_time_s(gpu, precision, out, in, tokens, batch, GemmOp::wgrad)};
}

double memory_time_s(const GpuSpec& gpu, double bytes) {
  return bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency);
}

namespace {

// One GPU's share of a layer, per micro-batch: its tokens and its tensor-parallel slice of every
// width. Widths are per rank (divided by tp) unless named otherwise.
struct LayerShape {
  Precision precision;
  double bytes_per_activation;  // B: 2 (16-bit, FP8's activations included) or 4
  double micro_batch;           // b, sequences
  double seq_q;                 // queries on this GPU: seq / cp
  double seq_kv;                // keys each query may attend: the whole sequence
  double tokens;                // T = b * seq_q
  double tp;
  double hidden;                // h (not split)
  double head_dim;              // d, the query/key head width
  double q_width, kv_width;     // query and key (or value) widths of the rank's heads
  double ffn_width;             // f / tp
  double heads;                 // attention heads of the rank
  double sp_split;              // element-wise work split by sequence parallel: tp, else 1
  double gated;                 // 2 for SwiGLU's two up projections, else 1
  bool flash;                   // blockwise attention (blockwise_attention)
  double causal_fraction;       // of the score blocks computed
  int cp;
};

LayerShape layer_shape(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  LayerShape s;
  s.precision = t.precision;
  s.bytes_per_activation = activation_bytes(t.precision);
  s.micro_batch = p.micro_batch;
  s.seq_q = double(t.seq_len) / p.cp;
  s.seq_kv = t.seq_len;
  s.tokens = s.micro_batch * s.seq_q;
  s.tp = p.tp;
  s.hidden = m.hidden_size;
  s.head_dim = m.head_dim;
  s.q_width = m.q_dim() / s.tp;
  s.kv_width = m.kv_dim() / s.tp;
  s.ffn_width = m.ffn_hidden_size / s.tp;
  s.heads = m.num_heads / s.tp;
  s.sp_split = p.sequence_parallel ? s.tp : 1.0;
  s.gated = m.mlp == MlpKind::swiglu ? 2.0 : 1.0;
  s.flash = blockwise_attention(t, p);
  // Causal flash attention skips the masked half of the score blocks (Dao 2023, FlashAttention-2).
  s.causal_fraction = s.flash ? 0.5 : 1.0;
  s.cp = p.cp;
  return s;
}

void add(LinearTimes& sum, const LinearTimes& x, double times = 1.0) {
  sum.forward_s += times * x.forward_s;
  sum.backward_s += times * x.backward_s;
}

// The q, k and v projections' GEMMs: forward, and backward's input and weight gradients (linear_times).
LinearTimes qkv_projection_times(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s) {
  const Precision prec = s.precision;
  const double T = s.tokens, h = s.hidden;
  if (!m.is_mla()) return linear_times(gpu, prec, T, s.q_width + 2 * s.kv_width, h);
  // MLA (layer_params): the down projections are replicated over tp and run on the
  // sequence-parallel shard of the tokens (Megatron-Core multi_latent_attention.py: "kv_compressed
  // [s / TP, b, kv_lora_rank]", then gather_from_sequence_parallel_region); the up projections
  // are column-parallel over all T tokens.
  const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const double nope = m.head_dim - rope, v_head = double(m.attn_out_dim()) / m.num_heads;
  LinearTimes qkv;
  if (rq > 0) {
    add(qkv, linear_times(gpu, prec, T / s.sp_split, rq, h));
    add(qkv, linear_times(gpu, prec, T, s.q_width, rq));
  } else {
    add(qkv, linear_times(gpu, prec, T, s.q_width, h));
  }
  add(qkv, linear_times(gpu, prec, T / s.sp_split, rkv + rope, h));
  add(qkv, linear_times(gpu, prec, T, s.heads * (nope + v_head), rkv));
  return qkv;
}

struct CoreTimes {
  double forward_s = 0, backward_s = 0;
};

// The attention core of a layer whose queries attend to `keys` keys each: scores over the
// query/key head width d, PV over the value head width.
CoreTimes attention_core_times(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s, double keys) {
  const double d = s.head_dim, d_v = double(m.attn_out_dim()) / m.num_heads;
  const double s_q = s.seq_q, b = s.micro_batch, heads = s.heads, causal = s.causal_fraction;
  // FP8 training (Transformer Engine's recipe) runs the linear layers' GEMMs in FP8 but leaves the
  // attention core in 16 bits (TE's DotProductAttention; FP8 attention is a separate opt-in,
  // NVTE_FP8_DPA), so the core is priced at the 16-bit rate.
  const Precision core_prec = s.precision == Precision::fp8 ? Precision::bf16 : s.precision;
  double fwd_s = gemm_time_s(gpu, core_prec, s_q, keys * causal, d, b * heads, GemmOp::batched) +
                 gemm_time_s(gpu, core_prec, s_q, d_v, keys * causal, b * heads, GemmOp::batched);
  // Flash attention's backward does 2.5x the forward's matmul work (recomputes the scores: Dao
  // 2023); unfused attention's backward is 2x like every GEMM. Where the profile measured the
  // framework's own flash-attention kernel, its times replace both; else where it gives the
  // fused kernel's achieved fraction of the 16-bit peak (GpuSpec::attention_*_efficiency: the
  // softmax between the two matmuls keeps flash attention well under GEMM efficiency, Shah et
  // al. 2024, FlashAttention-3), that prices it.
  double bwd_s = (s.flash ? 2.5 : 2.0) * fwd_s;
  if (!s.flash) return {fwd_s, bwd_s};
  const double flops = 2 * s_q * keys * d * b * heads;  // QK^T, unmasked
  const double fwd = measured_gemm_flops_per_s(gpu, core_prec, s_q, keys, d, b * heads, GemmOp::attention_forward);
  const double bwd = measured_gemm_flops_per_s(gpu, core_prec, s_q, keys, d, b * heads, GemmOp::attention_backward);
  if (fwd > 0 && bwd > 0) {
    fwd_s = flops / (fwd * gpu.sustained_fraction);
    bwd_s = flops / (bwd * gpu.sustained_fraction);
  } else if (gpu.attention_forward_efficiency > 0) {
    // Forward: QK^T (d wide) and PV (d_v wide), the causal half; backward 2.5x that.
    // A context-parallel ring runs cp calls of seq / cp keys each (Megatron-Core / TE's p2p
    // context parallel, Liu et al. 2023), so each call sees keys / cp.
    const double work = flops * (1 + d_v / d) * causal;
    const double call_keys = keys / s.cp;
    const double peak = peak_flops_per_s(gpu, core_prec) * gpu.sustained_fraction * call_keys /
                        (call_keys + gpu.attention_half_keys);
    fwd_s = work / (peak * gpu.attention_forward_efficiency) + gpu.kernel_overhead_s;
    bwd_s = 2.5 * work / (peak * gpu.attention_backward_efficiency) + gpu.kernel_overhead_s;
  }
  return {fwd_s, bwd_s};
}

// Sliding-window layers attend to their window only (layer_forward_flops' mean_attended_keys
// derivation); the core is the layer-weighted mean of the windowed and the full one.
CoreTimes mean_attention_core_times(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s, int seq_len) {
  CoreTimes core = attention_core_times(m, gpu, s, s.seq_kv);
  // Eager attention computes every score and masks those outside the window (unfused_attention_bytes).
  if (s.flash && m.window_binds(seq_len)) {
    const double share = sliding_share(m);
    const CoreTimes windowed = attention_core_times(m, gpu, s, windowed_keys(m, seq_len));
    core.forward_s = (1 - share) * core.forward_s + share * windowed.forward_s;
    core.backward_s = (1 - share) * core.backward_s + share * windowed.backward_s;
  }
  return core;
}

// A dense MLP's up (two with SwiGLU) and down projections over `tokens` tokens, `ffn_width`
// columns on this rank.
LinearTimes dense_mlp_times(const GpuSpec& gpu, const LayerShape& s, double tokens, double ffn_width) {
  LinearTimes mlp;
  add(mlp, linear_times(gpu, s.precision, tokens, s.gated * ffn_width, s.hidden));
  add(mlp, linear_times(gpu, s.precision, tokens, s.hidden, ffn_width));
  return mlp;
}

// Tokens a rank brings to an MoE layer (the sequence-parallel split, T / tp), and the tokens its
// experts see after the all-to-all over ep and the all-gather over etp: etp * (T / tp) * k.
double moe_tokens_in(const LayerShape& s) { return s.tokens / s.tp; }
double moe_expert_tokens(const ModelSpec& m, const LayerShape& s, const ParallelConfig& p) {
  return moe_tokens_in(s) * m.experts_per_token * p.expert_tp();
}

// MoE (Megatron-Core with parallel folding and the alltoall dispatcher; time_phases.cpp prices
// its communication): a rank enters the layer with T/tp tokens (sequence-parallel split), routes
// them (router GEMM T/tp x E x h, then fp32 softmax and top-k over the T/tp x E logits), permutes
// its k copies of each token into expert order, and after the all-to-all over ep and the
// all-gather over etp holds etp*(T/tp)*k tokens for its E/ep local experts, each expert's FFN
// split over etp: T*k*etp*ep/(tp*E) tokens per expert under balanced routing (the load-balancing
// aux loss keeps routing near balanced; the imbalance left is not priced). The local experts run
// as one grouped GEMM (Megatron's --moe-grouped-gemm, TE GroupedLinear): priced as a batched GEMM
// of E/ep problems, so one launch and wave quantization over all experts' tiles instead of E/ep
// sequential small GEMMs.
// The mean layer's MLP GEMMs by part: an MoE layer's routed experts with the router, its shared
// experts, and the dense layers' MLP (a dense model's MLP), each weighted by its layers' share.
struct MlpTimes {
  LinearTimes routed, shared, dense;
  LinearTimes total() const {
    LinearTimes sum;
    for (const LinearTimes* x : {&routed, &shared, &dense}) add(sum, *x);
    return sum;
  }
};
MlpTimes mlp_times(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s, const ParallelConfig& p) {
  MlpTimes mlp;
  if (!m.is_moe()) {
    mlp.dense = dense_mlp_times(gpu, s, s.tokens, s.ffn_width);
    return mlp;
  }
  const Precision prec = s.precision;
  const double h = s.hidden;
  const double experts_local = double(m.num_experts) / p.ep;
  const double tokens_per_expert = moe_expert_tokens(m, s, p) / experts_local;
  const double fe = double(m.ffn_hidden_size) / p.expert_tp();  // expert FFN columns per rank
  const double moe = m.moe_layer_fraction();
  add(mlp.routed, linear_times(gpu, prec, tokens_per_expert, s.gated * fe, h, experts_local), moe);
  add(mlp.routed, linear_times(gpu, prec, tokens_per_expert, h, fe, experts_local), moe);
  add(mlp.routed, linear_times(gpu, prec, moe_tokens_in(s), m.num_experts, h), moe);  // router
  // Shared experts: a dense MLP over all T tokens, split over tp like any MLP.
  if (m.shared_expert_ffn_size > 0)
    add(mlp.shared, dense_mlp_times(gpu, s, s.tokens, m.shared_expert_ffn_size / s.tp), moe);
  // Dense layers of an MoE model: the mean layer weights the MoE and the dense MLP by count.
  if (m.num_dense_layers() > 0)
    add(mlp.dense, dense_mlp_times(gpu, s, s.tokens, m.dense_ffn_hidden_size / s.tp), 1 - moe);
  return mlp;
}

// Forward element-wise traffic of the norms and residuals (bytes): two norms (read x, write y),
// two residual adds with dropout (read 2, write 1, 1-byte mask); sequence parallel splits both.
double norm_residual_bytes(const ModelSpec& m, const LayerShape& s) {
  const double T = s.tokens, h = s.hidden, B = s.bytes_per_activation;
  return 2 * (2 * T * h * B) / s.sp_split + 2 * (3 * T * h * B + (m.hidden_dropout > 0 ? T * h : 0)) / s.sp_split;
}

// Rotary embedding on q and k (read + write), bytes.
double rotary_bytes(const ModelSpec& m, const LayerShape& s) {
  return m.position == PositionKind::rotary ? 2 * s.tokens * (s.q_width + s.kv_width) * s.bytes_per_activation : 0;
}

// The MLP activation (read the up projections, write the product), bytes: on T tokens x f/tp
// columns; an MoE rank's on its experts' tokens x f/etp, plus its shared experts on T x
// f_shared/tp; dense layers of an MoE model at their width (the mean layer).
struct MlpBytes {
  double routed = 0, shared = 0, dense = 0;
  double total() const { return routed + shared + dense; }
};
MlpBytes mlp_activation_parts(const ModelSpec& m, const LayerShape& s, const ParallelConfig& p) {
  const double T = s.tokens, tp = s.tp, pass = s.bytes_per_activation * (s.gated + 1);
  MlpBytes x;
  if (!m.is_moe()) {
    x.dense = T * s.ffn_width * pass;
    return x;
  }
  const double moe = m.moe_layer_fraction();
  x.routed = moe * moe_expert_tokens(m, s, p) * m.ffn_hidden_size / p.expert_tp() * pass;
  x.shared = moe * T * m.shared_expert_ffn_size / tp * pass;
  x.dense = (1 - moe) * T * m.dense_ffn_hidden_size / tp * pass;
  return x;
}
double mlp_activation_bytes(const ModelSpec& m, const LayerShape& s, const ParallelConfig& p) {
  return mlp_activation_parts(m, s, p).total();
}

// With standard attention, the fused scale-mask-softmax (read + write) and attention dropout, bytes.
double unfused_attention_bytes(const ModelSpec& m, const LayerShape& s) {
  if (s.flash) return 0;
  const double B = s.bytes_per_activation;
  // Eager attention materialises every score, windowed or not.
  const double scores = s.micro_batch * s.heads * s.seq_q * s.seq_kv;
  return 2 * scores * B + (m.attention_dropout > 0 ? 2 * scores * B + scores : 0);
}

// MoE's memory-bound kernels per mean layer (the dense layers of an MoE model route nothing).
// Permute: gather the k copies of each token into expert order (read and write (T/tp)*k*h);
// un-permute: read them back, weight by the routing probabilities and sum into T/tp tokens;
// with etp > 1 the gathered tokens are re-sorted by expert once more each way
// (sort_chunks_by_idxs). Router: fp32 logits written by the GEMM, read by softmax and top-k,
// probabilities written (3 passes of 4 bytes over T/tp x E). Added to `bytes` term by term.
void add_moe_dispatch_bytes(double& bytes, const ModelSpec& m, const LayerShape& s, const ParallelConfig& p) {
  const double k = m.experts_per_token, etp = p.expert_tp(), moe = m.moe_layer_fraction();
  const double h = s.hidden, B = s.bytes_per_activation;
  bytes += moe * (2 * k + (k + 1)) * moe_tokens_in(s) * h * B;
  if (etp > 1) bytes += moe * 2 * 2 * moe_expert_tokens(m, s, p) * h * B;
  bytes += moe * 3 * 4.0 * moe_tokens_in(s) * m.num_experts;
}

// The layer's element-wise kernels outside the attention core, forward: their HBM time and one
// launch each (8, and 6 more per MoE layer: softmax, top-k, permute, un-permute, aux loss, and the
// probabilities' scatter).
double elementwise_forward_s(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s, const ParallelConfig& p) {
  double bytes = norm_residual_bytes(m, s);
  bytes += rotary_bytes(m, s);
  bytes += mlp_activation_bytes(m, s, p);
  double moe_kernels = 0;
  if (m.is_moe()) {
    add_moe_dispatch_bytes(bytes, m, s, p);
    moe_kernels = 6 * m.moe_layer_fraction();
  }
  return memory_time_s(gpu, bytes) + (8 + moe_kernels) * gpu.kernel_overhead_s;
}

// FP8 (Transformer Engine): before each of the four linear layers' GEMMs its input is cast to
// FP8 together with the transpose the weight-gradient GEMM needs (read 2 bytes, write 1 + 1; TE's
// fused cast-transpose, which also records the amax), and in backward each output gradient
// likewise. With sequence parallel the h-wide inputs are cast before the all-gather (1/tp of the
// tokens). One kernel per cast.
CoreTimes fp8_cast_times(const ModelSpec& m, const GpuSpec& gpu, const LayerShape& s) {
  if (s.precision != Precision::fp8) return {};
  constexpr double kCastBytes = 2 + 1 + 1;
  const double T = s.tokens, h = s.hidden, sp = s.sp_split, f = s.ffn_width;
  return {memory_time_s(gpu, kCastBytes * T * (2 * h / sp + m.attn_out_dim() / s.tp + f)) +
              4 * gpu.kernel_overhead_s,
          memory_time_s(gpu, kCastBytes * T * ((s.q_width + 2 * s.kv_width) + 2 * h / sp + s.gated * f)) +
              4 * gpu.kernel_overhead_s};
}

// Megatron's selective recompute (megatron_recompute_shares): the replayed GEMMs, and the
// element-wise work of the modules it reruns: a separate norm (read and write T*h) for an MoE
// layer's pre-MLP norm and MLA's input norm (layernorm), a dense MLP's fused norm and activation
// (mlp), an MoE layer's activations, permutation and router softmax (moe), the routed or shared
// experts' activations alone (moe_act, shared_experts), MLA's rotary embedding (mla_up_proj).
double megatron_recompute_s(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p,
                            const LayerShape& s, const LayerTimes& x, const LinearTimes& qkv, const MlpTimes& mlp) {
  const RecomputeModules& r = t.recompute_modules;
  const MegatronRecomputeShares share = megatron_recompute_shares(m, r);
  const MlpBytes act = mlp_activation_parts(m, s, p);
  const double norm = 2 * s.tokens * s.hidden * s.bytes_per_activation / s.sp_split;
  const double moe = m.is_moe() ? m.moe_layer_fraction() : 0.0;
  const bool whole_moe = m.is_moe() && r.has(RecomputeModule::moe);
  double bytes = 0;
  if (r.has(RecomputeModule::layernorm)) bytes += norm * ((whole_moe ? 0.0 : moe) + (m.is_mla() ? 1.0 : 0.0));
  if (r.has(RecomputeModule::mlp)) bytes += (1 - moe) * norm + act.dense;
  if (whole_moe) {
    bytes += act.routed + act.shared;
    add_moe_dispatch_bytes(bytes, m, s, p);
  } else {
    if (r.has(RecomputeModule::moe_act)) bytes += act.routed;
    if (r.has(RecomputeModule::shared_experts)) bytes += act.shared;
  }
  if (r.has(RecomputeModule::mla_up_proj) && m.is_mla()) bytes += rotary_bytes(m, s);
  return share.attention * x.attention_core_s + share.qkv * qkv.forward_s + share.routed_mlp * mlp.routed.forward_s +
         share.shared_mlp * mlp.shared.forward_s + share.dense_mlp * mlp.dense.forward_s +
         (bytes > 0 ? memory_time_s(gpu, bytes) : 0.0);
}

}  // namespace

MegatronRecomputeShares megatron_recompute_shares(const ModelSpec& m, RecomputeModules r) {
  MegatronRecomputeShares x;
  const double moe = m.is_moe() ? m.moe_layer_fraction() : 0.0;
  const bool whole_moe = m.is_moe() && r.has(RecomputeModule::moe);
  x.attention = r.has(RecomputeModule::core_attn) ? 1 : 0;
  if (m.is_mla() && r.has(RecomputeModule::mla_up_proj)) {
    // The up projections' share of layer_forward_flops' q/k/v FLOPs (per token).
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, nope = m.head_dim - m.qk_rope_head_dim;
    const double up = (rq > 0 ? rq * m.q_dim() : 0.0) + rkv * (m.num_heads * nope + m.attn_out_dim());
    x.qkv = 2 * up / layer_forward_flops(m, 1, 1).qkv;
  }
  x.routed_mlp = whole_moe ? 1 : 0;
  x.shared_mlp = whole_moe || (m.is_moe() && r.has(RecomputeModule::shared_experts)) ? 1 : 0;
  x.dense_mlp = r.has(RecomputeModule::mlp) ? 1 : 0;
  // The MLP's collective is one of the layer's two forward ones (tensor_parallel_comm).
  x.tp_comm = 0.5 * ((r.has(RecomputeModule::mlp) ? 1 - moe : 0.0) + (whole_moe ? moe : 0.0));
  x.ep_comm = whole_moe ? 1 : 0;
  return x;
}

RecomputedComm recomputed_comm(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  switch (p.recompute) {
    case Recompute::full: return {1, 1, 1};
    case Recompute::selective:
      if (t.engine.selective == SelectiveRecompute::attention_core) {
        const MegatronRecomputeShares share = megatron_recompute_shares(m, t.recompute_modules);
        return {share.tp_comm, share.attention, share.ep_comm};
      }
      return {};
    case Recompute::none: break;
  }
  return {};
}

double recompute_flops(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p, double tokens,
                       double seq_len) {
  const LayerFlops lf = layer_forward_flops(m, tokens, seq_len);
  const double layers = m.num_layers + m.mtp_layers;  // MTP modules' layers recompute as the others
  switch (p.recompute) {
    case Recompute::none: return 0;
    case Recompute::full: return layers * lf.total();
    case Recompute::selective: break;
  }
  if (t.engine.selective == SelectiveRecompute::op_policy) {
    const OpPolicyShares share = op_policy_recompute_shares(m);
    return layers * (share.qkv * lf.qkv + share.out_proj * lf.out_proj + share.mlp * lf.mlp);
  }
  const MegatronRecomputeShares share = megatron_recompute_shares(m, t.recompute_modules);
  // The MLP's FLOPs by part, as layer_forward_flops weighs them (the router with the routed experts).
  double routed = 0, shared = 0, dense = lf.mlp;
  if (m.is_moe()) {
    const double moe = m.moe_layer_fraction();
    routed = moe * m.experts_per_token * mlp_flops(m, tokens, m.ffn_hidden_size) + lf.router;
    shared = moe * mlp_flops(m, tokens, m.shared_expert_ffn_size);
    dense = (1 - moe) * mlp_flops(m, tokens, m.dense_ffn_hidden_size);
  }
  return layers * (share.attention * lf.attention + share.qkv * lf.qkv + share.routed_mlp * routed +
                   share.shared_mlp * shared + share.dense_mlp * dense);
}

OpPolicyShares op_policy_recompute_shares(const ModelSpec& m) {
  const double q = m.q_dim(), kv = m.kv_dim();
  return {kv / (q + 2 * kv), 1.0, m.mlp == MlpKind::gelu ? 0.5 : 1.0 / 3};
}

LayerTimes layer_times(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p) {
  const LayerShape s = layer_shape(m, t, p);
  const LinearTimes qkv = qkv_projection_times(m, gpu, s);
  const CoreTimes core = mean_attention_core_times(m, gpu, s, t.seq_len);
  const LinearTimes out = linear_times(gpu, s.precision, s.tokens, s.hidden, m.attn_out_dim() / s.tp);
  const MlpTimes mlp_parts = mlp_times(m, gpu, s, p);
  const LinearTimes mlp = mlp_parts.total();
  const double elementwise_s = elementwise_forward_s(m, gpu, s, p);
  const double attention_elementwise_s = memory_time_s(gpu, unfused_attention_bytes(m, s));
  const CoreTimes fp8_cast = fp8_cast_times(m, gpu, s);

  LayerTimes x;
  x.gemm_forward_s = qkv.forward_s + core.forward_s + out.forward_s + mlp.forward_s;
  x.gemm_backward_s = qkv.backward_s + out.backward_s + mlp.backward_s + core.backward_s;
  x.attention_core_s = core.forward_s + attention_elementwise_s;
  x.mlp_forward_s = mlp.forward_s;
  x.mlp_backward_s = mlp.backward_s;
  x.forward_s = x.gemm_forward_s + elementwise_s + attention_elementwise_s + fp8_cast.forward_s;
  x.backward_s = x.gemm_backward_s + 2 * (elementwise_s + attention_elementwise_s) + fp8_cast.backward_s;
  switch (p.recompute) {
    case Recompute::full: x.recompute_s = x.forward_s; break;
    case Recompute::selective:
      if (t.engine.selective == SelectiveRecompute::op_policy) {
        const OpPolicyShares share = op_policy_recompute_shares(m);
        x.recompute_s = share.qkv * qkv.forward_s + share.out_proj * out.forward_s + share.mlp * mlp.forward_s +
                        elementwise_s + attention_elementwise_s + fp8_cast.forward_s;
      } else {
        x.recompute_s = megatron_recompute_s(m, gpu, t, p, s, x, qkv, mlp_parts);
      }
      break;
    case Recompute::none: break;
  }
  return x;
}

namespace {
constexpr std::array<const char*, kNumFlopParts> kFlopPartNames = {"qkv",     "attention", "out_proj", "mlp",
                                                                   "experts", "router",    "head",     "mtp_proj"};

// One layer's forward on one rank per micro-batch, by part (rank_step_flops): the GEMM shapes
// qkv_projection_times, attention_core_times, mlp_times and dense_mlp_times price.
FlopsByPart rank_layer_forward_flops(const ModelSpec& m, const LayerShape& s, const ParallelConfig& p, int layer) {
  FlopsByPart x{};
  auto part = [&x](FlopPart f) -> double& { return x[static_cast<int>(f)]; };
  const double T = s.tokens, h = s.hidden, sp = s.sp_split;
  const double v_head = double(m.attn_out_dim()) / m.num_heads;
  if (m.is_mla()) {
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.head_dim - rope;
    part(FlopPart::qkv) = (rq > 0 ? 2 * (T / sp) * h * rq + 2 * T * rq * s.q_width : 2 * T * h * s.q_width) +
                          2 * (T / sp) * h * (rkv + rope) + 2 * T * rkv * s.heads * (nope + v_head);
  } else {
    part(FlopPart::qkv) = 2 * T * h * (s.q_width + 2 * s.kv_width);
  }
  const int window = m.attention_window(layer);
  const double keys = s.flash && window > 0 && window < s.seq_kv ? windowed_keys(m, s.seq_kv) : s.seq_kv;
  part(FlopPart::attention) = 2 * T * keys * s.causal_fraction * s.heads * (s.head_dim + v_head);
  part(FlopPart::out_proj) = 2 * T * s.heads * v_head * h;
  if (m.is_moe() && !m.is_dense_layer(layer)) {
    part(FlopPart::experts) = moe_expert_tokens(m, s, p) * mlp_flops(m, 1, m.ffn_hidden_size / double(p.expert_tp()));
    part(FlopPart::router) = 2 * moe_tokens_in(s) * h * m.num_experts;
    part(FlopPart::mlp) = mlp_flops(m, T, m.shared_expert_ffn_size / s.tp);
    if (m.shared_expert_ffn_size > 0 && m.shared_expert_gate) part(FlopPart::mlp) += 2 * (T / sp) * h;  // its [1, h] gate
  } else {
    part(FlopPart::mlp) = mlp_flops(m, T, (m.is_moe() ? m.dense_ffn_hidden_size : m.ffn_hidden_size) / s.tp);
  }
  return x;
}

// What recompute replays of that layer (recompute_flops' shares, applied to this layer's parts).
FlopsByPart rank_layer_recompute_flops(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p,
                                       const FlopsByPart& f, int layer) {
  FlopsByPart share{};
  auto set = [&share](FlopPart part, double x) { share[static_cast<int>(part)] = x; };
  switch (p.recompute) {
    case Recompute::none: return {};
    case Recompute::full: share.fill(1); break;
    case Recompute::selective:
      if (t.engine.selective == SelectiveRecompute::op_policy) {
        const OpPolicyShares op = op_policy_recompute_shares(m);
        set(FlopPart::qkv, op.qkv);
        set(FlopPart::out_proj, op.out_proj);
        set(FlopPart::mlp, op.mlp);
        set(FlopPart::experts, op.mlp);
      } else {
        const MegatronRecomputeShares mr = megatron_recompute_shares(m, t.recompute_modules);
        const bool moe_layer = m.is_moe() && !m.is_dense_layer(layer);
        set(FlopPart::attention, mr.attention);
        set(FlopPart::qkv, mr.qkv);
        set(FlopPart::experts, mr.routed_mlp);
        set(FlopPart::router, mr.routed_mlp);
        set(FlopPart::mlp, moe_layer ? mr.shared_mlp : mr.dense_mlp);
      }
      break;
  }
  share[static_cast<int>(FlopPart::head)] = 0;
  FlopsByPart x{};
  for (int i = 0; i < kNumFlopParts; ++i) x[i] = share[i] * f[i];
  return x;
}
}  // namespace

const char* to_string(FlopPart part) { return kFlopPartNames.at(static_cast<size_t>(part)); }

std::optional<FlopPart> flop_part_from_string(std::string_view name) {
  for (int i = 0; i < kNumFlopParts; ++i)
    if (name == kFlopPartNames[i]) return static_cast<FlopPart>(i);
  return std::nullopt;
}

RankStepFlops rank_step_flops(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p,
                              const std::vector<int>& layers, bool lm_head) {
  const LayerShape s = layer_shape(m, t, p);
  const double micro_batches = num_microbatches(t, p);
  RankStepFlops x;
  std::vector<int> all = layers;
  if (lm_head)
    for (int k = 0; k < m.mtp_layers; ++k) all.push_back(m.num_layers + k);  // the MTP modules' layers
  for (int layer : all) {
    const FlopsByPart f = rank_layer_forward_flops(m, s, p, layer);
    const FlopsByPart r = rank_layer_recompute_flops(m, t, p, f, layer);
    for (int i = 0; i < kNumFlopParts; ++i) {
      x.forward[i] += micro_batches * f[i];
      x.recompute[i] += micro_batches * r[i];
    }
  }
  // The LM head over this rank's tokens (gathered under sequence parallel) and its vocabulary slice
  // (edge_times), once more for each MTP module, and the modules' eh_proj (column-parallel, h x 2h).
  if (lm_head) {
    x.forward[static_cast<int>(FlopPart::head)] =
        (1 + m.mtp_layers) * micro_batches * 2 * s.tokens * s.hidden * (padded_vocab(m, t, p.tp) / double(p.tp));
    x.forward[static_cast<int>(FlopPart::mtp_proj)] =
        m.mtp_layers * micro_batches * 2 * s.tokens * 2 * s.hidden * s.hidden / s.tp;
  }
  return x;
}

EdgeTimes edge_times(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p) {
  const double B = activation_bytes(t.precision);
  const double T = double(p.micro_batch) * t.seq_len / p.cp;
  const double h = m.hidden_size, vocab = padded_vocab(m, t, p.tp) / double(p.tp);
  EdgeTimes e;
  // Embedding: gather T rows (read + write Th); backward scatters them into the gradient.
  e.embedding_forward_s = memory_time_s(gpu, 2 * T * h * B) + gpu.kernel_overhead_s;
  e.embedding_backward_s = 2 * e.embedding_forward_s;
  // LM head GEMM, then fp32 cross-entropy over the vocabulary shard: the logits
  // are written, read for max / sum-exp (vocab-parallel reductions) and
  // softmax, and written as the gradient.
  const LinearTimes head = linear_times(gpu, t.precision, T, vocab, h);
  double loss = memory_time_s(gpu, T * vocab * (B + 4 * 3)) + 4 * gpu.kernel_overhead_s;
  e.head_gemm_forward_s = head.forward_s;
  e.head_gemm_backward_s = head.backward_s;
  e.head_forward_s = head.forward_s + loss;
  e.head_backward_s = head.backward_s + memory_time_s(gpu, T * vocab * (4 + B));
  // MTP modules (ModelSpec::mtp_layers) beside the head: each looks up the next tokens' embeddings,
  // projects the 2h-wide concatenation back to h (eh_proj, column-parallel) and runs a head and loss
  // of its own; its transformer layer is priced as a layer of the loss chunk (stage_times).
  if (m.mtp_layers > 0) {
    const double d = m.mtp_layers;
    const LinearTimes eh = linear_times(gpu, t.precision, T, h / p.tp, 2 * h);
    e.head_forward_s += d * (e.head_forward_s + eh.forward_s + e.embedding_forward_s);
    e.head_backward_s += d * (e.head_backward_s + eh.backward_s + e.embedding_backward_s);
    e.head_gemm_forward_s += d * (head.forward_s + eh.forward_s);
    e.head_gemm_backward_s += d * (head.backward_s + eh.backward_s);
  }
  return e;
}

bool gradient_accumulation_fused(const TrainingSpec& t, const ParallelConfig& p) {
  // Megatron-FSDP (core_v0.15.0) asserts the fusion off: its ZeRO-2/3 strategies keep their own
  // gradient buffers, which the fused GEMM cannot write (export_megatron.cpp, sharding_arguments).
  if (t.engine.engine == Engine::megatron && p.zero_stage >= 2) return false;
  return t.gradient_accumulation_fusion;
}

double unfused_accumulation_s(const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p, double num_params) {
  if (gradient_accumulation_fused(t, p)) return 0;
  // Megatron-Core's DistributedDataParallel backward hook (core_v0.15.0,
  // distributed/distributed_data_parallel.py _make_backward_post_hook): with the fusion off the
  // weight-gradient GEMM writes param.grad in the parameter's type and the hook adds it into
  // main_grad (the gradient buffer: fp32 with fp32 gradients, else the parameter's type): read the
  // gradient, read and write main_grad. The fused GEMM's own read of main_grad is not priced
  // (GEMMs are priced with beta = 0), so this pass is the difference.
  const double param_bytes = t.precision == Precision::fp32 ? 4 : 2;
  const double buffer_bytes = bytes_per_param(t).grads;
  return memory_time_s(gpu, (param_bytes + 2 * buffer_bytes) * num_params);
}

double optimizer_step_s(const GpuSpec& gpu, const TrainingSpec& t, double num_params) {
  // Mixed precision: read grad (2 or 4), fp32 master, m, v (12); write master, m, v (12) and the
  // 16-bit weights (2). fp32: read grad, w, m, v (16), write w, m, v (12).
  const double bytes = t.precision == Precision::fp32 ? 28.0 : bytes_per_param(t).grads + 12 + 12 + 2;
  return memory_time_s(gpu, bytes * num_params) + gpu.kernel_overhead_s;
}

}  // namespace dplan::costmodel
