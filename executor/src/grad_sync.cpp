#include "grad_sync.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "phase_clock.h"

#include <cmath>

namespace dplan::executor {

GradSync::GradSync(std::vector<Parameter>& params, ParallelContext& ctx, int64_t bucket_bytes)
    : params_(params), ctx_(ctx) {
  // Assign parameters to buckets, last parameter first, closing a bucket once it holds bucket_bytes.
  std::vector<std::vector<int>> members(1);
  int64_t filled = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const at::Tensor& t = params[i].tensor;
    if (filled > 0 && filled + int64_t(t.nbytes()) > bucket_bytes) {
      members.emplace_back();
      filled = 0;
    }
    members.back().push_back(i);
    filled += t.nbytes();
  }
  for (size_t b = 0; b < members.size(); ++b) {
    int64_t numel = 0;
    for (int i : members[b]) numel += params[i].tensor.numel();
    Bucket bucket;
    bucket.buffer = at::zeros({numel}, params[members[b][0]].tensor.options().requires_grad(false));
    bucket.size = static_cast<int>(members[b].size());
    int64_t offset = 0;
    for (int i : members[b]) {
      at::Tensor& p = params[i].tensor;
      // The gradient accumulator adds into an existing .grad in place, so the view stays the grad.
      p.mutable_grad() = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (ctx.dp.size() > 1) {
        auto acc = torch::autograd::impl::grad_accumulator(p);
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, b](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
              mark_ready(static_cast<int>(b));
              return outputs;
            }));
        accumulators_.push_back(std::move(acc));
      }
    }
    buckets_.push_back(std::move(bucket));
  }
}

GradSync::~GradSync() = default;

int64_t GradSync::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.buffer.nbytes();
  return n;
}

void GradSync::arm_last_microbatch() {
  armed_ = true;
  for (auto& b : buckets_) b.ready = 0;
}

void GradSync::mark_ready(int bucket) {
  if (!armed_) return;  // an accumulation micro-batch: no communication
  Bucket& b = buckets_[bucket];
  if (++b.ready == b.size) b.work = ctx_.dp.all_reduce_async(b.buffer);
}

void GradSync::finish() {
  armed_ = false;
  {
    PhaseScope scope(Phase::dp_comm);
    for (auto& b : buckets_) {
      if (ctx_.dp.size() > 1 && !b.work.pending())  // a bucket whose hooks did not all fire (unused parameter)
        b.work = ctx_.dp.all_reduce_async(b.buffer);
      b.work.wait();
    }
    for (auto& p : params_) {
      if (p.tied_embedding && ctx_.has_embedding_group) {
        at::Tensor g = p.tensor.mutable_grad();
        ctx_.embedding.all_reduce(g);
      }
    }
  }
  PhaseScope scope(Phase::tp_comm);
  for (auto& p : params_) {
    if (p.sequence_parallel_partial) {
      at::Tensor g = p.tensor.mutable_grad();
      ctx_.tp.all_reduce(g);
    }
  }
}

double GradSync::clip_grad_norm(double max_norm) {
  at::Tensor sum_sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(ctx_.device));
  const bool last_stage_copy = ctx_.has_embedding_group && ctx_.stage == ctx_.num_stages - 1;
  for (auto& p : params_) {
    if (p.tp_replicated && ctx_.tp.rank() != 0) continue;
    if (p.tied_embedding && last_stage_copy) continue;
    sum_sq += p.tensor.grad().to(at::kDouble).pow(2).sum();
  }
  // Data-parallel replicas hold the same reduced gradients: only tp and pp shards are summed.
  ctx_.tp.all_reduce(sum_sq);
  ctx_.pp.all_reduce(sum_sq);
  const double norm = std::sqrt(sum_sq.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& b : buckets_) b.buffer.mul_(scale);
  }
  return norm;
}

void GradSync::zero() {
  for (auto& b : buckets_) b.buffer.zero_();
}

}  // namespace dplan::executor
