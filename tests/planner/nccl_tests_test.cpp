// dplan probe --import-nccl-tests: reading nccl-tests output, and fitting a
// link tier to it.
#include "dplan/planner/nccl_tests.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/compute.h"
#include "dplan/planner/gpu_probe.h"
#include "dplan/planner/profiles.h"
#include "process.h"
#include "test_profiles.h"

namespace {
using namespace dplan;
using namespace dplan::planner;
using costmodel::ClusterSpec;
using costmodel::Collective;
using dplan::testing::read_file;
using dplan::testing::run_program;
using dplan::testing::TempDir;

const std::string kA100 = std::string(DPLAN_VALIDATION_DIR) + "/nccl-tests/a100-8x-all_reduce.txt";

// nccl-tests output for `ranks` ranks on `hosts` hosts, with the times the cost model gives on `c`.
std::string synthetic_output(const ClusterSpec& c, Collective op, int ranks, int hosts, const std::string& test) {
  costmodel::Network net(c, ranks);
  std::ostringstream out;
  out << "# Collective test starting: " << test << "\n# Using devices\n";
  for (int r = 0; r < ranks; ++r)
    out << "#  Rank " << r << " Group  0 Pid  " << 100 + r << " on  node" << r / (ranks / hosts) << " device  "
        << r % (ranks / hosts) << " [0x07] NVIDIA H100 80GB HBM3\n";
  out << "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
  for (double bytes = 1 << 20; bytes <= double(8LL << 30); bytes *= 4) {
    const auto cost = net.cost(op, bytes, {ranks, 1});
    char row[256];
    std::snprintf(row, sizeof row, "%12.0f %12.0f float sum -1 %10.2f %7.2f %7.2f 0 %10.2f %7.2f %7.2f 0\n", bytes,
                  bytes / 4, cost.time_s * 1e6, bytes / cost.time_s / 1e9, cost.bus_bandwidth_bytes_per_s / 1e9,
                  cost.time_s * 1e6, bytes / cost.time_s / 1e9, cost.bus_bandwidth_bytes_per_s / 1e9);
    out << row;
  }
  out << "# Out of bounds values : 0 OK\n";
  return out.str();
}

// What dplan-gpu-probe would write for a GPU that behaves exactly as `g` (isolated GEMMs: the
// sustained fraction is 1), over transformer-like shapes and squares in bf16 and fp32.
nlohmann::json synthetic_probe(costmodel::GpuSpec g, double copy_bytes_per_s, int devices) {
  g.sustained_fraction = 1;
  // The GEMMs' memory-bound part runs at the bandwidth the probe's copy measures.
  g.memory_efficiency = copy_bytes_per_s / g.hbm_bandwidth_bytes_per_s;
  nlohmann::json gemms = nlohmann::json::array();
  for (auto [p, name] : {std::pair{costmodel::Precision::bf16, "bf16"}, {costmodel::Precision::fp32, "fp32"}})
    for (double h : {1024.0, 4096.0, 8192.0})
      for (auto [m, n, k] : {std::array{2048.0, 3 * h, h}, {8192.0, h, 4 * h}, {h, h, h}, {256.0, h, h}})
        gemms.push_back({{"precision", name}, {"m", m}, {"n", n}, {"k", k},
                         {"time_s", costmodel::gemm_time_s(g, p, m, n, k)}});
  return {{"format_version", 1}, {"generator", "dplan-gpu-probe"},
          {"device", {{"name", "NVIDIA H100 80GB HBM3"}, {"sm_count", g.sm_count}, {"memory_bytes", 85e9}, {"count", devices}}},
          {"gemm", gemms}, {"memory", {{"copy_bytes", 1 << 30}, {"time_s", 1.0}, {"bytes_per_s", copy_bytes_per_s}}}};
}

}  // namespace

TEST_CASE("nccl-tests output: ranks, hosts, collective and the out-of-place rows", "[nccl-tests]") {
  NcclTestsRun run = parse_nccl_tests(read_file(kA100), kA100);
  CHECK(run.collective == Collective::all_reduce);
  CHECK(run.ranks == 8);
  CHECK(run.nodes == 1);
  REQUIRE(run.rows.size() == 7);
  CHECK(run.rows[1].bytes == 1048576);
  CHECK(run.rows[1].time_s == Approx(101.9e-6));
  CHECK(run.rows[1].busbw_bytes_per_s == Approx(18.0e9));
  CHECK(run.rows.back().bytes == 17179869184.0);
  // --collective overrides the file's own name.
  CHECK(parse_nccl_tests(read_file(kA100), kA100, Collective::all_gather).collective == Collective::all_gather);
}

TEST_CASE("nccl-tests output: what is not nccl-tests output is refused with the reason", "[nccl-tests]") {
  CHECK_THROWS_WITH(parse_nccl_tests("hello\n", "x.txt", Collective::all_reduce), Catch::Contains("Rank"));
  CHECK_THROWS_WITH(parse_nccl_tests("# Collective test starting: broadcast_perf\n", "x.txt"),
                    Catch::Contains("all_reduce_perf"));
  CHECK_THROWS_WITH(parse_nccl_tests("#  Rank  0 Group  0 Pid  1 on  h device  0\n", "x.txt", Collective::all_reduce),
                    Catch::Contains("no result rows"));
  // A row with wrong values is left out.
  std::string text = read_file(kA100);
  const std::string row = "    101.9   10.29   18.00      0";
  text.replace(text.find(row), row.size(), "    101.9   10.29   18.00      3");
  NcclTestsRun run = parse_nccl_tests(text, "x.txt");
  CHECK(run.rows.size() == 6);
  CHECK(run.skipped_rows == 1);
}

TEST_CASE("fitting the intra-node tier recovers the parameters a run was generated with", "[nccl-tests]") {
  ClusterSpec truth = dplan::testing::store().load_cluster("dgx-a100-80g");
  truth.intra_node.efficiency_fraction = 0.62;
  truth.intra_node.half_bandwidth_bytes = 9.0 * (1 << 20);
  truth.intra_node.latency_s = 2.0e-6;
  const ClusterSpec base = dplan::testing::store().load_cluster("dgx-a100-80g");  // 0.78, 3.8 MiB, 3.4 us
  NcclTestsRun run = parse_nccl_tests(synthetic_output(truth, Collective::all_reduce, 8, 1, "all_reduce_perf"), "syn.txt");
  TierFit fit = fit_link_tier(base, run);
  CHECK(fit.tier == "intra_node");
  CHECK(fit.rms_log_error_before > 0.05);
  CHECK(fit.rms_log_error_after < 0.01);
  // Large messages pin the efficiency; small ones the fill time and latency, which trade off a little.
  CHECK(fit.cluster.intra_node.efficiency_fraction == Approx(0.62).epsilon(0.02));
  CHECK(fit.cluster.intra_node.half_bandwidth_bytes / fit.cluster.intra_node.efficiency_fraction ==
        Approx(truth.intra_node.half_bandwidth_bytes / 0.62).epsilon(0.25));
  for (const auto& r : fit.rows) CHECK(r.after_s == Approx(r.measured_s).epsilon(0.02));
}

TEST_CASE("fitting a multi-node run fits the NICs and keeps the intra-node tier", "[nccl-tests]") {
  ClusterSpec truth = dplan::testing::store().load_cluster("dgx-h100");
  truth.nic_efficiency_fraction = 0.7;
  truth.inter_node_half_bandwidth_bytes = 80.0 * (1 << 20);
  const ClusterSpec base = dplan::testing::store().load_cluster("dgx-h100");
  NcclTestsRun run = parse_nccl_tests(synthetic_output(truth, Collective::all_gather, 16, 2, "all_gather_perf"), "syn.txt");
  CHECK(run.nodes == 2);
  TierFit fit = fit_link_tier(base, run);
  CHECK(fit.tier == "inter_node");
  CHECK(fit.cluster.intra_node == base.intra_node);
  CHECK(fit.rms_log_error_after < 0.01);
  CHECK(fit.cluster.nic_efficiency_fraction == Approx(0.7).epsilon(0.02));
}

TEST_CASE("fitting refuses runs it cannot place or determine", "[nccl-tests]") {
  const ClusterSpec a100 = dplan::testing::store().load_cluster("dgx-a100-80g");
  NcclTestsRun run = parse_nccl_tests(read_file(kA100), kA100);
  run.rows.resize(2);  // 2 sizes, 3 parameters
  CHECK_THROWS_WITH(fit_link_tier(a100, run), Catch::Contains("cannot determine 3 parameters"));
  run = parse_nccl_tests(read_file(kA100), kA100);
  ClusterSpec small = a100;
  small.gpus_per_node = 4;
  CHECK_THROWS_WITH(fit_link_tier(small, run), Catch::Contains("GPUs per node"));
}

TEST_CASE("dplan probe --import-nccl-tests prints the fit and writes a profile that --cluster reads", "[nccl-tests][cli]") {
  TempDir dir;
  const std::string out = (dir.path() / "a100-measured.json").string();
  auto r = run_program(DPLAN_BINARY, {"probe", "--import-nccl-tests", kA100, "--cluster", "dgx-a100-80g", "-o", out});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("all_reduce, 8 ranks on 1 node, 6 sizes 1 MiB..16 GiB"));
  CHECK_THAT(r.out, Catch::Contains("rms log error"));
  const std::string written = read_file(out);
  CHECK_THAT(written, Catch::Contains("fitted by dplan probe to"));
  CHECK_THAT(written, Catch::Contains("dgx-a100-80g-measured"));
  r = run_program(DPLAN_BINARY, {"estimate", "--model", "7B", "--cluster", out, "--gpus", "8", "--tp", "8"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("dgx-a100-80g-measured"));
  // Bad input: one line, exit 2.
  r = run_program(DPLAN_BINARY, {"probe", "--import-nccl-tests", (dir.path() / "none.txt").string(), "--cluster",
                                 "dgx-a100-80g"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("none.txt"));
}

TEST_CASE("fitting a GPU to dplan-gpu-probe's GEMMs recovers the efficiency and overhead it was generated with",
          "[gpu-probe]") {
  const costmodel::GpuSpec base = dplan::testing::store().load_gpu("h100-sxm5-80gb");
  costmodel::GpuSpec truth = base;
  truth.matmul_max_efficiency = 0.66;
  truth.kernel_overhead_s = 9e-6;
  truth.sm_count = 114;  // a part with fewer SMs than the profile's
  GpuProbe probe = parse_gpu_probe(synthetic_probe(truth, 0.8 * base.hbm_bandwidth_bytes_per_s, 1), "probe.json");
  CHECK(probe.gemms.size() == 24);
  GpuFit fit = fit_gpu(base, probe);
  CHECK(fit.gpu.sm_count == 114);
  CHECK(fit.gpu.memory_efficiency == Approx(0.8));
  CHECK(fit.gpu.matmul_max_efficiency == Approx(0.66).epsilon(0.02));
  CHECK(fit.gpu.kernel_overhead_s == Approx(9e-6).epsilon(0.1));
  CHECK(fit.rms_log_error_before > 0.05);
  CHECK(fit.rms_log_error_after < 0.01);
  // The profile keeps every measured GEMM: the cost model gives back each
  // measured time exactly (sustained_fraction 1: the table is the rate).
  CHECK(fit.gpu.sustained_fraction == 1);
  REQUIRE(fit.gpu.matmul_measured.size() == probe.gemms.size());
  for (const GemmSample& s : probe.gemms)
    CHECK(costmodel::gemm_time_s(fit.gpu, s.precision, s.m, s.n, s.k, s.batch, s.op) ==
          Approx(s.time_s).epsilon(1e-12));
  // Malformed or too little.
  CHECK_THROWS_WITH(parse_gpu_probe(nlohmann::json::object(), "x.json"), Catch::Contains("dplan-gpu-probe"));
  probe.gemms.resize(1);
  CHECK_THROWS_WITH(fit_gpu(base, probe), Catch::Contains("cannot determine 2 parameters"));
}

TEST_CASE("dplan probe --import-gpu-probe writes a GPU and a cluster profile that --cluster reads", "[gpu-probe][cli]") {
  TempDir dir;
  ClusterSpec truth = dplan::testing::store().load_cluster("dgx-h100");
  truth.gpu.matmul_max_efficiency = 0.7;
  truth.nvls_efficiency_fraction = 0.55;  // NVLS carries the all-reduce on this node at every size
  nlohmann::json probe = synthetic_probe(truth.gpu, 2.9e12, 8);
  dir.write("probe-all_reduce_perf.txt", synthetic_output(truth, Collective::all_reduce, 8, 1, "all_reduce_perf"));
  dir.write("probe-all_gather_perf.txt", synthetic_output(truth, Collective::all_gather, 8, 1, "all_gather_perf"));
  probe["nccl_tests_files"] = {"probe-all_reduce_perf.txt", "probe-all_gather_perf.txt"};  // beside the probe file
  probe["overlap"] = {{"collective", "all_reduce"}, {"bytes", 1 << 29}, {"gemm_s", 2e-3},
                      {"collective_s", 2e-3},       {"both_s", 2.5e-3}, {"fraction", 0.75}};
  const std::string probe_path = dir.write("gpu-probe.json", probe.dump());
  const std::string out = (dir.path() / "my-node.json").string();
  auto r = run_program(DPLAN_BINARY, {"probe", "--import-gpu-probe", probe_path, "--cluster", "dgx-h100", "-o", out});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("fitted GPU h100-sxm5-80gb"));
  CHECK_THAT(r.out, Catch::Contains("fitted intra_node of dgx-h100"));
  const ClusterSpec measured = dplan::testing::store().load_cluster(out);
  CHECK(measured.name == "dgx-h100-measured");
  CHECK(measured.gpu.name == "dgx-h100-measured-gpu");
  CHECK(measured.gpu.matmul_max_efficiency == Approx(0.7).epsilon(0.02));
  CHECK(measured.nvls_efficiency_fraction == Approx(0.55).epsilon(0.05));
  // The profile keeps what was measured: every GEMM, both collectives' sizes on
  // 8 ranks, the overlap.
  CHECK(measured.gpu.matmul_measured.size() == probe["gemm"].size());
  CHECK(measured.gpu.sustained_fraction == 1);
  CHECK(measured.comm_overlap_fraction == 0.75);
  CHECK_THAT(r.out, Catch::Contains("75 % of it hides under compute"));
  size_t all_reduce_rows = 0, all_gather_rows = 0;
  for (const auto& x : measured.intra_node.measured) {
    CHECK(x.ranks == 8);
    all_reduce_rows += x.op == Collective::all_reduce;
    all_gather_rows += x.op == Collective::all_gather;
  }
  CHECK(all_reduce_rows > 5);
  CHECK(all_gather_rows == all_reduce_rows);
  // A tp-8 group's all-gather takes the measured time (the synthetic sweep's
  // own); the tier's figures were fitted to the all-reduce alone.
  const auto& row = measured.intra_node.measured.back();
  CHECK(costmodel::Network(measured, 8).cost(Collective::all_gather, row.bytes, {8, 1}).time_s ==
        Approx(row.time_s).epsilon(1e-9));
  r = run_program(DPLAN_BINARY, {"estimate", "--model", "8B", "--cluster", out, "--gpus", "8", "--tp", "8"});
  INFO(r.err);
  CHECK(r.status == 0);
  // Neither or both imports: one clear line.
  r = run_program(DPLAN_BINARY, {"probe", "--cluster", "dgx-h100"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("--import-nccl-tests") && Catch::Contains("--import-gpu-probe"));
}

TEST_CASE("nccl-tests output: a row beyond what a machine measures is refused, not fitted as inf", "[nccl-tests]") {
  // The fuzzer's finding (fuzz/regressions/nccl_tests/busbw-1e308.txt): busbw 1e308 GB/s became
  // an infinite bandwidth.
  std::string text = read_file(kA100);
  const std::string row = "   2420.2  110.91  194.10      0";
  REQUIRE(text.find(row) != std::string::npos);
  text.replace(text.find(row), row.size(), "   2420.2  110.91  1e308      0");
  CHECK_THROWS_WITH(parse_nccl_tests(text, "x.txt"), Catch::Contains("a result row outside what a machine measures"));
  // A broken row's line is echoed escaped.
  std::string bad = read_file(kA100) + "  268435456 \x1b[31m a b c d e f g\n";
  CHECK_THROWS_WITH(parse_nccl_tests(bad, "x.txt"), Catch::Contains("without time, algbw and busbw: \"  268435456 \\x1b[31m"));
}
