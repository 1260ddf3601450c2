// The hardware a plan runs on: one GPU type (peak FLOP/s per precision, HBM bytes and
// bandwidth, a framework reserve) and a cluster of identical nodes (GPUs per node, the
// intra-node link tier, NICs, the fabric). Read from profiles/ JSON files; every figure in those
// files carries its source. Capacity keys use GB = 1e9 bytes or GiB = 2^30 as their names say.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

enum class Precision { fp32, bf16, fp16, fp8 };

// Which of training's GEMMs a measured time is for. A linear layer Y[T, out] =
// X[T, in] W[out, in]^T runs three: its forward, the input gradient dX = dY W
// (the GEMM (T, in, out)) and the weight gradient dW = dY^T X (the GEMM (out,
// in, T), contracting over the tokens). The same shape runs at different speeds
// in the three operand layouts. `batched` is the attention core's batched
// GEMMs. attention_forward and attention_backward are a whole causal
// flash-attention core (m = query length, n = key length, k = head size, batch
// = sequences x heads; 2mnk x batch counted as its FLOPs), measured where the
// probe can run the framework's own kernel: they stand only for themselves,
// never for a GEMM.
enum class GemmOp { forward, dgrad, wgrad, batched, attention_forward, attention_backward };
inline bool is_whole_attention(GemmOp op) { return op == GemmOp::attention_forward || op == GemmOp::attention_backward; }

// One GEMM a probe timed: (m x k) * (k x n), `batch` of them, in `time_s`
// (dplan probe writes them).
struct MeasuredGemm {
  Precision precision = Precision::bf16;
  GemmOp op = GemmOp::forward;
  double m = 0, n = 0, k = 0, batch = 1;
  double time_s = 0;
  bool operator==(const MeasuredGemm&) const = default;
};

struct GpuSpec {
  std::string name;
  std::string description;
  double hbm_bytes = 0;                          // the vendor's nominal capacity (decimal GB)
  // The device memory CUDA reports (cudaGetDeviceProperties' totalGlobalMem, as deviceQuery prints
  // it): 80 GB parts carry 80 GiB of HBM and show 79.2 GiB of it. 0 where no source gives it.
  double device_memory_bytes = 0;
  // What the memory model fits into before the framework reserve and the headroom: the device
  // memory where known, else the nominal capacity.
  double memory_capacity_bytes() const { return device_memory_bytes > 0 ? device_memory_bytes : hbm_bytes; }
  double hbm_bandwidth_bytes_per_s = 0;
  std::map<std::string, double> peak_flops_per_s;  // dense, by "fp32" "tf32" "bf16" "fp16" "fp8"
  double framework_reserve_bytes = 0;            // outside the allocator on one rank: CUDA context, cuBLAS, cuDNN
  // NCCL's device buffers for each communicator a rank runs collectives over (memory.h
  // outside_allocator_bytes); 0 where the backend keeps none on the device (gloo on CPU).
  double nccl_buffers_per_communicator_bytes = 0;
  // Matrix multiplies: the best large GEMM reaches matmul_max_efficiency of peak (measured MAMF);
  // smaller ones lose to wave quantization over sm_count SMs, to memory traffic (roofline) and to
  // a fixed per-kernel overhead (see compute.h).
  double matmul_max_efficiency = 0;
  // FP8 GEMMs reach a lower fraction of their (twice as high) peak than 16-bit ones: FP8 MAMF /
  // FP8 dense peak. 0: the profile gives none, and max_efficiency applies to FP8 too.
  double fp8_matmul_max_efficiency = 0;
  // The fused flash-attention kernel's achieved rate, forward and backward, as fractions of the
  // 16-bit dense peak at training sequence lengths (attention runs in 16 bits under FP8 training).
  // 0: the profile gives none, and the core is priced as batched GEMMs (compute.h).
  double attention_forward_efficiency = 0;
  double attention_backward_efficiency = 0;
  // Each call reaches efficiency x keys / (keys + attention_half_keys): short key blocks (a
  // context-parallel ring step sees seq / cp keys) leave the kernel's pipeline less to overlap.
  double attention_half_keys = 0;
  int sm_count = 0;
  double kernel_overhead_s = 0;
  // A probe's GEMM timings (optional). For a precision they cover, a GEMM's
  // rate is interpolated from them instead of the curve above (compute.h:
  // gemm_time_s).
  std::vector<MeasuredGemm> matmul_measured;
  double memory_efficiency = 0;   // achieved / datasheet HBM bandwidth, element-wise kernels
  double sustained_fraction = 1;  // of the matmul maximum, sustained over a training step
  // Board power (optional "power" in a profile). The figures above hold at power_limit_w, or at
  // tdp_w when power_limit_w is 0; power_cap.h derives the figures at a lower limit.
  double tdp_w = 0;              // the board's default and maximum power limit; 0: not given
  double min_power_limit_w = 0;  // the lowest limit the board accepts; 0: not given
  double power_limit_w = 0;      // the limit the figures hold at, when below tdp_w; 0: at tdp_w
  json sources;                   // free-form: figure -> source text
  bool operator==(const GpuSpec&) const = default;
};

// How a node's GPUs reach each other: through one NVSwitch or PCIe switch (or the host's memory
// for CPU ranks), or over direct links, a full mesh (AMD's XGMI; NVLink bridges, which join two
// H100 NVL or PCIe cards, four H200 NVL).
enum class IntraNodeKind { nvswitch, pcie, xgmi, shared_memory, nvlink_bridge };

enum class Collective { all_reduce, all_gather, reduce_scatter, all_to_all, send_recv };

// One collective a probe timed (nccl-tests' out-of-place time): `ranks` ranks,
// `bytes` as nccl-tests' size column counts them.
struct MeasuredCollective {
  Collective op = Collective::all_reduce;
  int ranks = 0;
  double bytes = 0, time_s = 0;
  bool operator==(const MeasuredCollective&) const = default;
};

struct LinkTier {
  double bandwidth_bytes_per_s = 0;  // per GPU, one direction, line rate
  double latency_s = 0;              // per hop (NCCL Ring/Simple hardware latency)
  double efficiency_fraction = 1.0;  // large-message ring bus bandwidth / line rate (measured)
  double half_bandwidth_bytes = 0;   // message size at which a collective reaches half that busbw
  // Timings of this tier's collectives by size (optional; `dplan probe` imports
  // them). A group of a measured collective and size inside one node takes the
  // measured time, interpolated log-log between sizes (collectives.cpp); other
  // groups use the model above.
  std::vector<MeasuredCollective> measured;
  // Training's time over the measured one (`dplan calibrate` fits it); ranks time-sharing cores
  // take the larger of it and 1 / core_share (collectives.cpp).
  double measured_scale = 1.0;
  bool operator==(const LinkTier&) const = default;
};

// The shared filesystem checkpoints go to (optional in a profile: "storage"). Bytes per second
// one node reaches on its own, and the whole filesystem's aggregate over every node at once; a
// write or read of many nodes takes the larger of the slowest node's time and the aggregate's
// (checkpoint_cost.h). All zero: the profile gives none, and no checkpoint time is predicted.
struct StorageSpec {
  double node_read_bytes_per_s = 0, node_write_bytes_per_s = 0;
  double aggregate_read_bytes_per_s = 0, aggregate_write_bytes_per_s = 0;
  bool given() const { return node_write_bytes_per_s > 0; }
  bool operator==(const StorageSpec&) const = default;
};

// Device <-> host copies (optimizer offload's traffic, a checkpoint's snapshot to host memory):
// PCIe Gen4/5 x16 moves about 25 GB/s per GPU in practice (profiles/clusters/SOURCES.md section 1:
// Gen4 31 GB/s, Gen5 63 GB/s per direction line rate). An assumption, documented in
// docs/cost-model.md; devices that are a host's cores copy at their memory bandwidth instead.
inline constexpr double kHostLinkBytesPerS = 25e9;

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
  // With cores_per_node: how much faster one rank alone computes than with every core busy
  // (measured by `dplan probe`; optional "lone_rank_speedup", default 1).
  double lone_rank_speedup = 1.0;
  // Of the compute a collective could hide under (gradient buckets under
  // backward, ZeRO gathers under forward), the fraction that does hide it: 1
  // for GPUs, whose collectives run on their own SMs and copy engines; measured
  // by `dplan probe` (a GEMM loop with an all-reduce in flight) and fitted by
  // `dplan calibrate`. Optional in the file ("comm_overlap"), default 1.
  double comm_overlap_fraction = 1.0;
  StorageSpec storage;                 // the shared filesystem (optional "storage")
  json sources;
  bool operator==(const ClusterSpec&) const = default;
};

// Dense peak FLOP/s of `gpu` for the math of `precision` (fp32 training uses tf32 tensor cores
// when the GPU has them, as PyTorch and Megatron do with allow_tf32). Throws InputError if the
// GPU has no such unit (fp8 on an A100).
double peak_flops_per_s(const GpuSpec& gpu, Precision precision);

// How fast each rank runs when the devices are the cores of one shared machine (cores_per_node > 0,
// the local-cpu cluster), relative to every core running one rank (how `dplan probe` measures):
// ranks beyond the cores time-share them, computing and communicating (Gloo's threads need a core
// too), so each gets cores / ranks; fewer ranks than cores contend less for the machine's caches
// and memory, up to lone_rank_speedup for a rank alone (geometric in between). 1 for dedicated
// devices.
double core_share(const ClusterSpec& cluster, int world_size);

// Profile files: {"format_version": 1, "gpu": {...}} and {"format_version": 1,
// "cluster": {...}}. A cluster names its GPU; `load_gpu` resolves that name to
// a GpuSpec, which the cluster's optional "power_limit_w" derives for that limit
// (power_cap.h). Strict: unknown keys, missing keys and out-of-range values throw
// InputError naming file and key.
using GpuLoader = std::function<GpuSpec(const std::string& gpu_name)>;
// The largest a GPU profile may state (gpu_from_json), and so the largest a measurement of one GPU
// may report (engine_logs.h): HBM in decimal GB, a peak in TFLOP/s.
inline constexpr double kMaxHbmGB = 1e5;
inline constexpr double kMaxPeakTflops = 1e6;
// The smallest fraction of a peak a GPU profile may state (its efficiencies): below 0.1 % nothing
// is being modelled.
inline constexpr double kMinEfficiency = 1e-3;
GpuSpec gpu_from_json(const json& j, const std::string& file);
ClusterSpec cluster_from_json(const json& j, const std::string& file, const GpuLoader& load_gpu);
// The cluster block a plan embeds (to_json(ClusterSpec): the GPU's figures in place of its name,
// sources optional), with the same keys and ranges as a cluster profile; errors name `file` and
// `pointer` ("/cluster").
ClusterSpec embedded_cluster_from_json(const json& cluster, const std::string& file, const std::string& pointer);

// -o's rules for profiles (json_io.h check_output_path): an earlier profile of the same kind is
// replaced without --force.
const OutputKind& gpu_profile_output();
const OutputKind& cluster_profile_output();

json to_json(const GpuSpec& gpu);
json to_json(const ClusterSpec& cluster);
json to_json(const std::vector<MeasuredCollective>& rows);  // a tier's "measured" array

const char* to_string(Precision precision);
const char* to_string(GemmOp op);
const char* to_string(Collective op);
Collective collective_from_string(const std::string& s);  // throws InputError listing the choices
GemmOp gemm_op_from_string(const std::string& s);         // throws InputError listing the choices
const char* to_string(IntraNodeKind kind);

}  // namespace dplan::costmodel
