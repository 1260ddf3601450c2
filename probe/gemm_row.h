// What the probes write and `dplan probe --import-gpu-probe` reads (planner/src/gpu_probe.cpp),
// built in one place so that the writers (probe/gpu_probe.cpp on a GPU node, `dplan-worker
// --probe` on a CPU machine) and the reader's tests agree on the keys.
//   - gemm_row: one timed GEMM, (m x k) * (k x n), `batch` of them, as training's `op` (forward,
//     dgrad, wgrad, batched, attention_forward, attention_backward), in `time_s`; FLOPs 2mnk x
//     batch.
//   - launch_json: the smallest kernel's launch cost (JSON "launch").
//   - device_json: the GPU as the driver reports it (JSON "device"), with the version texts of
//     cuda_version_text and nccl_version_text.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace dplan::probe {

inline nlohmann::json gemm_row(const char* precision, const char* op, int64_t m, int64_t n, int64_t k, int64_t batch,
                               double time_s) {
  return {{"precision", precision}, {"op", op},         {"m", m},           {"n", n},
          {"k", k},                 {"batch", batch},   {"time_s", time_s}, {"flops_per_s", 2.0 * m * n * k * batch / time_s}};
}

// `launches` back-to-back launches of `kernel`: the GPU's time per launch, the host's enqueue time
// per call.
inline nlohmann::json launch_json(const char* kernel, int launches, double time_per_launch_s,
                                  double enqueue_per_launch_s) {
  return {{"kernel", kernel},
          {"launches", launches},
          {"time_per_launch_s", time_per_launch_s},
          {"enqueue_per_launch_s", enqueue_per_launch_s}};
}

// "major.minor" of a CUDA version number, 1000 major + 10 minor (cudaDriverGetVersion's and
// cudaRuntimeGetVersion's: 12040 is 12.4).
inline std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// "major.minor.patch" of ncclGetVersion's code: 10000 major + 100 minor + patch from NCCL 2.9 on,
// 1000 major + 100 minor + patch before (nccl.h's NCCL_VERSION macro).
inline std::string nccl_version_text(int code) {
  const bool wide = code >= 20900;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code % 10000 / 100 : code % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

struct DeviceReport {
  std::string name;
  int sm_count = 0;
  uint64_t memory_bytes = 0;
  int count = 0;  // visible devices
  std::string compute_capability;  // "major.minor"
  double sm_clock_hz = 0, memory_clock_hz = 0;  // peak clocks
  int memory_bus_width_bits = 0;
  int64_t l2_bytes = 0;
  std::string driver_version, runtime_version, cublas_version, cublaslt_version, nccl_version;
};

inline nlohmann::json device_json(const DeviceReport& d) {
  return {{"name", d.name},
          {"sm_count", d.sm_count},
          {"memory_bytes", d.memory_bytes},
          {"count", d.count},
          {"compute_capability", d.compute_capability},
          {"sm_clock_hz", d.sm_clock_hz},
          {"memory_clock_hz", d.memory_clock_hz},
          {"memory_bus_width_bits", d.memory_bus_width_bits},
          {"l2_bytes", d.l2_bytes},
          {"driver_version", d.driver_version},
          {"runtime_version", d.runtime_version},
          {"cublas_version", d.cublas_version},
          {"cublaslt_version", d.cublaslt_version},
          {"nccl_version", d.nccl_version}};
}

}  // namespace dplan::probe
