// dplan's cost components, one at a time, against published measurements of that component alone
// (tests/data/components/*.json, each row with its source; README.md there lists them): one
// GEMM's rate by shape and precision (gemm_time_s), NCCL collectives' bus bandwidth by message
// size and rank count (Network::cost), the flash-attention core by sequence length and head
// dimension (layer_times), and DeepEP's expert-parallel dispatch and combine (the all-to-all over
// the ep group). Each case prints its table (Markdown) and holds every row and the mean to a bound.
//
// The error of a row is dplan / measured - 1. The bounds are what dplan achieves today plus a
// small margin; rows that miss badly carry a looser bound of their own, named in the table
// ("miss"), so that a change making them worse still fails. Rows whose measurement set the
// profile figure they test say so in their note (not independent).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/network.h"
#include "dplan/planner/nccl_tests.h"
#include "compared_table.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::Compared;
using dplan::testing::report;
using dplan::testing::store;

namespace {

json component_rows(const std::string& name) {
  return read_json_file(std::string(DPLAN_VALIDATION_DIR) + "/components/" + name + ".json").at("rows");
}

Precision precision_of(const std::string& s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "fp8") return Precision::fp8;
  if (s == "fp32") return Precision::fp32;
  throw std::runtime_error("components test: unknown precision " + s);
}

std::string shape_label(const json& in) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %s %dx%dx%d%s", in.at("gpu").get<std::string>().c_str(),
                in.at("precision").get<std::string>().c_str(), in.at("m").get<int>(), in.at("n").get<int>(),
                in.at("k").get<int>(),
                in.at("batch").get<int>() > 1 ? (" x" + std::to_string(in.at("batch").get<int>())).c_str() : "");
  return buf;
}

std::string size_label(double bytes) {
  char buf[32];
  if (bytes >= double(1 << 30)) std::snprintf(buf, sizeof buf, "%g GiB", bytes / (1 << 30));
  else if (bytes >= double(1 << 20)) std::snprintf(buf, sizeof buf, "%g MiB", bytes / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%g KiB", bytes / (1 << 10));
  return buf;
}

}  // namespace

// One GEMM as a benchmark runs it: alone, so without the training step's sustained_fraction (a
// derate fitted on whole steps: clocks under sustained load, interference). TFLOP/s = 2mnk*batch / time.
TEST_CASE("one GEMM's rate against published MAMF and per-shape tables", "[components]") {
  std::vector<Compared> rows;
  for (const json& r : component_rows("gemm")) {
    const json& in = r.at("inputs");
    GpuSpec gpu = store().load_gpu(in.at("gpu").get<std::string>());
    gpu.sustained_fraction = 1.0;
    const double m = in.at("m"), n = in.at("n"), k = in.at("k"), batch = in.at("batch");
    const double time_s = gemm_time_s(gpu, precision_of(in.at("precision")), m, n, k, batch);
    Compared c{shape_label(in), 2 * m * n * k * batch / time_s / 1e12, r.at("measured").get<double>(), 0.10};
    // Misses, each with its likely cause:
    const bool deepgemm = in.at("gpu") == "h800-sxm5-80gb";
    // the best MAMF shapes of Hopper FP8 lose a partial wave of 128x128 tiles and the 4 us overhead
    // on top of a MAMF that already holds both; the H100 PCIe takes the SXM's MAMF fraction;
    if (!deepgemm && in.at("precision") == "fp8" && in.at("gpu") != "b200") c.bound_fraction = 0.25, c.miss = true;
    if (in.at("gpu") == "h100-pcie-80gb") c.bound_fraction = 0.25, c.miss = true;
    // the MI300X MAMF of the Optuna search (758) above the profile's (668);
    if (in.at("gpu") == "mi300x" && r.at("measured").get<double>() > 700) c.bound_fraction = 0.15, c.miss = true;
    // DeepGEMM on H800: at m <= 128 a GEMM is HBM-bound; with the measured copy bandwidth (0.81)
    // and the BF16 output written in 2 bytes most rows land within 8 %, but n = 2112 and 4096 at
    // k = 7168 still run 30-55 % slower in dplan (DeepGEMM's split-k / block scheduling for few
    // tiles is not modelled); short k (512-2048) runs 15-115 % faster in dplan than measured (a
    // tile's fixed prologue and epilogue, not modelled); grouped m 256 +20-24 %.
    if (deepgemm && m <= 128) c.bound_fraction = 0.60, c.miss = true;
    if (deepgemm && m > 128) c.bound_fraction = k <= 512 ? 1.30 : 0.40, c.miss = true;
    rows.push_back(c);
  }
  report("GEMM rate by shape and precision (gemm_time_s, sustained_fraction 1)", "TFLOP/s", rows, 0.19);
}

// nccl-tests' busbw (doc/PERFORMANCE.md factors: all-reduce 2(n-1)/n, all-gather and
// reduce-scatter (n-1)/n) of one group of `ranks` ranks, the only group on its nodes.
TEST_CASE("NCCL bus bandwidth by size, ranks and nodes against published sweeps", "[components]") {
  std::vector<Compared> rows;
  auto add = [&](const ClusterSpec& cluster, Collective op, int ranks, int nodes, double bytes, double measured_gbps,
                 const std::string& what) {
    Network net(cluster, ranks);
    const CollectiveCost cost = net.cost(op, bytes, {ranks, 1});
    char label[200];
    std::snprintf(label, sizeof label, "%s %s %d ranks / %d node%s %s%s", cluster.name.c_str(), to_string(op), ranks,
                  nodes, nodes > 1 ? "s" : "", size_label(bytes).c_str(), what.c_str());
    Compared c{label, cost.bus_bandwidth_bytes_per_s / 1e9, measured_gbps, 0.25};
    // At 512 MiB and above a collective runs at its tier's large-message bandwidth: 8 %.
    constexpr double kMiB = double(1 << 20);
    if (bytes >= 512 * kMiB) c.bound_fraction = 0.08;
    // Misses: at 4 MiB and below NCCL runs its LL/LL128 protocols, which are not modelled (only
    // Simple's latency and a fitted fill time); the 1-node B200 sweep steps from 741 GB/s at
    // 4 GiB to 839 at 8 GiB, which one fill time cannot follow.
    if (bytes <= 4 * kMiB) c.bound_fraction = 0.60, c.miss = true;
    // NCCL keeps the ring for an all-reduce of 4 H200s (NVLS from 5 up): collectives.cpp's
    // kNvlsMinRanks rests on these rows (not independent).
    if (cluster.name == "dgx-b200" && ranks == 8 && bytes >= 512 * kMiB && bytes <= 4096 * kMiB)
      c.bound_fraction = 0.15, c.miss = true;
    rows.push_back(c);
  };
  // The A100 sweep kept in nccl-tests form (profiles/clusters/SOURCES.md section 5, ml-eng).
  const planner::NcclTestsRun a100 = planner::parse_nccl_tests(
      read_text_file(std::string(DPLAN_VALIDATION_DIR) + "/nccl-tests/a100-8x-all_reduce.txt"), "a100-8x-all_reduce.txt");
  const ClusterSpec dgx_a100 = store().load_cluster("dgx-a100-80g");
  for (const planner::NcclTestsRow& r : a100.rows)
    add(dgx_a100, a100.collective, a100.ranks, a100.nodes, r.bytes, r.busbw_bytes_per_s / 1e9, "");
  for (const json& r : component_rows("nccl")) {
    const json& in = r.at("inputs");
    ClusterSpec cluster = store().load_cluster(in.at("cluster").get<std::string>());
    const bool nvls_off = in.contains("nvls") && !in.at("nvls").get<bool>();
    if (nvls_off) cluster.nvls = false;
    add(cluster, collective_from_string(in.at("collective").get<std::string>()), in.at("ranks"), in.at("nodes"), in.at("bytes"),
        r.at("measured"), nvls_off ? " (NVLS off)" : "");
  }
  report("NCCL busbw by message size, ranks and nodes (Network::cost)", "GB/s", rows, 0.09);
}

// The flash-attention core of one layer: layer_times' GEMM time less the linear layers' (the same
// linear_times calls layer_times makes), forward and backward. dplan prices the causal kernel
// (half the score blocks), so its rate is the executed FLOPs, 4bhs^2d / 2 forward and 2.5x that
// backward, over its time.
TEST_CASE("the flash-attention core's rate against FlashAttention-2 and -3 measurements", "[components]") {
  std::vector<Compared> rows;
  for (const json& r : component_rows("attention")) {
    const json& in = r.at("inputs");
    GpuSpec gpu = store().load_gpu(in.at("gpu").get<std::string>());
    gpu.sustained_fraction = 1.0;  // a kernel benchmark, as in the GEMM case
    const int b = in.at("batch"), heads = in.at("heads"), s = in.at("seq_len"), d = in.at("head_dim");
    ModelSpec m;
    m.name = "attention-probe";
    m.num_layers = 1;
    m.hidden_size = heads * d;
    m.num_heads = m.num_kv_heads = heads;
    m.head_dim = d;
    m.ffn_hidden_size = 4 * m.hidden_size;
    m.vocab_size = 32000;
    m.max_seq_len = s;
    m.mlp = MlpKind::plain;
    TrainingSpec t;
    t.seq_len = s;
    t.global_batch = b;
    t.precision = Precision::bf16;
    t.attention = Attention::flash;
    ParallelConfig p;
    p.micro_batch = b;
    const LayerTimes x = layer_times(m, gpu, t, p);
    const double T = double(b) * s, h = m.hidden_size;
    const LinearTimes qkv = linear_times(gpu, t.precision, T, 3 * h, h), out = linear_times(gpu, t.precision, T, h, h),
                      up = linear_times(gpu, t.precision, T, 4 * h, h), down = linear_times(gpu, t.precision, T, h, 4 * h);
    const double core_forward_s = x.gemm_forward_s - (qkv.forward_s + out.forward_s + up.forward_s + down.forward_s);
    const double core_backward_s =
        x.gemm_backward_s - (qkv.backward_s + out.backward_s + up.backward_s + down.backward_s);
    REQUIRE(core_forward_s > 0);
    REQUIRE(core_backward_s > 0);
    const bool forward = in.at("pass") == "forward";
    const double executed_flops = 4.0 * b * heads * double(s) * s * d * 0.5 * (forward ? 1.0 : 2.5);
    const double rate_flops_per_s = executed_flops / (forward ? core_forward_s : core_backward_s);
    char label[160];
    std::snprintf(label, sizeof label, "%s %s b%d h%d s%d d%d", gpu.name.c_str(), forward ? "fwd" : "bwd", b, heads,
                  s, d);
    if (r.at("measured").is_array()) {
      // A published range (fraction of the dense peak): the row's measured value is the range's
      // nearest end, so a figure inside the range has error 0.
      const double lo = r.at("measured")[0], hi = r.at("measured")[1];
      const double fraction = rate_flops_per_s / peak_flops_per_s(gpu, Precision::bf16);
      Compared c{std::string(label) + " (of peak, range 0.50-0.73)", fraction, std::clamp(fraction, lo, hi), 0.10};
      // Misses: the A100 profile has no attention block, so the core is priced as two batched
      // GEMMs, each bound by HBM traffic of the s x s score matrix a fused kernel never writes
      // (rate proportional to the head dim): head dim 128 lands inside FlashAttention-2's range from
      // 1k keys, head dim 64 at half of it.
      if (d == 64 || s <= 512) c.bound_fraction = 0.55, c.miss = true;
      rows.push_back(c);
    } else {
      rows.push_back({label, rate_flops_per_s / 1e12, r.at("measured").get<double>(), 0.07});
    }
  }
  report("Flash-attention core rate by sequence length and head dimension (layer_times, sustained_fraction 1)",
         "TFLOP/s, or fraction of peak", rows, 0.20);
}

// DeepEP's kernels against the all-to-all of the ep group (Megatron's alltoall dispatcher: every
// rank sends its tokens' k copies, tokens x topk x hidden elements). Normal kernels report the
// bottleneck bandwidth: the bytes one GPU moves over its bottleneck link per second; dplan's is
// the share of its all-to-all bytes that crosses that link over its time: (n-1)/n of them inside a
// node (NVLink), (n-8)/n across nodes (the GPU's one NIC). Low-latency kernels report the time.
TEST_CASE("the ep group's all-to-all against DeepEP's dispatch and combine", "[components]") {
  std::vector<Compared> normal, low_latency;
  for (const json& r : component_rows("deepep")) {
    const json& in = r.at("inputs");
    const ClusterSpec cluster = store().load_cluster(in.at("cluster").get<std::string>());
    const int ep = in.at("ep");
    Network net(cluster, ep);
    char label[160];
    std::snprintf(label, sizeof label, "%s %s %s EP %d", cluster.name.c_str(), in.at("kernel").get<std::string>().c_str(),
                  in.at("op").get<std::string>().c_str(), ep);
    if (in.at("kernel") == "normal") {
      const double bytes = double(in.at("tokens")) * double(in.at("topk")) * double(in.at("hidden")) *
                           double(in.at("bytes_per_element"));
      const double time_s = net.cost(Collective::all_to_all, bytes, {ep, 1}).time_s;
      const int local = std::min(ep, cluster.gpus_per_node);
      const double crossing = ep > cluster.gpus_per_node ? double(ep - local) / ep : double(ep - 1) / ep;
      Compared c{label, bytes * crossing / time_s / 1e9, r.at("measured").get<double>(), 0.10};
      // Miss: DeepEP reports 57-58 GB/s at EP 32 and 50-51 at EP 64, above one NDR NIC's 50 GB/s
      // line rate, where dplan holds a NIC to its measured ring efficiency (0.94 x 50 GB/s).
      if (ep >= 32) c.bound_fraction = 0.30, c.miss = true;
      normal.push_back(c);
    } else {
      const double bytes = double(r.at("measured")) * 1e-6 * double(in.at("reported_rdma_gbytes_per_s")) * 1e9;
      const double time_s = net.cost(Collective::all_to_all, bytes, {ep, 1}).time_s;
      Compared c{label + std::string(" (") + size_label(bytes) + ")", time_s * 1e6, r.at("measured").get<double>(), 0.25};
      // Misses: dplan prices an all-to-all as a ring (n - 1 latency steps, N - 1 of them network
      // hops, and the ring's fill time) where DeepEP's low-latency kernels post every peer's
      // message at once: its time grows 17x from EP 8 to 256 where DeepEP's grows 2.5x.
      if (ep >= 16) c.bound_fraction = ep <= 32 ? 1.75 : ep <= 128 ? 4.0 : 7.5, c.miss = true;
      low_latency.push_back(c);
    }
  }
  report("DeepEP normal kernels: bottleneck bandwidth (Network::cost all_to_all)", "GB/s", normal, 0.12);
  report("DeepEP low-latency kernels: time (Network::cost all_to_all)", "us", low_latency, 2.2);
}
