// Megatron-LM's tensor-parallel operators as autograd functions (Shoeybi et al. 2019, §3, Fig. 3;
// Korthikanti et al. 2022, §4.2.2 for the sequence-parallel pair). Each is the identity on a group
// of size 1, so one code path serves every layout. Communication time is charged to tp_comm on
// the clock passed in.
//   copy_to_tp       f: forward identity,          backward all-reduce
//   reduce_from_tp   g: forward all-reduce,        backward identity
//   scatter_to_sp    forward reduce-scatter(seq),  backward all-gather(seq)
//   gather_from_sp   forward all-gather(seq),      backward reduce-scatter(seq)
//   gather_from_tp   forward all-gather(dim),      backward this rank's part (a column-parallel
//                    output made whole on every rank: Megatron's gather_from_tensor_model_parallel_region)
//   split_to_sp      forward this rank's part(seq), backward all-gather(seq) (a replicated tensor
//                    into sequence parallel: Megatron's scatter_to_sequence_parallel_region)
//   sp_column_linears  g (all-gather(seq)) fused with the column-parallel linears that follow it
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "comm.h"
#include "phase_clock.h"

namespace dplan::executor {

at::Tensor copy_to_tp(const at::Tensor& x, Group& tp, PhaseClock& clock);
at::Tensor reduce_from_tp(const at::Tensor& x, Group& tp, PhaseClock& clock);
at::Tensor scatter_to_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim);
at::Tensor gather_from_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim);
at::Tensor gather_from_tp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim);
at::Tensor split_to_sp(const at::Tensor& x, Group& tp, PhaseClock& clock, int64_t dim);

// Under sequence parallel: the column-parallel linears y_i = x_full W_i^T + b_i of one
// sequence-sharded input x (all-gathered along `dim` for them), saving only the shard and
// gathering it again in backward (Megatron's sequence-parallel linear). biases[i] may be
// undefined; `biases` may be shorter than `weights`.
std::vector<at::Tensor> sp_column_linears(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                          const std::vector<at::Tensor>& biases, Group& tp, PhaseClock& clock,
                                          int64_t dim);

// Cross-entropy over a vocabulary split across the tp group (Megatron's vocab-parallel loss):
// `logits` [N, V/tp] holds this rank's columns [vocab_start, vocab_start + V/tp); `targets` [N] are
// global ids. Columns at or past `vocab_size` (padding) are excluded from the softmax, so the loss
// does not depend on how much padding tp forced. Returns the per-token loss [N] (fp32).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        int64_t vocab_size, Group& tp, PhaseClock& clock);

}  // namespace dplan::executor
