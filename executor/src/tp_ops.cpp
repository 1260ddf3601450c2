#include "tp_ops.h"

#include <limits>

#include <torch/torch.h>

#include "phase_clock.h"

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Group& group_of(AutogradContext* ctx) { return *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt()); }
void remember(AutogradContext* ctx, Group& g) { ctx->saved_data["group"] = reinterpret_cast<int64_t>(&g); }

at::Tensor all_reduced(const at::Tensor& x, Group& g) {
  if (g.size() == 1) return x;
  PhaseScope scope(Phase::tp_comm);
  at::Tensor y = x.contiguous().clone();
  g.all_reduce(y);
  return y;
}
at::Tensor gathered(const at::Tensor& x, Group& g, int64_t dim) {
  if (g.size() == 1) return x;
  PhaseScope scope(Phase::tp_comm);
  return g.all_gather(x, dim);
}
at::Tensor scattered(const at::Tensor& x, Group& g, int64_t dim) {
  if (g.size() == 1) return x;
  PhaseScope scope(Phase::tp_comm);
  return g.reduce_scatter(x, dim);
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g) {
    remember(ctx, *g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduced(grad[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, Group* g) { return all_reduced(x, *g); }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

struct GatherFromSp : torch::autograd::Function<GatherFromSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, int64_t dim) {
    remember(ctx, *g);
    ctx->saved_data["dim"] = dim;
    return gathered(x, *g, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {scattered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct ScatterToSp : torch::autograd::Function<ScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Group* g, int64_t dim) {
    remember(ctx, *g);
    ctx->saved_data["dim"] = dim;
    return scattered(x, *g, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {gathered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& targets,
                            int64_t vocab_start, int64_t vocab_size, Group* g) {
    const int64_t local = logits_in.size(1);
    at::Tensor logits = logits_in.to(at::kFloat).clone();
    if (vocab_start + local > vocab_size)  // padding columns never win and carry no probability
      logits.narrow(1, vocab_size - vocab_start, vocab_start + local - vocab_size)
          .fill_(-std::numeric_limits<float>::infinity());
    // Any per-row shift works; it only has to be the same on every rank: the global row maximum.
    at::Tensor row_max = std::get<0>(logits.max(1));
    if (g->size() > 1) {
      PhaseScope scope(Phase::tp_comm);
      row_max = g->all_gather(row_max.unsqueeze(0), 0).amax(0);
    }
    logits.sub_(row_max.unsqueeze(1));
    at::Tensor in_shard = (targets >= vocab_start).logical_and(targets < vocab_start + local);
    at::Tensor local_target = (targets - vocab_start).masked_fill(in_shard.logical_not(), 0);
    at::Tensor target_logit = logits.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(in_shard.logical_not(), 0);
    at::Tensor exp = logits.exp_();
    at::Tensor sums = at::stack({exp.sum(1), target_logit});  // one all-reduce for both
    sums = all_reduced(sums, *g);
    at::Tensor sum_exp = sums[0];
    exp.div_(sum_exp.unsqueeze(1));  // softmax, kept for backward
    ctx->save_for_backward({exp, local_target, in_shard});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits_in.scalar_type());
    return sum_exp.log() - sums[1];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0].clone();  // d loss_i / d logit_ij = softmax_ij - [j == target_i]
    at::Tensor hit = saved[2].to(g.scalar_type());
    g.scatter_add_(1, saved[1].unsqueeze(1), -hit.unsqueeze(1));
    g.mul_(grad[0].unsqueeze(1));
    auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, Group& tp) { return tp.size() == 1 ? x : CopyToTp::apply(x, &tp); }
at::Tensor reduce_from_tp(const at::Tensor& x, Group& tp) { return tp.size() == 1 ? x : ReduceFromTp::apply(x, &tp); }
at::Tensor gather_from_sp(const at::Tensor& x, Group& tp, int64_t dim) {
  return tp.size() == 1 ? x : GatherFromSp::apply(x, &tp, dim);
}
at::Tensor scatter_to_sp(const at::Tensor& x, Group& tp, int64_t dim) {
  return tp.size() == 1 ? x : ScatterToSp::apply(x, &tp, dim);
}
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab_size, Group& tp) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, vocab_size, &tp);
}

}  // namespace dplan::executor
