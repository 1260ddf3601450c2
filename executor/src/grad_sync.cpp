#include "grad_sync.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "phase_clock.h"

#include <algorithm>
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
  const int dp = ctx.dp.size();
  for (size_t b = 0; b < members.size(); ++b) {
    int64_t numel = 0;
    for (int i : members[b]) numel += params[i].tensor.numel();
    numel = (numel + dp - 1) / dp * dp;  // equal slices for a sharded optimizer
    Bucket bucket;
    auto options = params[members[b][0]].tensor.options().requires_grad(false);
    bucket.buffer = at::zeros({numel}, options);
    bucket.params = at::zeros({numel}, options);
    bucket.members = members[b];
    int64_t offset = 0;
    for (int i : members[b]) {
      at::Tensor& p = params[i].tensor;
      {  // the parameter moves into the bucket's flat storage (values unchanged)
        at::NoGradGuard no_grad;
        at::Tensor home = bucket.params.narrow(0, offset, p.numel()).view(p.sizes());
        home.copy_(p);
        p.set_(home);
      }
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
  if (++b.ready == static_cast<int>(b.members.size())) b.work = ctx_.dp.all_reduce_async(b.buffer);
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

std::vector<GradSync::OptimizerParam> GradSync::optimizer_params(bool shard_over_dp) {
  std::vector<OptimizerParam> out;
  if (!shard_over_dp || ctx_.dp.size() == 1) {
    for (auto& p : params_) out.push_back({p.tensor, p.weight_decay});
    return out;
  }
  const int dp = ctx_.dp.size(), r = ctx_.dp.rank();
  for (auto& b : buckets_) {
    const int64_t slice = b.buffer.numel() / dp, lo = r * slice, hi = lo + slice;
    int64_t offset = 0;
    for (int i : b.members) {
      const int64_t first = std::max(lo, offset), last = std::min(hi, offset + params_[i].tensor.numel());
      if (first < last) {
        at::Tensor piece = b.params.narrow(0, first, last - first).detach().requires_grad_(true);
        piece.mutable_grad() = b.buffer.narrow(0, first, last - first);
        out.push_back({piece, params_[i].weight_decay});
      }
      offset += params_[i].tensor.numel();
    }
  }
  return out;
}

void GradSync::gather_parameters() {
  if (ctx_.dp.size() == 1) return;
  PhaseScope scope(Phase::dp_comm);
  at::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    const int64_t slice = b.params.numel() / ctx_.dp.size();
    b.params.copy_(ctx_.dp.all_gather(b.params.narrow(0, ctx_.dp.rank() * slice, slice), 0));
  }
}

void GradSync::zero() {
  for (auto& b : buckets_) b.buffer.zero_();
}

}  // namespace dplan::executor
