// The hardware a plan runs on: one GPU type (peak FLOP/s per precision, HBM bytes and
// bandwidth, a framework reserve) and a cluster of identical nodes (GPUs per node, the
// intra-node link tier, NICs, the fabric). Read from profiles/ JSON files; every figure in those
// files carries its source. Capacity keys use GB = 1e9 bytes or GiB = 2^30 as their names say.
#pragma once

#include <map>
#include <string>

#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

enum class Precision { fp32, bf16, fp16, fp8 };

struct GpuSpec {
  std::string name;
  std::string description;
  double hbm_bytes = 0;                          // usable capacity before the framework reserve
  double hbm_bandwidth_bytes_per_s = 0;
  std::map<std::string, double> peak_flops_per_s;  // dense, by "fp32" "tf32" "bf16" "fp16" "fp8"
  double framework_reserve_bytes = 0;            // CUDA context, NCCL buffers, fragmentation
  // Matrix multiplies: the best large GEMM reaches matmul_max_efficiency of peak (measured MAMF);
  // smaller ones lose to wave quantization over sm_count SMs, to memory traffic (roofline) and to
  // a fixed per-kernel overhead (see compute.h).
  double matmul_max_efficiency = 0;
  int sm_count = 0;
  double kernel_overhead_s = 0;
  double memory_efficiency = 0;                  // achieved / datasheet HBM bandwidth, element-wise kernels
  double sustained_fraction = 1;                 // of the matmul maximum, sustained over a training step
  json sources;                                  // free-form: figure -> source text
  bool operator==(const GpuSpec&) const = default;
};

enum class IntraNodeKind { nvswitch, pcie, xgmi, shared_memory };

struct LinkTier {
  double bandwidth_bytes_per_s = 0;  // per GPU, one direction, line rate
  double latency_s = 0;              // per hop (NCCL Ring/Simple hardware latency)
  double efficiency_fraction = 1.0;  // large-message ring bus bandwidth / line rate (measured)
  double half_bandwidth_bytes = 0;   // message size at which a collective reaches half that busbw
  bool operator==(const LinkTier&) const = default;
};

struct ClusterSpec {
  std::string name;
  std::string description;
  GpuSpec gpu;
  int gpus_per_node = 0;
  IntraNodeKind intra_node_kind = IntraNodeKind::nvswitch;
  LinkTier intra_node;                 // GPU <-> GPU inside a node
  bool nvls = false;                   // NVLink SHARP (in-switch reduction)
  double nvls_efficiency_fraction = 0;   // NVLS all-reduce algbw / intra_node line rate (0: no nvls)
  double nvls_half_bandwidth_bytes = 0;  // message size at which NVLS reaches half that algbw
  int nics_per_node = 0;
  double nic_bandwidth_bytes_per_s = 0;  // one NIC, one direction, line rate
  double inter_node_latency_s = 0;       // per hop (NCCL NET Ring/Simple hardware latency)
  double nic_efficiency_fraction = 1.0;  // achieved busbw per NIC / line rate (measured)
  double inter_node_half_bandwidth_bytes = 0;  // as LinkTier::half_bandwidth_bytes, for the NICs
  int nodes_per_leaf = 0;              // nodes under one leaf switch
  double oversubscription = 1.0;       // leaf uplink over-subscription (1 = non-blocking)
  double host_memory_bytes = 0;        // per node
  // Devices that are the cores of one shared machine (local-cpu): the cores its ranks share; 0
  // when every device is its own. The time model gives each rank min(1, cores / ranks) of one.
  int cores_per_node = 0;
  json sources;
  bool operator==(const ClusterSpec&) const = default;
};

// Dense peak FLOP/s of `gpu` for the math of `precision` (fp32 training uses tf32 tensor cores
// when the GPU has them, as PyTorch and Megatron do with allow_tf32). Throws InputError if the
// GPU has no such unit (fp8 on an A100).
double peak_flops_per_s(const GpuSpec& gpu, Precision precision);

// Profile files: {"format_version": 1, "gpu": {...}} and {"format_version": 1, "cluster": {...}}.
// A cluster names its GPU; `load_gpu` resolves that name to a GpuSpec. Strict: unknown keys,
// missing keys and out-of-range values throw InputError naming file and key.
using GpuLoader = std::function<GpuSpec(const std::string& gpu_name)>;
GpuSpec gpu_from_json(const json& j, const std::string& file);
ClusterSpec cluster_from_json(const json& j, const std::string& file, const GpuLoader& load_gpu);

json to_json(const GpuSpec& gpu);
json to_json(const ClusterSpec& cluster);

const char* to_string(Precision precision);
const char* to_string(IntraNodeKind kind);

}  // namespace dplan::costmodel
