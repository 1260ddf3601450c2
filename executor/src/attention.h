// Memory-efficient exact causal attention (Rabe & Staats 2021, arXiv 2112.05682, "Self-attention
// does not need O(n^2) memory"; Dao et al. 2022, arXiv 2205.14135, FlashAttention), so that the
// executor's stored activations are what a FlashAttention kernel stores.
//
// Saved for backward, and nothing else: q, k, v at their own head counts (grouped-query K/V stay
// at kv-head width; contiguous copies only of inputs that are not contiguous, so a strided view
// into a fused QKV tensor does not keep that tensor alive), the output (the very tensor returned),
// and an fp32 log-sum-exp per (batch, head, query). No s x s tensor is saved: scores exist only
// transiently, one [b, heads, block, <= s] tile per block of queries (backward holds two: P and
// dP). Backward recomputes P from the log-sum-exp. Only ATen ops: runs on CPU and CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace dplan::executor {

// q [b, heads, s, d], k [b, kv_heads, s, d], v [b, kv_heads, s, dv] with heads % kv_heads == 0 (dv,
// the value head width, may differ from d, the query/key head width: DeepSeek's multi-head latent
// attention has d = 192, dv = 128); causal (query i sees keys 0..i), and with window > 0 only the
// last `window` of those (keys i - window + 1 .. i: a sliding window, Mistral's and gpt-oss's; no
// work is done on the keys it hides). The scores are q k^T * scale, scale 0 standing for
// 1 / sqrt(d) (DeepSeek's yarn mscale gives another; any other must be positive). Returns the
// context as [b, s, heads * dv] (contiguous), the same tensor the function saves, so that an output
// projection that saves its input shares that storage (as flash-attn's [b, s, h, dv] output does).
// Softmax statistics are fp32 whatever the input dtype; the result has q's dtype. Gradients: q's
// [b, heads, s, d], k's [b, kv_heads, s, d], v's [b, kv_heads, s, dv]. Not twice differentiable.
//
// dropout > 0: attention dropout on the probabilities, as FlashAttention applies it (Dao et al.
// 2022, Algorithms 2 and 4): each query block's probabilities are multiplied by a keep mask and
// 1 / (1 - dropout) after the softmax (the log-sum-exp stays that of the undropped scores), the
// masks drawn from a seed taken from the default generator of q's device when the forward runs
// (so recompute, which restores that generator, replays them) and drawn again in backward.
//
// sinks [heads] (defined: gpt-oss's attention sinks, add_sinks below) receive their gradient too.
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block = 64,
                           double dropout = 0.0, int64_t window = 0, const at::Tensor& sinks = {},
                           double scale = 0);

// The tensors a flash_attention output's graph node holds for backward, in the order
// {q, k, v, out, lse} (v [b, kv_heads, s, dv], out [b, s, heads * dv]) and the sinks where given;
// empty if `out` did not come from flash_attention; throws once backward has freed them. For tests
// and memory accounting.
std::vector<at::Tensor> flash_attention_saved(const at::Tensor& out);

// The blockwise pieces flash_attention is made of, shared with the context-parallel ring
// (ring_attention.h), which runs them on one K/V block at a time. q, k, v and the gradients fp32.
//
// Which of a block's keys each query sees, by their positions in the sequence: query row i is at
// q_first + i, key row j at k_first + j; key j is seen when it is not later than the query
// (causal) and, with a window, fewer than `window` positions earlier.
struct KeyMask {
  bool causal = true;
  int64_t q_first = 0, k_first = 0;
  int64_t window = 0;  // 0: no window
};

// Attention of q [b, heads, n, d] to one block of keys k [b, kv_heads, m, d] and values v
// [b, kv_heads, m, dv] only (dv may differ from d), in query blocks of `block` rows; only the keys
// `mask` lets a query block see are multiplied. The scores are q k^T * scale (0: 1 / sqrt(d), as
// flash_attention). Writes the output normalised over this block's keys into out4
// [b, n, heads, dv] (any strides, e.g. a view of a [b, n, heads * dv] tensor) and the fp32
// log-sum-exp of each query's scores into lse [b, heads, n]; a query that sees none of the block's
// keys gets output 0 and log-sum-exp -inf.
//
// `dropout`: flash_attention's attention dropout (probability 0: none); the same masks (and the
// same scale) must be given to attend_block_backward.
struct AttentionDropout {
  double probability = 0;
  uint64_t seed = 0;
};
void attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KeyMask& mask, int64_t block,
                  const at::Tensor& out4, const at::Tensor& lse, const AttentionDropout& dropout = {},
                  double scale = 0);

// Gradients through attend_block's scores against the same block, given the output out4
// [b, n, heads, dv] and fp32 log-sum-exp lse [b, heads, n] of the whole attention the block is
// part of (with those, each block's probabilities P = exp(S - lse) are the whole softmax's and
// D = rowsum(dO * O) is the whole output's: Dao et al. 2022, Algorithm 4): adds into dq
// [b, heads, n, d], dk [b, kv_heads, m, d] and dv [b, kv_heads, m, dv] (fp32, any strides).
// dout4 [b, n, heads, dv]. `scale` as given to attend_block.
void attend_block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out4,
                           const at::Tensor& dout4, const at::Tensor& lse, const KeyMask& mask, int64_t block,
                           const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                           const AttentionDropout& dropout = {}, double scale = 0);

// Attention sinks (gpt-oss: transformers' GptOssAttention; Xiao et al. 2023, arXiv 2309.17453): a
// learned logit per head in every query's softmax denominator, attending to no value. Given the
// output out4 [b, n, heads, dv] and fp32 log-sum-exp lse [b, heads, n] over the keys, folds sinks
// [heads] in, in place: lse' = log(e^lse + e^sink), out4 *= e^(lse - lse'). Backward then runs on
// out4 and lse' as on any output: the keys' probabilities P = exp(S - lse') are the sink softmax's.
void add_sinks(const at::Tensor& out4, const at::Tensor& lse, const at::Tensor& sinks);

// The sinks' gradient [heads] (fp32) given the final out4 [b, n, heads, dv], its gradient dout4
// (the same shape) and lse': with Z = sum e^S + e^sink, dO/dsink = -O e^sink / Z, so
// dL/dsink = -sum over batch and queries of e^(sink - lse') rowsum(dO * O).
at::Tensor sinks_backward(const at::Tensor& out4, const at::Tensor& dout4, const at::Tensor& lse, const at::Tensor& sinks);

}  // namespace dplan::executor
