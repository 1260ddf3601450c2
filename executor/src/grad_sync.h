// Data-parallel gradient reduction and ZeRO's sharding of the model state over the data-parallel
// group (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models"), on flat buckets of parameters:
//   - stage 0: every parameter and its .grad are views into a bucket's flat buffers (PyTorch
//     DDP's Reducer with gradient_as_bucket_view, Megatron's grad buffer). A hook on each gradient
//     accumulator counts the parameter ready; once the last one of a bucket is ready on the step's
//     last micro-batch the bucket's all-reduce starts, overlapping the rest of backward.
//     Accumulation micro-batches only accumulate.
//   - stage 1 (and Megatron's distributed optimizer): the same, but each dp rank steps only its
//     1/dp slice of each bucket and the slices are all-gathered after the step.
//   - stage 2: gradients are sharded too. When a bucket's first gradient of a micro-batch
//     arrives, a flat buffer is made and its members' .grads become views of it; once all are
//     there it is reduce-scattered, this rank's slice added into its gradient shard, and freed:
//     every micro-batch, as DeepSpeed does, so no full gradient outlives its bucket. At most two
//     buckets are unsharded at a time (one reducing, one filling).
//   - stage 3: parameters are sharded as well. A bucket is one unit of the model (GptStage's
//     units: the embedding, each layer, the head); its full parameters exist only while the unit
//     runs: gathered before its forward and again before its backward, the next unit's gather
//     prefetched, and freed after use (the views keep their shapes, the storage goes).
// After the last backward, finish() waits for the outstanding reductions, then sums the grads of
// tp-replicated parameters that sequence parallelism leaves partial, and the word-embedding grads
// of the first and last pipeline stages when embeddings are tied (that parameter has a bucket of
// its own, so both stages shard it alike).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include "comm.h"
#include "gpt.h"

namespace dplan::executor {

class GradSync : public UnitHooks {
 public:
  // zero_stage 0-3; shard_optimizer: stage 1 or the distributed optimizer (implied by 2, 3).
  // Buckets follow the reverse of the parameters' order (the order backward produces gradients);
  // with ZeRO-3 a bucket is a unit of `stage` (which then calls this object's unit hooks).
  // Gradients are kept and reduced in grad_dtype: fp32 accumulates 16-bit parameters' gradients
  // in fp32 (Megatron's main_grad); otherwise the parameters' dtype.
  GradSync(GptStage& stage, ParallelContext& ctx, int64_t bucket_bytes, int zero_stage, bool shard_optimizer,
           at::ScalarType grad_dtype);
  ~GradSync() override;

  // Before the backward of the step's last micro-batch through model chunk `chunk`: arm that
  // chunk's buckets (a bucket never spans two chunks, whose last backwards come at different times).
  void arm_last_microbatch(int chunk);
  // After the last backward: wait for the buckets and do the tp / embedding sums.
  void finish();
  void zero();
  // The L2 norm of the whole model's gradient, over every tp, pp and (sharded) dp shard, each
  // value counted once (tp-replicated parameters on tp rank 0 only, the tied embedding on the
  // first stage only); if it exceeds max_norm (> 0), every gradient is scaled by max_norm / norm,
  // as torch.nn.utils.clip_grad_norm_ and Megatron's clip_grad_norm do. Returns the norm before
  // clipping. Call after finish().
  double clip_grad_norm(double max_norm);
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  bool sharded_optimizer() const { return shard_optimizer_; }

  // Bytes held for the whole step: parameters (their shards under ZeRO-3) and gradients (their
  // shards under ZeRO-2 and 3), padding included.
  int64_t weight_bytes() const;
  int64_t gradient_bytes() const;

  // fp32 master weights kept apart from 16-bit parameters (0 when the parameters are fp32, or
  // when they live in host memory: offload).
  int64_t master_bytes() const;

  // Optimizer offload (Ren et al. 2021, "ZeRO-Offload"): the fp32 weights the optimizer steps
  // and an fp32 copy of their reduced gradients move to host memory (pinned on CUDA, allocated
  // under a HostScope so the meter counts them apart), distinct from the device's parameters and
  // gradients even on CPU; optimizer_params() then hands out those. Call once, right after
  // construction, before optimizer_params(). Each step: gradients_to_host() before the host's
  // step, and finish_step() copies the updated weights back into the device's parameters.
  void offload_optimizer();
  bool offloaded() const { return offload_; }
  // The reduced (and clipped) gradients of the optimizer's region into their host copy: on CUDA
  // on a side stream, after the compute stream's work, waited for before returning.
  void gradients_to_host();
  int64_t host_master_bytes() const;
  int64_t host_gradient_bytes() const;

  // What the optimizer steps: every bucket (unsharded) or this rank's 1/dp slice of it (sharded),
  // cut at parameter boundaries (so weight decay stays per parameter) into leaf views of the fp32
  // weights (the parameters themselves, or their master copy) whose grads are views of the
  // gradients; the optimizer holds state for just those elements.
  struct OptimizerParam {
    at::Tensor tensor;
    bool weight_decay = true;
  };
  std::vector<OptimizerParam> optimizer_params();
  // What a checkpoint holds of this rank's optimizer region, one entry per optimizer_params()
  // entry, in the same order: parameter `param`'s elements [lo, lo + n) (of its flattened local
  // tensor), its weights in the parameters' dtype (`weight`: views into the parameters, the shard
  // under ZeRO-3) and the fp32 weights the optimizer steps (`master`: the tensor optimizer_params()
  // gave, a view of `weight` itself when the parameters are fp32 and not offloaded). `writes`:
  // this rank is the one that writes these elements (each element once across the job: the dp x cp
  // (edp for experts) rank 0 of an unsharded optimizer, every shard's owner of a sharded one; tp
  // rank 0 of tp-replicated parameters; the first stage of a tied embedding).
  struct StatePiece {
    int param = 0;
    int64_t lo = 0, n = 0;
    at::Tensor weight, master;
    bool writes = false;
  };
  std::vector<StatePiece> state_pieces();
  // After the optimizer step: master weights into 16-bit parameters, and for a sharded optimizer
  // (ZeRO 1 and 2) every rank's updated slice to every rank.
  void finish_step();
  // ZeRO-3: gather every unit and keep it (to read the whole model after training).
  void gather_all_units();

  // UnitHooks (ZeRO-3).
  void before_forward(const std::vector<int>& units) override;
  at::Tensor after_forward(const std::vector<int>& units, const at::Tensor& output) override;

 private:
  struct Bucket {
    std::vector<int> members;
    Group* group = nullptr;  // what its members' gradients are summed and sharded over: dp, or edp for experts
    int unit = -1;
    int chunk = 0;          // the model chunk its members belong to
    int64_t numel = 0;      // padded to a multiple of dp
    at::Tensor params;      // the parameters' storage (flat, full); ZeRO-3: present only while gathered
    at::Tensor grads;       // flat, full: the .grads' storage for stages 0, 1; a scratch buffer for 2, 3
    at::Tensor param_shard;  // this rank's slice of params (ZeRO-3: its own storage)
    at::Tensor grad_shard;   // this rank's slice of the reduced gradient (stages 1-3)
    at::Tensor master;       // fp32 weights the optimizer steps (its region of the bucket); offload: on the host
    at::Tensor host_grads;   // offload: the host's fp32 copy of the region's reduced gradients
    at::Tensor grads_reduced;  // stages 2, 3: this rank's slice of the sum, while it is in flight
    int ready = 0;          // members whose gradient is final (this micro-batch from stage 2 on)
    Work work;              // the outstanding reduction
  };
  struct Unit {
    std::vector<int> buckets;
    enum class State { released, gathering, gathered } state = State::released;
    std::vector<Work> gathers;
    int reducing = 0;  // buckets whose gradients have gone to reduction this micro-batch
  };
  // The constructor's parts: bucket `b` of parameters `members`, and its members moved into the
  // bucket's flat storage (their .grads views of its gradients, stages 0 and 1) with a hook on each
  // gradient accumulator where gradients are reduced.
  Bucket make_bucket(int b, const std::vector<int>& members);
  void adopt_parameters(Bucket& bucket, int b);
  void mark_ready(int bucket, int param);
  void provide_gradient_buffer(int bucket);
  void launch_sharded_reduction(int bucket);
  void complete_reductions();
  void gather(int unit, bool wait);
  void release(int unit);
  void before_backward(const std::vector<int>& units);
  at::Tensor optimizer_region(const Bucket& b, const at::Tensor& flat) const;
  // The weights the optimizer's region of a bucket maps to in the parameters' dtype (the shard
  // under ZeRO-3), and the device gradients it steps with (the reduced shard from ZeRO-2 on).
  at::Tensor optimizer_weights(const Bucket& b) const;
  at::Tensor optimizer_gradients(const Bucket& b) const;
  // The group the dense buckets are reduced (and ZeRO-sharded) over: dp x cp, since every cp rank
  // holds every dense parameter (Megatron-Core's data-parallel group with context parallel;
  // costmodel memory.cpp shards over dp * cp). The same ranks as dp when cp is 1.
  Group& dense_group() const { return ctx_.dp_cp; }

  GptStage& stage_;
  std::vector<Parameter>& params_;
  ParallelContext& ctx_;
  int zero_stage_;
  bool shard_optimizer_;
  at::ScalarType grad_dtype_;
  std::vector<Bucket> buckets_;
  std::vector<Unit> units_;
  std::vector<int> reducing_;  // stage 2, 3: buckets whose reduce-scatter is in flight, oldest first
  // The gradient accumulators, kept alive for their hooks. Autograd holds its nodes by
  // std::shared_ptr in LibTorch 1.13 and by c10::intrusive_ptr in later 2.x: whichever
  // grad_accumulator() returns.
  using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<NodePtr> accumulators_;
  std::vector<bool> armed_;  // per model chunk: its last micro-batch's backward is running
  bool offload_ = false;
  bool has_experts_ = false;  // an MoE stage: the expert groups exist
};

}  // namespace dplan::executor
