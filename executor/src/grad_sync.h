// Data-parallel gradient reduction in buckets that starts during backward (what PyTorch DDP's
// Reducer and Megatron's grad buffer do): each parameter's .grad is a view into a flat bucket
// buffer, a hook on its gradient accumulator counts it ready, and when the last parameter of a
// bucket is ready on the last micro-batch of the step the bucket's all-reduce is launched
// asynchronously. Accumulation micro-batches only accumulate: no communication. finish() waits
// for the outstanding buckets (the exposed part is charged to dp_comm), then sums the grads of
// tp-replicated parameters that sequence parallelism leaves partial, and the word-embedding
// grads of the first and last pipeline stages when embeddings are tied.
#pragma once

#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "comm.h"
#include "gpt.h"

namespace torch::autograd {
struct Node;
}

namespace dplan::executor {

class GradSync {
 public:
  // Buckets follow the reverse of `params`' order (the order backward produces gradients).
  GradSync(std::vector<Parameter>& params, ParallelContext& ctx, int64_t bucket_bytes);
  ~GradSync();

  // Before the backward of the step's last micro-batch: arm the buckets.
  void arm_last_microbatch();
  // After the last backward: wait for the buckets and do the tp / embedding sums.
  void finish();
  void zero();
  // The L2 norm of the whole model's gradient, over every tp shard and pipeline stage, each value
  // counted once (tp-replicated parameters on tp rank 0 only, the tied embedding on the first
  // stage only); if it exceeds max_norm (> 0), every gradient is scaled by max_norm / norm, as
  // torch.nn.utils.clip_grad_norm_ and Megatron's clip_grad_norm do. Returns the norm before
  // clipping. Call after finish().
  double clip_grad_norm(double max_norm);
  int64_t buffer_bytes() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  // What the optimizer steps. Unsharded: the parameters themselves. Sharded over dp (ZeRO-1, the
  // Megatron distributed optimizer): this rank's 1/dp slice of every bucket, cut at parameter
  // boundaries into leaf views of the flat parameter buffer whose grads are views of the
  // gradient buffer, so stepping them updates the model in place and the optimizer holds state
  // for 1/dp of the parameters.
  struct OptimizerParam {
    at::Tensor tensor;
    bool weight_decay = true;
  };
  std::vector<OptimizerParam> optimizer_params(bool shard_over_dp);
  // After a sharded step: every rank's updated slice to every rank (an all-gather per bucket).
  void gather_parameters();

 private:
  struct Bucket {
    at::Tensor buffer;  // gradients, flat, padded to a multiple of dp
    at::Tensor params;  // the parameters' storage, same layout
    std::vector<int> members;
    int ready = 0;  // members whose gradient is final this step
    Work work;
  };
  void mark_ready(int bucket);

  std::vector<Parameter>& params_;
  ParallelContext& ctx_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  bool armed_ = false;
};

}  // namespace dplan::executor
