#include "dplan/costmodel/hardware.h"

#include <algorithm>
#include <cmath>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/training.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {
namespace {


void check_format_version(ObjectReader& r) {
  if (r.positive_int("format_version") != 1) r.fail("format_version", "1");
}

const std::vector<std::string> kIntraKinds = {"nvswitch", "pcie", "xgmi", "shared-memory"};

// An achieved / line-rate ratio: in (0, 1].
double efficiency_fraction(ObjectReader& r, const std::string& key) {
  double f = r.fraction(key);
  if (f <= 0) r.fail(key, "a fraction in (0, 1]");
  return f;
}

IntraNodeKind intra_kind_from_string(const std::string& s) {
  if (s == "nvswitch") return IntraNodeKind::nvswitch;
  if (s == "pcie") return IntraNodeKind::pcie;
  if (s == "xgmi") return IntraNodeKind::xgmi;
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
  }
  return "?";
}

double peak_flops_per_s(const GpuSpec& gpu, Precision precision) {
  std::string key = to_string(precision);
  if (precision == Precision::fp32 && gpu.peak_flops_per_s.count("tf32")) key = "tf32";
  auto it = gpu.peak_flops_per_s.find(key);
  if (it == gpu.peak_flops_per_s.end()) {
    std::vector<std::string> have;
    for (const auto& [k, v] : gpu.peak_flops_per_s) have.push_back(k);
    throw InputError("GPU " + gpu.name + " has no " + key + " peak in its profile (it lists " +
                     join_choices(have) + "); choose another --precision");
  }
  return it->second;
}

double core_share(const ClusterSpec& c, int world_size) {
  if (c.cores_per_node <= 0) return 1.0;
  const int ranks = std::max(1, std::min(world_size, c.gpus_per_node));
  if (ranks >= c.cores_per_node) return double(c.cores_per_node) / ranks;
  return std::pow(c.lone_rank_speedup, double(c.cores_per_node - ranks) / (c.cores_per_node - 1));
}

GpuSpec gpu_from_json(const json& j, const std::string& file) {
  ObjectReader top(j, file);
  check_format_version(top);
  ObjectReader r = top.object("gpu");
  GpuSpec g;
  g.name = r.string("name");
  g.description = r.string("description");
  g.hbm_bytes = r.positive_number("hbm_gb") * kGB;
  g.hbm_bandwidth_bytes_per_s = r.positive_number("hbm_gbytes_per_s") * kGB;
  ObjectReader peaks = r.object("peak_tflops");
  for (const char* key : {"fp32", "tf32", "bf16", "fp16", "fp8"})
    if (peaks.has(key)) g.peak_flops_per_s[key] = peaks.positive_number(key) * 1e12;
  peaks.finish();
  if (g.peak_flops_per_s.empty()) r.fail("peak_tflops", "at least one of fp32, tf32, bf16, fp16, fp8");
  g.framework_reserve_bytes = r.non_negative_number("framework_reserve_gib") * kGiB;
  if (g.framework_reserve_bytes >= g.hbm_bytes) r.fail("framework_reserve_gib", "less than the HBM capacity");
  ObjectReader matmul = r.object("matmul");
  g.matmul_max_efficiency = matmul.fraction("max_efficiency");
  if (g.matmul_max_efficiency <= 0) matmul.fail("max_efficiency", "a fraction in (0, 1]");
  g.sm_count = static_cast<int>(matmul.positive_int("sm_count"));
  g.kernel_overhead_s = matmul.non_negative_number("kernel_overhead_us") * 1e-6;
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
      x.m = row.positive_number("m");
      x.n = row.positive_number("n");
      x.k = row.positive_number("k");
      x.batch = row.has("batch") ? static_cast<double>(row.positive_int("batch")) : 1.0;
      x.time_s = row.positive_number("time_us") * 1e-6;
      row.finish();
      g.matmul_measured.push_back(x);
    }
  }
  matmul.finish();
  g.memory_efficiency = r.fraction("memory_efficiency");
  if (g.memory_efficiency <= 0) r.fail("memory_efficiency", "a fraction in (0, 1]");
  // Of the GEMM rate; above 1 only where `dplan calibrate` found measured runs outpacing a probe's
  // table (a probe taken while the machine was slower).
  g.sustained_fraction = r.positive_number("sustained_fraction");
  if (g.sustained_fraction > 2) r.fail("sustained_fraction", "a number in (0, 2]");
  g.sources = r.raw("sources");
  if (!g.sources.is_object()) r.fail("sources", "an object of source strings");
  r.finish();
  top.finish();
  return g;
}

ClusterSpec cluster_from_json(const json& j, const std::string& file, const GpuLoader& load_gpu) {
  ObjectReader top(j, file);
  check_format_version(top);
  ObjectReader r = top.object("cluster");
  ClusterSpec c;
  c.name = r.string("name");
  c.description = r.string("description");
  c.gpu = load_gpu(r.string("gpu"));
  long long gpn = r.positive_int("gpus_per_node");
  if (gpn > 4096) r.fail("gpus_per_node", "at most 4096");
  c.gpus_per_node = static_cast<int>(gpn);

  ObjectReader intra = r.object("intra_node");
  c.intra_node_kind = intra_kind_from_string(intra.one_of("kind", kIntraKinds));
  c.intra_node.bandwidth_bytes_per_s = intra.positive_number("gbytes_per_s") * kGB;
  c.intra_node.latency_s = intra.non_negative_number("latency_us") * 1e-6;
  c.intra_node.efficiency_fraction = efficiency_fraction(intra, "efficiency");
  c.intra_node.half_bandwidth_bytes = intra.non_negative_number("half_bandwidth_mib") * kMiB;
  c.nvls = intra.boolean("nvls");
  if (c.nvls) {
    if (c.intra_node_kind != IntraNodeKind::nvswitch) intra.fail("nvls", "false unless kind is nvswitch");
    c.nvls_efficiency_fraction = efficiency_fraction(intra, "nvls_efficiency");
    c.nvls_half_bandwidth_bytes = intra.non_negative_number("nvls_half_bandwidth_mib") * kMiB;
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
      x.ranks = static_cast<int>(row.positive_int("ranks"));
      if (x.ranks < 2) row.fail("ranks", "at least 2");
      x.bytes = row.positive_number("bytes");
      x.time_s = row.positive_number("time_us") * 1e-6;
      row.finish();
      c.intra_node.measured.push_back(x);
    }
    if (intra.has("measured_scale")) c.intra_node.measured_scale = intra.positive_number("measured_scale");
  }
  c.sources["intra_node"] = intra.string("source");
  intra.finish();

  ObjectReader inter = r.object("inter_node");
  c.nics_per_node = static_cast<int>(inter.positive_int("nics_per_node"));
  c.nic_bandwidth_bytes_per_s = inter.positive_number("nic_gbits_per_s") * kGB / 8;
  c.inter_node_latency_s = inter.non_negative_number("latency_us") * 1e-6;
  c.nic_efficiency_fraction = efficiency_fraction(inter, "efficiency");
  c.inter_node_half_bandwidth_bytes = inter.non_negative_number("half_bandwidth_mib") * kMiB;
  c.sources["inter_node"] = inter.string("source");
  inter.finish();

  ObjectReader fabric = r.object("fabric");
  fabric.one_of("kind", {"fat-tree"});
  c.nodes_per_leaf = static_cast<int>(fabric.positive_int("nodes_per_leaf"));
  c.oversubscription = fabric.positive_number("oversubscription");
  if (c.oversubscription < 1.0) fabric.fail("oversubscription", "a ratio >= 1 (1 = non-blocking)");
  c.sources["fabric"] = fabric.string("source");
  fabric.finish();

  c.host_memory_bytes = r.positive_number("host_memory_gib") * kGiB;
  if (r.has("cores_per_node")) c.cores_per_node = static_cast<int>(r.positive_int("cores_per_node"));
  if (r.has("lone_rank_speedup")) {
    ObjectReader lone = r.object("lone_rank_speedup");
    c.lone_rank_speedup = lone.positive_number("factor");
    c.sources["lone_rank_speedup"] = lone.string("source");
    lone.finish();
  }
  if (r.has("comm_overlap")) {
    ObjectReader overlap = r.object("comm_overlap");
    c.comm_overlap_fraction = overlap.fraction("fraction");
    c.sources["comm_overlap"] = overlap.string("source");
    overlap.finish();
  }
  c.sources["cluster"] = r.string("source");
  r.finish();
  top.finish();
  return c;
}

json to_json(const GpuSpec& g) {
  json peaks = json::object();
  for (const auto& [k, v] : g.peak_flops_per_s) peaks[k] = v / 1e12;
  json matmul = {{"max_efficiency", g.matmul_max_efficiency},
                 {"sm_count", g.sm_count},
                 {"kernel_overhead_us", g.kernel_overhead_s * 1e6}};
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
  return json{{"name", g.name},
              {"description", g.description},
              {"hbm_gb", g.hbm_bytes / kGB},
              {"hbm_gbytes_per_s", g.hbm_bandwidth_bytes_per_s / kGB},
              {"peak_tflops", peaks},
              {"framework_reserve_gib", g.framework_reserve_bytes / kGiB},
              {"matmul", matmul},
              {"memory_efficiency", g.memory_efficiency},
              {"sustained_fraction", g.sustained_fraction},
              {"sources", g.sources}};
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
  if (c.lone_rank_speedup != 1.0)
    out["lone_rank_speedup"] = {{"factor", c.lone_rank_speedup},
                                {"source", c.sources.is_object() ? c.sources.value("lone_rank_speedup", std::string())
                                                                 : std::string()}};
  return out;
}

}  // namespace dplan::costmodel
