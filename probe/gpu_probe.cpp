// dplan-gpu-probe: what this node's GPUs achieve, measured with the CUDA
// toolkit alone (CUDA runtime, cuBLAS, NCCL; no LibTorch), for `dplan probe` to
// turn into a profile.
//   - GEMM throughput over the shapes a transformer layer produces (QKV, output
//   projection, fc1,
//     fc2 for a range of hidden sizes and token counts), each in the three
//     roles training runs per linear layer: op "forward" Y = X W^T, "dgrad" dX
//     = dY W (rows m, k, n) and "wgrad" dW = dY^T X (rows n, k, m: contraction
//     over tokens); plus a square sweep (forward) and, op "batched", the
//     attention core per head (32 heads as the batch, causal so s/2 keys): S =
//     Q K^T and O = P V for seq 1k-8k and head dim 64, 128 (bf16, fp16 only).
//     In bf16 and fp16 with fp32 accumulation and in fp32 with TF32 tensor
//     cores (what PyTorch's allow_tf32 uses); CUDA events around `iters`
//     back-to-back calls after a warm-up, FLOPs = 2mnk * batch (Narayanan et
//     al. 2021, Eq. 3's per-GEMM count). Rows: precision, op, m, n, k, batch,
//     time_s, flops_per_s.
//   - HBM bandwidth: a device-to-device copy (bytes read + bytes written per
//   second).
//   - NCCL all-reduce, all-gather and reduce-scatter across all visible GPUs
//   from one process
//     (ncclCommInitAll), by message size, written in nccl-tests' text format
//     (rank lines, then size count type redop root time algbw busbw #wrong per
//     row, busbw with nccl-tests' factors of doc/PERFORMANCE.md) so that `dplan
//     probe --import-nccl-tests` fits the intra-node tier.
//   - Overlap (2+ GPUs, JSON "overlap", the cluster's comm_overlap): how much
//   of a bf16 all-reduce
//     (512 MiB, ~2 ms on 8 NVLink H100s) hides under bf16 8192^3 GEMMs on the
//     same GPUs, as a gradient bucket's reduction runs under backward: the
//     all-reduce alone on a communication stream per device, a GEMM loop of
//     about its length alone on a compute stream per device, then both at once;
//     slowest device, median of 5 rounds.
//   - FP8 GEMMs (compute capability 8.9 or later, JSON rows of precision "fp8"): the
//     layers' forward, dgrad and wgrad shapes and the squares through cuBLASLt, E4M3 operands,
//     bf16 output, fp32 accumulation and scale, each role as a "TN" GEMM of its own (m, n, k)
//     (Transformer Engine cast-transposes every FP8 operand so that Hopper runs each as TN);
//     skipped with one line where the GPU or cuBLASLt has none.
//   - Launch overhead (JSON "launch"): back-to-back 4-byte cudaMemsetAsync calls on one stream,
//     the GPU's time per launch (CUDA events) and the host's enqueue time per call (wall clock).
//   - The device as the driver reports it (JSON "device"): compute capability, SM and memory
//     clocks, bus width, L2, driver, runtime, cuBLAS(Lt) and NCCL versions.
// The output is written (atomically) after the GEMMs, after the FP8 GEMMs and at the end, with
// "incomplete" naming what is still to come until the last write; a failure part-way leaves what
// was measured, with "error".
// Usage: dplan-gpu-probe [-o probe.json] [--nccl-prefix DIR/name] [--iters N]
// [--max-mib M] [--quick]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gemm_row.h"

namespace {
using nlohmann::json;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

struct Options {
  std::string output = "gpu-probe.json";
  std::string nccl_prefix = "gpu-probe";  // writes <prefix>-all_reduce.txt etc.
  int iters = 20;
  double max_mib = 4096;
  bool quick = false;  // a subset of the shapes: seconds, not minutes
};

// Seconds per call of `launch`, from CUDA events around `iters` calls after 3 warm-up calls.
template <typename F>
double time_per_call_s(F&& launch, int iters, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) launch();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) launch();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1e-3 / iters;
}

struct Precision {
  const char* name;
  cudaDataType_t data;
  cublasComputeType_t compute;
  size_t bytes;
};

// The shapes every precision is timed over. layers: (m tokens, n outputs, k inputs), a layer's
// GEMMs for hidden h, gated MLP f = 3.5h rounded to 256, at 2k and 8k tokens, each timed as
// forward, dgrad and wgrad. squares: forward only. attention: the core (seq s, head dim d), one
// batch entry per head; causal, so s/2 keys per query. --quick: h 2048 and 4096, squares
// 1024..8192, the same attention.
struct Shapes {
  std::vector<std::array<long, 3>> layers, squares;
  std::vector<std::array<long, 2>> attention;
};

Shapes probe_shapes(bool quick) {
  Shapes s;
  const std::vector<long> hidden = quick ? std::vector<long>{2048, 4096} : std::vector<long>{1024, 2048, 4096, 8192};
  for (long h : hidden) {
    const long f = (h * 7 / 2 + 255) / 256 * 256;
    for (long t : {2048L, 8192L})
      for (auto x : {std::array<long, 3>{t, 3 * h, h}, {t, h, h}, {t, 2 * f, h}, {t, h, f}}) s.layers.push_back(x);
  }
  for (long n = quick ? 1024 : 256; n <= (quick ? 8192 : 16384); n *= 2) s.squares.push_back({n, n, n});
  for (long seq : {1024L, 2048L, 4096L, 8192L})
    for (long d : {64L, 128L}) s.attention.push_back({seq, d});
  return s;
}

// The precisions the GEMMs are timed in (FP8 apart: probe_fp8_gemms).
const Precision kGemmPrecisions[] = {{"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2},
                                     {"fp16", CUDA_R_16F, CUBLAS_COMPUTE_32F, 2},
                                     {"fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4}};
// The attention core is timed with this many heads, one batch entry per head.
constexpr long kAttentionHeads = 32;

bool batched_precision(const Precision& p) { return p.data != CUDA_R_32F; }  // bf16, fp16 only

// The bytes each of the three buffers needs: the largest operand of any GEMM timed.
size_t gemm_buffer_bytes(const Shapes& shapes) {
  size_t max_bytes = 0;
  auto fit = [&](long elems, size_t elem_bytes) { max_bytes = std::max(max_bytes, size_t(elems) * elem_bytes); };
  const long heads = kAttentionHeads;
  for (const Precision& p : kGemmPrecisions) {
    for (const auto* list : {&shapes.layers, &shapes.squares})
      for (auto [m, n, k] : *list) {
        fit(m * k, p.bytes);
        fit(n * k, p.bytes);
        fit(m * n, p.bytes);
      }
    if (batched_precision(p))
      for (auto [s, d] : shapes.attention) {
        fit(heads * s * d, p.bytes);        // Q, O
        fit(heads * (s / 2) * d, p.bytes);  // K, V
        fit(heads * s * (s / 2), p.bytes);  // S, P
      }
  }
  return max_bytes;
}

// What the GEMM timings share: the cuBLAS handle, three device buffers (an input in a, the
// weights or the other input in b, the output in c) and the rows timed so far.
struct GemmBench {
  const Options& o;
  cublasHandle_t handle;
  void *a, *b, *c;
  json rows = json::array();

  // Times `launch` and records it as the GEMM (m, n, k) x batch.
  template <typename F>
  void record(const Precision& p, const char* op, long m, long n, long k, long batch, F&& launch) {
    const double t = time_per_call_s(launch, o.iters, nullptr);
    const double flops_per_s = 2.0 * m * n * k * batch / t;
    rows.push_back(dplan::probe::gemm_row(p.name, op, m, n, k, batch, t));
    std::fprintf(stderr, "gemm %s %s %ld x %ld x %ld x %ld: %.1f TFLOP/s\n", p.name, op, batch, m, n, k,
                 flops_per_s / 1e12);
  }
};

// cuBLAS is column-major: a row-major [r, c] matrix with leading dimension c
// is its transpose to cuBLAS, so row-major C = A B runs as column-major C^T =
// B^T A^T (the operands swap).
// A linear layer's GEMMs in precision p: each layer shape forward, dgrad and wgrad, then the
// squares forward.
void time_linear_gemms(GemmBench& g, const Precision& p, const Shapes& shapes) {
  const float alpha = 1, beta = 0;
  // Row-major Y[m, n] = X[m, k] W[n, k]^T is column-major Y^T = W X^T: cuBLAS
  // (n, m, k), op(W) = T. X in a, W in b, Y in c.
  auto forward = [&](long m, long n, long k) {
    check(cublasGemmEx(g.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, g.b, p.data, int(k), g.a,
                       p.data, int(k), &beta, g.c, p.data, int(n), p.compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  for (auto [m, n, k] : shapes.layers) {
    g.record(p, "forward", m, n, k, 1, [&] { forward(m, n, k); });
    // Row-major dX[m, k] = dY[m, n] W[n, k] is column-major dX^T = W^T dY^T:
    // cuBLAS (k, m, n), no transposes; W (b) ld k, dY (a) ld n, dX (c) ld k.
    g.record(p, "dgrad", m, k, n, 1, [&] {
      check(cublasGemmEx(g.handle, CUBLAS_OP_N, CUBLAS_OP_N, int(k), int(m), int(n), &alpha, g.b, p.data, int(k), g.a,
                         p.data, int(n), &beta, g.c, p.data, int(k), p.compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    });
    // Row-major dW[n, k] = dY[m, n]^T X[m, k] is column-major dW^T = X^T dY:
    // cuBLAS (k, n, m), op(dY) = T; X (a) ld k, dY (b) ld n, dW (c) ld k.
    g.record(p, "wgrad", n, k, m, 1, [&] {
      check(cublasGemmEx(g.handle, CUBLAS_OP_N, CUBLAS_OP_T, int(k), int(n), int(m), &alpha, g.a, p.data, int(k), g.b,
                         p.data, int(n), &beta, g.c, p.data, int(k), p.compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    });
  }
  for (auto [m, n, k] : shapes.squares) g.record(p, "forward", m, n, k, 1, [&] { forward(m, n, k); });
}

// The attention core's two batched GEMMs in precision p, per (seq, head dim).
void time_attention_gemms(GemmBench& g, const Precision& p, const Shapes& shapes) {
  const float alpha = 1, beta = 0;
  const long heads = kAttentionHeads;
  for (auto [s, d] : shapes.attention) {
    const long kv = s / 2;  // keys a query attends to, causal average
    // Per head, row-major S[s, kv] = Q[s, d] K[kv, d]^T is column-major S^T =
    // K Q^T: cuBLAS (kv, s, d), op(K) = T; Q (a) ld d, K (b) ld d, S (c) ld
    // kv.
    g.record(p, "batched", s, kv, d, heads, [&] {
      check(cublasGemmStridedBatchedEx(g.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(kv), int(s), int(d), &alpha, g.b,
                                       p.data, int(d), kv * d, g.a, p.data, int(d), s * d, &beta, g.c, p.data, int(kv),
                                       s * kv, int(heads), p.compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
    });
    // Per head, row-major O[s, d] = P[s, kv] V[kv, d] is column-major O^T =
    // V^T P^T: cuBLAS (d, s, kv), no transposes; P (a) ld kv, V (b) ld d, O
    // (c) ld d.
    g.record(p, "batched", s, d, kv, heads, [&] {
      check(cublasGemmStridedBatchedEx(g.handle, CUBLAS_OP_N, CUBLAS_OP_N, int(d), int(s), int(kv), &alpha, g.b,
                                       p.data, int(d), kv * d, g.a, p.data, int(kv), s * kv, &beta, g.c, p.data, int(d),
                                       s * d, int(heads), p.compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
    });
  }
}

json probe_gemms(const Options& o, const Shapes& shapes) {
  const size_t max_bytes = gemm_buffer_bytes(shapes);
  GemmBench g{o, nullptr, nullptr, nullptr, nullptr};
  check(cudaMalloc(&g.a, max_bytes), "cudaMalloc");
  check(cudaMalloc(&g.b, max_bytes), "cudaMalloc");
  check(cudaMalloc(&g.c, max_bytes), "cudaMalloc");
  check(cudaMemset(g.a, 0, max_bytes), "cudaMemset");
  check(cudaMemset(g.b, 0, max_bytes), "cudaMemset");
  check(cublasCreate(&g.handle), "cublasCreate");
  for (const Precision& p : kGemmPrecisions) {
    time_linear_gemms(g, p, shapes);
    if (batched_precision(p)) time_attention_gemms(g, p, shapes);
  }
  cublasDestroy(g.handle);
  cudaFree(g.a);
  cudaFree(g.b);
  cudaFree(g.c);
  return g.rows;
}

// Runs `f` on every path out of a scope: the FP8 part may stop part-way and the probe goes on.
template <typename F>
struct Finally {
  F f;
  ~Finally() { f(); }
};
template <typename F>
Finally(F) -> Finally<F>;

// FP8 GEMMs through cuBLASLt, for GPUs of compute capability 8.9 or later. Hopper's FP8 kernels
// take one operand layout: "A must be transposed and B non-transposed (The "TN" format)", with
// 16-byte aligned pointers and leading dimensions (cuBLAS documentation, cublasLtMatmul(), the
// FP8 requirements: https://docs.nvidia.com/cuda/cublas/#cublasltmatmul). Transformer Engine
// meets it by cast-transposing each FP8 operand, so that every training GEMM (forward, dgrad,
// wgrad) runs as TN; here each role's (m, n, k) is timed as one: row-major out[m, n] = X[m, k]
// Y[n, k]^T, both operands contiguous along k, is column-major out^T = Y X^T: cuBLASLt (n, m, k),
// op(A) = T on Y (stored k x n, ld k), op(B) = N on X (stored k x m, ld k), D bf16 n x m (ld n).
// Every dimension here is a multiple of 16 (checked), so every leading dimension is 16-byte
// aligned in E4M3 and bf16 alike. Operands E4M3 with the default scale 1, output bf16, FP32
// accumulation and scale type; CUBLASLT_MATMUL_DESC_FAST_ACCUM at its default (off). The
// algorithm is cublasLtMatmulAlgoGetHeuristic's first with up to 32 MiB of workspace. Rows go
// into `rows` as they are measured, so a failure part-way keeps the ones before it.
void probe_fp8_gemms(const Options& o, const Shapes& shapes, json& rows) {
  std::vector<std::pair<const char*, std::array<long, 3>>> roles;  // op, (m, n, k) as recorded
  for (auto [m, n, k] : shapes.layers) {
    roles.push_back({"forward", {m, n, k}});
    roles.push_back({"dgrad", {m, k, n}});
    roles.push_back({"wgrad", {n, k, m}});
  }
  for (const auto& x : shapes.squares) roles.push_back({"forward", x});
  size_t operand_bytes = 0, output_bytes = 0;
  for (const auto& [op, x] : roles) {
    const auto [m, n, k] = x;
    if (m % 16 || n % 16 || k % 16)
      throw std::runtime_error("fp8 " + std::string(op) + " " + std::to_string(m) + " x " + std::to_string(n) +
                               " x " + std::to_string(k) + " is not a multiple of 16 (cuBLASLt's FP8 alignment)");
    operand_bytes = std::max(operand_bytes, size_t(std::max(m, n)) * size_t(k));  // 1 byte per element
    output_bytes = std::max(output_bytes, size_t(m) * size_t(n) * 2);              // bf16
  }
  const uint64_t workspace_bytes = uint64_t(32) << 20;
  void *x = nullptr, *y = nullptr, *d = nullptr, *workspace = nullptr;
  cublasLtHandle_t lt = nullptr;
  Finally release{[&] {
    if (lt) cublasLtDestroy(lt);
    for (void* p : {x, y, d, workspace}) cudaFree(p);
  }};
  check(cudaMalloc(&x, operand_bytes), "cudaMalloc");
  check(cudaMalloc(&y, operand_bytes), "cudaMalloc");
  check(cudaMalloc(&d, output_bytes), "cudaMalloc");
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc");
  check(cudaMemset(x, 0, operand_bytes), "cudaMemset");
  check(cudaMemset(y, 0, operand_bytes), "cudaMemset");
  check(cublasLtCreate(&lt), "cublasLtCreate");
  const float alpha = 1, beta = 0;
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  for (const auto& [op, shape] : roles) {
    const auto [m, n, k] = shape;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    Finally destroy{[&] {
      if (preference) cublasLtMatmulPreferenceDestroy(preference);
      for (cublasLtMatrixLayout_t l : {a_layout, b_layout, d_layout})
        if (l) cublasLtMatrixLayoutDestroy(l);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }};
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
          "cublasLtMatmulDescSetAttribute(TRANSA)");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
          "cublasLtMatmulDescSetAttribute(TRANSB)");
    check(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), int64_t(k)),
          "cublasLtMatrixLayoutCreate(A)");
    check(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), int64_t(k)),
          "cublasLtMatrixLayoutCreate(B)");
    check(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_16BF, uint64_t(n), uint64_t(m), int64_t(n)),
          "cublasLtMatrixLayoutCreate(D)");
    check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace_bytes, sizeof workspace_bytes),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    cublasLtMatmulHeuristicResult_t best{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(lt, desc, a_layout, b_layout, d_layout, d_layout, preference, 1, &best,
                                         &found),
          "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1 || best.state != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasLtMatmulAlgoGetHeuristic found no algorithm for fp8 " + std::string(op) + " " +
                               std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k));
    // C is D (beta 0): bf16 like D, as cuBLASLt's FP8 type table requires for a bf16 output.
    const double t = time_per_call_s(
        [&] {
          check(cublasLtMatmul(lt, desc, &alpha, y, a_layout, x, b_layout, &beta, d, d_layout, d, d_layout, &best.algo,
                               workspace, workspace_bytes, nullptr),
                "cublasLtMatmul");
        },
        o.iters, nullptr);
    rows.push_back(dplan::probe::gemm_row("fp8", op, m, n, k, 1, t));
    std::fprintf(stderr, "gemm fp8 %s 1 x %ld x %ld x %ld: %.1f TFLOP/s\n", op, m, n, k, 2.0 * m * n * k / t / 1e12);
  }
}

// The smallest kernel's launch cost: `launches` back-to-back 4-byte cudaMemsetAsync calls on one
// stream after a warm-up; the GPU's time per launch from CUDA events around them (the larger of
// the GPU's per-launch cost and the host's enqueue rate, as a training step's chains of small
// kernels see it), and the host's enqueue time per call from the wall clock around the loop.
json probe_launch() {
  const int launches = 1000;
  cudaStream_t stream = nullptr;
  void* p = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Finally release{[&] {
    for (cudaEvent_t e : {start, stop})
      if (e) cudaEventDestroy(e);
    cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }};
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&p, 4), "cudaMalloc");
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  auto launch = [&] { check(cudaMemsetAsync(p, 0, 4, stream), "cudaMemsetAsync"); };
  for (int i = 0; i < 100; ++i) launch();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  const auto wall_start = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) launch();
  const auto wall_stop = std::chrono::steady_clock::now();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  const double time_per_launch_s = ms * 1e-3 / launches;
  const double enqueue_per_launch_s = std::chrono::duration<double>(wall_stop - wall_start).count() / launches;
  std::fprintf(stderr, "launch: %d back-to-back 4-byte cudaMemsetAsync: %.2f us each on the GPU, %.2f us to enqueue\n",
               launches, time_per_launch_s * 1e6, enqueue_per_launch_s * 1e6);
  return dplan::probe::launch_json("cudaMemsetAsync 4 B", launches, time_per_launch_s, enqueue_per_launch_s);
}

// Device 0 as the driver reports it, and the libraries' versions.
json probe_device(const cudaDeviceProp& prop, int ndev) {
  auto attribute = [](cudaDeviceAttr a, const char* what) {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, a, 0), what);
    return v;
  };
  // cuBLAS and cuBLASLt: the loaded library's major, minor and patch level.
  auto library_version = [](auto get_property, const char* what) {
    int major = 0, minor = 0, patch = 0;
    check(get_property(MAJOR_VERSION, &major), what);
    check(get_property(MINOR_VERSION, &minor), what);
    check(get_property(PATCH_LEVEL, &patch), what);
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  };
  int driver = 0, runtime = 0, nccl = 0;
  check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  check(ncclGetVersion(&nccl), "ncclGetVersion");
  dplan::probe::DeviceReport d;
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.memory_bytes = prop.totalGlobalMem;
  d.count = ndev;
  d.compute_capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  // Peak clocks in kHz (the runtime API's cudaDevAttrClockRate and cudaDevAttrMemoryClockRate).
  d.sm_clock_hz = 1e3 * attribute(cudaDevAttrClockRate, "cudaDeviceGetAttribute(ClockRate)");
  d.memory_clock_hz = 1e3 * attribute(cudaDevAttrMemoryClockRate, "cudaDeviceGetAttribute(MemoryClockRate)");
  d.memory_bus_width_bits = attribute(cudaDevAttrGlobalMemoryBusWidth, "cudaDeviceGetAttribute(GlobalMemoryBusWidth)");
  d.l2_bytes = attribute(cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(L2CacheSize)");
  d.driver_version = dplan::probe::cuda_version_text(driver);
  d.runtime_version = dplan::probe::cuda_version_text(runtime);
  d.cublas_version = library_version(cublasGetProperty, "cublasGetProperty");
  d.cublaslt_version = library_version(cublasLtGetProperty, "cublasLtGetProperty");
  d.nccl_version = dplan::probe::nccl_version_text(nccl);
  return dplan::probe::device_json(d);
}

json probe_memory(const Options& o) {
  const size_t bytes = size_t(1) << 30;
  void *src, *dst;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  const double t = time_per_call_s([&] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync"); },
                                   o.iters, nullptr);
  cudaFree(src);
  cudaFree(dst);
  std::fprintf(stderr, "device-to-device copy of 1 GiB: %.0f GB/s (read + write)\n", 2.0 * bytes / t / 1e9);
  return {{"copy_bytes", bytes}, {"time_s", t}, {"bytes_per_s", 2.0 * bytes / t}};
}

// One collective over all GPUs, by size, as nccl-tests would print it.
void probe_collective(const Options& o, const std::string& test, int ndev, const std::vector<ncclComm_t>& comms,
                      const std::vector<cudaStream_t>& streams) {
  const std::string path = o.nccl_prefix + "-" + test + ".txt";
  std::ofstream out(path);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  out << "# Collective test starting: " << test << "\n# dplan-gpu-probe, one process, " << ndev << " GPUs\n";
  for (int d = 0; d < ndev; ++d) {
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    out << "#  Rank " << d << " Group  0 Pid " << getpid() << " on " << host << " device " << d << " [0x00] " << prop.name
        << "\n";
  }
  out << "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
  const size_t max_bytes = size_t(o.max_mib * 1024 * 1024);
  std::vector<void*> send(ndev), recv(ndev);
  for (int d = 0; d < ndev; ++d) {
    check(cudaSetDevice(d), "cudaSetDevice");
    check(cudaMalloc(&send[d], max_bytes), "cudaMalloc");
    check(cudaMalloc(&recv[d], max_bytes), "cudaMalloc");
  }
  for (size_t bytes = size_t(1) << 20; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / 4;  // float elements of the size column's buffer
    auto launch = [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int d = 0; d < ndev; ++d) {
        if (test == "all_reduce_perf")
          check(ncclAllReduce(send[d], recv[d], count, ncclFloat, ncclSum, comms[d], streams[d]), "ncclAllReduce");
        else if (test == "all_gather_perf")  // size = the gathered output
          check(ncclAllGather(send[d], recv[d], count / ndev, ncclFloat, comms[d], streams[d]), "ncclAllGather");
        else  // reduce_scatter_perf: size = the input
          check(ncclReduceScatter(send[d], recv[d], count / ndev, ncclFloat, ncclSum, comms[d], streams[d]),
                "ncclReduceScatter");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    };
    for (int i = 0; i < 3; ++i) launch();
    for (int d = 0; d < ndev; ++d) check(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaEventRecord(start, streams[0]), "cudaEventRecord");
    for (int i = 0; i < o.iters; ++i) launch();
    for (int d = 0; d < ndev; ++d) check(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaEventRecord(stop, streams[0]), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    const double t_us = ms * 1e3 / o.iters;
    const double algbw = bytes / (t_us * 1e-6) / 1e9;
    const double factor = test == "all_reduce_perf" ? 2.0 * (ndev - 1) / ndev : double(ndev - 1) / ndev;
    char row[256];
    std::snprintf(row, sizeof row, "%12zu %12zu float %s -1 %10.2f %7.2f %7.2f 0 %10.2f %7.2f %7.2f 0\n", bytes, count,
                  test == "all_gather_perf" ? "none" : "sum", t_us, algbw, algbw * factor, t_us, algbw, algbw * factor);
    out << row;
  }
  for (int d = 0; d < ndev; ++d) {
    cudaSetDevice(d);
    cudaFree(send[d]);
    cudaFree(recv[d]);
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

// One device's streams, cuBLAS handle, buffers and events for probe_overlap.
struct OverlapDevice {
  cudaStream_t comm, compute;
  cublasHandle_t handle;
  void* send, *recv, *a, *b, *c;
  cudaEvent_t start, compute_done, stop;
};

// Device d's streams, handle, zeroed buffers (`bytes` for the all-reduce, `gemm_bytes` per GEMM
// operand) and events.
OverlapDevice make_overlap_device(int d, size_t bytes, size_t gemm_bytes) {
  OverlapDevice v;
  check(cudaSetDevice(d), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&v.comm, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&v.compute, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&v.handle), "cublasCreate");
  check(cublasSetStream(v.handle, v.compute), "cublasSetStream");
  for (void **p : {&v.send, &v.recv}) {
    check(cudaMalloc(p, bytes), "cudaMalloc");
    check(cudaMemset(*p, 0, bytes), "cudaMemset");
  }
  for (void **p : {&v.a, &v.b, &v.c}) {
    check(cudaMalloc(p, gemm_bytes), "cudaMalloc");
    check(cudaMemset(*p, 0, gemm_bytes), "cudaMemset");
  }
  for (cudaEvent_t* e : {&v.start, &v.compute_done, &v.stop}) check(cudaEventCreate(e), "cudaEventCreate");
  check(cudaDeviceSynchronize(),
        "cudaDeviceSynchronize");  // the memsets, which non-blocking streams
                                   // skip
  return v;
}

void free_overlap_device(int d, OverlapDevice& v) {
  cudaSetDevice(d);
  for (cudaEvent_t e : {v.start, v.compute_done, v.stop}) cudaEventDestroy(e);
  for (void* p : {v.send, v.recv, v.a, v.b, v.c}) cudaFree(p);
  cublasDestroy(v.handle);
  cudaStreamDestroy(v.comm);
  cudaStreamDestroy(v.compute);
}

// The rounds probe_overlap times: an all-reduce of `count` bf16 values, a loop of `gemms` bf16
// n^3 GEMMs, or both, on every device at once.
struct OverlapRounds {
  std::vector<OverlapDevice>& devs;
  const std::vector<ncclComm_t>& comms;
  size_t count;
  long n;
  int reps;
  int gemms = 0;

  void gemm(int d) const {
    const float alpha = 1, beta = 0;
    check(cublasGemmEx(devs[d].handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, devs[d].b, CUDA_R_16BF,
                       int(n), devs[d].a, CUDA_R_16BF, int(n), &beta, devs[d].c, CUDA_R_16BF, int(n),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }

  // One round: every compute stream starts at its comm stream's start event,
  // the comm stream waits for the compute stream's end; seconds start to stop
  // on the slowest device.
  double round_s(bool collective, bool compute) const {
    const int ndev = int(devs.size());
    for (int d = 0; d < ndev; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      check(cudaEventRecord(devs[d].start, devs[d].comm), "cudaEventRecord");
      check(cudaStreamWaitEvent(devs[d].compute, devs[d].start, 0), "cudaStreamWaitEvent");
    }
    if (collective) {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int d = 0; d < ndev; ++d)
        check(ncclAllReduce(devs[d].send, devs[d].recv, count, ncclBfloat16, ncclSum, comms[d], devs[d].comm),
              "ncclAllReduce");
      check(ncclGroupEnd(), "ncclGroupEnd");
    }
    if (compute)
      for (int i = 0; i < gemms; ++i)  // devices interleaved so that every loop starts at once
        for (int d = 0; d < ndev; ++d) {
          check(cudaSetDevice(d), "cudaSetDevice");
          gemm(d);
        }
    for (int d = 0; d < ndev; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      check(cudaEventRecord(devs[d].compute_done, devs[d].compute), "cudaEventRecord");
      check(cudaStreamWaitEvent(devs[d].comm, devs[d].compute_done, 0), "cudaStreamWaitEvent");
      check(cudaEventRecord(devs[d].stop, devs[d].comm), "cudaEventRecord");
    }
    double slowest_s = 0;
    for (int d = 0; d < ndev; ++d) {
      check(cudaEventSynchronize(devs[d].stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, devs[d].start, devs[d].stop), "cudaEventElapsedTime");
      slowest_s = std::max(slowest_s, ms * 1e-3);
    }
    return slowest_s;
  }

  // The median of `reps` rounds after a warm-up round.
  double median_s(bool collective, bool compute) const {
    round_s(collective, compute);  // warm-up
    std::vector<double> t(reps);
    for (double& x : t) x = round_s(collective, compute);
    std::sort(t.begin(), t.end());
    return t[reps / 2];
  }
};

// How much of an all-reduce hides under GEMMs running at the same time on every
// GPU, as a gradient bucket's reduction runs under backward: the all-reduce
// alone on a communication stream per device, a bf16 GEMM loop of about the
// same length alone on a compute stream per device, then both at once. Each is
// the slowest device's time, from a common start event to both streams done,
// median of `reps` rounds after a warm-up round. fraction = (gemm + all-reduce
// - both) / min(gemm, all-reduce), in [0, 1]: 1 = the all-reduce hid completely
// under the GEMMs, 0 = they serialised (e.g. NCCL's kernels waited for SMs).
json probe_overlap(const Options& o, int ndev, const std::vector<ncclComm_t>& comms) {
  // 512 MiB of bf16 (--max-mib caps it): ~2 ms on 8 NVLink H100s at ~450 GB/s
  // busbw, long beside the launch skew between devices.
  const size_t bytes = std::min(size_t(512) << 20, size_t(o.max_mib * 1024 * 1024)) / 2 * 2;
  const size_t count = bytes / 2;
  const long n = 8192;  // square GEMM, ~1.6 ms in bf16 on an H100
  const size_t gemm_bytes = size_t(n) * n * 2;
  const int reps = 5;
  std::vector<OverlapDevice> devs;
  for (int d = 0; d < ndev; ++d) devs.push_back(make_overlap_device(d, bytes, gemm_bytes));
  OverlapRounds rounds{devs, comms, count, n, reps};
  const double collective_s = rounds.median_s(true, false);
  // Size the loop to the all-reduce from one GEMM's time on device 0.
  check(cudaSetDevice(0), "cudaSetDevice");
  const double one_gemm_s = time_per_call_s([&] { rounds.gemm(0); }, o.iters, devs[0].compute);
  rounds.gemms = std::max(1, int(std::lround(collective_s / one_gemm_s)));
  const double gemm_s = rounds.median_s(false, true);
  const double both_s = rounds.median_s(true, true);
  const double fraction = std::clamp((gemm_s + collective_s - both_s) / std::min(gemm_s, collective_s), 0.0, 1.0);
  for (int d = 0; d < ndev; ++d) free_overlap_device(d, devs[d]);
  check(cudaSetDevice(0), "cudaSetDevice");
  std::fprintf(stderr,
               "overlap of a %zu MiB bf16 all-reduce (%.2f ms) with %d bf16 "
               "%ld^3 GEMMs (%.2f ms): both %.2f ms, "
               "fraction %.2f\n",
               bytes >> 20, collective_s * 1e3, rounds.gemms, n, gemm_s * 1e3, both_s * 1e3, fraction);
  return {{"collective", "all_reduce"},   {"bytes", bytes},   {"gemm_s", gemm_s},
          {"collective_s", collective_s}, {"both_s", both_s}, {"fraction", fraction}};
}

// Writes `result` to `path` atomically: a temporary file beside it, then a rename.
void write_result(const json& result, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << result.dump(1) << "\n";
    out.close();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot write " + path);
}

// Reads the command line into `o`; throws std::invalid_argument naming a bad option.
void parse_options(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "-o") o.output = value();
    else if (a == "--nccl-prefix") o.nccl_prefix = value();
    else if (a == "--iters") o.iters = std::stoi(value());
    else if (a == "--max-mib") o.max_mib = std::stod(value());
    else if (a == "--quick") o.quick = true;
    else
      throw std::invalid_argument("unknown option " + a +
                                  "; valid: -o FILE, --nccl-prefix P, --iters N, --max-mib M, --quick");
    if (o.iters < 1 || !(o.max_mib >= 1)) throw std::invalid_argument("--iters and --max-mib must be at least 1");
  }
}

// FP8: where the GPU has it; a failure here (no algorithm, a status) ends the FP8 part alone,
// keeping the rows measured so far.
void probe_fp8_part(const Options& o, const Shapes& shapes, const cudaDeviceProp& prop, json& result) {
  if (prop.major * 10 + prop.minor < 89) {
    std::fprintf(stderr, "dplan-gpu-probe: fp8 GEMMs skipped: compute capability %d.%d has no FP8 tensor cores "
                         "(8.9 or later)\n", prop.major, prop.minor);
    return;
  }
  const size_t before = result["gemm"].size();
  try {
    probe_fp8_gemms(o, shapes, result["gemm"]);
  } catch (const std::exception& e) {
    const size_t kept = result["gemm"].size() - before;
    if (kept == 0) std::fprintf(stderr, "dplan-gpu-probe: fp8 GEMMs skipped: %s\n", e.what());
    else std::fprintf(stderr, "dplan-gpu-probe: fp8 GEMMs stopped after %zu (kept): %s\n", kept, e.what());
    // A failed call may leave an error behind; one the context cannot recover from fails the
    // rest of the probe (and the file keeps what was measured).
    cudaGetLastError();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the fp8 GEMMs");
  }
}

// With several devices: the collectives as nccl-tests files beside the result, and the overlap.
void probe_nccl_part(const Options& o, int ndev, json& result) {
  result["incomplete"] = "still measuring: NCCL collectives";
  write_result(result, o.output);
  std::vector<ncclComm_t> comms(ndev);
  std::vector<int> devs(ndev);
  for (int d = 0; d < ndev; ++d) devs[d] = d;
  check(ncclCommInitAll(comms.data(), ndev, devs.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(ndev);
  for (int d = 0; d < ndev; ++d) {
    check(cudaSetDevice(d), "cudaSetDevice");
    check(cudaStreamCreate(&streams[d]), "cudaStreamCreate");
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  json files = json::array();
  for (const char* test : {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf"}) {
    probe_collective(o, test, ndev, comms, streams);
    files.push_back(o.nccl_prefix + "-" + test + ".txt");
  }
  result["nccl_tests_files"] = files;
  result["overlap"] = probe_overlap(o, ndev, comms);
  for (auto& c : comms) ncclCommDestroy(c);
}

// Measures everything into `result`, writing it as it goes; `measured` turns true once it holds
// the device and the GEMMs (worth writing on a failure).
void probe_all(const Options& o, int ndev, json& result, bool& measured) {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  result = {{"format_version", 1}, {"generator", "dplan-gpu-probe"}, {"device", probe_device(prop, ndev)}};
  if (o.quick) result["quick"] = true;
  const Shapes shapes = probe_shapes(o.quick);
  result["gemm"] = probe_gemms(o, shapes);
  measured = true;
  result["memory"] = probe_memory(o);
  result["launch"] = probe_launch();
  result["incomplete"] = "still measuring: fp8 GEMMs, NCCL collectives";
  write_result(result, o.output);
  probe_fp8_part(o, shapes, prop, result);
  if (ndev > 1) probe_nccl_part(o, ndev, result);
  result.erase("incomplete");
  write_result(result, o.output);
  std::fprintf(stderr, "wrote %s\n", o.output.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    parse_options(argc, argv, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dplan-gpu-probe: error: %s\n", e.what());
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "dplan-gpu-probe: error: no CUDA device is visible\n");
    return 2;
  }
  json result;
  bool measured = false;  // result holds the device and the GEMMs: worth writing on a failure
  try {
    probe_all(o, ndev, result, measured);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dplan-gpu-probe: error: %s\n", e.what());
    if (measured) {
      result["error"] = e.what();
      try {
        write_result(result, o.output);
        std::fprintf(stderr, "dplan-gpu-probe: wrote what was measured before the error to %s\n", o.output.c_str());
      } catch (const std::exception& w) {
        std::fprintf(stderr, "dplan-gpu-probe: error: %s\n", w.what());
      }
    }
    return 1;
  }
}
