#include "ring_attention.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "attention.h"

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tags of the ring's three streams (one Gloo process group per cp group; each stream is received
// in the order it is sent, which every member follows).
constexpr int kForwardKvTag = 1, kBackwardKvTag = 2, kBackwardDkvTag = 3;

// A part of a K,V block that one of this rank's query chunks sees, with its mask.
struct Piece {
  int query_chunk, key_chunk;
  KeyMask mask;
};

// The parts of cp rank `src`'s K,V block that this rank's query chunks see. The block holds the
// sequence chunks src (its rows 0 .. c) and 2cp-1-src (rows c .. 2c), this rank's queries the
// chunks rank (query chunk 0) and 2cp-1-rank (1); a key chunk is seen unless it is in the query
// chunk's future or, under a sliding window, wholly beyond it. Each comes with its mask by the
// tokens' true positions; in the own block (src == rank) each query chunk's own key chunk first,
// so that every query has seen a key (its own) before anything is merged into its output.
std::vector<Piece> pieces_seen(int rank, int src, int cp, int64_t c, int64_t window) {
  auto position = [&](int holder, int chunk) { return (chunk == 0 ? holder : 2 * cp - 1 - holder) * c; };
  std::vector<Piece> out;
  for (int qc = 0; qc < 2; ++qc) {
    const int64_t q_first = position(rank, qc);
    for (int kc : src == rank ? std::vector<int>{qc, 1 - qc} : std::vector<int>{0, 1}) {
      const int64_t k_first = position(src, kc);
      if (k_first > q_first) continue;                                     // the query chunk's future
      if (window > 0 && q_first - (k_first + c - 1) >= window) continue;  // beyond every query's window
      out.push_back({qc, kc, KeyMask{true, q_first, k_first, window}});
    }
  }
  return out;
}

// The dropout masks of one piece of one block: drawn from the forward's seed and the piece alone,
// so backward, which meets each piece once as forward did, draws them again.
AttentionDropout piece_dropout(double probability, int64_t seed, int src, const Piece& piece) {
  if (probability == 0) return {};
  const uint64_t which = static_cast<uint64_t>(src) * 4 + piece.query_chunk * 2 + piece.key_chunk + 1;
  return {probability, static_cast<uint64_t>(seed) ^ (which * 0xD1B54A32D192ED03ULL)};
}

// K [b, kv, 2c, d] and V [b, kv, 2c, dv] travel as one flat buffer, K's elements then V's (one
// transfer a step whatever V's head width; with dv == d the bytes of stacking them); dK, dV alike.
at::Tensor pack_kv(const at::Tensor& k, const at::Tensor& v) { return at::cat({k.reshape(-1), v.reshape(-1)}); }

// A flat K,V (or dK,dV) buffer's two parts, as contiguous views with the shapes of k and v.
std::pair<at::Tensor, at::Tensor> unpack_kv(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v) {
  return {kv.narrow(0, 0, k.numel()).view(k.sizes()), kv.narrow(0, k.numel(), v.numel()).view(v.sizes())};
}

// Times the enclosed ring communication into cp_comm when there is a clock.
struct RingScope {
  explicit RingScope(PhaseClock* clock) {
    if (clock) scope.emplace(*clock, Phase::cp_comm);
  }
  std::optional<PhaseScope> scope;
};

// Posts this step's transfer: `here` to the next member, the previous member's into a new tensor.
struct Transfer {
  Work send, recv;
  at::Tensor received;
  Transfer(Group& g, const at::Tensor& here, int tag, PhaseClock* clock) : received(at::empty_like(here)) {
    RingScope scope(clock);
    const int n = g.size(), r = g.rank();
    send = g.send(here, (r + 1) % n, tag);
    recv = g.recv(received, (r + n - 1) % n, tag);
  }
  at::Tensor finish(PhaseClock* clock) {
    RingScope scope(clock);
    send.wait();
    recv.wait();
    return received;
  }
};

Group* group_of(AutogradContext* ctx) { return reinterpret_cast<Group*>(ctx->saved_data["group"].toInt()); }
PhaseClock* clock_of(AutogradContext* ctx) { return reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt()); }

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            Group* cp, PhaseClock* clock, int64_t block, int64_t window, const at::Tensor& sinks,
                            double dropout, int64_t dropout_seed, double scale) {
    at::NoGradGuard no_grad;
    at::Tensor q_c = q.contiguous(), k_c = k.contiguous(), v_c = v.contiguous();
    TORCH_CHECK(q_c.dim() == 4 && k_c.dim() == 4 && v_c.dim() == 4 &&
                    v_c.sizes().slice(0, 3) == k_c.sizes().slice(0, 3) && k_c.size(2) == q_c.size(2) &&
                    q_c.size(2) % 2 == 0,
                "ring_attention: q [b, heads, 2c, d], k [b, kv_heads, 2c, d] and v [b, kv_heads, 2c, dv]");
    TORCH_CHECK(k_c.scalar_type() == q_c.scalar_type() && v_c.scalar_type() == q_c.scalar_type(),
                "ring_attention: q, k, v differ in dtype");
    const int64_t b = q_c.size(0), heads = q_c.size(1), c = q_c.size(2) / 2, dv = v_c.size(3);
    const int n = cp->size(), r = cp->rank();
    at::Tensor qf = q_c.to(at::kFloat);
    // The output accumulates in fp32 as [b, 2c, heads, dv] (the returned layout), with the
    // log-sum-exp so far; step 0 (own block) gives every query at least its own key.
    at::Tensor acc = at::empty({b, 2 * c, heads, dv}, qf.options());
    at::Tensor lse = at::empty({b, heads, 2 * c}, qf.options());
    at::Tensor kv = pack_kv(k_c, v_c);  // what travels
    for (int t = 0; t < n; ++t) {
      const int src = (r - t + n) % n;
      std::optional<Transfer> next;
      if (t + 1 < n) next.emplace(*cp, kv, kForwardKvTag, clock);
      const auto [kt, vt] = unpack_kv(kv, k_c, v_c);
      at::Tensor kf = kt.to(at::kFloat), vf = vt.to(at::kFloat);
      for (const Piece& piece : pieces_seen(r, src, n, c, window)) {
        const int64_t q0 = piece.query_chunk * c, k0 = piece.key_chunk * c;
        at::Tensor qc = qf.narrow(2, q0, c), acc_c = acc.narrow(1, q0, c), lse_c = lse.narrow(2, q0, c);
        at::Tensor kc = kf.narrow(2, k0, c), vc = vf.narrow(2, k0, c);
        const AttentionDropout drop = piece_dropout(dropout, dropout_seed, src, piece);
        if (t == 0 && piece.key_chunk == piece.query_chunk) {  // the diagonal: the first keys these queries see
          attend_block(qc, kc, vc, piece.mask, block, acc_c, lse_c, drop, scale);
          continue;
        }
        at::Tensor part = at::empty({b, c, heads, dv}, qf.options()), part_lse = at::empty({b, heads, c}, qf.options());
        attend_block(qc, kc, vc, piece.mask, block, part, part_lse, drop, scale);
        // softmax over the union of keys: weights exp(lse_i - lse_new), lse_new = log(e^lse + e^lse_t)
        // (a query that saw none of the piece's keys has lse_t = -inf, weight 0).
        at::Tensor merged = at::logaddexp(lse_c, part_lse);
        auto weight = [&](const at::Tensor& l) { return (l - merged).exp_().transpose(1, 2).unsqueeze(-1); };
        acc_c.mul_(weight(lse_c)).add_(part.mul_(weight(part_lse)));
        lse_c.copy_(merged);
      }
      if (next) kv = next->finish(clock);
    }
    const bool has_sinks = sinks.numel() > 0;  // an empty tensor stands for none (ring_attention)
    if (has_sinks) add_sinks(acc, lse, sinks);  // every query's softmax complete: fold the sinks in
    at::Tensor out = acc.to(q_c.scalar_type()).view({b, 2 * c, heads * dv});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(cp);
    ctx->saved_data["clock"] = reinterpret_cast<int64_t>(clock);
    ctx->saved_data["block"] = block;
    ctx->saved_data["window"] = window;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["dropout_seed"] = dropout_seed;
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q_c, k_c, v_c, out, lse, has_sinks ? sinks : at::Tensor()});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Group* cp = group_of(ctx);
    PhaseClock* clock = clock_of(ctx);
    const int64_t block = ctx->saved_data["block"].toInt(), window = ctx->saved_data["window"].toInt();
    const double dropout = ctx->saved_data["dropout"].toDouble();
    const int64_t dropout_seed = ctx->saved_data["dropout_seed"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t b = q.size(0), heads = q.size(1), c = q.size(2) / 2, d = q.size(3), dv = v.size(3);
    const int n = cp->size(), r = cp->rank();
    at::Tensor qf = q.to(at::kFloat);
    at::Tensor out4 = out.view({b, 2 * c, heads, dv});
    at::Tensor dout4 = grad[0].reshape({b, 2 * c, heads, dv});
    at::Tensor dq = at::zeros({b, heads, 2 * c, d}, qf.options());
    at::Tensor kv = pack_kv(k, v);
    std::vector<Work> dkv_sends;
    std::vector<at::Tensor> dkv_sent;  // alive until their sends complete
    at::Tensor dkv_in;
    Work dkv_recv;
    auto post_dkv_recv = [&]() {
      RingScope scope(clock);
      dkv_in = at::empty_like(kv);
      dkv_recv = cp->recv(dkv_in, (r + n - 1) % n, kBackwardDkvTag);
    };
    for (int t = 0; t < n; ++t) {
      const int src = (r - t + n) % n;
      std::optional<Transfer> next;
      if (t + 1 < n) next.emplace(*cp, kv, kBackwardKvTag, clock);
      if (t > 0) post_dkv_recv();  // block src's dK,dV so far, from the member that held it last step
      const auto [kt, vt] = unpack_kv(kv, k, v);
      at::Tensor kf = kt.to(at::kFloat), vf = vt.to(at::kFloat);
      at::Tensor dkv = at::zeros({k.numel() + v.numel()}, qf.options());  // dK, dV packed as K, V
      const auto [dk_src, dv_src] = unpack_kv(dkv, k, v);
      for (const Piece& piece : pieces_seen(r, src, n, c, window)) {
        const int64_t q0 = piece.query_chunk * c, k0 = piece.key_chunk * c;
        attend_block_backward(qf.narrow(2, q0, c), kf.narrow(2, k0, c), vf.narrow(2, k0, c), out4.narrow(1, q0, c),
                              dout4.narrow(1, q0, c), lse.narrow(2, q0, c), piece.mask, block, dq.narrow(2, q0, c),
                              dk_src.narrow(2, k0, c), dv_src.narrow(2, k0, c),
                              piece_dropout(dropout, dropout_seed, src, piece), scale);
      }
      if (t > 0) {
        RingScope scope(clock);
        dkv_recv.wait();
        dkv.add_(dkv_in);
      }
      {
        RingScope scope(clock);
        dkv_sent.push_back(dkv.to(k.scalar_type()));
        dkv_sends.push_back(cp->send(dkv_sent.back(), (r + 1) % n, kBackwardDkvTag));
      }
      if (next) kv = next->finish(clock);
    }
    post_dkv_recv();  // this rank's own block, home from the last member to hold it
    {
      RingScope scope(clock);
      dkv_recv.wait();
      for (Work& w : dkv_sends) w.wait();
    }
    // The sinks' gradient from this rank's queries (summed over cp with the other replicated parameters').
    at::Tensor dsinks;
    if (saved[5].defined()) dsinks = sinks_backward(out4, dout4, lse, saved[5]).to(saved[5].scalar_type());
    const auto [dk_own, dv_own] = unpack_kv(dkv_in, k, v);  // this rank's block's, complete
    return {dq.to(q.scalar_type()), dk_own, dv_own, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), dsinks,
            at::Tensor(),           at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor cp_chunks(const at::Tensor& full, int64_t dim, int cp, int rank) {
  if (cp <= 1) return full;
  TORCH_CHECK(full.size(dim) % (2 * cp) == 0, "cp_chunks: ", full.size(dim), " is not divisible by 2 * cp = ", 2 * cp);
  const int64_t c = full.size(dim) / (2 * cp);
  return at::cat({full.narrow(dim, rank * c, c), full.narrow(dim, (2 * cp - 1 - rank) * c, c)}, dim);
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Group& cp,
                          PhaseClock* clock, int64_t window, const at::Tensor& sinks, const AttentionDropout& dropout,
                          int64_t block, double scale) {
  TORCH_CHECK(block > 0, "ring_attention: block must be positive");
  TORCH_CHECK(scale >= 0 && std::isfinite(scale), "ring_attention: the scale must be 0 (1 / sqrt(d)) or positive");
  TORCH_CHECK(window >= 0, "ring_attention: the window must be 0 (none) or positive");
  TORCH_CHECK(dropout.probability >= 0 && dropout.probability < 1, "ring_attention: dropout must be in [0, 1)");
  // An empty tensor stands for "no sinks": every tensor a Function takes must be defined.
  return RingAttention::apply(q, k, v, &cp, clock, block, window,
                              sinks.defined() ? sinks : at::empty({0}, q.options().dtype(at::kFloat)),
                              dropout.probability, static_cast<int64_t>(dropout.seed), scale);
}

std::vector<at::Tensor> ring_attention_saved(const at::Tensor& out) {
  auto* node = dynamic_cast<torch::autograd::CppNode<RingAttention>*>(out.grad_fn().get());
  if (node == nullptr) return {};
  std::vector<at::Tensor> saved = node->ctx_.get_saved_variables();
  if (!saved.back().defined()) saved.pop_back();  // no sinks
  return saved;
}

}  // namespace dplan::executor
