#include "tp_ops.h"

#include <algorithm>
#include <limits>

#include <torch/torch.h>


namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Backward runs later, on autograd's thread: the forward's group and clock are kept in the
// function's saved data (as addresses; both outlive the step).
Group& group_of(AutogradContext* ctx) { return *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt()); }
PhaseClock& clock_of(AutogradContext* ctx) { return *reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt()); }
void remember(AutogradContext* ctx, Group& g, PhaseClock& clock) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(&g);
  ctx->saved_data["clock"] = reinterpret_cast<int64_t>(&clock);
}

at::Tensor all_reduced(const at::Tensor& x, Group& g, PhaseClock& clock) {
  if (g.size() == 1) return x;
  PhaseScope scope(clock, Phase::tp_comm);
  at::Tensor y = x.contiguous().clone();
  g.all_reduce(y);
  return y;
}
at::Tensor gathered(const at::Tensor& x, Group& g, PhaseClock& clock, int64_t dim) {
  if (g.size() == 1) return x;
  PhaseScope scope(clock, Phase::tp_comm);
  return g.all_gather(x, dim);
}
at::Tensor scattered(const at::Tensor& x, Group& g, PhaseClock& clock, int64_t dim) {
  if (g.size() == 1) return x;
  PhaseScope scope(clock, Phase::tp_comm);
  return g.reduce_scatter(x, dim);
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, PhaseClock* clock) {
    remember(ctx, *g, *clock);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduced(grad[0], group_of(ctx), clock_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, Group* g, PhaseClock* clock) {
    return all_reduced(x, *g, *clock);
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor(), at::Tensor()}; }
};

// Along the sequence dim: all-gather or reduce-scatter forward, the other backward.
template <bool kGatherForward>
struct SequenceExchange : torch::autograd::Function<SequenceExchange<kGatherForward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, PhaseClock* clock, int64_t dim) {
    remember(ctx, *g, *clock);
    ctx->saved_data["dim"] = dim;
    return kGatherForward ? gathered(x, *g, *clock, dim) : scattered(x, *g, *clock, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    Group& g = group_of(ctx);
    PhaseClock& clock = clock_of(ctx);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {kGatherForward ? scattered(grad[0], g, clock, dim) : gathered(grad[0], g, clock, dim), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};
using ScatterToSp = SequenceExchange<false>;
using GatherFromSp = SequenceExchange<true>;

// A tensor every rank holds the same gradient of: all-gathered along `dim` or split to this
// rank's part forward, the other backward.
at::Tensor own_part(const at::Tensor& x, Group& g, int64_t dim) {
  return g.size() == 1 ? x : x.chunk(g.size(), dim)[g.rank()].contiguous();
}
template <bool kGatherForward>
struct ReplicatedExchange : torch::autograd::Function<ReplicatedExchange<kGatherForward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, PhaseClock* clock, int64_t dim) {
    remember(ctx, *g, *clock);
    ctx->saved_data["dim"] = dim;
    return kGatherForward ? gathered(x.contiguous(), *g, *clock, dim) : own_part(x, *g, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    Group& g = group_of(ctx);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {kGatherForward ? own_part(grad[0], g, dim) : gathered(grad[0].contiguous(), g, clock_of(ctx), dim),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Sequence parallel into column-parallel linears sharing one input (QKV; fc1 and gate; the LM
// head), as Megatron's LinearWithGradAccumulationAndAsyncCommunication does with
// sequence_parallel: the sequence-sharded input is all-gathered for the matmuls, only the shard is
// saved, and backward all-gathers it again for the weight gradients while the input gradient is
// reduce-scattered (Korthikanti et al. 2022, §4.2.2: the stored GEMM input is sbh/t).
// `tensors` = {x, W_1 .. W_n, then the biases of the linears whose bit is set in bias_mask}.
struct SpColumnLinears : torch::autograd::Function<SpColumnLinears> {
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, int64_t n, int64_t bias_mask, Group* g,
                               PhaseClock* clock, int64_t dim) {
    remember(ctx, *g, *clock);
    ctx->saved_data["n"] = n;
    ctx->saved_data["bias_mask"] = bias_mask;
    ctx->saved_data["dim"] = dim;
    at::Tensor full = gathered(tensors[0], *g, *clock, dim);
    variable_list out;
    int64_t next_bias = 1 + n;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& w = tensors[1 + i];
      out.push_back((bias_mask >> i) & 1 ? at::linear(full, w, tensors[next_bias++]) : at::linear(full, w));
    }
    ctx->save_for_backward(tensors.slice(0, 1 + n).vec());  // the input shard and the weights
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t n = ctx->saved_data["n"].toInt(), mask = ctx->saved_data["bias_mask"].toInt();
    Group& g = group_of(ctx);
    PhaseClock& clock = clock_of(ctx);
    auto saved = ctx->get_saved_variables();
    at::Tensor full = gathered(saved[0], g, clock, ctx->saved_data["dim"].toInt());
    const at::Tensor full_2d = full.reshape({-1, full.size(-1)});
    at::Tensor dfull;
    variable_list weight_grads, bias_grads;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& w = saved[1 + i];
      if (!grads[i].defined()) {  // an output that did not reach the loss
        weight_grads.push_back(at::zeros_like(w));
        if ((mask >> i) & 1) bias_grads.emplace_back();
        continue;
      }
      const at::Tensor& dy = grads[i];
      const at::Tensor dy_2d = dy.reshape({-1, dy.size(-1)});
      dfull = dfull.defined() ? dfull.add_(dy.matmul(w)) : dy.matmul(w);
      weight_grads.push_back(dy_2d.t().mm(full_2d));
      if ((mask >> i) & 1) bias_grads.push_back(dy_2d.sum(0));
    }
    full = at::Tensor();
    variable_list out{dfull.defined() ? scattered(dfull, g, clock, ctx->saved_data["dim"].toInt()) : at::Tensor()};
    out.insert(out.end(), weight_grads.begin(), weight_grads.end());
    out.insert(out.end(), bias_grads.begin(), bias_grads.end());
    for (int i = 0; i < 5; ++i) out.emplace_back();  // n, bias_mask, group, clock, dim
    return out;
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& targets,
                            int64_t vocab_start, int64_t vocab_size, Group* g, PhaseClock* clock) {
    const int64_t local = logits_in.size(1);
    // Worked on in place, as Megatron does: the head's output feeds only this function and its
    // backward does not need it, so one fp32 [tokens, V/tp] tensor becomes the saved softmax (a
    // 16-bit input is converted first, and that copy is transient).
    at::Tensor logits = logits_in.scalar_type() == at::kFloat ? logits_in.detach() : logits_in.to(at::kFloat);
    // Padding columns never win and carry no probability; a rank may hold nothing but padding (the
    // plan's vocab_pad_multiple x tp rows, more than a tiny vocabulary fills).
    const int64_t real = std::clamp<int64_t>(vocab_size - vocab_start, 0, local);
    if (real < local) logits.narrow(1, real, local - real).fill_(-std::numeric_limits<float>::infinity());
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits_in.scalar_type());
    if (g->size() == 1) {
      // The whole vocabulary here: ATen's log-softmax, one fused pass over each row (max, sum of
      // exponentials and the write while the row is in cache), in place, where the steps below
      // make six passes over [N, V]; backward turns the saved log-probabilities into the softmax
      // in place (exp_). The loss is -log p(target), as torch.nn.functional.cross_entropy's.
      at::_log_softmax_out(logits, logits, 1, /*half_to_float=*/false);
      at::Tensor loss = logits.gather(1, targets.unsqueeze(1)).squeeze(1).neg();
      ctx->save_for_backward({logits, targets, at::Tensor()});
      ctx->saved_data["log_probs"] = true;
      return loss;
    }
    // Any per-row shift works; it only has to be the same on every rank: the global row maximum.
    at::Tensor row_max = std::get<0>(logits.max(1));
    if (g->size() > 1) {
      PhaseScope scope(*clock, Phase::tp_comm);
      row_max = g->all_gather(row_max.unsqueeze(0), 0).amax(0);
    }
    logits.sub_(row_max.unsqueeze(1));
    at::Tensor in_shard = (targets >= vocab_start).logical_and(targets < vocab_start + local);
    at::Tensor local_target = (targets - vocab_start).masked_fill(in_shard.logical_not(), 0);
    at::Tensor target_logit = logits.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(in_shard.logical_not(), 0);
    at::Tensor exp = logits.exp_();
    at::Tensor sums = at::stack({exp.sum(1), target_logit});  // one all-reduce for both
    sums = all_reduced(sums, *g, *clock);
    at::Tensor sum_exp = sums[0];
    exp.div_(sum_exp.unsqueeze(1));  // softmax, kept for backward
    ctx->save_for_backward({exp, local_target, in_shard});
    return sum_exp.log() - sums[1];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    // d loss_i / d logit_ij = softmax_ij - [j == target_i], in place of the saved softmax (Megatron's
    // too): the graph is not kept, nothing reads it again.
    at::Tensor g = saved[0];
    if (ctx->saved_data.count("log_probs")) {  // one rank: log-probabilities, every target here
      g.exp_();
      g.scatter_add_(1, saved[1].unsqueeze(1), at::full({g.size(0), 1}, -1.0, g.options()));
    } else {
      at::Tensor hit = saved[2].to(g.scalar_type());
      g.scatter_add_(1, saved[1].unsqueeze(1), -hit.unsqueeze(1));
    }
    g.mul_(grad[0].unsqueeze(1));
    auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, Group& tp, PhaseClock& clock) {
  return tp.size() == 1 ? x : CopyToTp::apply(x, &tp, &clock);
}
at::Tensor reduce_from_tp(const at::Tensor& x, Group& tp, PhaseClock& clock) {
  return tp.size() == 1 ? x : ReduceFromTp::apply(x, &tp, &clock);
}
at::Tensor scatter_to_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim) {
  return tp.size() == 1 ? x : ScatterToSp::apply(x, &tp, &clock, dim);
}
at::Tensor gather_from_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim) {
  return tp.size() == 1 ? x : GatherFromSp::apply(x, &tp, &clock, dim);
}
at::Tensor gather_from_tp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim) {
  return tp.size() == 1 ? x : ReplicatedExchange<true>::apply(x, &tp, &clock, dim);
}
at::Tensor split_to_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim) {
  return tp.size() == 1 ? x : ReplicatedExchange<false>::apply(x, &tp, &clock, dim);
}
std::vector<at::Tensor> sp_column_linears(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                          const std::vector<at::Tensor>& biases, Group& tp, PhaseClock& clock,
                                          int64_t dim) {
  std::vector<at::Tensor> tensors{x};
  tensors.insert(tensors.end(), weights.begin(), weights.end());
  int64_t mask = 0;
  for (size_t i = 0; i < biases.size(); ++i) {
    if (!biases[i].defined()) continue;
    mask |= int64_t(1) << i;
    tensors.push_back(biases[i]);
  }
  return SpColumnLinears::apply(at::TensorList(tensors), int64_t(weights.size()), mask, &tp, &clock, dim);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab_size, Group& tp, PhaseClock& clock) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, vocab_size, &tp, &clock);
}

}  // namespace dplan::executor
