#include "moe.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include <torch/torch.h>

#include "fused_ops.h"
#include "gpt.h"
#include "memory_meter.h"
#include "phase_clock.h"
#include "tp_ops.h"

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The all-to-all of the dispatcher: rows send[j] to member j, recv[i] from member i; backward
// sends the gradients back the way the rows came (the reverse all-to-all).
struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, PhaseClock* clock,
                            std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["clock"] = reinterpret_cast<int64_t>(clock);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    PhaseScope scope(*clock, Phase::ep_comm);
    return g->all_to_all(x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    Group& g = *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    PhaseClock& clock = *reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt());
    PhaseScope scope(clock, Phase::ep_comm);
    at::Tensor back = g.all_to_all(grad[0], ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector());
    return {back, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Over the etp group, rows[i] rows from member i (each padded to the largest, so that the
// collectives are the equal-split ones comm.h has). gather: every member's rows, in member order;
// scatter: the sum over the members of [sum(rows), h], this member's rows of it.
// The padded staging tensors are the collective's buffers (CommunicationScope), what a
// variable-split collective would not need; only the result counts as activation memory.
at::Tensor gather_rows(const at::Tensor& x, Group& g, const std::vector<int64_t>& rows) {
  const int64_t most = *std::max_element(rows.begin(), rows.end());
  std::vector<at::Tensor> parts;
  at::Tensor all;
  {
    CommunicationScope buffers;
    at::Tensor padded = at::zeros({most, x.size(1)}, x.options());
    padded.narrow(0, 0, x.size(0)).copy_(x);
    all = g.all_gather(padded, 0);
  }
  for (int i = 0; i < g.size(); ++i) parts.push_back(all.narrow(0, i * most, rows[i]));
  return at::cat(parts, 0);
}
at::Tensor scatter_rows(const at::Tensor& x, Group& g, const std::vector<int64_t>& rows) {
  const int64_t most = *std::max_element(rows.begin(), rows.end());
  at::Tensor mine;
  {
    CommunicationScope buffers;
    at::Tensor padded = at::zeros({g.size() * most, x.size(1)}, x.options());
    int64_t first = 0;
    for (int i = 0; i < g.size(); ++i) {
      padded.narrow(0, i * most, rows[i]).copy_(x.narrow(0, first, rows[i]));
      first += rows[i];
    }
    mine = g.reduce_scatter(padded, 0);
  }
  return mine.narrow(0, 0, rows[g.rank()]).contiguous();
}

// etp > 1: the received tokens all-gathered before the experts (backward: the partial input
// gradients reduce-scattered), and the experts' partial outputs reduce-scattered after (backward:
// all-gathered); Megatron's gather_from_sequence_parallel_region / reduce_scatter_to_sequence_
// parallel_region with output_split_sizes.
struct EtpRows : torch::autograd::Function<EtpRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, PhaseClock* clock,
                            std::vector<int64_t> rows, bool gather) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["clock"] = reinterpret_cast<int64_t>(clock);
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["gather"] = gather;
    PhaseScope scope(*clock, Phase::ep_comm);
    return gather ? gather_rows(x, *g, rows) : scatter_rows(x, *g, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    Group& g = *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    PhaseClock& clock = *reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt());
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    PhaseScope scope(clock, Phase::ep_comm);
    at::Tensor back = ctx->saved_data["gather"].toBool() ? scatter_rows(grad[0], g, rows) : gather_rows(grad[0], g, rows);
    return {back, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct AttachAuxLoss : torch::autograd::Function<AttachAuxLoss> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& out, const at::Tensor&) {
    return out.view_as(out);
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], at::ones({}, grad[0].options().dtype(at::kFloat))};
  }
};

// Without sequence parallel the tokens are replicated over tp: each tp rank routes its 1/tp of
// them (copy_to_tp: the input gradients, zero outside each rank's part, are summed in backward).
at::Tensor tp_share_of_tokens(const at::Tensor& x, Group& tp, PhaseClock& clock) {
  if (x.size(1) % tp.size() != 0)
    throw std::invalid_argument("seq_len (" + std::to_string(x.size(1)) + ") is not divisible by tp = " +
                                std::to_string(tp.size()) + " (the MoE layer splits the tokens over tp)");
  const int64_t part = x.size(1) / tp.size();
  return copy_to_tp(x, tp, clock).narrow(1, tp.rank() * part, part);
}

// Every tp rank's part [b, s/tp, h] of the output back into the replicated [b, s, h].
at::Tensor tp_shares_summed(const at::Tensor& y, Group& tp, PhaseClock& clock) {
  const int64_t part = y.size(1);
  at::Tensor full = at::constant_pad_nd(y, {0, 0, tp.rank() * part, (tp.size() - 1 - tp.rank()) * part});
  return reduce_from_tp(full, tp, clock);
}

// The per-sequence load-balancing loss, from statistics summed over the ranks holding parts of
// the sequence. probs [b * s, E]: the router's probabilities; top_e [b * s, k]: the chosen experts.
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& top_e, int64_t b, int64_t s, int seq_len,
                               double aux_scale, ParallelContext& ctx) {
  const int64_t E = probs.size(-1), k = top_e.size(-1);
  at::Tensor p_sum = probs.view({b, s, E}).sum(1);  // [b, E]
  at::Tensor routed = at::one_hot(top_e.view({b, s * k}), E).sum(1).to(at::kFloat);  // [b, E]
  for (Group* g : {&ctx.tp, &ctx.cp}) {
    if (g->size() <= 1) continue;  // tp: its ranks hold different tokens (sequence parallel, or split above)
    p_sum = reduce_from_tp(p_sum, *g, ctx.clock);  // forward sum, backward identity: each rank its part
    PhaseScope scope(ctx.clock, Phase::tp_comm);
    g->all_reduce(routed);
  }
  const double S = seq_len;
  at::Tensor per_sequence = (routed / (S * k) * (p_sum / S)).sum(-1) * double(E);  // [b]
  return per_sequence.sum() * aux_scale;
}

// The router's choice for tokens [N, h]: each token's k experts [N, k], their weights [N, k] (fp32,
// as Megatron's moe_router_dtype and transformers compute them), and the probabilities [N, E] the
// load-balancing loss reads.
struct Routing {
  at::Tensor experts, weights, probs;
};
Routing route(const costmodel::ModelSpec& model, const MoeWeights& w, const at::Tensor& tokens, ParallelContext& ctx) {
  using Score = costmodel::ModelSpec::RouterScore;
  const int64_t E = model.num_experts, k = model.experts_per_token;
  const bool sigmoid = model.moe_router_score == Score::sigmoid;
  // gpt-oss's router bias enters the logits; a sigmoid router's (DeepSeek-V3's correction bias)
  // only the choice below.
  at::Tensor logits = w.router_bias.defined() && !sigmoid ? at::linear(tokens, w.router, w.router_bias)
                                                          : at::linear(tokens, w.router);
  ctx.count_linear(costmodel::FlopPart::router, logits, w.router);
  at::Tensor scores = sigmoid ? logits.to(at::kFloat).sigmoid() : at::softmax(logits.to(at::kFloat), -1);  // [N, E]
  Routing r;
  if (!sigmoid && model.moe_groups == 0) {
    std::tie(r.weights, r.experts) = scores.topk(k, -1);
  } else {
    // DeepSeek (transformers 5.23 DeepseekV2TopkRouter, DeepseekV3TopkRouter): the choice by the
    // scores plus the correction bias, among the best groups' experts only; the weights are the
    // chosen experts' scores without the bias.
    at::Tensor choice = scores.detach();
    if (sigmoid && w.router_bias.defined()) choice = choice + w.router_bias.detach().to(at::kFloat);
    if (model.moe_groups > 0) {
      const int64_t groups = model.moe_groups, per_group = E / groups;
      at::Tensor by_group = choice.view({-1, groups, per_group});
      // A group's score: its best expert's (V2's group_limited_greedy), or its two best summed (V3).
      at::Tensor group_score = sigmoid ? std::get<0>(by_group.topk(2, -1)).sum(-1) : std::get<0>(by_group.max(-1));
      at::Tensor kept = at::zeros_like(group_score, at::kBool).scatter_(1, std::get<1>(group_score.topk(model.moe_group_topk, -1)), true);
      // Outside the kept groups: -inf (V3), 0 (V2: its scores are positive, so the same choice).
      choice = choice.masked_fill(kept.logical_not().unsqueeze(-1).expand({-1, groups, per_group}).reshape({-1, E}),
                                  -std::numeric_limits<float>::infinity());
    }
    r.experts = std::get<1>(choice.topk(k, -1));
    r.weights = scores.gather(1, r.experts);  // the gradient reaches the router through these
    // The correction bias takes part with a zero derivative: its gradient arrives, zero, as every
    // parameter's must (ZeRO-3 frees a layer's parameters once all its gradients are in), and AdamW
    // leaves it as it is (zero moments, no decay): trained by no gradient, as transformers' buffer.
    if (sigmoid && w.router_bias.defined())
      r.weights = r.weights + w.router_bias.sum().to(at::kFloat) * 0.0;
  }
  // MixtralSparseMoeBlock: routing_weights /= sum; Qwen-MoE's and DeepSeek-V3's only with
  // norm_topk_prob (V3 adds 1e-20 to the sum of its sigmoid scores).
  if (model.moe_norm_topk_prob) r.weights = r.weights / (sigmoid ? r.weights.sum(-1, true) + 1e-20 : r.weights.sum(-1, true));
  if (model.moe_routed_scaling != 1.0) r.weights = r.weights * model.moe_routed_scaling;
  // The balance loss's probabilities: a sigmoid router's scores normalised over the experts
  // (Megatron-LM moe_utils.py compute_routing_scores_for_aux_loss, score_function "sigmoid").
  r.probs = sigmoid ? scores / (scores.sum(-1, true) + 1e-20) : scores;
  return r;
}

// Dispatch: the N*k routed copies ordered by expert (stable: a token's copies keep slot order), and
// how many go between this rank and each ep rank.
struct Dispatch {
  int n_ep = 1;                     // ep ranks
  int64_t local = 0;                // experts per ep rank
  at::Tensor order;                 // [N k]: the routed copies (token * k + slot) by expert
  at::Tensor token_of;              // [N k]: the token of each ordered copy
  at::Tensor per_expert;            // [E]: this rank's copies per expert
  at::Tensor all_counts;            // [ep, E]: every ep rank's copies per expert
  at::Tensor mine;                  // [ep, local]: what each sends to my experts
  std::vector<int64_t> send, recv;  // copies to, and from, each ep rank
};

Dispatch dispatch_counts(const at::Tensor& top_e, int64_t E, int64_t k, ParallelContext& ctx) {
  Dispatch d;
  at::Tensor flat_e = top_e.reshape({-1});
  d.order = std::get<1>(at::sort(flat_e, /*stable=*/true, 0, false));
  d.token_of = at::div(d.order, k, "floor");  // the token of each ordered copy
  d.per_expert = at::bincount(flat_e, {}, E);  // [E]
  Group& ep = ctx.ep;
  d.n_ep = std::max(1, ep.size());
  const int me = d.n_ep > 1 ? ep.rank() : 0;
  d.local = E / d.n_ep;
  d.all_counts = d.per_expert.view({1, E});  // [ep, E]: every ep rank's copies per expert
  if (d.n_ep > 1) {
    PhaseScope scope(ctx.clock, Phase::ep_comm);
    d.all_counts = ep.all_gather(d.per_expert, 0).view({d.n_ep, E});
  }
  d.send = to_vector(d.per_expert.view({d.n_ep, d.local}).sum(1));
  d.mine = d.all_counts.narrow(1, me * d.local, d.local);  // [ep, local]: what each sends to my experts
  d.recv = to_vector(d.mine.sum(1));
  return d;
}

// x / parts forward, the gradient passed whole: a bias each of `parts` ranks adds to its partial
// output before they are summed, so that the sum holds it once and every replica's gradient is
// the whole bias's.
struct ShareOfSum : torch::autograd::Function<ShareOfSum> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t parts) { return x / double(parts); }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

at::Tensor biased(const at::Tensor& x, const at::Tensor& w, const std::vector<at::Tensor>& biases, size_t l) {
  return biases.empty() ? at::linear(x, w) : at::linear(x, w, biases[l]);
}

// Each local expert's output for its rows of `grouped` (the received rows ordered by expert, rows[l]
// of them expert l's): the partial sum over this etp rank's slice of ffn_hidden_size.
std::vector<at::Tensor> expert_outputs(const costmodel::ModelSpec& model, const MoeWeights& w, const at::Tensor& grouped,
                                       const std::vector<int64_t>& rows, ParallelContext& ctx) {
  const int etp = ctx.etp.size();
  auto count = [&ctx](const at::Tensor& out, const at::Tensor& weight) {
    ctx.count_linear(costmodel::FlopPart::experts, out, weight);
    return out;
  };
  std::vector<at::Tensor> outs;
  int64_t first = 0;
  for (size_t l = 0; l < rows.size(); ++l) {
    at::Tensor in = grouped.narrow(0, first, rows[l]);
    first += rows[l];
    // Shazeer 2020: down(silu(gate x) * up x), the dense MLP's SwiGLU (fused_ops.h); gpt-oss's clamped one.
    at::Tensor h = swiglu(count(biased(in, w.gate[l], w.gate_b, l), w.gate[l]),
                          count(biased(in, w.up[l], w.up_b, l), w.up[l]), model.swiglu_limit,
                          model.swiglu_limit > 0 ? model.swiglu_alpha : 1.0);
    at::Tensor out = count(at::linear(h, w.down[l]), w.down[l]);
    if (!w.down_b.empty()) out = out + (etp > 1 ? ShareOfSum::apply(w.down_b[l], etp) : w.down_b[l]);
    outs.push_back(out);
  }
  return outs;
}

}  // namespace

at::Tensor moe_mlp(const costmodel::ModelSpec& model, const MoeWeights& w, const at::Tensor& x_in, int seq_len,
                   double aux_scale, ParallelContext& ctx, MoeCounts& counts) {
  const int64_t E = model.num_experts, k = model.experts_per_token, H = model.hidden_size;
  Group& tp = ctx.tp;
  const bool split_tokens = tp.size() > 1 && !(ctx.sequence_parallel);
  const at::Tensor x = split_tokens ? tp_share_of_tokens(x_in, tp, ctx.clock) : x_in;
  const int64_t b = x.size(0), s = x.size(1);
  at::Tensor tokens = x.reshape({b * s, H});

  const Routing r = route(model, w, tokens, ctx);
  const at::Tensor& top_p = r.weights;
  const at::Tensor& top_e = r.experts;
  at::Tensor aux;
  // The model's coefficient (ModelSpec::moe_aux_loss_coef: the config's, 0 where it trains without).
  if (at::GradMode::is_enabled() && model.moe_aux_loss_coef > 0)
    aux = load_balancing_loss(r.probs, top_e, b, s, seq_len, model.moe_aux_loss_coef * aux_scale, ctx);

  // Dispatch, the local experts, and back. Their tensors stay this function's locals until the
  // output is combined: the activation peak the memory tests check includes them.
  const Dispatch d = dispatch_counts(top_e, E, k, ctx);
  Group& ep = ctx.ep;
  at::Tensor sent = tokens.index_select(0, d.token_of);
  at::Tensor received = d.n_ep > 1 ? AllToAll::apply(sent, &ep, &ctx.clock, d.send, d.recv) : sent;
  // The local expert of each received row: sources in ep order, each's rows in expert order.
  at::Tensor expert_of =
      at::repeat_interleave(at::arange(d.local, d.mine.options()).repeat({d.n_ep}), d.mine.reshape({-1}));

  if (at::GradMode::is_enabled()) {  // once per micro-batch (recompute's first forward runs without grad)
    counts.routed += d.order.numel();
    counts.processed += received.size(0);
  }
  Group& etp = ctx.etp;
  const bool etp_split = etp.size() > 1;
  std::vector<int64_t> etp_rows;
  if (etp_split) {
    at::Tensor n = at::full({1}, received.size(0), at::kLong);
    {
      PhaseScope scope(ctx.clock, Phase::ep_comm);
      etp_rows = to_vector(etp.all_gather(n, 0));
      expert_of = gather_rows(expert_of.view({-1, 1}), etp, etp_rows).view({-1});
    }
    received = EtpRows::apply(received, &etp, &ctx.clock, etp_rows, true);
  }
  at::Tensor by_expert = std::get<1>(at::sort(expert_of, /*stable=*/true, 0, false));
  std::vector<int64_t> rows = to_vector(at::bincount(expert_of, {}, d.local));
  at::Tensor grouped = received.index_select(0, by_expert);
  std::vector<at::Tensor> outs = expert_outputs(model, w, grouped, rows, ctx);
  at::Tensor out = at::cat(outs, 0).index_select(0, at::argsort(by_expert));  // back to arrival order
  if (etp_split) out = EtpRows::apply(out, &etp, &ctx.clock, etp_rows, false);
  at::Tensor back = d.n_ep > 1 ? AllToAll::apply(out, &ep, &ctx.clock, d.recv, d.send) : out;

  // Combine: each token the weighted sum of its k experts' outputs, the copies put back in token
  // order first (what the multiplication saves is that [N k, h] tensor, as Megatron's unpermute
  // saves the permuted tokens; an index_add would save its weighted source besides).
  at::Tensor by_token = back.index_select(0, at::argsort(d.order)).view({b * s, k, H});
  at::Tensor y = (by_token * top_p.to(back.scalar_type()).unsqueeze(-1)).sum(1).view({b, s, H});
  if (aux.defined()) y = attach_loss(y, aux);
  if (split_tokens) y = tp_shares_summed(y, tp, ctx.clock);
  if (model.hidden_dropout > 0) y = at::dropout(y, model.hidden_dropout, true);
  return y;
}

at::Tensor attach_loss(const at::Tensor& out, const at::Tensor& loss) { return AttachAuxLoss::apply(out, loss); }

}  // namespace dplan::executor
