// dplan-gpu-probe: what this node's GPUs achieve, measured with the CUDA toolkit alone (CUDA
// runtime, cuBLAS, NCCL; no LibTorch), for `dplan probe` to turn into a profile.
//   - GEMM throughput over the shapes a transformer layer produces (QKV, output projection, fc1,
//     fc2 for a range of hidden sizes and token counts) and a square sweep, in bf16 and fp16 with
//     fp32 accumulation and in fp32 with TF32 tensor cores (what PyTorch's allow_tf32 uses); CUDA
//     events around `iters` back-to-back calls after a warm-up, FLOPs = 2mnk (Narayanan et al.
//     2021, Eq. 3's per-GEMM count).
//   - HBM bandwidth: a device-to-device copy (bytes read + bytes written per second).
//   - NCCL all-reduce, all-gather and reduce-scatter across all visible GPUs from one process
//     (ncclCommInitAll), by message size, written in nccl-tests' text format (rank lines, then
//     size count type redop root time algbw busbw #wrong per row, busbw with nccl-tests' factors
//     of doc/PERFORMANCE.md) so that `dplan probe --import-nccl-tests` fits the intra-node tier.
// Usage: dplan-gpu-probe [-o probe.json] [--nccl-prefix DIR/name] [--iters N] [--max-mib M]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  // (m tokens, n outputs, k inputs): a layer's GEMMs for hidden h, gated MLP f = 3.5h rounded to
  // 256, at 2k and 8k tokens; then squares.
  std::vector<std::array<long, 3>> shapes;
  for (long h : {1024L, 2048L, 4096L, 8192L}) {
    const long f = (h * 7 / 2 + 255) / 256 * 256;
    for (long t : {2048L, 8192L})
      for (auto s : {std::array<long, 3>{t, 3 * h, h}, {t, h, h}, {t, 2 * f, h}, {t, h, f}}) shapes.push_back(s);
  }
  for (long n = 256; n <= 16384; n *= 2) shapes.push_back({n, n, n});
  size_t max_elems = 0;
  for (auto& s : shapes) max_elems = std::max({max_elems, size_t(s[0] * s[2]), size_t(s[1] * s[2]), size_t(s[0] * s[1])});
  void *a, *b, *c;
  check(cudaMalloc(&a, max_elems * 4), "cudaMalloc");
  check(cudaMalloc(&b, max_elems * 4), "cudaMalloc");
  check(cudaMalloc(&c, max_elems * 4), "cudaMalloc");
  check(cudaMemset(a, 0, max_elems * 4), "cudaMemset");
  check(cudaMemset(b, 0, max_elems * 4), "cudaMemset");
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  json rows = json::array();
  const float alpha = 1, beta = 0;
  for (const Precision& p : precisions) {
    for (auto [m, n, k] : shapes) {
      // Row-major Y[m, n] = X[m, k] W[n, k]^T is column-major Y^T = W X^T: cuBLAS (n, m, k), op(W) = T.
      auto launch = [&] {
        check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, p.data, int(k), a, p.data,
                           int(k), &beta, c, p.data, int(n), p.compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      };
      const double t = time_per_call_s(launch, o.iters, nullptr);
      rows.push_back({{"precision", p.name}, {"m", m}, {"n", n}, {"k", k}, {"time_s", t},
                      {"flops_per_s", 2.0 * m * n * k / t}});
      std::fprintf(stderr, "gemm %s %ld x %ld x %ld: %.1f TFLOP/s\n", p.name, m, n, k, 2.0 * m * n * k / t / 1e12);
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
