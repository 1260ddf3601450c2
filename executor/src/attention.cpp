#include "attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Query heads are grouped by the kv head they read (head i reads kv head i / g, as
// repeat_interleave lays them out), so a query block viewed as [b, kv, g * n, d] multiplies K/V at
// kv width directly (its output coming out as [b, kv, g * n, dv]): K/V are never expanded, and
// P^T dO sums dV over the g heads for free. n queries against m keys; d the query/key head width,
// dv the value (and output) head width.
struct Shape {
  int64_t b, heads, kv, g, n, m, d, dv;
  double scale;
};

// `scale` 0: 1 / sqrt(d).
Shape shape_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* who, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && v.size(0) == k.size(0) && v.size(1) == k.size(1) &&
                  v.size(2) == k.size(2),
              who, ": q [b, heads, s, d], k [b, kv_heads, s, d] and v [b, kv_heads, s, dv]");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), who, ": q and k differ in batch or head size");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, who, ": heads % kv_heads != 0");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), who, ": q, k, v differ in dtype");
  TORCH_CHECK(scale >= 0 && std::isfinite(scale), who, ": the scale must be 0 (1 / sqrt(d)) or positive");
  return {q.size(0), q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2), k.size(2), q.size(3), v.size(3),
          scale > 0 ? scale : 1.0 / std::sqrt(double(q.size(3)))};
}

// Query rows [i0, i0 + n) of a [b, heads, sh.n, d] tensor, as [b, kv, g * n, d].
at::Tensor query_block(const at::Tensor& qf, const Shape& sh, int64_t i0, int64_t n) {
  return qf.view({sh.b, sh.kv, sh.g, sh.n, sh.d}).narrow(3, i0, n).reshape({sh.b, sh.kv, sh.g * n, sh.d});
}

// The keys query rows [i0, i0 + n) see, [lo, hi): later keys are hidden from every row of the
// query block by the causal mask, earlier ones by the window; empty when the block sees none.
struct KeyRange {
  int64_t lo, hi;
};
KeyRange keys_seen(const Shape& sh, const KeyMask& mask, int64_t i0, int64_t n) {
  const int64_t first = mask.q_first + i0, last = first + n - 1;  // the query rows' positions
  const int64_t hi = mask.causal ? std::clamp<int64_t>(last - mask.k_first + 1, 0, sh.m) : sh.m;
  const int64_t lo = mask.window > 0 ? std::clamp<int64_t>(first - mask.window + 1 - mask.k_first, 0, sh.m) : 0;
  return {lo, std::max(lo, hi)};
}

// Scaled scores of query rows [i0, i0 + n) against keys [lo, hi), as one fp32 tile
// [b, kv, g * n, keys] that callers turn into probabilities in place, -inf where the mask hides a
// key (only where it can: the causal mask where the keys reach past the first row, the window
// where they reach back beyond the last row's window).
at::Tensor scores(const at::Tensor& qb, const at::Tensor& kb, const Shape& sh, const KeyMask& mask, int64_t i0,
                  int64_t n, KeyRange keys) {
  at::Tensor s = at::matmul(qb, kb.transpose(-2, -1)).mul_(sh.scale);
  const int64_t q0 = mask.q_first + i0, k0 = mask.k_first + keys.lo, count = keys.hi - keys.lo;
  const bool future = mask.causal && k0 + count - 1 > q0;
  const bool past = mask.window > 0 && q0 + n - 1 - k0 >= mask.window;
  if (!future && !past) return s;
  const at::TensorOptions index = qb.options().dtype(at::kLong);
  at::Tensor q_pos = at::arange(q0, q0 + n, index).unsqueeze(1), tile = s.view({sh.b, sh.kv, sh.g, n, count});
  // Each mask over the columns it can hide only: the causal one over the keys after the first
  // query (the last n x n part of a diagonal block), the window over those before the last
  // query's window.
  auto hide = [&](int64_t from, int64_t to, auto&& hidden) {
    if (from >= to) return;
    at::Tensor k_pos = at::arange(k0 + from, k0 + to, index).unsqueeze(0);
    tile.narrow(-1, from, to - from).masked_fill_(hidden(k_pos), -std::numeric_limits<float>::infinity());
  };
  if (future) hide(std::max<int64_t>(0, q0 + 1 - k0), count, [&](const at::Tensor& k_pos) { return k_pos > q_pos; });
  if (past)
    hide(0, std::min<int64_t>(count, q0 + n - mask.window - k0),
         [&](const at::Tensor& k_pos) { return q_pos - k_pos >= mask.window; });
  return s;
}
}  // namespace

namespace {
// The keep mask of query block `i0` scaled by 1 / (1 - p), shaped like its probability tile: drawn
// on the CPU from a generator seeded by (seed, i0) alone, so backward draws the same one.
at::Tensor dropout_scale(const AttentionDropout& d, int64_t i0, const at::Tensor& tile) {
  at::Generator gen = at::detail::createCPUGenerator(d.seed ^ (static_cast<uint64_t>(i0 + 1) * 0x9E3779B97F4A7C15ULL));
  at::Tensor keep = at::empty(tile.sizes(), at::kFloat).bernoulli_(1.0 - d.probability, gen);
  return keep.mul_(1.0 / (1.0 - d.probability)).to(tile.device());
}
}  // namespace

void attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KeyMask& mask, int64_t block,
                  const at::Tensor& out4, const at::Tensor& lse, const AttentionDropout& dropout, double scale) {
  const Shape sh = shape_of(q, k, v, "attend_block", scale);
  at::Tensor lse4 = lse.view({sh.b, sh.kv, sh.g, sh.n});
  for (int64_t i0 = 0; i0 < sh.n; i0 += block) {
    const int64_t n = std::min(block, sh.n - i0);
    const KeyRange keys = keys_seen(sh, mask, i0, n);
    if (keys.hi == keys.lo) {  // the block's keys are all hidden from these queries
      out4.narrow(1, i0, n).zero_();
      lse4.narrow(3, i0, n).fill_(-std::numeric_limits<float>::infinity());
      continue;
    }
    at::Tensor p = scores(query_block(q, sh, i0, n), k.slice(2, keys.lo, keys.hi), sh, mask, i0, n, keys);
    // Softmax in place (at::logsumexp would allocate a second tile). A row that sees none of these
    // keys (all -inf) takes a finite maximum and a zero sum, so probabilities 0 and lse -inf.
    at::Tensor row_max = std::get<0>(p.max(-1, /*keepdim=*/true)).clamp_min_(std::numeric_limits<float>::lowest());
    at::Tensor row_sum = p.sub_(row_max).exp_().sum(-1, /*keepdim=*/true);
    p.div_(row_sum.clamp_min(std::numeric_limits<float>::min()));
    at::Tensor lse_b = row_max.add_(row_sum.log_());  // [b, kv, g * n, 1]
    if (dropout.probability > 0) p.mul_(dropout_scale(dropout, i0, p));
    at::Tensor o = at::matmul(p, v.slice(2, keys.lo, keys.hi));  // [b, kv, g * n, dv] == [b, heads, n, dv]
    out4.narrow(1, i0, n).copy_(o.view({sh.b, sh.heads, n, sh.dv}).transpose(1, 2));
    lse4.narrow(3, i0, n).copy_(lse_b.view({sh.b, sh.kv, sh.g, n}));
  }
}

void attend_block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out4,
                           const at::Tensor& dout4, const at::Tensor& lse, const KeyMask& mask, int64_t block,
                           const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                           const AttentionDropout& dropout, double scale) {
  const Shape sh = shape_of(q, k, v, "attend_block_backward", scale);
  at::Tensor lse4 = lse.view({sh.b, sh.kv, sh.g, sh.n});
  at::Tensor dq5 = dq.view({sh.b, sh.kv, sh.g, sh.n, sh.d});
  for (int64_t i0 = 0; i0 < sh.n; i0 += block) {
    const int64_t n = std::min(block, sh.n - i0);
    const KeyRange keys = keys_seen(sh, mask, i0, n);
    if (keys.hi == keys.lo) continue;
    at::Tensor qb = query_block(q, sh, i0, n);
    at::Tensor kb = k.slice(2, keys.lo, keys.hi), vb = v.slice(2, keys.lo, keys.hi);
    at::Tensor dout_b = dout4.narrow(1, i0, n).to(at::kFloat);                  // [b, n, heads, dv]
    at::Tensor delta = (dout_b * out4.narrow(1, i0, n).to(at::kFloat)).sum(-1);  // D = rowsum(dO * O)
    delta = delta.transpose(1, 2).reshape({sh.b, sh.kv, sh.g * n, 1});
    dout_b = dout_b.transpose(1, 2).reshape({sh.b, sh.kv, sh.g * n, sh.dv});
    // P = exp(S - lse), recomputed rather than stored.
    at::Tensor p = scores(qb, kb, sh, mask, i0, n, keys);
    p.sub_(lse4.narrow(3, i0, n).reshape({sh.b, sh.kv, sh.g * n, 1})).exp_();
    // dS = P * (dP - D), in dP's storage; masked entries have P = 0 and so dS = 0. With dropout
    // (O = (P Z) V, Z the scaled keep mask): dV = (P Z)^T dO, dP = (dO V^T) Z, and D = rowsum(dO O)
    // still equals rowsum(P dP) (Dao et al. 2022, Algorithm 4).
    at::Tensor ds = at::matmul(dout_b, vb.transpose(-2, -1));
    at::Tensor dvb = dv.slice(2, keys.lo, keys.hi);
    if (dropout.probability > 0) {
      const at::Tensor z = dropout_scale(dropout, i0, p);
      dvb.add_(at::matmul((p * z).transpose(-2, -1), dout_b));
      ds.mul_(z);
    } else {
      dvb.add_(at::matmul(p.transpose(-2, -1), dout_b));
    }
    ds.sub_(delta).mul_(p);
    p.reset();
    dq5.narrow(3, i0, n).add_(at::matmul(ds, kb).mul_(sh.scale).view({sh.b, sh.kv, sh.g, n, sh.d}));
    dk.slice(2, keys.lo, keys.hi).add_(at::matmul(ds.transpose(-2, -1), qb), sh.scale);
  }
}

void add_sinks(const at::Tensor& out4, const at::Tensor& lse, const at::Tensor& sinks) {
  at::Tensor sink = sinks.to(at::kFloat).view({1, -1, 1});
  at::Tensor merged = at::logaddexp(lse, sink);                            // [b, heads, n]
  out4.mul_((lse - merged).exp_().transpose(1, 2).unsqueeze(-1).to(out4.scalar_type()));
  lse.copy_(merged);
}

at::Tensor sinks_backward(const at::Tensor& out4, const at::Tensor& dout4, const at::Tensor& lse, const at::Tensor& sinks) {
  at::Tensor rowsum = (dout4.to(at::kFloat) * out4.to(at::kFloat)).sum(-1).transpose(1, 2);  // [b, heads, n]
  at::Tensor p_sink = (sinks.to(at::kFloat).view({1, -1, 1}) - lse).exp();
  return (p_sink * rowsum).sum(at::IntArrayRef{0, 2}).neg();
}

namespace {
struct FlashAttention : torch::autograd::Function<FlashAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t block, double dropout, int64_t window, const at::Tensor& sinks, double scale) {
    at::NoGradGuard no_grad;
    AttentionDropout drop{dropout, 0};
    if (dropout > 0)  // one draw from q's device's default generator: what recompute restores
      drop.seed = static_cast<uint64_t>(at::empty({1}, q.options().dtype(at::kLong)).random_().item<int64_t>());
    // contiguous() copies only a strided view (e.g. into a fused QKV output), which then is not kept.
    at::Tensor q_c = q.contiguous(), k_c = k.contiguous(), v_c = v.contiguous();
    const Shape sh = shape_of(q_c, k_c, v_c, "flash_attention", scale);
    TORCH_CHECK(sh.m == sh.n, "flash_attention: q and k/v differ in sequence length");
    at::Tensor out = at::empty({sh.b, sh.n, sh.heads * sh.dv}, q_c.options());
    at::Tensor lse = at::empty({sh.b, sh.heads, sh.n}, q_c.options().dtype(at::kFloat));
    at::Tensor out4 = out.view({sh.b, sh.n, sh.heads, sh.dv});
    const bool has_sinks = sinks.numel() > 0;  // an empty tensor stands for none (flash_attention)
    if (has_sinks) {  // the softmax in fp32 throughout, the sinks folded in before the output's rounding
      at::Tensor acc = at::empty({sh.b, sh.n, sh.heads, sh.dv}, q_c.options().dtype(at::kFloat));
      attend_block(q_c.to(at::kFloat), k_c.to(at::kFloat), v_c.to(at::kFloat), KeyMask{true, 0, 0, window}, block, acc,
                   lse, drop, scale);
      add_sinks(acc, lse, sinks);
      out4.copy_(acc);
    } else {
      attend_block(q_c.to(at::kFloat), k_c.to(at::kFloat), v_c.to(at::kFloat), KeyMask{true, 0, 0, window}, block, out4,
                   lse, drop, scale);
    }
    ctx->saved_data["block"] = block;
    ctx->saved_data["window"] = window;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["dropout_seed"] = static_cast<int64_t>(drop.seed);
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q_c, k_c, v_c, out, lse, has_sinks ? sinks : at::Tensor()});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const int64_t block = ctx->saved_data["block"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const Shape sh = shape_of(q, k, v, "flash_attention", scale);
    at::Tensor dq = at::zeros({sh.b, sh.heads, sh.n, sh.d}, q.options().dtype(at::kFloat));
    at::Tensor dk = at::zeros({sh.b, sh.kv, sh.m, sh.d}, dq.options());
    at::Tensor dv = at::zeros({sh.b, sh.kv, sh.m, sh.dv}, dq.options());
    const at::Tensor out4 = out.view({sh.b, sh.n, sh.heads, sh.dv});
    const at::Tensor dout4 = grad[0].reshape({sh.b, sh.n, sh.heads, sh.dv});
    attend_block_backward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), out4, dout4, lse,
                          KeyMask{true, 0, 0, ctx->saved_data["window"].toInt()}, block, dq, dk, dv,
                          {ctx->saved_data["dropout"].toDouble(),
                           static_cast<uint64_t>(ctx->saved_data["dropout_seed"].toInt())},
                          scale);
    const at::Tensor& sinks = saved[5];
    at::Tensor dsinks;
    if (sinks.defined()) dsinks = sinks_backward(out4, dout4, lse, sinks).to(sinks.scalar_type());
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(), at::Tensor(),
            at::Tensor(), dsinks, at::Tensor()};
  }
};
}  // namespace

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block,
                           double dropout, int64_t window, const at::Tensor& sinks, double scale) {
  TORCH_CHECK(block > 0, "flash_attention: block must be positive");
  TORCH_CHECK(!sinks.defined() || (sinks.dim() == 1 && sinks.size(0) == q.size(1)), "flash_attention: sinks [heads]");
  TORCH_CHECK(dropout >= 0 && dropout < 1, "flash_attention: dropout must be in [0, 1)");
  TORCH_CHECK(window >= 0, "flash_attention: the window must be 0 (none) or positive");
  TORCH_CHECK(scale >= 0 && std::isfinite(scale), "flash_attention: the scale must be 0 (1 / sqrt(d)) or positive");
  // Every tensor a Function takes must be defined (LibTorch 1.13 records each input's device):
  // an empty one stands for "no sinks".
  return FlashAttention::apply(q, k, v, block, dropout, window,
                               sinks.defined() ? sinks : at::empty({0}, q.options().dtype(at::kFloat)), scale);
}

std::vector<at::Tensor> flash_attention_saved(const at::Tensor& out) {
  auto* node = dynamic_cast<torch::autograd::CppNode<FlashAttention>*>(out.grad_fn().get());
  if (node == nullptr) return {};
  std::vector<at::Tensor> saved = node->ctx_.get_saved_variables();
  if (!saved.back().defined()) saved.pop_back();  // no sinks
  return saved;
}

}  // namespace dplan::executor
