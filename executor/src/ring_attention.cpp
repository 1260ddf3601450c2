#include "ring_attention.h"

#include <optional>

#include <torch/torch.h>

#include "attention.h"

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tags of the ring's three streams (one Gloo process group per cp group; each stream is received
// in the order it is sent, which every member follows).
constexpr int kForwardKvTag = 1, kBackwardKvTag = 2, kBackwardDkvTag = 3;

// The keys of cp rank `src`'s block that this rank's query chunk `chunk` (0: chunk `rank`, 1:
// chunk 2cp-1-rank) sees: a prefix of the block [chunk src, chunk 2cp-1-src], of 0, c or 2c keys.
// Own block (src == rank): chunk 0 sees its own chunk causally; chunk 1 sees chunk `rank`
// (earlier) and itself causally, i.e. the 2c keys with the mask aligned to their end. Another
// block: chunk src is earlier than chunk 1 always and than chunk 0 iff src < rank; chunk 2cp-1-src
// is later than chunk 0 always and earlier than chunk 1 iff src > rank.
int64_t keys_seen(int rank, int src, int chunk, int64_t c) {
  if (src == rank) return chunk == 0 ? c : 2 * c;
  if (chunk == 0) return src < rank ? c : 0;
  return src > rank ? 2 * c : c;
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
                            Group* cp, PhaseClock* clock, int64_t block) {
    at::NoGradGuard no_grad;
    at::Tensor q_c = q.contiguous(), k_c = k.contiguous(), v_c = v.contiguous();
    TORCH_CHECK(q_c.dim() == 4 && k_c.dim() == 4 && v_c.sizes() == k_c.sizes() && k_c.size(2) == q_c.size(2) &&
                    q_c.size(2) % 2 == 0,
                "ring_attention: q [b, heads, 2c, d], k and v [b, kv_heads, 2c, d]");
    const int64_t b = q_c.size(0), heads = q_c.size(1), c = q_c.size(2) / 2, d = q_c.size(3);
    const int n = cp->size(), r = cp->rank();
    at::Tensor qf = q_c.to(at::kFloat);
    // The output accumulates in fp32 as [b, 2c, heads, d] (the returned layout), with the
    // log-sum-exp so far; step 0 (own block) gives every query at least its own key.
    at::Tensor acc = at::empty({b, 2 * c, heads, d}, qf.options());
    at::Tensor lse = at::empty({b, heads, 2 * c}, qf.options());
    at::Tensor kv = at::stack({k_c, v_c});  // what travels: [2, b, kv_heads, 2c, d]
    for (int t = 0; t < n; ++t) {
      const int src = (r - t + n) % n;
      std::optional<Transfer> next;
      if (t + 1 < n) next.emplace(*cp, kv, kForwardKvTag, clock);
      at::Tensor kf = kv[0].to(at::kFloat), vf = kv[1].to(at::kFloat);
      for (int chunk = 0; chunk < 2; ++chunk) {
        const int64_t keys = keys_seen(r, src, chunk, c);
        if (keys == 0) continue;
        at::Tensor qc = qf.narrow(2, chunk * c, c), acc_c = acc.narrow(1, chunk * c, c), lse_c = lse.narrow(2, chunk * c, c);
        if (t == 0) {
          attend_block(qc, kf.narrow(2, 0, keys), vf.narrow(2, 0, keys), /*causal=*/true, block, acc_c, lse_c);
          continue;
        }
        at::Tensor part = at::empty({b, c, heads, d}, qf.options()), part_lse = at::empty({b, heads, c}, qf.options());
        attend_block(qc, kf.narrow(2, 0, keys), vf.narrow(2, 0, keys), /*causal=*/false, block, part, part_lse);
        // softmax over the union of keys: weights exp(lse_i - lse_new), lse_new = log(e^lse + e^lse_t).
        at::Tensor merged = at::logaddexp(lse_c, part_lse);
        auto weight = [&](const at::Tensor& l) { return (l - merged).exp_().transpose(1, 2).unsqueeze(-1); };
        acc_c.mul_(weight(lse_c)).add_(part.mul_(weight(part_lse)));
        lse_c.copy_(merged);
      }
      if (next) kv = next->finish(clock);
    }
    at::Tensor out = acc.to(q_c.scalar_type()).view({b, 2 * c, heads * d});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(cp);
    ctx->saved_data["clock"] = reinterpret_cast<int64_t>(clock);
    ctx->saved_data["block"] = block;
    ctx->save_for_backward({q_c, k_c, v_c, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Group* cp = group_of(ctx);
    PhaseClock* clock = clock_of(ctx);
    const int64_t block = ctx->saved_data["block"].toInt();
    const int64_t b = q.size(0), heads = q.size(1), c = q.size(2) / 2, d = q.size(3);
    const int n = cp->size(), r = cp->rank();
    at::Tensor qf = q.to(at::kFloat);
    at::Tensor out4 = out.view({b, 2 * c, heads, d});
    at::Tensor dout4 = grad[0].reshape({b, 2 * c, heads, d});
    at::Tensor dq = at::zeros({b, heads, 2 * c, d}, qf.options());
    at::Tensor kv = at::stack({k, v});
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
      at::Tensor kf = kv[0].to(at::kFloat), vf = kv[1].to(at::kFloat);
      at::Tensor dkv = at::zeros({2, b, k.size(1), 2 * c, d}, qf.options());
      for (int chunk = 0; chunk < 2; ++chunk) {
        const int64_t keys = keys_seen(r, src, chunk, c);
        if (keys == 0) continue;
        attend_block_backward(qf.narrow(2, chunk * c, c), kf.narrow(2, 0, keys), vf.narrow(2, 0, keys),
                              out4.narrow(1, chunk * c, c), dout4.narrow(1, chunk * c, c), lse.narrow(2, chunk * c, c),
                              /*causal=*/t == 0, block, dq.narrow(2, chunk * c, c), dkv[0].narrow(2, 0, keys),
                              dkv[1].narrow(2, 0, keys));
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
    return {dq.to(q.scalar_type()), dkv_in[0], dkv_in[1], at::Tensor(), at::Tensor(), at::Tensor()};
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
                          PhaseClock* clock, int64_t block) {
  TORCH_CHECK(block > 0, "ring_attention: block must be positive");
  return RingAttention::apply(q, k, v, &cp, clock, block);
}

std::vector<at::Tensor> ring_attention_saved(const at::Tensor& out) {
  auto* node = dynamic_cast<torch::autograd::CppNode<RingAttention>*>(out.grad_fn().get());
  if (node == nullptr) return {};
  return node->ctx_.get_saved_variables();
}

}  // namespace dplan::executor
