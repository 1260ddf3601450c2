// The one place that speaks c10d. Everything above it (model, pipeline, data parallel, launcher)
// sees Group and Work, so the differences between LibTorch 1.13 and 2.x stay here:
//   - 1.13: ProcessGroupGloo / ProcessGroupNCCL derive from c10d::ProcessGroup;
//     2.x: they derive from c10d::Backend (ProcessGroup became a dispatching wrapper).
//   - 1.13's Gloo has no reduce-scatter and no all-gather into one tensor: a reduce-scatter is an
//     all-reduce and a slice (twice the traffic), an all-gather the list form into slices of the
//     output. 2.x's Gloo has both (reduce_scatter_single, all_gather_single, reached through the
//     _reduce_scatter_base / _allgather_base names every 2.x has); a 2.x whose Gloo still refuses
//     them falls back to the 1.13 forms at the first call. NCCL always has them.
//   - Gloo has no bf16: sums go through an fp32 copy, gathers move the bits as fp16.
// Groups of size 1 never touch the network: every collective is the identity on them (unless
// GroupOptions::connect_single asks for the backend, as check_collectives does).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/optim/optimizer.h>

namespace dplan::executor {

enum class Backend { gloo, nccl };
const char* to_string(Backend b);
// True when this build can create NCCL groups (LibTorch with CUDA and c10d NCCL).
bool nccl_available();

// The state an optimizer keeps for `param` (nullptr: none yet), and setting it. LibTorch 1.13 keys
// an optimizer's state by the string of the parameter's TensorImpl address, 2.x by the address.
torch::optim::OptimizerParamState* optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         std::unique_ptr<torch::optim::OptimizerParamState> state);

// An outstanding asynchronous operation; wait() rethrows the backend's error (peer gone, timeout).
// Gloo's worker thread lets go of an operation, and of the tensors it holds, just after it marks
// the operation complete: wait() on a Gloo operation returns once it has (bounded: a few ms at
// most), so that what the caller drops next is freed then. On CPU, where memory is counted
// exactly, a tensor that outlived its last use by the worker's delay raised the measured peak by a
// timing-dependent amount.
class Work {
 public:
  Work() = default;
  // `then` runs once, after the operation completes, inside wait(); `lingers`: the backend's
  // worker may hold the operation past its completion (Gloo).
  Work(c10::intrusive_ptr<c10d::Work> work, bool lingers, std::function<void()> then = {});
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  void wait();
  bool pending() const;
  // The operation has finished (without waiting); wait() still runs `then` and reports errors.
  bool completed() const;
  // Adds a step to run after the ones already there, inside wait().
  Work&& and_then(std::function<void()> next) &&;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  bool lingers_ = false;
  std::function<void()> then_;
};

struct GroupOptions {
  Backend backend = Backend::gloo;
  std::chrono::milliseconds timeout{60000};
  // Gloo: the address this rank listens on ("127.0.0.1" for one machine); empty: the interface
  // named by GLOO_SOCKET_IFNAME, else the hostname's address (Gloo's default device).
  std::string gloo_address;
  // Use the 1.13 forms of reduce-scatter and all-gather (above) on Gloo even where the LibTorch has
  // the one-tensor collectives: the tests check that both give the same values.
  bool legacy_gloo_collectives = false;
  // Connect a group of one too, so that its collectives run through the backend (the identity
  // otherwise): check_collectives below, which shows that the backend initialises and runs.
  bool connect_single = false;
};

// A process group over `ranks` (global ranks, in group order) that this rank belongs to.
class Group {
 public:
  Group() = default;
  // Every member calls this with the same name and ranks; non-members must not.
  // The store is shared by all groups; each group lives under its own key prefix.
  static Group create(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                      std::vector<int> ranks, int global_rank, const GroupOptions& options);

  int rank() const { return rank_; }  // this process's index in the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }
  const std::string& name() const { return name_; }

  // In-place sum over the group.
  void all_reduce(at::Tensor& tensor);
  Work all_reduce_async(at::Tensor& tensor);
  // The members' tensors concatenated along `dim`, in group order.
  at::Tensor all_gather(const at::Tensor& tensor, int64_t dim);
  // Sum over the group, then this member's 1/size slice along `dim` (which must divide).
  at::Tensor reduce_scatter(const at::Tensor& tensor, int64_t dim);
  // Flat (1-D) forms for ZeRO's buckets. all_gather_async: every member's `shard` into `flat`
  // (size * shard.numel() elements, member i's at offset i * shard.numel(); `shard` may be this
  // member's own slice of `flat`). reduce_scatter_async: the sum of `flat` over the group, this
  // member's slice of it written to `shard`; `flat` is used as scratch. The tensors must stay
  // alive until the Work completes.
  Work all_gather_async(at::Tensor& flat, const at::Tensor& shard);
  Work reduce_scatter_async(at::Tensor& flat, at::Tensor& shard);
  // All-to-all with split sizes along dim 0 (c10d alltoall_base; Gloo has it in 1.13 and 2.x):
  // rows [sum(send_rows[:j]), +send_rows[j]) of `input` go to member j, and what member i sends
  // here lands at rows [sum(recv_rows[:i]), +recv_rows[i]) of the result. Every member's
  // send_rows[j] must equal member j's recv_rows[i] (exchange the counts first).
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows);
  void broadcast(at::Tensor& tensor, int root);
  // Point-to-point with group ranks; the tensor must stay alive until the Work completes.
  Work send(const at::Tensor& tensor, int peer, int tag);
  Work recv(at::Tensor& tensor, int peer, int tag);
  void barrier();
  // Whether reduce-scatter and all-gather run as one-tensor collectives (NCCL; Gloo under LibTorch
  // 2.x) rather than the 1.13 forms; false after a Gloo refused them.
  bool one_tensor_collectives() const;

 private:
  // No backend behind the group (one member, not connected): every collective is the identity.
  bool local() const;
  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::vector<int> ranks_;
  std::string name_;
  int rank_ = 0;
};

// One collective of check_collectives: whether the backend's result equals the expected values.
struct CollectiveCheck {
  std::string collective;
  int64_t bytes = 0;
  double max_abs_error = 0;
  double time_s = 0;  // the collective's wall time, its device synchronised (median of 5)
  bool ok = false;
};

// The backend's own collectives (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast,
// barrier) on a group of this process alone, connected through an in-memory store, on `device`
// (NCCL: a CUDA device): that the backend initialises and its kernels run. Throws InputError when
// this build or machine cannot run the backend on that device.
std::vector<CollectiveCheck> check_collectives(Backend backend, const at::Device& device,
                                               std::chrono::milliseconds timeout);

}  // namespace dplan::executor
