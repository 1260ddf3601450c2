// Context parallel: exact causal attention over a sequence split between the cp ranks, as
// Megatron-Core runs it through Transformer Engine's p2p ring (attention.py,
// AttnFuncWithCPAndKVP2P; Liu et al. 2023, arXiv 2310.01889, "Ring Attention with Blockwise
// Transformers"), and as the cost model prices it (costmodel/src/time_phases.cpp
// context_parallel_comm, activations.cpp, compute.cpp):
//   - causal load balance: the sequence is cut into 2*cp chunks and cp rank i holds chunks i and
//     2cp-1-i, in that order (Megatron-LM get_batch_on_this_cp_rank), so every rank does the same
//     causal work;
//   - forward: cp steps; at step t the rank holds the K,V of cp rank i-t, attends its queries to
//     them (the blockwise flash pieces of attention.h, the causal mask and any sliding window by
//     each token's true position; a chunk entirely in a query chunk's future, or beyond its window,
//     is skipped), merges the partial outputs
//     by their log-sum-exp (online softmax, Milakov & Gimelshein 2018), and meanwhile sends the
//     K,V in hand to cp rank i+1 and receives cp rank i-t-1's: cp-1 transfers of its K,V chunk;
//   - backward: the ring again, K,V prefetched the same way; dQ accumulates here, the partial dK,dV
//     of the block in hand travel with it (received from cp rank i-1, this rank's share added, sent
//     to i+1), and after the last step each block's dK,dV arrive home: cp transfers of the dK,dV.
// Grouped-query K/V travel and multiply at kv-head width; K and V travel together as one flat
// buffer (K's elements, then V's: one transfer a step, whatever V's head width), as do dK and dV;
// softmax statistics are fp32; what travels has K/V's dtype. Saved for backward: this rank's q, k,
// v, the output and the fp32 log-sum-exp, the same as flash_attention (no received K,V outlives
// its step). Waits on the ring are timed into the cp_comm phase (costmodel/phases.h), beside the
// cost model's cp_comm.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "attention.h"
#include "comm.h"
#include "phase_clock.h"

namespace dplan::executor {

// This cp rank's share of a full-sequence tensor along `dim`: chunks `rank` and 2cp-1-rank of
// 2*cp equal chunks, concatenated (differentiable). `dim`'s size must be divisible by 2*cp.
at::Tensor cp_chunks(const at::Tensor& full, int64_t dim, int cp, int rank);

// q [b, heads, 2c, d], k [b, kv_heads, 2c, d], v [b, kv_heads, 2c, dv] (dv may differ from d, as
// flash_attention's): this rank's two chunks (cp_chunks order) of the queries, keys and values of a
// causal sequence of 2*c*cp tokens, heads % kv_heads == 0, q, k, v of one dtype. Every member of
// `cp` calls it with the same shapes in the same order. Returns this rank's rows of the context as
// [b, 2c, heads * dv] (contiguous), with q's dtype; the gradients have q's, k's and v's shapes.
// `clock` may be null. scale: the scores' scale, 0 standing for 1 / sqrt(d) (flash_attention's).
// window > 0: a sliding window (flash_attention's), by the tokens' true positions; a K,V chunk
// wholly outside every query's window is not multiplied (it still travels the ring). sinks
// [heads], defined: attention sinks (attention.h add_sinks), folded in once every query's keys are
// done; their gradient is this rank's queries' share. dropout: attention dropout as
// flash_attention's (its probabilities' keep masks), each (block, query chunk, key chunk) tile's
// masks drawn from dropout.seed and the tile alone, so that backward draws them again; the caller
// draws the seed (from the generator recompute restores: the masks replay).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Group& cp,
                          PhaseClock* clock, int64_t window = 0, const at::Tensor& sinks = {},
                          const AttentionDropout& dropout = {}, int64_t block = 64, double scale = 0);

// The tensors a ring_attention output's graph node holds for backward, {q, k, v, out, lse} (v
// [b, kv_heads, 2c, dv], out [b, 2c, heads * dv]) and the sinks where given; empty if `out` did
// not come from ring_attention. For tests and memory accounting.
std::vector<at::Tensor> ring_attention_saved(const at::Tensor& out);

}  // namespace dplan::executor
