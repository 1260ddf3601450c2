#include "dplan/costmodel/compute.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace dplan::costmodel {

LayerFlops layer_forward_flops(const ModelSpec& m, double tokens, double seq_len) {
  const double h = m.hidden_size, q = m.q_dim(), kv = m.kv_dim(), f = m.ffn_hidden_size;
  LayerFlops x;
  x.qkv = 2 * tokens * h * (q + 2 * kv);
  x.attention = 2 * (2 * tokens * seq_len * q);  // QK^T and PV over all heads
  x.out_proj = 2 * tokens * q * h;
  double mlp = (m.mlp == MlpKind::swiglu ? 6.0 : 4.0) * tokens * h * f;
  if (m.is_moe()) {
    x.mlp = m.experts_per_token * mlp;
    x.router = 2 * tokens * h * m.num_experts;
  } else {
    x.mlp = mlp;
  }
  return x;
}

double head_forward_flops(const ModelSpec& m, double tokens, double vocab) { return 2 * tokens * m.hidden_size * vocab; }

double model_flops_per_step(const ModelSpec& m, const TrainingSpec& t) {
  double tokens = double(t.global_batch) * t.seq_len;
  double forward = m.num_layers * layer_forward_flops(m, tokens, t.seq_len).total() +
                   head_forward_flops(m, tokens, m.vocab_size);
  return 3 * forward;
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
  const double compute_s =
      flops / (peak_flops_per_s(gpu, precision) * gpu.matmul_max_efficiency * gpu.sustained_fraction * wave_efficiency);
  const double element = precision == Precision::fp32 ? 4.0 : precision == Precision::fp8 ? 1.0 : 2.0;
  const double bytes = element * batch * (m * k + k * n + m * n);
  return std::max(compute_s, memory_time_s(gpu, bytes)) + gpu.kernel_overhead_s;
}

LinearTimes linear_times(const GpuSpec& gpu, Precision precision, double tokens, double out, double in) {
  return {gemm_time_s(gpu, precision, tokens, out, in, 1, GemmOp::forward),
          gemm_time_s(gpu, precision, tokens, in, out, 1, GemmOp::dgrad) +
              gemm_time_s(gpu, precision, out, in, tokens, 1, GemmOp::wgrad)};
}

double memory_time_s(const GpuSpec& gpu, double bytes) {
  return bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency);
}

LayerTimes layer_times(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p) {
  const Precision prec = t.precision;
  const double B = activation_bytes(prec);
  const double b = p.micro_batch, s_q = double(t.seq_len) / p.cp, s_kv = t.seq_len;
  const double T = b * s_q;                                      // tokens on this GPU
  const double tp = p.tp, h = m.hidden_size, d = m.head_dim;
  const double q = m.q_dim() / tp, kv = m.kv_dim() / tp, f = m.ffn_hidden_size / tp;
  const double heads = m.num_heads / tp;
  const double sp = p.sequence_parallel ? tp : 1.0;             // element-wise work split by SP
  const double gated = m.mlp == MlpKind::swiglu ? 2.0 : 1.0;
  const bool flash = t.attention == Attention::flash;
  // Causal flash attention skips the masked half of the score blocks (Dao 2023, FlashAttention-2).
  const double causal = flash ? 0.5 : 1.0;

  // GEMMs: forward, and backward's input and weight gradients (linear_times).
  const LinearTimes qkv = linear_times(gpu, prec, T, q + 2 * kv, h);
  double core = gemm_time_s(gpu, prec, s_q, s_kv * causal, d, b * heads, GemmOp::batched) +
                gemm_time_s(gpu, prec, s_q, d, s_kv * causal, b * heads, GemmOp::batched);
  // Flash attention's backward does 2.5x the forward's matmul work (recomputes the scores: Dao
  // 2023); unfused attention's backward is 2x like every GEMM. Where the profile measured the
  // framework's own flash-attention kernel, its times replace both.
  double core_backward = (flash ? 2.5 : 2.0) * core;
  if (flash) {
    const double fwd = measured_gemm_flops_per_s(gpu, prec, s_q, s_kv, d, b * heads, GemmOp::attention_forward);
    const double bwd = measured_gemm_flops_per_s(gpu, prec, s_q, s_kv, d, b * heads, GemmOp::attention_backward);
    if (fwd > 0 && bwd > 0) {
      const double flops = 2 * s_q * s_kv * d * b * heads;
      core = flops / (fwd * gpu.sustained_fraction);
      core_backward = flops / (bwd * gpu.sustained_fraction);
    }
  }
  const LinearTimes out = linear_times(gpu, prec, T, h, q);
  LinearTimes mlp;
  auto add = [](LinearTimes& sum, const LinearTimes& x, double times = 1.0) {
    sum.forward_s += times * x.forward_s;
    sum.backward_s += times * x.backward_s;
  };
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
  const double moe_tokens_in = T / tp;  // tokens a rank brings to the MoE layer
  const double moe_tokens = moe_tokens_in * m.experts_per_token * p.expert_tp();  // tokens its experts see
  if (m.is_moe()) {
    const double experts_local = double(m.num_experts) / p.ep;
    const double tokens_per_expert = moe_tokens / experts_local;
    const double fe = double(m.ffn_hidden_size) / p.expert_tp();  // expert FFN columns per rank
    auto grouped = [&](double out, double in) {
      return LinearTimes{gemm_time_s(gpu, prec, tokens_per_expert, out, in, experts_local, GemmOp::forward),
                         gemm_time_s(gpu, prec, tokens_per_expert, in, out, experts_local, GemmOp::dgrad) +
                             gemm_time_s(gpu, prec, out, in, tokens_per_expert, experts_local, GemmOp::wgrad)};
    };
    add(mlp, grouped(gated * fe, h));
    add(mlp, grouped(h, fe));
    add(mlp, linear_times(gpu, prec, moe_tokens_in, m.num_experts, h));  // router
  } else {
    add(mlp, linear_times(gpu, prec, T, gated * f, h));
    add(mlp, linear_times(gpu, prec, T, h, f));
  }

  // Forward element-wise traffic (bytes): two norms (read x, write y), two residual adds with
  // dropout (read 2, write 1, 1-byte mask), rotary on q and k, the MLP activation, and with
  // standard attention the fused scale-mask-softmax (read + write) and attention dropout.
  double elementwise = 2 * (2 * T * h * B) / sp;
  elementwise += 2 * (3 * T * h * B + (m.hidden_dropout > 0 ? T * h : 0)) / sp;
  if (m.position == PositionKind::rotary) elementwise += 2 * T * (q + kv) * B;
  // The MLP activation: on T tokens x f/tp columns; an MoE rank's on its experts' tokens x f/etp.
  elementwise += (m.is_moe() ? moe_tokens * m.ffn_hidden_size / p.expert_tp() : T * f) * B * (gated + 1);
  double attention_elementwise = 0;
  if (!flash) {
    double scores = b * heads * s_q * s_kv;
    attention_elementwise = 2 * scores * B + (m.attention_dropout > 0 ? 2 * scores * B + scores : 0);
  }
  double moe_kernels = 0;
  if (m.is_moe()) {
    // Permute: gather the k copies of each token into expert order (read and write (T/tp)*k*h);
    // un-permute: read them back, weight by the routing probabilities and sum into T/tp tokens;
    // with etp > 1 the gathered tokens are re-sorted by expert once more each way
    // (sort_chunks_by_idxs). Router: fp32 logits written by the GEMM, read by softmax and top-k,
    // probabilities written (3 passes of 4 bytes over T/tp x E).
    const double k = m.experts_per_token, etp = p.expert_tp();
    elementwise += (2 * k + (k + 1)) * moe_tokens_in * h * B;
    if (etp > 1) elementwise += 2 * 2 * moe_tokens * h * B;
    elementwise += 3 * 4.0 * moe_tokens_in * m.num_experts;
    moe_kernels = 6;  // softmax, top-k, permute, un-permute, aux loss, and the probabilities' scatter
  }
  double elementwise_s = memory_time_s(gpu, elementwise) + (8 + moe_kernels) * gpu.kernel_overhead_s;
  double attention_elementwise_s = memory_time_s(gpu, attention_elementwise);

  LayerTimes x;
  x.gemm_forward_s = qkv.forward_s + core + out.forward_s + mlp.forward_s;
  x.gemm_backward_s = qkv.backward_s + out.backward_s + mlp.backward_s + core_backward;
  x.attention_core_s = core + attention_elementwise_s;
  x.forward_s = qkv.forward_s + core + out.forward_s + mlp.forward_s + elementwise_s + attention_elementwise_s;
  x.backward_s =
      qkv.backward_s + out.backward_s + mlp.backward_s + core_backward + 2 * (elementwise_s + attention_elementwise_s);
  switch (p.recompute) {
    case Recompute::full: x.recompute_s = x.forward_s; break;
    case Recompute::selective: x.recompute_s = x.attention_core_s; break;
    case Recompute::none: break;
  }
  LayerFlops fl = layer_forward_flops(m, T, s_kv);
  x.forward_flops = (fl.total() - fl.attention * (1 - causal)) / tp;
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
  return e;
}

double optimizer_step_s(const GpuSpec& gpu, const TrainingSpec& t, double num_params) {
  // Mixed precision: read grad (2 or 4), fp32 master, m, v (12); write master, m, v (12) and the
  // 16-bit weights (2). fp32: read grad, w, m, v (16), write w, m, v (12).
  double bytes_per_param = t.precision == Precision::fp32 ? 28.0 : (t.fp32_grads ? 4.0 : 2.0) + 12 + 12 + 2;
  return memory_time_s(gpu, bytes_per_param * num_params) + gpu.kernel_overhead_s;
}

}  // namespace dplan::costmodel
