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
// Usage: dplan-gpu-probe [-o probe.json] [--nccl-prefix DIR/name] [--iters N]
// [--max-mib M]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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

json probe_gemms(const Options& o) {
  const Precision precisions[] = {{"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2},
                                  {"fp16", CUDA_R_16F, CUBLAS_COMPUTE_32F, 2},
                                  {"fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4}};
  // (m tokens, n outputs, k inputs): a layer's GEMMs for hidden h, gated MLP f
  // = 3.5h rounded to 256, at 2k and 8k tokens; each timed as forward, dgrad
  // and wgrad. Squares: forward only.
  std::vector<std::array<long, 3>> layers, squares;
  for (long h : {1024L, 2048L, 4096L, 8192L}) {
    const long f = (h * 7 / 2 + 255) / 256 * 256;
    for (long t : {2048L, 8192L})
      for (auto s : {std::array<long, 3>{t, 3 * h, h}, {t, h, h}, {t, 2 * f, h}, {t, h, f}}) layers.push_back(s);
  }
  for (long n = 256; n <= 16384; n *= 2) squares.push_back({n, n, n});
  // Attention core (seq s, head dim d), one batch entry per head; causal, so
  // s/2 keys per query.
  const long heads = 32;
  std::vector<std::array<long, 2>> attention;
  for (long s : {1024L, 2048L, 4096L, 8192L})
    for (long d : {64L, 128L}) attention.push_back({s, d});
  auto batched_precision = [](const Precision& p) { return p.data != CUDA_R_32F; };  // bf16, fp16 only
  // Each of the three buffers holds the largest operand of any GEMM below.
  size_t max_bytes = 0;
  auto fit = [&](long elems, size_t elem_bytes) { max_bytes = std::max(max_bytes, size_t(elems) * elem_bytes); };
  for (const Precision& p : precisions) {
    for (const auto* list : {&layers, &squares})
      for (auto [m, n, k] : *list) {
        fit(m * k, p.bytes);
        fit(n * k, p.bytes);
        fit(m * n, p.bytes);
      }
    if (batched_precision(p))
      for (auto [s, d] : attention) {
        fit(heads * s * d, p.bytes);        // Q, O
        fit(heads * (s / 2) * d, p.bytes);  // K, V
        fit(heads * s * (s / 2), p.bytes);  // S, P
      }
  }
  void *a, *b, *c;
  check(cudaMalloc(&a, max_bytes), "cudaMalloc");
  check(cudaMalloc(&b, max_bytes), "cudaMalloc");
  check(cudaMalloc(&c, max_bytes), "cudaMalloc");
  check(cudaMemset(a, 0, max_bytes), "cudaMemset");
  check(cudaMemset(b, 0, max_bytes), "cudaMemset");
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  json rows = json::array();
  const float alpha = 1, beta = 0;
  // Times `launch` and records it as the GEMM (m, n, k) x batch.
  auto record = [&](const Precision& p, const char* op, long m, long n, long k, long batch, auto&& launch) {
    const double t = time_per_call_s(launch, o.iters, nullptr);
    const double flops_per_s = 2.0 * m * n * k * batch / t;
    rows.push_back(dplan::probe::gemm_row(p.name, op, m, n, k, batch, t));
    std::fprintf(stderr, "gemm %s %s %ld x %ld x %ld x %ld: %.1f TFLOP/s\n", p.name, op, batch, m, n, k,
                 flops_per_s / 1e12);
  };
  // cuBLAS is column-major: a row-major [r, c] matrix with leading dimension c
  // is its transpose to cuBLAS, so row-major C = A B runs as column-major C^T =
  // B^T A^T (the operands swap).
  for (const Precision& p : precisions) {
    // Row-major Y[m, n] = X[m, k] W[n, k]^T is column-major Y^T = W X^T: cuBLAS
    // (n, m, k), op(W) = T. X in a, W in b, Y in c.
    auto forward = [&](long m, long n, long k) {
      check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, p.data, int(k), a, p.data,
                         int(k), &beta, c, p.data, int(n), p.compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    };
    for (auto [m, n, k] : layers) {
      record(p, "forward", m, n, k, 1, [&] { forward(m, n, k); });
      // Row-major dX[m, k] = dY[m, n] W[n, k] is column-major dX^T = W^T dY^T:
      // cuBLAS (k, m, n), no transposes; W (b) ld k, dY (a) ld n, dX (c) ld k.
      record(p, "dgrad", m, k, n, 1, [&] {
        check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(k), int(m), int(n), &alpha, b, p.data, int(k), a,
                           p.data, int(n), &beta, c, p.data, int(k), p.compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      });
      // Row-major dW[n, k] = dY[m, n]^T X[m, k] is column-major dW^T = X^T dY:
      // cuBLAS (k, n, m), op(dY) = T; X (a) ld k, dY (b) ld n, dW (c) ld k.
      record(p, "wgrad", n, k, m, 1, [&] {
        check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, int(k), int(n), int(m), &alpha, a, p.data, int(k), b,
                           p.data, int(n), &beta, c, p.data, int(k), p.compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      });
    }
    for (auto [m, n, k] : squares) record(p, "forward", m, n, k, 1, [&] { forward(m, n, k); });
    if (!batched_precision(p)) continue;
    for (auto [s, d] : attention) {
      const long kv = s / 2;  // keys a query attends to, causal average
      // Per head, row-major S[s, kv] = Q[s, d] K[kv, d]^T is column-major S^T =
      // K Q^T: cuBLAS (kv, s, d), op(K) = T; Q (a) ld d, K (b) ld d, S (c) ld
      // kv.
      record(p, "batched", s, kv, d, heads, [&] {
        check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(kv), int(s), int(d), &alpha, b, p.data,
                                         int(d), kv * d, a, p.data, int(d), s * d, &beta, c, p.data, int(kv), s * kv,
                                         int(heads), p.compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
      });
      // Per head, row-major O[s, d] = P[s, kv] V[kv, d] is column-major O^T =
      // V^T P^T: cuBLAS (d, s, kv), no transposes; P (a) ld kv, V (b) ld d, O
      // (c) ld d.
      record(p, "batched", s, d, kv, heads, [&] {
        check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(d), int(s), int(kv), &alpha, b, p.data,
                                         int(d), kv * d, a, p.data, int(kv), s * kv, &beta, c, p.data, int(d), s * d,
                                         int(heads), p.compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
      });
    }
  }
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return rows;
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
  struct Device {
    cudaStream_t comm, compute;
    cublasHandle_t handle;
    void* send, *recv, *a, *b, *c;
    cudaEvent_t start, compute_done, stop;
  };
  std::vector<Device> devs(ndev);
  for (int d = 0; d < ndev; ++d) {
    Device& v = devs[d];
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
  }
  const float alpha = 1, beta = 0;
  auto gemm = [&](int d) {
    check(cublasGemmEx(devs[d].handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, devs[d].b, CUDA_R_16BF,
                       int(n), devs[d].a, CUDA_R_16BF, int(n), &beta, devs[d].c, CUDA_R_16BF, int(n),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  int gemms = 0;
  // One round: every compute stream starts at its comm stream's start event,
  // the comm stream waits for the compute stream's end; seconds start to stop
  // on the slowest device.
  auto round_s = [&](bool collective, bool compute) {
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
  };
  auto median_s = [&](bool collective, bool compute) {
    round_s(collective, compute);  // warm-up
    std::vector<double> t(reps);
    for (double& x : t) x = round_s(collective, compute);
    std::sort(t.begin(), t.end());
    return t[reps / 2];
  };
  const double collective_s = median_s(true, false);
  // Size the loop to the all-reduce from one GEMM's time on device 0.
  check(cudaSetDevice(0), "cudaSetDevice");
  const double one_gemm_s = time_per_call_s([&] { gemm(0); }, o.iters, devs[0].compute);
  gemms = std::max(1, int(std::lround(collective_s / one_gemm_s)));
  const double gemm_s = median_s(false, true);
  const double both_s = median_s(true, true);
  const double fraction = std::clamp((gemm_s + collective_s - both_s) / std::min(gemm_s, collective_s), 0.0, 1.0);
  for (int d = 0; d < ndev; ++d) {
    Device& v = devs[d];
    cudaSetDevice(d);
    for (cudaEvent_t e : {v.start, v.compute_done, v.stop}) cudaEventDestroy(e);
    for (void* p : {v.send, v.recv, v.a, v.b, v.c}) cudaFree(p);
    cublasDestroy(v.handle);
    cudaStreamDestroy(v.comm);
    cudaStreamDestroy(v.compute);
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  std::fprintf(stderr,
               "overlap of a %zu MiB bf16 all-reduce (%.2f ms) with %d bf16 "
               "%ld^3 GEMMs (%.2f ms): both %.2f ms, "
               "fraction %.2f\n",
               bytes >> 20, collective_s * 1e3, gemms, n, gemm_s * 1e3, both_s * 1e3, fraction);
  return {{"collective", "all_reduce"},   {"bytes", bytes},   {"gemm_s", gemm_s},
          {"collective_s", collective_s}, {"both_s", both_s}, {"fraction", fraction}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "-o") o.output = value();
      else if (a == "--nccl-prefix") o.nccl_prefix = value();
      else if (a == "--iters") o.iters = std::stoi(value());
      else if (a == "--max-mib") o.max_mib = std::stod(value());
      else throw std::invalid_argument("unknown option " + a + "; valid: -o FILE, --nccl-prefix P, --iters N, --max-mib M");
      if (o.iters < 1 || !(o.max_mib >= 1)) throw std::invalid_argument("--iters and --max-mib must be at least 1");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dplan-gpu-probe: error: %s\n", e.what());
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "dplan-gpu-probe: error: no CUDA device is visible\n");
    return 2;
  }
  try {
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    json result = {{"format_version", 1},
                   {"generator", "dplan-gpu-probe"},
                   {"device", {{"name", prop.name}, {"sm_count", prop.multiProcessorCount},
                               {"memory_bytes", prop.totalGlobalMem}, {"count", ndev}}}};
    check(cudaSetDevice(0), "cudaSetDevice");
    result["gemm"] = probe_gemms(o);
    result["memory"] = probe_memory(o);
    if (ndev > 1) {
      std::vector<ncclComm_t> comms(ndev);
      std::vector<int> devs(ndev);
      for (int d = 0; d < ndev; ++d) devs[d] = d;
      check(ncclCommInitAll(comms.data(), ndev, devs.data()), "ncclCommInitAll");
      std::vector<cudaStream_t> streams(ndev);
      for (int d = 0; d < ndev; ++d) {
        check(cudaSetDevice(d), "cudaSetDevice");
        check(cudaStreamCreate(&streams[d]), "cudaStreamCreate");
      }
      json files = json::array();
      for (const char* test : {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf"}) {
        probe_collective(o, test, ndev, comms, streams);
        files.push_back(o.nccl_prefix + "-" + test + ".txt");
      }
      result["nccl_tests_files"] = files;
      result["overlap"] = probe_overlap(o, ndev, comms);
      for (auto& c : comms) ncclCommDestroy(c);
    }
    const std::string tmp = o.output + ".tmp";
    std::ofstream(tmp) << result.dump(1) << "\n";
    if (std::rename(tmp.c_str(), o.output.c_str()) != 0) throw std::runtime_error("cannot write " + o.output);
    std::fprintf(stderr, "wrote %s\n", o.output.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dplan-gpu-probe: error: %s\n", e.what());
    return 1;
  }
}
