// Megatron-LM's tensor-parallel operators as autograd functions (Shoeybi et al. 2019, §3, Fig. 3;
// Korthikanti et al. 2022, §4.2.2 for the sequence-parallel pair). Each is the identity on a group
// of size 1, so one code path serves every layout. Communication time is charged to tp_comm.
//   copy_to_tp       f: forward identity,          backward all-reduce
//   reduce_from_tp   g: forward all-reduce,        backward identity
//   gather_from_sp   g: forward all-gather(seq),   backward reduce-scatter(seq)
//   scatter_to_sp    forward reduce-scatter(seq),  backward all-gather(seq)
#pragma once

#include <ATen/ATen.h>

#include "comm.h"

namespace dplan::executor {

at::Tensor copy_to_tp(const at::Tensor& x, Group& tp);
at::Tensor reduce_from_tp(const at::Tensor& x, Group& tp);
at::Tensor gather_from_sp(const at::Tensor& x, Group& tp, int64_t dim);
at::Tensor scatter_to_sp(const at::Tensor& x, Group& tp, int64_t dim);

// Cross-entropy over a vocabulary split across the tp group (Megatron's vocab-parallel loss):
// `logits` [N, V/tp] holds this rank's columns [vocab_start, vocab_start + V/tp); `targets` [N] are
// global ids. Columns at or past `vocab_size` (padding) are excluded from the softmax, so the loss
// does not depend on how much padding tp forced. Returns the per-token loss [N] (fp32).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab_size, Group& tp);

}  // namespace dplan::executor
