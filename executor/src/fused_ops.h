// RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) and SwiGLU (Shazeer 2020, arXiv 2002.05202)
// as single autograd nodes, so that the executor's stored activations are what fused kernels
// store (Apex / Transformer Engine fused RMSNorm; Megatron-LM's fused bias_swiglu), which is what
// the cost model assumes, rather than what a chain of eager ATen ops keeps.
//
// Saved for backward, and nothing else:
//  - rms_norm: x and weight (the tensors passed in, not copies) and rstd = rsqrt(mean(x^2) + eps)
//    per row, [..., 1] in fp32 (fp64 for fp64 x). The normalised x is not saved: backward
//    recomputes x * rstd.
//  - swiglu: gate and up (the tensors passed in; views into a fused [.., 2 * ffn] projection share
//    its storage, so nothing is added). silu(gate) and sigmoid(gate) are recomputed in backward.
// Forward runs with autograd off (as torch::autograd::Function runs it); arithmetic is in fp32 for
// 16-bit inputs and results have the input's dtype. Only ATen ops: runs on CPU and CUDA. Not
// twice differentiable.
#pragma once

#include <vector>

#include <ATen/ATen.h>

namespace dplan::executor {

// y = x * rsqrt(mean(x^2, -1) + eps) * weight over the last dim; weight [x.size(-1)].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// silu(gate) * up; gate and up of one shape and dtype. limit > 0: gpt-oss's clamped form
// (transformers GptOssExperts._apply_gate), (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)
// with g = min(gate, limit), saving the same two tensors.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, double limit = 0, double alpha = 1);

// The tensors an rms_norm / swiglu output's graph node holds for backward, in the orders
// {x, weight, rstd} and {gate, up}; empty if `out` did not come from that function; throws once
// backward has freed them. For tests and memory accounting.
std::vector<at::Tensor> rms_norm_saved(const at::Tensor& out);
std::vector<at::Tensor> swiglu_saved(const at::Tensor& out);

}  // namespace dplan::executor
