// dplan-gpu-probe's JSON as `dplan probe --import-gpu-probe` reads it: the driver's device keys,
// the launch overhead and FP8 GEMM rows (files from before them still read), and the fit with FP8
// rows. The fixtures are built with the probe's own writers (probe/gemm_row.h), so a key renamed on
// one side fails here.
#include "dplan/planner/gpu_probe.h"

#include <algorithm>
#include <array>
#include <string>

#include <catch2/catch.hpp>

#include "../../probe/gemm_row.h"
#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "process.h"
#include "test_profiles.h"

namespace {
using namespace dplan;
using namespace dplan::planner;
using costmodel::GemmOp;
using costmodel::Precision;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;

// What dplan-gpu-probe writes on one H100 SXM5 (driver 580, CUDA 13.0): the device as the driver
// reports it, a few bf16 and fp8 GEMMs (the fp8 ones as TN GEMMs of each role's shape), the copy,
// the launch overhead.
json h100_probe_file() {
  dplan::probe::DeviceReport d;
  d.name = "NVIDIA H100 80GB HBM3";
  d.sm_count = 132;
  d.memory_bytes = 85029158912ull;
  d.count = 1;
  d.compute_capability = "9.0";
  d.sm_clock_hz = 1980e6;
  d.memory_clock_hz = 2619e6;
  d.memory_bus_width_bits = 5120;
  d.l2_bytes = 52428800;
  d.driver_version = dplan::probe::cuda_version_text(13000);
  d.runtime_version = dplan::probe::cuda_version_text(13000);
  d.cublas_version = "13.0.2";
  d.cublaslt_version = "13.0.2";
  d.nccl_version = dplan::probe::nccl_version_text(22707);
  json gemms = json::array();
  gemms.push_back(dplan::probe::gemm_row("bf16", "forward", 8192, 12288, 4096, 1, 1.21e-3));
  gemms.push_back(dplan::probe::gemm_row("bf16", "dgrad", 8192, 4096, 12288, 1, 1.30e-3));
  gemms.push_back(dplan::probe::gemm_row("bf16", "wgrad", 12288, 4096, 8192, 1, 1.34e-3));
  gemms.push_back(dplan::probe::gemm_row("bf16", "batched", 4096, 2048, 128, 32, 0.21e-3));
  gemms.push_back(dplan::probe::gemm_row("fp8", "forward", 8192, 12288, 4096, 1, 0.68e-3));
  gemms.push_back(dplan::probe::gemm_row("fp8", "dgrad", 8192, 4096, 12288, 1, 0.70e-3));
  gemms.push_back(dplan::probe::gemm_row("fp8", "wgrad", 12288, 4096, 8192, 1, 0.73e-3));
  gemms.push_back(dplan::probe::gemm_row("fp8", "forward", 8192, 8192, 8192, 1, 0.80e-3));
  return {{"format_version", 1},
          {"generator", "dplan-gpu-probe"},
          {"device", dplan::probe::device_json(d)},
          {"gemm", gemms},
          {"memory", {{"copy_bytes", 1 << 30}, {"time_s", 0.78e-3}, {"bytes_per_s", 2.75e12}}},
          {"launch", dplan::probe::launch_json("cudaMemsetAsync 4 B", 1000, 2.1e-6, 1.6e-6)}};
}

// The same file as dplan-gpu-probe wrote it before the FP8 release: the four device keys, no
// launch, no fp8 rows.
json older_probe_file() {
  json j = h100_probe_file();
  j["device"] = {{"name", "NVIDIA H100 80GB HBM3"}, {"sm_count", 132}, {"memory_bytes", 85029158912ull}, {"count", 1}};
  j.erase("launch");
  json gemms = json::array();
  for (const json& row : j["gemm"])
    if (row["precision"] != "fp8") gemms.push_back(row);
  j["gemm"] = gemms;
  return j;
}

// A probe file whose GEMMs take the cost model's times on `truth` (isolated GEMMs: sustained
// fraction 1), in bf16 and fp8, each layer shape in the three roles.
json synthetic_probe(costmodel::GpuSpec truth) {
  truth.sustained_fraction = 1;
  truth.memory_efficiency = 0.85;
  json j = h100_probe_file();
  j["device"]["sm_count"] = truth.sm_count;
  j["memory"]["bytes_per_s"] = 0.85 * truth.hbm_bandwidth_bytes_per_s;
  json gemms = json::array();
  for (auto [p, name] : {std::pair{Precision::bf16, "bf16"}, {Precision::fp8, "fp8"}})
    for (double h : {1024.0, 4096.0, 8192.0})
      for (double t : {2048.0, 8192.0})
        for (auto [m, n, k] : {std::array{t, 3 * h, h}, {t, h, h}, {t, 7 * h, h}}) {
          gemms.push_back(dplan::probe::gemm_row(name, "forward", m, n, k, 1,
                                                 costmodel::gemm_time_s(truth, p, m, n, k, 1, GemmOp::forward)));
          gemms.push_back(dplan::probe::gemm_row(name, "dgrad", m, k, n, 1,
                                                 costmodel::gemm_time_s(truth, p, m, k, n, 1, GemmOp::dgrad)));
          gemms.push_back(dplan::probe::gemm_row(name, "wgrad", n, k, m, 1,
                                                 costmodel::gemm_time_s(truth, p, n, k, m, 1, GemmOp::wgrad)));
        }
  j["gemm"] = gemms;
  return j;
}

size_t count_fp8(const std::vector<costmodel::MeasuredGemm>& rows) {
  return std::count_if(rows.begin(), rows.end(), [](const auto& r) { return r.precision == Precision::fp8; });
}

}  // namespace

TEST_CASE("the probe's version texts: CUDA's 1000 major + 10 minor, NCCL's code before and after 2.9",
          "[gpu-probe]") {
  CHECK(dplan::probe::cuda_version_text(13000) == "13.0");
  CHECK(dplan::probe::cuda_version_text(12040) == "12.4");
  CHECK(dplan::probe::cuda_version_text(12090) == "12.9");
  CHECK(dplan::probe::nccl_version_text(22809) == "2.28.9");
  CHECK(dplan::probe::nccl_version_text(21903) == "2.19.3");
  CHECK(dplan::probe::nccl_version_text(2708) == "2.7.8");  // NCCL 2.7.8: 1000 major + 100 minor + patch
}

TEST_CASE("a dplan-gpu-probe file with the driver's device keys, the launch overhead and fp8 GEMMs",
          "[gpu-probe]") {
  const GpuProbe p = parse_gpu_probe(h100_probe_file(), "gpu-probe.json");
  CHECK(p.device_name == "NVIDIA H100 80GB HBM3");
  CHECK(p.sm_count == 132);
  CHECK(p.device_count == 1);
  CHECK(p.compute_capability == "9.0");
  CHECK(p.sm_clock_hz == 1980e6);
  CHECK(p.memory_clock_hz == 2619e6);
  CHECK(p.memory_bus_width_bits == 5120);
  CHECK(p.l2_bytes == 52428800);
  CHECK(p.driver_version == "13.0");
  CHECK(p.runtime_version == "13.0");
  CHECK(p.cublas_version == "13.0.2");
  CHECK(p.cublaslt_version == "13.0.2");
  CHECK(p.nccl_version == "2.27.7");
  CHECK(p.launch_kernel == "cudaMemsetAsync 4 B");
  CHECK(p.launch_count == 1000);
  CHECK(p.launch_overhead_s == 2.1e-6);
  CHECK(p.launch_enqueue_s == 1.6e-6);
  CHECK(p.incomplete.empty());
  REQUIRE(p.gemms.size() == 8);
  CHECK(p.gemms[3].op == GemmOp::batched);
  CHECK(p.gemms[3].batch == 32);
  const GemmSample& wgrad = p.gemms[6];
  CHECK(wgrad.precision == Precision::fp8);
  CHECK(wgrad.op == GemmOp::wgrad);
  CHECK((wgrad.m == 12288 && wgrad.n == 4096 && wgrad.k == 8192));
  CHECK(wgrad.time_s == 0.73e-3);
}

TEST_CASE("a dplan-gpu-probe file from before the launch and device keys still reads", "[gpu-probe]") {
  const GpuProbe p = parse_gpu_probe(older_probe_file(), "old-probe.json");
  CHECK(p.device_name == "NVIDIA H100 80GB HBM3");
  CHECK(p.gemms.size() == 4);
  CHECK(p.launch_overhead_s == 0);
  CHECK(p.launch_count == 0);
  CHECK(p.compute_capability.empty());
  CHECK(p.sm_clock_hz == 0);
  CHECK(p.nccl_version.empty());
  // And it fits as before: two parameters, no fp8 efficiency.
  const costmodel::GpuSpec base = dplan::testing::store().load_gpu("h100-sxm5-80gb");
  const GpuFit fit = fit_gpu(base, p);
  CHECK(fit.gpu.fp8_matmul_max_efficiency == base.fp8_matmul_max_efficiency);
  CHECK(fit.fp8_gemms_ignored == 0);
  CHECK(fit.gpu.matmul_measured.size() == 4);
}

TEST_CASE("a malformed launch or device key is one error naming the file and JSON path", "[gpu-probe]") {
  json j = h100_probe_file();
  j["launch"]["time_per_launch_s"] = -2e-6;
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"),
                    Catch::StartsWith("gpu-probe.json: /launch/time_per_launch_s: expected") &&
                        Catch::Contains("got -2e-06"));
  j = h100_probe_file();
  j["launch"].erase("launches");
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"),
                    Catch::Equals("gpu-probe.json: /launch: missing key \"launches\""));
  j = h100_probe_file();
  j["launch"] = "2 us";
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"), Catch::StartsWith("gpu-probe.json: /launch: expected"));
  j = h100_probe_file();
  j["device"]["compute_capability"] = "sm_90";
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"),
                    Catch::StartsWith("gpu-probe.json: /device/compute_capability: expected \"major.minor\""));
  j = h100_probe_file();
  j["device"]["sm_clock_hz"] = "1980 MHz";
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"), Catch::StartsWith("gpu-probe.json: /device/sm_clock_hz:"));
  j = h100_probe_file();
  j["gemm"][5]["precision"] = "fp4";
  CHECK_THROWS_WITH(parse_gpu_probe(j, "gpu-probe.json"), Catch::StartsWith("gpu-probe.json: /gemm/5/precision:"));
  // A probe that stopped part-way says so; what it measured still reads.
  j = h100_probe_file();
  j["error"] = "ncclCommInitAll: unhandled system error";
  CHECK(parse_gpu_probe(j, "gpu-probe.json").incomplete == "it failed: ncclCommInitAll: unhandled system error");
}

TEST_CASE("fitting fp8 GEMMs on the H100 profile recovers their own efficiency beside the bf16 one",
          "[gpu-probe]") {
  const costmodel::GpuSpec base = dplan::testing::store().load_gpu("h100-sxm5-80gb");
  REQUIRE(base.peak_flops_per_s.count("fp8"));  // the shipped H100 and H200 profiles give an fp8 peak
  REQUIRE(dplan::testing::store().load_gpu("h200-sxm-141gb").peak_flops_per_s.count("fp8"));
  costmodel::GpuSpec truth = base;
  truth.matmul_max_efficiency = 0.66;
  truth.fp8_matmul_max_efficiency = 0.52;  // the profile says 0.709
  truth.kernel_overhead_s = 7e-6;
  const GpuProbe probe = parse_gpu_probe(synthetic_probe(truth), "gpu-probe.json");
  REQUIRE(probe.gemms.size() == 108);
  const GpuFit fit = fit_gpu(base, probe);
  CHECK(fit.fp8_gemms_ignored == 0);
  CHECK(fit.gpu.matmul_max_efficiency == Approx(0.66).epsilon(0.02));
  CHECK(fit.gpu.fp8_matmul_max_efficiency == Approx(0.52).epsilon(0.02));
  CHECK(fit.gpu.kernel_overhead_s == Approx(7e-6).epsilon(0.1));
  CHECK(fit.rms_log_error_after < 0.01);
  CHECK(fit.rms_log_error_before > 0.05);
  CHECK(count_fp8(fit.gpu.matmul_measured) == 54);
}

TEST_CASE("fp8 GEMMs on a GPU profile without an fp8 peak are left out, not fatal", "[gpu-probe]") {
  const costmodel::GpuSpec a100 = dplan::testing::store().load_gpu("a100-sxm4-80gb");
  REQUIRE_FALSE(a100.peak_flops_per_s.count("fp8"));
  // An H100's file (the A100 has no fp8 to time) against the A100's profile.
  const GpuProbe probe =
      parse_gpu_probe(synthetic_probe(dplan::testing::store().load_gpu("h100-sxm5-80gb")), "gpu-probe.json");
  const GpuFit fit = fit_gpu(a100, probe);
  CHECK(fit.fp8_gemms_ignored == 54);
  CHECK(fit.gpu.matmul_measured.size() == 54);
  CHECK(count_fp8(fit.gpu.matmul_measured) == 0);
  CHECK(fit.rows.size() == 54);
  // With nothing but fp8 GEMMs there is nothing to fit: the error says why.
  GpuProbe fp8_only = probe;
  std::erase_if(fp8_only.gemms, [](const GemmSample& s) { return s.precision != Precision::fp8; });
  CHECK_THROWS_WITH(fit_gpu(a100, fp8_only), Catch::Contains("cannot determine 2 parameters") &&
                                                 Catch::Contains("54 fp8 GEMMs left out"));
}

TEST_CASE("a probe whose memory bandwidth is under 0.1 % of the base's HBM is refused, not written unreadable",
          "[gpu-probe]") {
  // Found by the gpu_probe fuzz target (fuzz/regressions/gpu_probe/memory-bandwidth-below-min-efficiency.json):
  // 4 KB/s on an H100 base gave memory_efficiency 1.2e-9, which the GPU file's reader refuses.
  const costmodel::GpuSpec base = dplan::testing::store().load_gpu("h100-sxm5-80gb");
  json j = synthetic_probe(base);
  j["memory"]["bytes_per_s"] = 4097.0;
  const GpuProbe probe = parse_gpu_probe(j, "gpu-probe.json");
  CHECK_THROWS_WITH(fit_gpu(base, probe), Catch::StartsWith("gpu-probe.json: /memory: 4.1e+03 bytes/s is 1.22e-09 of "
                                                            "h100-sxm5-80gb's HBM bandwidth") &&
                                              Catch::Contains("give the --cluster that was probed"));
  j["memory"]["bytes_per_s"] = 0.002 * base.hbm_bandwidth_bytes_per_s;  // slow, but a reading of it
  CHECK(fit_gpu(base, parse_gpu_probe(j, "gpu-probe.json")).gpu.memory_efficiency == Approx(0.002));
}

TEST_CASE("dplan probe --import-gpu-probe prints the launch overhead and the measured rates against the peaks",
          "[gpu-probe][cli]") {
  TempDir dir;
  costmodel::GpuSpec truth = dplan::testing::store().load_gpu("h100-sxm5-80gb");
  truth.matmul_max_efficiency = 0.66;
  truth.fp8_matmul_max_efficiency = 0.52;
  const std::string probe_path = dir.write("gpu-probe.json", synthetic_probe(truth).dump());
  const std::string out = (dir.path() / "my-node.json").string();
  auto r = run_program(DPLAN_BINARY, {"probe", "--import-gpu-probe", probe_path, "--cluster", "dgx-h100", "-o", out});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("compute capability 9.0, SM clock 1980 MHz") &&
                        Catch::Contains("cuBLASLt 13.0.2, NCCL 2.27.7"));
  CHECK_THAT(r.out, Catch::Contains("measured launch overhead: 2.10 us per back-to-back cudaMemsetAsync 4 B "
                                    "(1000 launches; host enqueue 1.60 us), beside the fitted kernel_overhead_us"));
  CHECK_THAT(r.out, Catch::Contains("matmul.fp8_max_efficiency        0.709 -> 0.5"));
  CHECK_THAT(r.out, Catch::Contains("  bf16  median ") && Catch::Contains("profile peak 989") &&
                        Catch::Contains("max_efficiency 0.803 -> 0.6"));
  CHECK_THAT(r.out, Catch::Contains("  fp8   median ") && Catch::Contains("profile peak 1979") &&
                        Catch::Contains("fp8_max_efficiency 0.709 -> 0.5"));
  const costmodel::ClusterSpec measured = dplan::testing::store().load_cluster(out);
  CHECK(measured.gpu.fp8_matmul_max_efficiency == Approx(0.52).epsilon(0.02));
  CHECK(count_fp8(measured.gpu.matmul_measured) == 54);

  // On a GPU profile without an fp8 peak the import goes on without the fp8 GEMMs, and says so.
  r = run_program(DPLAN_BINARY, {"probe", "--import-gpu-probe", probe_path, "--cluster", "dgx-a100-80g", "-o",
                                 (dir.path() / "a100-node.json").string()});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("note: 54 fp8 GEMMs left out (neither fitted nor kept): a100-sxm4-80gb has no "
                                    "fp8 peak"));
  CHECK_THAT(r.out, Catch::Contains("no fp8 peak in the profile: not fitted, not kept"));
  CHECK(count_fp8(dplan::testing::store().load_cluster((dir.path() / "a100-node.json").string())
                      .gpu.matmul_measured) == 0);
}
