#include "grad_sync.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "memory_meter.h"
#include "phase_clock.h"
#ifdef DPLAN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dplan::executor {
namespace {

// ZeRO-3 frees a unit's full parameters by taking the storage's memory away and gives it back
// before the next use; the parameters stay views of that storage (shapes, strides and autograd
// identity unchanged), which is how FSDP frees and refills its flat parameters.
void free_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = flat.numel() * flat.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

// Parameters into buckets, last parameter first: a new bucket once the current one holds
// bucket_bytes (ZeRO-3: at each unit's boundary), at each model chunk's boundary (Megatron keeps a
// grad buffer per chunk), and the tied word embedding in one of its own. Each bucket's parameter
// indices, in the order its gradients come.
std::vector<std::vector<int>> bucket_members(const GptStage& stage, const std::vector<Parameter>& params,
                                             bool has_embedding_group, int64_t bucket_bytes, int zero_stage) {
  const std::vector<int>& unit_of = stage.unit_of_parameter();
  auto alone = [&](int i) { return params[i].tied_embedding && has_embedding_group; };
  auto chunk_of = [&](int i) { return stage.chunk_of_unit(unit_of[i]); };
  std::vector<std::vector<int>> members;
  int64_t filled = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const int64_t bytes = params[i].tensor.nbytes();
    bool fresh = members.empty() || alone(i) || alone(members.back().back()) ||
                 chunk_of(i) != chunk_of(members.back().back()) ||
                 params[i].expert != params[members.back().back()].expert;  // experts reduce over edp
    if (!fresh) fresh = zero_stage >= 3 ? unit_of[i] != unit_of[members.back().back()] : filled + bytes > bucket_bytes;
    if (fresh) {
      members.emplace_back();
      filled = 0;
    }
    members.back().push_back(i);
    filled += bytes;
  }
  return members;
}

}  // namespace

GradSync::GradSync(GptStage& stage, ParallelContext& ctx, int64_t bucket_bytes, int zero_stage, bool shard_optimizer,
                   at::ScalarType grad_dtype)
    : stage_(stage),
      params_(stage.parameters()),
      ctx_(ctx),
      zero_stage_(zero_stage),
      shard_optimizer_(shard_optimizer || zero_stage >= 1),
      grad_dtype_(grad_dtype) {
  const std::vector<std::vector<int>> members =
      bucket_members(stage, params_, ctx.has_embedding_group, bucket_bytes, zero_stage);
  armed_.assign(stage.num_chunks(), false);
  for (const Parameter& p : params_) has_experts_ = has_experts_ || p.expert;
  if (zero_stage >= 3) units_.resize(stage.num_units());
  for (size_t b = 0; b < members.size(); ++b) buckets_.push_back(make_bucket(static_cast<int>(b), members[b]));
  if (zero_stage >= 3) {
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      for (int b : units_[u].buckets) free_storage(buckets_[b].params);
    }
    stage.set_unit_hooks(this);
  }
}

GradSync::Bucket GradSync::make_bucket(int b, const std::vector<int>& members) {
  Bucket bucket;
  bucket.members = members;
  bucket.chunk = stage_.chunk_of_unit(stage_.unit_of_parameter()[members[0]]);
  bucket.group = params_[members[0]].expert ? &ctx_.edp : &dense_group();
  const int dp = bucket.group->size(), r = bucket.group->rank();
  for (int i : bucket.members) bucket.numel += params_[i].tensor.numel();
  bucket.numel = (bucket.numel + dp - 1) / dp * dp;  // equal slices for the dp ranks
  const int64_t slice = bucket.numel / dp;
  auto options = params_[bucket.members[0]].tensor.options().requires_grad(false);
  auto grad_options = options.dtype(grad_dtype_);
  bucket.params = at::zeros({bucket.numel}, options);
  if (zero_stage_ < 2) bucket.grads = at::zeros({bucket.numel}, grad_options);
  adopt_parameters(bucket, b);
  if (zero_stage_ >= 3) {
    bucket.param_shard = bucket.params.narrow(0, r * slice, slice).clone();
    bucket.unit = stage_.unit_of_parameter()[bucket.members[0]];
    units_[bucket.unit].buckets.push_back(b);
  } else {
    bucket.param_shard = bucket.params.narrow(0, r * slice, slice);
  }
  if (zero_stage_ >= 2)
    bucket.grad_shard = at::zeros({slice}, grad_options);
  else if (shard_optimizer_)
    bucket.grad_shard = bucket.grads.narrow(0, r * slice, slice);
  // What the optimizer steps: its region of the bucket (the shard, or all of it), in fp32: the
  // parameters' own storage when they are fp32, else fp32 master weights (mixed precision,
  // Micikevicius et al. 2018) copied back into the 16-bit parameters after each step.
  at::Tensor region = optimizer_weights(bucket);
  bucket.master = region.scalar_type() == at::kFloat ? region : region.to(at::kFloat);
  return bucket;
}

void GradSync::adopt_parameters(Bucket& bucket, int b) {
  const bool hooked = bucket.group->size() > 1 || zero_stage_ >= 2;
  int64_t offset = 0;
  for (int i : bucket.members) {
    at::Tensor& p = params_[i].tensor;
    {  // the parameter moves into the bucket's flat storage (values unchanged)
      at::NoGradGuard no_grad;
      at::Tensor home = bucket.params.narrow(0, offset, p.numel()).view(p.sizes());
      home.copy_(p);
      p.set_(home);
    }
    // The gradient accumulator adds into an existing .grad in place, so the view stays the grad.
    if (bucket.grads.defined()) p.mutable_grad() = bucket.grads.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (hooked) {
      auto acc = torch::autograd::impl::grad_accumulator(p);
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, b, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            mark_ready(b, i);
            return outputs;
          }));
      accumulators_.push_back(std::move(acc));
    }
  }
}

GradSync::~GradSync() {
  if (zero_stage_ >= 3) stage_.set_unit_hooks(nullptr);
}

int64_t GradSync::weight_bytes() const {
  int64_t n = 0;
  if (zero_stage_ >= 3) {
    for (const auto& b : buckets_) n += b.param_shard.nbytes();
  } else {
    for (const auto& p : params_) n += p.tensor.nbytes();
  }
  return n;
}

int64_t GradSync::gradient_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += zero_stage_ >= 2 ? b.grad_shard.nbytes() : b.grads.nbytes();
  return n;
}

void GradSync::arm_last_microbatch(int chunk) {
  armed_.at(chunk) = true;
  if (zero_stage_ < 2)
    for (auto& b : buckets_)
      if (b.chunk == chunk) b.ready = 0;
}

void GradSync::mark_ready(int bucket, int param) {
  Bucket& b = buckets_[bucket];
  if (zero_stage_ >= 2) {  // every micro-batch: the unsharded gradients go as soon as their bucket is complete
    provide_gradient_buffer(bucket);  // no-op once this micro-batch's buffer is there
    if (++b.ready == static_cast<int>(b.members.size())) launch_sharded_reduction(bucket);
    return;
  }
  if (!armed_[b.chunk]) return;  // an accumulation micro-batch: no communication
  if (++b.ready == static_cast<int>(b.members.size())) b.work = b.group->all_reduce_async(b.grads);
}

// Stages 2, 3: a flat gradient buffer for one micro-batch of a bucket, the members' .grads views
// into it, so autograd accumulates in place (ZeRO-3 sets it up before the unit's backward; ZeRO-2
// when the bucket's first gradient arrives, which is copied in).
void GradSync::provide_gradient_buffer(int bucket) {
  Bucket& b = buckets_[bucket];
  if (b.grads.defined()) {
    if (std::find(reducing_.begin(), reducing_.end(), bucket) == reducing_.end()) return;
    complete_reductions();  // the previous micro-batch's reduction of this bucket is still in flight
  }
  ctx_.meter.note_buffer_bytes(b.numel * at::elementSize(grad_dtype_));
  b.grads = at::zeros({b.numel}, b.params.options().dtype(grad_dtype_));
  int64_t offset = 0;
  for (int i : b.members) {
    at::Tensor& p = params_[i].tensor;
    at::Tensor view = b.grads.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.mutable_grad().defined()) view.copy_(p.mutable_grad());
    p.mutable_grad() = view;
    offset += p.numel();
  }
}

void GradSync::launch_sharded_reduction(int bucket) {
  complete_reductions();  // one bucket reducing while the next fills: two unsharded buckets at most
  Bucket& b = buckets_[bucket];
  provide_gradient_buffer(bucket);
  for (int i : b.members) params_[i].tensor.mutable_grad() = at::Tensor();  // the buffer alone holds them now
  ctx_.meter.note_buffer_bytes(b.numel / b.group->size() * at::elementSize(grad_dtype_));
  b.grads_reduced = at::empty({b.numel / b.group->size()}, b.grads.options());
  b.ready = 0;
  b.work = b.group->reduce_scatter_async(b.grads, b.grads_reduced);
  reducing_.push_back(bucket);
  if (zero_stage_ >= 3) {  // the unit's backward is over once all its buckets are reducing
    Unit& u = units_[b.unit];
    if (++u.reducing == static_cast<int>(u.buckets.size())) {
      u.reducing = 0;
      release(b.unit);
    }
  }
}

void GradSync::complete_reductions() {
  if (reducing_.empty()) return;
  PhaseScope scope(ctx_.clock, Phase::dp_comm);
  for (int i : reducing_) {
    Bucket& b = buckets_[i];
    b.work.wait();  // the backend has let go of the buffers: they go when dropped here
    b.grad_shard.add_(b.grads_reduced);
    const int64_t bytes = b.grads.nbytes() + b.grads_reduced.nbytes();
    b.grads = at::Tensor();
    b.grads_reduced = at::Tensor();
    ctx_.meter.note_buffer_bytes(-bytes);
  }
  reducing_.clear();
}

// Calls fn(member, offset in the shard, length) for each parameter's part of this rank's shard.
template <typename Fn>
void for_each_piece(const std::vector<Parameter>& params, const std::vector<int>& members, int64_t numel, int dp,
                    int rank, Fn&& fn) {
  const int64_t slice = numel / dp, lo = rank * slice, hi = lo + slice;
  int64_t offset = 0;
  for (int i : members) {
    const int64_t first = std::max(lo, offset), last = std::min(hi, offset + params[i].tensor.numel());
    if (first < last) fn(i, first - lo, last - first);
    offset += params[i].tensor.numel();
  }
}

void GradSync::finish() {
  armed_.assign(armed_.size(), false);
  {
    PhaseScope scope(ctx_.clock, Phase::dp_comm);
    if (zero_stage_ >= 2) {
      for (size_t i = 0; i < buckets_.size(); ++i)  // a bucket with an unused parameter: reduce what there is
        if (buckets_[i].ready > 0) launch_sharded_reduction(static_cast<int>(i));
      complete_reductions();
    } else {
      for (auto& b : buckets_) {
        if (b.group->size() > 1 && !b.work.pending())  // a bucket whose hooks did not all fire (unused parameter)
          b.work = b.group->all_reduce_async(b.grads);
        b.work.wait();
      }
    }
    if (ctx_.has_embedding_group) {
      for (auto& b : buckets_) {
        if (!params_[b.members[0]].tied_embedding) continue;
        at::Tensor g = zero_stage_ >= 2 ? b.grad_shard : b.grads;  // the tied embedding's own bucket
        ctx_.embedding.all_reduce(g);
      }
    }
  }
  PhaseScope scope(ctx_.clock, Phase::tp_comm);
  if (zero_stage_ >= 2) {
    for (auto& b : buckets_) {
      for_each_piece(params_, b.members, b.numel, b.group->size(), b.group->rank(), [&](int i, int64_t at, int64_t n) {
        if (!params_[i].sequence_parallel_partial) return;
        at::Tensor piece = b.grad_shard.narrow(0, at, n);
        ctx_.tp.all_reduce(piece);
      });
    }
    return;
  }
  for (auto& p : params_) {
    if (p.sequence_parallel_partial) {
      at::Tensor g = p.tensor.mutable_grad();
      ctx_.tp.all_reduce(g);
    }
  }
}

double GradSync::clip_grad_norm(double max_norm) {
  // Dense gradients are split over tp (and sharded over dp); experts' over etp and ep (and sharded
  // over edp): summed apart, each element once.
  const auto options = at::TensorOptions().dtype(at::kDouble).device(ctx_.device);
  at::Tensor dense_sq = at::zeros({1}, options), expert_sq = at::zeros({1}, options);
  auto sum_sq_of = [&](const Parameter& p) -> at::Tensor& { return p.expert ? expert_sq : dense_sq; };
  const bool last_stage_copy = ctx_.has_embedding_group && ctx_.stage == ctx_.num_stages - 1;
  auto counted = [&](const Parameter& p) {
    return !(p.tp_replicated && ctx_.tp.rank() != 0) && !(p.etp_replicated && ctx_.etp.rank() != 0) &&
           !(p.tied_embedding && last_stage_copy);
  };
  if (zero_stage_ >= 2) {
    for (auto& b : buckets_) {
      for_each_piece(params_, b.members, b.numel, b.group->size(), b.group->rank(), [&](int i, int64_t at, int64_t n) {
        if (counted(params_[i])) sum_sq_of(params_[i]) += b.grad_shard.narrow(0, at, n).to(at::kDouble).pow(2).sum();
      });
    }
    dense_group().all_reduce(dense_sq);  // the shards are disjoint
    if (has_experts_) ctx_.edp.all_reduce(expert_sq);
  } else {
    // Data-parallel replicas hold the same reduced gradients: only tp and pp shards are summed.
    for (auto& p : params_)
      if (counted(p)) sum_sq_of(p) += p.tensor.grad().to(at::kDouble).pow(2).sum();
  }
  ctx_.tp.all_reduce(dense_sq);
  if (has_experts_) {
    ctx_.etp.all_reduce(expert_sq);
    ctx_.ep.all_reduce(expert_sq);
  }
  at::Tensor sum_sq = dense_sq + expert_sq;
  ctx_.pp.all_reduce(sum_sq);
  const double norm = std::sqrt(sum_sq.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& b : buckets_) (zero_stage_ >= 2 ? b.grad_shard : b.grads).mul_(scale);
  }
  return norm;
}

at::Tensor GradSync::optimizer_region(const Bucket& b, const at::Tensor& flat) const {
  if (!shard_optimizer_) return flat;
  const int64_t slice = b.numel / b.group->size();
  return flat.narrow(0, b.group->rank() * slice, slice);
}

at::Tensor GradSync::optimizer_weights(const Bucket& b) const {
  return zero_stage_ >= 3 ? b.param_shard : optimizer_region(b, b.params);
}

at::Tensor GradSync::optimizer_gradients(const Bucket& b) const {
  return zero_stage_ >= 2 ? b.grad_shard : optimizer_region(b, b.grads);
}

int64_t GradSync::master_bytes() const {
  int64_t n = 0;
  if (offload_) return 0;  // host_master_bytes()
  for (const auto& b : buckets_) {
    const at::Tensor region = optimizer_weights(b);
    if (region.data_ptr() != b.master.data_ptr()) n += b.master.nbytes();
  }
  return n;
}

void GradSync::offload_optimizer() {
  HostScope host;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(ctx_.device.is_cuda());
  for (auto& b : buckets_) {
    at::Tensor master = at::empty({b.master.numel()}, options);
    master.copy_(b.master);
    b.master = master;  // a device-side fp32 copy (mixed precision) is freed here
    b.host_grads = at::zeros({b.master.numel()}, options);
  }
  offload_ = true;
}

int64_t GradSync::host_master_bytes() const {
  if (!offload_) return 0;
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.master.nbytes();
  return n;
}

int64_t GradSync::host_gradient_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.host_grads.defined() ? b.host_grads.nbytes() : 0;
  return n;
}

void GradSync::gradients_to_host() {
  PhaseScope scope(ctx_.clock, Phase::offload);
#ifdef DPLAN_WITH_CUDA
  if (ctx_.device.is_cuda()) {
    // Device to pinned host memory on a side stream, ordered after the compute stream's work
    // (reductions, clipping) by an event, so the copies do not queue behind later kernels.
    // The gradients are persistent buffers, zeroed on the compute stream only after the step
    // waited for this stream, so no recordStream is needed.
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(ctx_.device.index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, ctx_.device.index());
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      for (auto& b : buckets_) b.host_grads.copy_(optimizer_gradients(b), /*non_blocking=*/true);
    }
    side.synchronize();
    return;
  }
#endif
  for (auto& b : buckets_) b.host_grads.copy_(optimizer_gradients(b));
}

std::vector<GradSync::OptimizerParam> GradSync::optimizer_params() {
  std::vector<OptimizerParam> out;
  for (auto& b : buckets_) {
    const int parts = shard_optimizer_ ? b.group->size() : 1, index = shard_optimizer_ ? b.group->rank() : 0;
    const at::Tensor grads = offload_ ? b.host_grads : optimizer_gradients(b);
    for_each_piece(params_, b.members, b.numel, parts, index, [&](int i, int64_t at, int64_t n) {
      at::Tensor piece = b.master.narrow(0, at, n).detach().requires_grad_(true);
      piece.mutable_grad() = grads.narrow(0, at, n);
      out.push_back({piece, params_[i].weight_decay});
    });
  }
  return out;
}

std::vector<GradSync::StatePiece> GradSync::state_pieces() {
  std::vector<StatePiece> out;
  for (auto& b : buckets_) {
    const int parts = shard_optimizer_ ? b.group->size() : 1, index = shard_optimizer_ ? b.group->rank() : 0;
    const int64_t slice = b.numel / parts, lo = index * slice, hi = lo + slice;
    const at::Tensor weights = optimizer_weights(b);
    const bool owner = shard_optimizer_ || b.group->rank() == 0;
    int64_t offset = 0;
    for (int i : b.members) {  // as for_each_piece, with the offset in the parameter too
      const Parameter& p = params_[i];
      const int64_t numel = p.tensor.numel();
      const int64_t first = std::max(lo, offset), last = std::min(hi, offset + numel);
      if (first < last) {
        const bool writes = owner && (!p.tp_replicated || ctx_.tp.rank() == 0) &&
                            (!p.etp_replicated || ctx_.etp.rank() == 0) &&
                            !(p.tied_embedding && ctx_.has_embedding_group && ctx_.stage != 0);
        out.push_back({i, first - offset, last - first, weights.narrow(0, first - lo, last - first),
                       b.master.narrow(0, first - lo, last - first), writes});
      }
      offset += numel;
    }
  }
  return out;
}

void GradSync::finish_step() {
  at::NoGradGuard no_grad;
  std::optional<PhaseScope> to_device;  // offload: the stepped master weights back to the device
  if (offload_) to_device.emplace(ctx_.clock, Phase::offload);
  for (auto& b : buckets_) {  // mixed precision or offload: the stepped fp32 master weights into the parameters
    at::Tensor region = optimizer_weights(b);
    // Offload on CUDA: host to device from pinned memory, asynchronous on the compute stream, so
    // the next forward is ordered after it; the host writes the master again only after the next
    // gradients_to_host(), whose side stream waits for this stream.
    if (region.data_ptr() != b.master.data_ptr()) region.copy_(b.master, /*non_blocking=*/offload_);
  }
  to_device.reset();
  if (!shard_optimizer_ || zero_stage_ >= 3) return;
  PhaseScope scope(ctx_.clock, Phase::param_gather);  // every rank's updated slice to every rank
  std::vector<Work> works;
  for (auto& b : buckets_)
    if (b.group->size() > 1) works.push_back(b.group->all_gather_async(b.params, b.param_shard));
  for (auto& w : works) w.wait();
}

void GradSync::zero() {
  for (auto& b : buckets_) (zero_stage_ >= 2 ? b.grad_shard : b.grads).zero_();
}

// ZeRO-3 units: released -> gathering (all-gather in flight) -> gathered -> released.
void GradSync::gather(int unit, bool wait) {
  Unit& u = units_[unit];
  if (u.state == Unit::State::released) {
    for (int i : u.buckets) {
      Bucket& b = buckets_[i];
      ctx_.meter.note_buffer_bytes(b.params.nbytes());  // first, so that the allocation counts as a buffer
      allocate_storage(b.params);
      u.gathers.push_back(b.group->all_gather_async(b.params, b.param_shard));
    }
    u.state = Unit::State::gathering;
  }
  if (wait && u.state == Unit::State::gathering) {
    PhaseScope scope(ctx_.clock, Phase::param_gather);
    for (auto& w : u.gathers) w.wait();
    u.gathers.clear();
    u.state = Unit::State::gathered;
  }
}

void GradSync::release(int unit) {
  Unit& u = units_[unit];
  if (u.state == Unit::State::released) return;
  gather(unit, /*wait=*/true);  // nothing is freed under a collective in flight
  for (int i : u.buckets) {
    free_storage(buckets_[i].params);
    ctx_.meter.note_buffer_bytes(-buckets_[i].params.nbytes());
  }
  u.state = Unit::State::released;
}

void GradSync::gather_all_units() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) gather(u, true);
}

void GradSync::before_forward(const std::vector<int>& units) {
  for (int u : units) gather(u, true);
  // Prefetch: the next unit's all-gather overlaps this one's compute (within the model chunk: the
  // next chunk's turn may be several micro-batches away under the interleaved schedule).
  const int next = units[0] + 1;
  if (next < static_cast<int>(units_.size()) && std::find(units.begin(), units.end(), next) == units.end() &&
      stage_.chunk_of_unit(next) == stage_.chunk_of_unit(units[0]))
    gather(next, false);
}

at::Tensor GradSync::after_forward(const std::vector<int>& units, const at::Tensor& output) {
  for (int u : units) release(u);
  if (!output.requires_grad()) return output;
  output.register_hook([this, units](const at::Tensor& grad) {
    before_backward(units);
    return grad;
  });
  return output;
}

void GradSync::before_backward(const std::vector<int>& units) {
  for (int u : units) {
    gather(u, true);
    for (int b : units_[u].buckets) provide_gradient_buffer(b);
  }
  const int previous = units[0] - 1;  // prefetch: backward visits a chunk's units in reverse
  if (previous >= 0 && std::find(units.begin(), units.end(), previous) == units.end() &&
      stage_.chunk_of_unit(previous) == stage_.chunk_of_unit(units[0]))
    gather(previous, false);
}

}  // namespace dplan::executor
