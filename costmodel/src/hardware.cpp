#include "dplan/costmodel/hardware.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/power_cap.h"
#include "dplan/costmodel/training.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {
namespace {


void check_format_version(ObjectReader& r) {
  if (r.positive_int("format_version") != 1) r.fail("format_version", "1");
}

const std::vector<std::string> kIntraKinds = {"nvswitch", "pcie", "xgmi", "shared-memory", "nvlink-bridge"};

// An achieved / line-rate ratio: in (0, 1].
// Ranges of the figures a profile gives: wide enough for a CPU core as a device and for GPUs
// and fabrics well beyond today's (HBM up to 100 TB, 1 EFLOP/s per device, 1 PB/s links); a
// figure outside is a typo or a unit mix-up, and tiny ones would make every time infinite.
constexpr double kMaxMicroseconds = 1e6;  // latencies and overheads: a second is no latency
constexpr double kMaxMiB = 1e6;           // half-bandwidth message sizes
constexpr double kMaxPowerW = 1e5;        // a board's power: 100 kW is no accelerator

double efficiency_fraction(ObjectReader& r, const std::string& key) { return r.number_in(key, kMinEfficiency, 1); }

IntraNodeKind intra_kind_from_string(const std::string& s) {
  if (s == "nvswitch") return IntraNodeKind::nvswitch;
  if (s == "pcie") return IntraNodeKind::pcie;
  if (s == "xgmi") return IntraNodeKind::xgmi;
  if (s == "nvlink-bridge") return IntraNodeKind::nvlink_bridge;
  return IntraNodeKind::shared_memory;
}

}  // namespace

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}

const char* to_string(GemmOp op) {
  switch (op) {
    case GemmOp::forward:
      return "forward";
    case GemmOp::dgrad:
      return "dgrad";
    case GemmOp::wgrad:
      return "wgrad";
    case GemmOp::batched:
      return "batched";
    case GemmOp::attention_forward:
      return "attention_forward";
    case GemmOp::attention_backward:
      return "attention_backward";
  }
  return "?";
}

const char* to_string(Collective op) {
  switch (op) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_to_all:
      return "all_to_all";
    case Collective::send_recv:
      return "send_recv";
  }
  return "?";
}

Collective collective_from_string(const std::string& s) {
  for (Collective op : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                        Collective::all_to_all, Collective::send_recv})
    if (s == to_string(op)) return op;
  throw InputError("unknown collective \"" + s +
                   "\"; choose all_reduce, all_gather, reduce_scatter, "
                   "all_to_all or send_recv");
}

GemmOp gemm_op_from_string(const std::string& s) {
  for (GemmOp op : {GemmOp::forward, GemmOp::dgrad, GemmOp::wgrad, GemmOp::batched, GemmOp::attention_forward,
                    GemmOp::attention_backward})
    if (s == to_string(op)) return op;
  throw InputError("unknown GEMM op \"" + s +
                   "\"; choose forward, dgrad, wgrad, batched, "
                   "attention_forward or attention_backward");
}

const char* to_string(IntraNodeKind k) {
  switch (k) {
    case IntraNodeKind::nvswitch: return "nvswitch";
    case IntraNodeKind::pcie: return "pcie";
    case IntraNodeKind::xgmi: return "xgmi";
    case IntraNodeKind::shared_memory: return "shared-memory";
    case IntraNodeKind::nvlink_bridge: return "nvlink-bridge";
  }
  return "?";
}

double peak_flops_per_s(const GpuSpec& gpu, Precision precision) {
  // The time model asks once per GEMM it prices: the (at most five) units are walked in order and
  // compared character by character, without making a string or calling memcmp.
  auto is = [](const std::string& unit, std::string_view name) {
    if (unit.size() != name.size()) return false;
    for (size_t i = 0; i < name.size(); ++i)
      if (unit[i] != name[i]) return false;
    return true;
  };
  const std::string_view wanted = to_string(precision);
  if (precision != Precision::fp32) {
    for (const auto& [unit, flops_per_s] : gpu.peak_flops_per_s)
      if (is(unit, wanted)) return flops_per_s;
  } else {
    const double* fp32 = nullptr;
    for (const auto& [unit, flops_per_s] : gpu.peak_flops_per_s) {
      if (is(unit, "tf32")) return flops_per_s;
      if (is(unit, wanted)) fp32 = &flops_per_s;
    }
    if (fp32) return *fp32;
  }
  std::vector<std::string> have;
  for (const auto& [k, v] : gpu.peak_flops_per_s) have.push_back(k);
  throw InputError("GPU " + gpu.name + " has no " + std::string(wanted) + " peak in its profile (it lists " +
                   join_choices(have) + "); choose another --precision");
}

double core_share(const ClusterSpec& c, int world_size) {
  if (c.cores_per_node <= 0) return 1.0;
  const int ranks = std::max(1, std::min(world_size, c.gpus_per_node));
  if (ranks >= c.cores_per_node) return double(c.cores_per_node) / ranks;
  return std::pow(c.lone_rank_speedup, double(c.cores_per_node - ranks) / (c.cores_per_node - 1));
}

namespace {

// A GPU's figures, from the object `r` reads: a GPU profile's "gpu", or the "gpu" a plan's cluster
// block embeds (to_json(GpuSpec)).
GpuSpec read_gpu(ObjectReader& r, const std::string& file) {
  GpuSpec g;
  g.name = r.string("name");
  g.description = r.string("description");
  g.hbm_bytes = r.number_in("hbm_gb", 0.01, kMaxHbmGB) * kGB;
  if (r.has("device_memory_bytes")) g.device_memory_bytes = r.number_in("device_memory_bytes", 1e6, 1e14);
  g.hbm_bandwidth_bytes_per_s = r.number_in("hbm_gbytes_per_s", 0.01, 1e6) * kGB;
  ObjectReader peaks = r.object("peak_tflops");
  for (const char* key : {"fp32", "tf32", "bf16", "fp16", "fp8"})
    if (peaks.has(key)) g.peak_flops_per_s[key] = peaks.number_in(key, 1e-4, kMaxPeakTflops) * 1e12;
  peaks.finish();
  if (g.peak_flops_per_s.empty()) r.fail("peak_tflops", "at least one of fp32, tf32, bf16, fp16, fp8");
  g.framework_reserve_bytes = r.non_negative_number("framework_reserve_gib") * kGiB;
  if (r.has("nccl_buffers_per_communicator_mib"))
    g.nccl_buffers_per_communicator_bytes = r.number_in("nccl_buffers_per_communicator_mib", 0, 1e5) * kMiB;
  if (g.framework_reserve_bytes >= g.memory_capacity_bytes()) r.fail("framework_reserve_gib", "less than the HBM capacity");
  ObjectReader matmul = r.object("matmul");
  g.matmul_max_efficiency = efficiency_fraction(matmul, "max_efficiency");
  if (matmul.has("fp8_max_efficiency")) g.fp8_matmul_max_efficiency = efficiency_fraction(matmul, "fp8_max_efficiency");
  g.sm_count = static_cast<int>(matmul.int_in("sm_count", 1, 100000));
  g.kernel_overhead_s = matmul.number_in("kernel_overhead_us", 0, kMaxMicroseconds) * 1e-6;
  if (matmul.has("measured")) {
    const json& rows = matmul.raw("measured");
    if (!rows.is_array()) matmul.fail("measured", "an array of measured GEMMs");
    for (size_t i = 0; i < rows.size(); ++i) {
      ObjectReader row(rows[i], file, "/gpu/matmul/measured/" + std::to_string(i));
      MeasuredGemm x;
      x.precision = precision_from_string(row.one_of("precision", {"fp32", "bf16", "fp16", "fp8"}));
      if (!g.peak_flops_per_s.count(to_string(x.precision)) &&
          !(x.precision == Precision::fp32 && g.peak_flops_per_s.count("tf32")))
        row.fail("precision", "a precision this GPU lists in peak_tflops");
      x.op = gemm_op_from_string(
          row.one_of("op", {"forward", "dgrad", "wgrad", "batched", "attention_forward", "attention_backward"}));
      x.m = row.number_in("m", 1, 1e9);
      x.n = row.number_in("n", 1, 1e9);
      x.k = row.number_in("k", 1, 1e9);
      x.batch = row.has("batch") ? static_cast<double>(row.int_in("batch", 1, 1000000)) : 1.0;
      x.time_s = row.number_in("time_us", 1e-3, 1e10) * 1e-6;
      row.finish();
      g.matmul_measured.push_back(x);
    }
  }
  matmul.finish();
  if (r.has("attention")) {
    ObjectReader attention = r.object("attention");
    g.attention_forward_efficiency = efficiency_fraction(attention, "forward_efficiency");
    g.attention_backward_efficiency = efficiency_fraction(attention, "backward_efficiency");
    if (attention.has("half_keys")) g.attention_half_keys = attention.number_in("half_keys", 0, kMaxSeqLen);
    attention.finish();
  }
  g.memory_efficiency = efficiency_fraction(r, "memory_efficiency");
  // Of the GEMM rate; above 1 only where `dplan calibrate` found measured runs outpacing a probe's
  // table (a probe taken while the machine was slower).
  g.sustained_fraction = r.number_in("sustained_fraction", kMinEfficiency, 2);
  if (r.has("power")) {
    // The board's power limits in watts: the TDP (default and maximum limit) the figures above
    // hold at, the lowest limit it accepts, and, in a derived profile (power_cap.h), the limit
    // the figures were derived for.
    ObjectReader power = r.object("power");
    g.tdp_w = power.number_in("tdp_w", 1, kMaxPowerW);
    if (power.has("min_limit_w")) g.min_power_limit_w = power.number_in("min_limit_w", 1, g.tdp_w);
    if (power.has("limit_w")) {
      g.power_limit_w = power.number_in("limit_w", g.min_power_limit_w > 0 ? g.min_power_limit_w : 1, g.tdp_w);
      if (g.power_limit_w == g.tdp_w) g.power_limit_w = 0;  // at the TDP: the datasheet's figures
    }
    power.finish();
  }
  g.sources = r.raw("sources");
  if (!g.sources.is_object()) r.fail("sources", "an object of source strings");
  if (g.tdp_w > 0 && !g.sources.contains("power")) r.fail("sources", "a \"power\" source for the power block");
  r.finish();
  return g;
}

// A cluster profile names its GPU and cites a source for each block; the cluster block a plan
// embeds (to_json(ClusterSpec)) holds the GPU's figures in place of its name and no sources.
enum class ClusterForm { profile, embedded };

// The cluster's figures, from the object `r` reads, with the same keys and ranges in both forms.
ClusterSpec read_cluster(ObjectReader& r, const std::string& file, ClusterForm form, const GpuLoader& load_gpu) {
  // A block's "source": required in a profile, read where present in an embedded block.
  auto source = [&](ObjectReader& block) {
    return form == ClusterForm::profile || block.has("source") ? block.string("source") : std::string();
  };
  ClusterSpec c;
  c.name = r.string("name");
  c.description = r.string("description");
  if (form == ClusterForm::profile) {
    c.gpu = load_gpu(r.string("gpu"));
  } else {
    ObjectReader gpu = r.object("gpu");
    c.gpu = read_gpu(gpu, file);
  }
  // The GPUs' configured power limit (nvidia-smi -pl): the GPU's figures derived for it.
  if (r.has("power_limit_w")) {
    try {
      c.gpu = power_capped(c.gpu, r.number_in("power_limit_w", 1, kMaxPowerW));
    } catch (const InputError& e) {
      throw InputError(r.where("power_limit_w") + ": " + e.what());
    }
  }
  c.gpus_per_node = static_cast<int>(r.int_in("gpus_per_node", 1, 4096));

  ObjectReader intra = r.object("intra_node");
  c.intra_node_kind = intra_kind_from_string(intra.one_of("kind", kIntraKinds));
  c.intra_node.bandwidth_bytes_per_s = intra.number_in("gbytes_per_s", 1e-3, 1e6) * kGB;
  c.intra_node.latency_s = intra.number_in("latency_us", 0, kMaxMicroseconds) * 1e-6;
  c.intra_node.efficiency_fraction = efficiency_fraction(intra, "efficiency");
  c.intra_node.half_bandwidth_bytes = intra.number_in("half_bandwidth_mib", 0, kMaxMiB) * kMiB;
  c.nvls = intra.boolean("nvls");
  if (c.nvls) {
    if (c.intra_node_kind != IntraNodeKind::nvswitch) intra.fail("nvls", "false unless kind is nvswitch");
    c.nvls_efficiency_fraction = efficiency_fraction(intra, "nvls_efficiency");
    c.nvls_half_bandwidth_bytes = intra.number_in("nvls_half_bandwidth_mib", 0, kMaxMiB) * kMiB;
  } else {
    for (const char* key : {"nvls_efficiency", "nvls_half_bandwidth_mib"})
      if (intra.has(key)) intra.fail(key, "no such key when nvls is false");
  }
  if (intra.has("measured")) {
    const json& rows = intra.raw("measured");
    if (!rows.is_array()) intra.fail("measured", "an array of measured collectives");
    for (size_t i = 0; i < rows.size(); ++i) {
      ObjectReader row(rows[i], file, "/cluster/intra_node/measured/" + std::to_string(i));
      MeasuredCollective x;
      x.op = collective_from_string(
          row.one_of("collective", {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}));
      x.ranks = static_cast<int>(row.int_in("ranks", 2, kMaxGpus));
      x.bytes = row.number_in("bytes", 1, 1e15);
      x.time_s = row.number_in("time_us", 1e-3, 1e10) * 1e-6;
      row.finish();
      c.intra_node.measured.push_back(x);
    }
    if (intra.has("measured_scale")) c.intra_node.measured_scale = intra.number_in("measured_scale", 1e-3, 1e3);
  }
  c.sources["intra_node"] = source(intra);
  intra.finish();

  ObjectReader inter = r.object("inter_node");
  c.nics_per_node = static_cast<int>(inter.int_in("nics_per_node", 1, 64));
  c.nic_bandwidth_bytes_per_s = inter.number_in("nic_gbits_per_s", 1e-3, 1e7) * kGB / 8;
  c.inter_node_latency_s = inter.number_in("latency_us", 0, kMaxMicroseconds) * 1e-6;
  c.nic_efficiency_fraction = efficiency_fraction(inter, "efficiency");
  c.inter_node_half_bandwidth_bytes = inter.number_in("half_bandwidth_mib", 0, kMaxMiB) * kMiB;
  c.sources["inter_node"] = source(inter);
  inter.finish();

  ObjectReader fabric = r.object("fabric");
  fabric.one_of("kind", {"fat-tree"});
  c.nodes_per_leaf = static_cast<int>(fabric.int_in("nodes_per_leaf", 1, kMaxGpus));
  c.oversubscription = fabric.number_in("oversubscription", 1, 1000);  // 1 = non-blocking
  c.sources["fabric"] = source(fabric);
  fabric.finish();

  c.host_memory_bytes = r.number_in("host_memory_gib", 1e-3, 1e7) * kGiB;
  if (r.has("cores_per_node")) c.cores_per_node = static_cast<int>(r.int_in("cores_per_node", 1, 100000));
  if (r.has("lone_rank_speedup")) {
    ObjectReader lone = r.object("lone_rank_speedup");
    c.lone_rank_speedup = lone.number_in("factor", 0.01, 100);
    c.sources["lone_rank_speedup"] = source(lone);
    lone.finish();
  }
  if (r.has("comm_overlap")) {
    ObjectReader overlap = r.object("comm_overlap");
    c.comm_overlap_fraction = overlap.fraction("fraction");
    c.sources["comm_overlap"] = source(overlap);
    overlap.finish();
  }
  if (r.has("storage")) {
    // Decimal GB/s, as every bandwidth in a profile; from a slow local disk (0.01 GB/s) to a
    // filesystem far beyond today's largest (1 PB/s aggregate).
    ObjectReader storage = r.object("storage");
    c.storage.node_read_bytes_per_s = storage.number_in("node_read_gbytes_per_s", 1e-2, 1e5) * kGB;
    c.storage.node_write_bytes_per_s = storage.number_in("node_write_gbytes_per_s", 1e-2, 1e5) * kGB;
    c.storage.aggregate_read_bytes_per_s = storage.number_in("aggregate_read_gbytes_per_s", 1e-2, 1e6) * kGB;
    c.storage.aggregate_write_bytes_per_s = storage.number_in("aggregate_write_gbytes_per_s", 1e-2, 1e6) * kGB;
    if (c.storage.aggregate_read_bytes_per_s < c.storage.node_read_bytes_per_s)
      storage.fail("aggregate_read_gbytes_per_s", "at least node_read_gbytes_per_s");
    if (c.storage.aggregate_write_bytes_per_s < c.storage.node_write_bytes_per_s)
      storage.fail("aggregate_write_gbytes_per_s", "at least node_write_gbytes_per_s");
    c.sources["storage"] = source(storage);
    storage.finish();
  }
  c.sources["cluster"] = source(r);
  r.finish();
  return c;
}

}  // namespace

GpuSpec gpu_from_json(const json& j, const std::string& file) {
  ObjectReader top(j, file);
  check_format_version(top);
  ObjectReader r = top.object("gpu");
  GpuSpec g = read_gpu(r, file);
  top.finish();
  return g;
}

ClusterSpec cluster_from_json(const json& j, const std::string& file, const GpuLoader& load_gpu) {
  ObjectReader top(j, file);
  check_format_version(top);
  ObjectReader r = top.object("cluster");
  ClusterSpec c = read_cluster(r, file, ClusterForm::profile, load_gpu);
  top.finish();
  return c;
}

ClusterSpec embedded_cluster_from_json(const json& cluster, const std::string& file, const std::string& pointer) {
  ObjectReader r(cluster, file, pointer);
  return read_cluster(r, file, ClusterForm::embedded, nullptr);
}

const OutputKind& gpu_profile_output() {
  static const OutputKind kind = json_output_kind("GPU profile", [](const json& j) { gpu_from_json(j, "-o"); });
  return kind;
}

const OutputKind& cluster_profile_output() {
  // The GPU it names is not resolved: any name read as a GPU is enough to recognise the file.
  static const OutputKind kind = json_output_kind("cluster profile", [](const json& j) {
    cluster_from_json(j, "-o", [](const std::string&) { return GpuSpec{}; });
  });
  return kind;
}

json to_json(const GpuSpec& g) {
  json peaks = json::object();
  for (const auto& [k, v] : g.peak_flops_per_s) peaks[k] = v / 1e12;
  json matmul = {{"max_efficiency", g.matmul_max_efficiency},
                 {"sm_count", g.sm_count},
                 {"kernel_overhead_us", g.kernel_overhead_s * 1e6}};
  if (g.fp8_matmul_max_efficiency > 0) matmul["fp8_max_efficiency"] = g.fp8_matmul_max_efficiency;
  if (!g.matmul_measured.empty()) {
    json rows = json::array();
    for (const MeasuredGemm& x : g.matmul_measured)
      rows.push_back({{"precision", to_string(x.precision)},
                      {"op", to_string(x.op)},
                      {"m", x.m},
                      {"n", x.n},
                      {"k", x.k},
                      {"batch", static_cast<long long>(x.batch)},
                      {"time_us", x.time_s * 1e6}});
    matmul["measured"] = rows;
  }
  json out{{"name", g.name},
           {"description", g.description},
           {"hbm_gb", g.hbm_bytes / kGB},
           {"hbm_gbytes_per_s", g.hbm_bandwidth_bytes_per_s / kGB},
           {"peak_tflops", peaks},
           {"framework_reserve_gib", g.framework_reserve_bytes / kGiB},
           {"matmul", matmul},
           {"memory_efficiency", g.memory_efficiency},
           {"sustained_fraction", g.sustained_fraction},
           {"sources", g.sources}};
  if (g.device_memory_bytes > 0) out["device_memory_bytes"] = static_cast<long long>(g.device_memory_bytes);
  if (g.nccl_buffers_per_communicator_bytes > 0)
    out["nccl_buffers_per_communicator_mib"] = g.nccl_buffers_per_communicator_bytes / kMiB;
  if (g.attention_forward_efficiency > 0)
    out["attention"] = {{"forward_efficiency", g.attention_forward_efficiency},
                        {"backward_efficiency", g.attention_backward_efficiency},
                        {"half_keys", g.attention_half_keys}};
  if (g.tdp_w > 0) {
    json power = {{"tdp_w", g.tdp_w}};
    if (g.min_power_limit_w > 0) power["min_limit_w"] = g.min_power_limit_w;
    if (g.power_limit_w > 0) power["limit_w"] = g.power_limit_w;
    out["power"] = power;
  }
  return out;
}

json to_json(const std::vector<MeasuredCollective>& rows) {
  json out = json::array();
  for (const MeasuredCollective& x : rows)
    out.push_back(
        {{"collective", to_string(x.op)}, {"ranks", x.ranks}, {"bytes", x.bytes}, {"time_us", x.time_s * 1e6}});
  return out;
}

json to_json(const ClusterSpec& c) {
  json intra = {{"kind", to_string(c.intra_node_kind)},
                {"gbytes_per_s", c.intra_node.bandwidth_bytes_per_s / kGB},
                {"latency_us", c.intra_node.latency_s * 1e6},
                {"efficiency", c.intra_node.efficiency_fraction},
                {"half_bandwidth_mib", c.intra_node.half_bandwidth_bytes / kMiB},
                {"nvls", c.nvls}};
  if (c.nvls) {
    intra["nvls_efficiency"] = c.nvls_efficiency_fraction;
    intra["nvls_half_bandwidth_mib"] = c.nvls_half_bandwidth_bytes / kMiB;
  }
  if (!c.intra_node.measured.empty()) {
    intra["measured"] = to_json(c.intra_node.measured);
    intra["measured_scale"] = c.intra_node.measured_scale;
  }
  json out{{"name", c.name},
           {"description", c.description},
           {"gpu", to_json(c.gpu)},
           {"gpus_per_node", c.gpus_per_node},
           {"intra_node", intra},
           {"inter_node",
            {{"nics_per_node", c.nics_per_node},
             {"nic_gbits_per_s", c.nic_bandwidth_bytes_per_s * 8 / kGB},
             {"latency_us", c.inter_node_latency_s * 1e6},
             {"efficiency", c.nic_efficiency_fraction},
             {"half_bandwidth_mib", c.inter_node_half_bandwidth_bytes / kMiB}}},
           {"fabric",
            {{"kind", "fat-tree"}, {"nodes_per_leaf", c.nodes_per_leaf}, {"oversubscription", c.oversubscription}}},
           {"host_memory_gib", c.host_memory_bytes / kGiB},
           {"comm_overlap",
            {{"fraction", c.comm_overlap_fraction},
             {"source", c.sources.is_object() ? c.sources.value("comm_overlap", std::string("default: full overlap"))
                                              : std::string("default: full overlap")}}}};
  if (c.cores_per_node > 0) out["cores_per_node"] = c.cores_per_node;  // absent: dedicated devices
  if (c.storage.given())
    out["storage"] = {{"node_read_gbytes_per_s", c.storage.node_read_bytes_per_s / kGB},
                      {"node_write_gbytes_per_s", c.storage.node_write_bytes_per_s / kGB},
                      {"aggregate_read_gbytes_per_s", c.storage.aggregate_read_bytes_per_s / kGB},
                      {"aggregate_write_gbytes_per_s", c.storage.aggregate_write_bytes_per_s / kGB},
                      {"source", c.sources.is_object() ? c.sources.value("storage", std::string()) : std::string()}};
  if (c.lone_rank_speedup != 1.0)
    out["lone_rank_speedup"] = {{"factor", c.lone_rank_speedup},
                                {"source", c.sources.is_object() ? c.sources.value("lone_rank_speedup", std::string())
                                                                 : std::string()}};
  return out;
}

}  // namespace dplan::costmodel
