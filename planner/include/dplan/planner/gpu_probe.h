// What dplan-gpu-probe measured (probe/gpu_probe.cpp writes it; `dplan-worker
// --probe` writes the same for a CPU machine, executor/src/machine_probe.cpp),
// read into a GPU profile: `dplan probe --import-gpu-probe gpu-probe.json
// --cluster BASE -o my-node.json` fits the GPU's matmul efficiency and
// per-kernel overhead to the measured GEMMs through the cost model's own GEMM
// time (costmodel/src/compute.cpp: wave quantization over the measured SM
// count, roofline against HBM, overhead), keeps the GEMMs as the profile's
// measured table, and sets the achieved HBM fraction from the measured
// element-wise kernels (or, without them, the copy bandwidth).
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::planner {

struct GemmSample {
  costmodel::Precision precision = costmodel::Precision::bf16;
  double m = 0, n = 0, k = 0;  // (m x k) * (k x n)
  double time_s = 0;
  costmodel::GemmOp op = costmodel::GemmOp::forward;  // which of training's GEMMs ("op"; default
                                                      // forward)
  double batch = 1;                                   // batched GEMMs ("batch"; default 1)
};

struct GpuProbe {
  std::string file;
  std::string device_name;
  int sm_count = 0;
  int device_count = 0;
  int cores = 0;  // dplan-worker --probe: the machine's cores, which its ranks share (0: GPUs)
  double copy_bytes_per_s = 0;  // read + written per second, device to device
  // Training's element-wise kernels (GELU, norms, softmax, adds), read +
  // written per second (0: not measured); when measured, the memory-bound
  // work's rate is this, not the copy's.
  double elementwise_bytes_per_s = 0;
  std::vector<GemmSample> gemms;
  std::vector<std::string> nccl_tests_files;  // as written by the probe
  // An all-reduce alone, a GEMM loop alone and both at once ("overlap"; absent
  // with one device): the fraction of the all-reduce that hid under the GEMMs,
  // in [0, 1]; negative when not measured.
  double overlap_fraction = -1;
  // A CPU probe: one rank computing alone against every rank at once ("lone_rank"; 0: not measured).
  double lone_rank_speedup = 0, lone_rank_alone_s = 0, lone_rank_busy_s = 0;
  double overlap_bytes = 0, overlap_gemm_s = 0, overlap_collective_s = 0, overlap_both_s = 0;
  // The smallest kernel's launch cost ("launch"; 0: not measured, as in files before it): the GPU's
  // time per back-to-back launch and the host's enqueue time per call.
  std::string launch_kernel;
  int launch_count = 0;
  double launch_overhead_s = 0, launch_enqueue_s = 0;
  // The device as the driver reports it ("device"; empty or 0 where the file does not say).
  std::string compute_capability;  // "major.minor"
  double sm_clock_hz = 0, memory_clock_hz = 0, l2_bytes = 0;
  int memory_bus_width_bits = 0;
  std::string driver_version, runtime_version, cublas_version, cublaslt_version, nccl_version;
  // A probe that stopped part-way ("incomplete" while it still ran, "error" when it failed): what
  // it says, empty for a finished probe.
  std::string incomplete;
};

// Throws InputError naming the file and key for anything malformed.
GpuProbe parse_gpu_probe(const json& j, const std::string& file);

struct GemmFitRow {
  GemmSample sample;
  double before_s = 0, after_s = 0;
};

struct GpuFit {
  costmodel::GpuSpec gpu;  // the base with the measured SM count, memory efficiency and fitted matmul figures
  std::vector<GemmFitRow> rows;
  double rms_log_error_before = 0, rms_log_error_after = 0;
  // FP8 GEMMs left out (neither fitted nor kept) because the base GPU has no fp8 peak.
  size_t fp8_gemms_ignored = 0;
};

// Least squares on log time over every GEMM (all precisions together, each
// against its own peak): matmul max_efficiency and kernel_overhead, and with FP8
// GEMMs fp8_max_efficiency (FP8 reaches its own fraction of its peak); sm_count is
// the measured one and memory_efficiency is element-wise (else copy) bandwidth
// / datasheet HBM bandwidth (at most 1). The isolated GEMMs measure the maximum
// achievable matmul rate (MAMF), so the fit holds sustained_fraction at 1. The
// returned GPU also keeps every GEMM as matmul_measured (the cost model
// interpolates their rates) with sustained_fraction 1: the probe measured them
// with every rank of the node busy. FP8 GEMMs on a base GPU without an fp8 peak
// are left out (counted in fp8_gemms_ignored): the profile could not hold them.
// Throws InputError with fewer than 2 GEMMs, or a GEMM in another precision the
// base GPU has no peak for.
GpuFit fit_gpu(const costmodel::GpuSpec& base, const GpuProbe& probe);

}  // namespace dplan::planner
