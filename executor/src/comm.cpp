#include "comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/cuda.h>

#include "dplan/costmodel/errors.h"
#include "memory_meter.h"
#ifdef DPLAN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace dplan::executor {

namespace {
// 1.13's key is c10::guts::to_string of the TensorImpl pointer: the address as an ostream prints it.
template <typename Key>
Key optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(param.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
}  // namespace

torch::optim::OptimizerParamState* optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& states = optimizer.state();
  auto it = states.find(optimizer_state_key<OptimizerStateKey>(param));
  return it == states.end() ? nullptr : it->second.get();
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         std::unique_ptr<torch::optim::OptimizerParamState> state) {
  optimizer.state()[optimizer_state_key<OptimizerStateKey>(param)] = std::move(state);
}

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

const char* to_string(Backend b) { return b == Backend::nccl ? "nccl" : "gloo"; }

bool nccl_available() {
#ifdef DPLAN_WITH_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// Waits for `work` and, where the backend's worker may still hold it (Gloo), until this is its
// last owner, then drops it: its tensors are gone when this returns, unless the caller holds them.
void finish(c10::intrusive_ptr<c10d::Work> work, bool lingers) {
  work->wait();
  if (!lingers) return;
  for (int i = 0; i < 100000 && work.use_count() > 1; ++i) std::this_thread::yield();
}

}  // namespace

Work::Work(c10::intrusive_ptr<c10d::Work> work, bool lingers, std::function<void()> then)
    : work_(std::move(work)), lingers_(lingers), then_(std::move(then)) {}
Work::~Work() = default;
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;
bool Work::pending() const { return work_.defined() || bool(then_); }
Work&& Work::and_then(std::function<void()> next) && {
  if (!then_) {
    then_ = std::move(next);
  } else {
    then_ = [first = std::move(then_), second = std::move(next)] {
      first();
      second();
    };
  }
  return std::move(*this);
}

bool Work::completed() const { return !work_ || work_->isCompleted(); }
void Work::wait() {
  auto w = std::move(work_);
  auto then = std::move(then_);
  work_.reset();
  then_ = nullptr;
  if (w) finish(std::move(w), lingers_);
  if (then) then();
}

struct Group::Impl {
  c10::intrusive_ptr<BackendBase> pg;
  Backend backend = Backend::gloo;
  // Reduce-scatter and all-gather as one-tensor collectives (comm.h).
  bool one_tensor = false;
  // Gloo's kernels stop at fp16: bf16 is summed in fp32 and gathered as fp16 bits (a gather only moves bytes).
  bool lacks(const at::Tensor& t) const { return backend == Backend::gloo && t.scalar_type() == at::kBFloat16; }
  // An operation of this group's backend, to wait for later or now (Work above).
  Work track(c10::intrusive_ptr<c10d::Work> work, std::function<void()> then = {}) const {
    return Work(std::move(work), backend == Backend::gloo, std::move(then));
  }
  void complete(c10::intrusive_ptr<c10d::Work> work) const { finish(std::move(work), backend == Backend::gloo); }

  // Starts a one-tensor collective; a Gloo that refuses it (c10d's Backend throws "does not
  // support" before anything is sent, so no peer has started either) turns them off for good, and
  // the caller falls back. Every member makes the same call on the same LibTorch, so all fall back.
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> try_one_tensor(Start start) {
    if (!one_tensor) return {};
    try {
      CommunicationScope buffers;  // what the backend allocates here is the collective's
      return start();
    } catch (const c10::Error&) {
      if (backend != Backend::gloo) throw;
      one_tensor = false;
      return {};
    }
  }

  // The sum of flat over the group, this member's slice into shard, as one collective; a Work that
  // is not pending when there is none (then flat is untouched).
  Work reduce_scatter(at::Tensor& flat, at::Tensor& shard) {
    if (lacks(flat)) {  // summed in fp32, this member's slice converted back when done
      at::Tensor wide_flat = flat.to(at::kFloat), wide_shard = at::empty(shard.sizes(), wide_flat.options());
      if (auto work = try_one_tensor([&] { return pg->_reduce_scatter_base(wide_shard, wide_flat); }))
        return track(std::move(work), [shard, wide_shard, wide_flat]() mutable { shard.copy_(wide_shard); });
      return Work();
    }
    if (auto work = try_one_tensor([&] { return pg->_reduce_scatter_base(shard, flat); })) return track(std::move(work));
    return Work();
  }
};

Group Group::create(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name, std::vector<int> ranks,
                    int global_rank, const GroupOptions& options) {
  Group g;
  g.name_ = name;
  g.ranks_ = std::move(ranks);
  g.rank_ = -1;
  for (int i = 0; i < g.size(); ++i)
    if (g.ranks_[i] == global_rank) g.rank_ = i;
  if (g.rank_ < 0) throw std::logic_error("rank " + std::to_string(global_rank) + " is not in group " + name);
  g.impl_ = std::make_shared<Impl>();
  g.impl_->backend = options.backend;
  g.impl_->one_tensor = options.backend == Backend::nccl || (TORCH_VERSION_MAJOR >= 2 && !options.legacy_gloo_collectives);
  if (g.size() == 1 && !options.connect_single) return g;  // nothing to connect: collectives are the identity
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dplan/group/" + name, store);
  if (options.backend == Backend::gloo) {
    auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
    if (!options.gloo_address.empty()) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_address));
    } else if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else {
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    g.impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, g.rank_, g.size(), o);
  } else {
#ifdef DPLAN_WITH_NCCL
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = options.timeout;
    g.impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, g.rank_, g.size(), o);
#else
    throw std::runtime_error("this dplan-worker was built without NCCL (LibTorch without CUDA)");
#endif
  }
  return g;
}

void Group::all_reduce(at::Tensor& tensor) { all_reduce_async(tensor).wait(); }

Work Group::all_reduce_async(at::Tensor& tensor) {
  if (local()) return Work();
  if (impl_->lacks(tensor)) {
    std::vector<at::Tensor> wide{tensor.to(at::kFloat)};
    return impl_->track(impl_->pg->allreduce(wide), [tensor, wide]() mutable { tensor.copy_(wide[0]); });
  }
  std::vector<at::Tensor> t{tensor};
  return impl_->track(impl_->pg->allreduce(t));
}

at::Tensor Group::all_gather(const at::Tensor& tensor, int64_t dim) {
  if (local()) return tensor;
  // Member i's tensor at [i] of a [size, ...] buffer (either form of all_gather_async fills it, bf16
  // included), then laid side by side along dim.
  at::Tensor input = tensor.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape.insert(shape.begin(), size());
  at::Tensor stacked = at::empty(shape, input.options());
  at::Tensor flat = stacked.view(-1);
  all_gather_async(flat, input.view(-1)).wait();
  return dim == 0 ? stacked.flatten(0, 1) : at::cat(stacked.unbind(0), dim);
}

at::Tensor Group::reduce_scatter(const at::Tensor& tensor, int64_t dim) {
  if (local()) return tensor;
  if (tensor.size(dim) % size() != 0)
    throw std::logic_error("reduce_scatter: dimension " + std::to_string(dim) + " of size " +
                           std::to_string(tensor.size(dim)) + " does not split over " + std::to_string(size()));
  if (impl_->one_tensor) {
    // A real reduce-scatter: each rank sends and receives (n-1)/n of the tensor.
    at::Tensor input = tensor.movedim(dim, 0).contiguous();
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] /= size();
    at::Tensor output = at::empty(shape, input.options());
    at::Tensor flat = input.view(-1), shard = output.view(-1);
    if (Work work = impl_->reduce_scatter(flat, shard); work.pending()) {
      work.wait();
      return output.movedim(0, dim);
    }
  }
  // Gloo in LibTorch 1.13 has no reduce_scatter: an all-reduce followed by taking this rank's
  // slice gives the same values but moves 2(n-1)/n of the tensor per rank instead of (n-1)/n,
  // twice the traffic of a true reduce-scatter (the cost model prices the true one).
  at::Tensor sum = tensor.contiguous().clone();
  all_reduce(sum);
  return sum.chunk(size(), dim)[rank_].contiguous();
}

Work Group::all_gather_async(at::Tensor& flat, const at::Tensor& shard) {
  if (local()) {
    if (flat.data_ptr() != shard.data_ptr()) flat.copy_(shard);
    return Work();
  }
  if (impl_->lacks(flat)) {
    at::Tensor bits = flat.view(at::kHalf);
    return all_gather_async(bits, shard.contiguous().view(at::kHalf));
  }
  at::Tensor input = shard;  // in place when the shard is this member's slice of flat
  if (auto work = impl_->try_one_tensor([&] { return impl_->pg->_allgather_base(flat, input); }))
    return impl_->track(std::move(work));
  // Gloo: the list form, each output a slice of the flat buffer.
  std::vector<at::Tensor> in{shard.contiguous()};
  std::vector<std::vector<at::Tensor>> out{flat.chunk(size(), 0)};
  return impl_->track(impl_->pg->allgather(out, in));
}

Work Group::reduce_scatter_async(at::Tensor& flat, at::Tensor& shard) {
  if (local()) {
    shard.copy_(flat);
    return Work();
  }
  if (Work work = impl_->reduce_scatter(flat, shard); work.pending()) return work;
  // Gloo under 1.13: all-reduce, then keep this member's slice (twice the traffic; see reduce_scatter()).
  const int64_t n = shard.numel(), offset = int64_t(rank_) * n;
  return all_reduce_async(flat).and_then([flat, shard, offset, n]() mutable { shard.copy_(flat.narrow(0, offset, n)); });
}

at::Tensor Group::all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows) {
  if (local()) return input;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = 0;
  for (int64_t n : recv_rows) shape[0] += n;
  at::Tensor in = input.contiguous();
  at::Tensor out = at::empty(shape, in.options());
  if (impl_->lacks(in)) {  // Gloo has no bf16; an all-to-all only moves bytes: send them as fp16 bits
    at::Tensor bits = out.view(at::kHalf), in_bits = in.view(at::kHalf);
    std::vector<int64_t> s(send_rows), r(recv_rows);
    CommunicationScope buffers;
    impl_->complete(impl_->pg->alltoall_base(bits, in_bits, r, s));
    return out;
  }
  std::vector<int64_t> s(send_rows), r(recv_rows);  // c10d takes them by non-const reference
  CommunicationScope buffers;  // what the backend allocates while it runs is the collective's
  impl_->complete(impl_->pg->alltoall_base(out, in, r, s));
  return out;
}

void Group::broadcast(at::Tensor& tensor, int root) {
  if (local()) return;
  std::vector<at::Tensor> t{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->complete(impl_->pg->broadcast(t, o));
}

Work Group::send(const at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> t{tensor};
  return impl_->track(impl_->pg->send(t, peer, tag));
}

Work Group::recv(at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> t{tensor};
  return impl_->track(impl_->pg->recv(t, peer, tag));
}

bool Group::one_tensor_collectives() const { return impl_->one_tensor; }

bool Group::local() const { return !impl_ || !impl_->pg; }

void Group::barrier() {
  if (local()) return;
  impl_->complete(impl_->pg->barrier());
}

std::vector<CollectiveCheck> check_collectives(Backend backend, const at::Device& device,
                                               std::chrono::milliseconds timeout) {
  const std::string which = std::string("--check-backend ") + to_string(backend);
  if (backend == Backend::nccl) {
    if (!nccl_available()) throw InputError(which + ": this dplan-worker was built without NCCL (LibTorch without CUDA)");
    if (!device.is_cuda() || !torch::cuda::is_available())
      throw InputError(which + ": no CUDA device is visible to this LibTorch");
  }
  GroupOptions options;
  options.backend = backend;
  options.timeout = timeout;
  options.gloo_address = "127.0.0.1";
  options.connect_single = true;
  Group g = Group::create(c10::make_intrusive<c10d::HashStore>(), "check", {0}, 0, options);
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  // 4 Mi fp32 elements (16 MiB): large enough to run the backend's bulk kernels, small enough for
  // any device; each collective run 5 times, the median kept.
  const int64_t n = int64_t(1) << 22;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor expected = at::arange(n, f32).remainder_(977).mul_(0.5);
  std::vector<CollectiveCheck> checks;
  auto run = [&](const std::string& name, int64_t bytes, const std::function<at::Tensor()>& collective) {
    std::vector<double> times_s;
    at::Tensor result;
    for (int i = 0; i < 5; ++i) {
      sync();
      const auto start = std::chrono::steady_clock::now();
      result = collective();
      sync();
      times_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times_s.begin(), times_s.end());
    CollectiveCheck c;
    c.collective = name;
    c.bytes = bytes;
    c.time_s = times_s[times_s.size() / 2];
    c.ok = result.defined() && result.sizes() == expected.sizes();
    if (c.ok) c.max_abs_error = (result - expected).abs().max().item<double>();
    c.ok = c.ok && c.max_abs_error == 0;
    checks.push_back(c);
  };
  // A group of one: the sum, the gathered and the scattered tensors are the input itself.
  run("all_reduce", n * 4, [&] {
    at::Tensor t = expected.clone();
    g.all_reduce(t);
    return t;
  });
  run("all_gather", n * 4, [&] { return g.all_gather(expected, 0); });
  run("reduce_scatter", n * 4, [&] { return g.reduce_scatter(expected, 0); });
  run("all_to_all", n * 4, [&] { return g.all_to_all(expected, {n}, {n}); });
  run("broadcast", n * 4, [&] {
    at::Tensor t = expected.clone();
    g.broadcast(t, 0);
    return t;
  });
  run("barrier", 0, [&] {
    g.barrier();
    return expected;
  });
  return checks;
}

}  // namespace dplan::executor
