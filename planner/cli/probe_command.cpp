#include "probe_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/profile_edit.h"
#include "dplan/planner/gpu_probe.h"
#include "dplan/planner/nccl_tests.h"
#include "dplan/costmodel/units.h"
#include "profile_files.h"
#include "run_command.h"

namespace dplan::cli {
namespace {
namespace fs = std::filesystem;
using costmodel::ClusterSpec;
using costmodel::Collective;
using costmodel::GpuSpec;
using nlohmann::json;



Collective collective_from(const std::string& name) {
  for (Collective op : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                        Collective::all_to_all, Collective::send_recv})
    if (name == costmodel::to_string(op)) return op;
  throw InputError("--collective " + name + " is not one of: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv");
}

std::string size_text(double bytes) {
  char buf[32];
  if (bytes >= kGiB) std::snprintf(buf, sizeof buf, "%.0f GiB", bytes / kGiB);
  else if (bytes >= kMiB) std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / kMiB);
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.0f KiB", bytes / 1024);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

// Figure by figure; a figure the base does not give shows as "-".
void print_changes(const json& before, const json& after) {
  for (const auto& [key, value] : after.items()) {
    if (before.contains(key))
      std::printf("  %-24s %12.4g -> %.4g\n", key.c_str(), before.at(key).get<double>(), value.get<double>());
    else
      std::printf("  %-24s %12s -> %.4g\n", key.c_str(), "-", value.get<double>());
  }
}

// The fitted figures as they appear in a cluster file, by tier (in the file's units: to_json's).
json tier_figures(const ClusterSpec& c, const std::string& tier) {
  std::vector<std::string> keys = {"efficiency", "half_bandwidth_mib", "latency_us"};
  if (tier != "inter_node" && c.nvls) keys.insert(keys.end(), {"nvls_efficiency", "nvls_half_bandwidth_mib"});
  return costmodel::pick_figures(costmodel::to_json(c).at(tier == "inter_node" ? "inter_node" : "intra_node"), keys);
}

// The fitted figures as they appear in a GPU file (fp8_max_efficiency where the GPU gives one).
json gpu_figures(const GpuSpec& g) {
  std::vector<std::string> keys = {"matmul.max_efficiency", "matmul.sm_count", "matmul.kernel_overhead_us",
                                   "memory_efficiency"};
  if (g.fp8_matmul_max_efficiency > 0) keys.push_back("matmul.fp8_max_efficiency");
  return costmodel::pick_figures(costmodel::to_json(g), keys);
}

// Per precision the probe measured: the median achieved rate of its GEMMs (not the whole
// attention kernels) beside the profile's peak, and the matmul efficiency before and after the fit
// (fp8: its own, where the GPU gives one).
void print_rates(const planner::GpuProbe& probe, const GpuSpec& base, const GpuSpec& fitted) {
  std::map<int, std::vector<double>> rates;  // by precision, FLOP/s
  for (const planner::GemmSample& s : probe.gemms)
    if (!costmodel::is_whole_attention(s.op))
      rates[static_cast<int>(s.precision)].push_back(2 * s.m * s.n * s.k * s.batch / s.time_s);
  if (rates.empty()) return;
  std::printf("measured rates against %s's peaks:\n", base.name.c_str());
  auto efficiency = [](const GpuSpec& g, costmodel::Precision p) {
    return p == costmodel::Precision::fp8 && g.fp8_matmul_max_efficiency > 0 ? g.fp8_matmul_max_efficiency
                                                                             : g.matmul_max_efficiency;
  };
  for (auto& [p, r] : rates) {
    const auto precision = static_cast<costmodel::Precision>(p);
    std::sort(r.begin(), r.end());
    const double median = r.size() % 2 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
    std::printf("  %-5s median %.4g TFLOP/s measured (best %.4g, %zu GEMMs)", costmodel::to_string(precision),
                median / 1e12, r.back() / 1e12, r.size());
    double peak = 0;
    try {
      peak = costmodel::peak_flops_per_s(base, precision);
    } catch (const InputError&) {
      std::printf(", no %s peak in the profile: not fitted, not kept\n", costmodel::to_string(precision));
      continue;
    }
    const char* name = precision == costmodel::Precision::fp8 && fitted.fp8_matmul_max_efficiency > 0
                           ? "fp8_max_efficiency"
                           : "max_efficiency";
    std::printf(", profile peak %.4g (median / peak %.3f), %s %.3g -> %.3g\n", peak / 1e12, median / peak, name,
                efficiency(base, precision), efficiency(fitted, precision));
  }
}

// Puts a one-node run's timings, every size, into `cluster`'s intra-node tier,
// replacing earlier ones of the same collective and group size: a group of this
// collective and size inside a node takes them, the fitted figures serve the
// others.
void keep_measured(const planner::NcclTestsRun& run, json& cluster) {
  json& tier = cluster.at("intra_node");
  json measured = json::array();
  for (const json& row : tier.value("measured", json::array()))
    if (!(row.at("collective") == costmodel::to_string(run.collective) && row.at("ranks") == run.ranks))
      measured.push_back(row);
  std::vector<costmodel::MeasuredCollective> rows;
  for (const auto& r : run.rows) rows.push_back({run.collective, run.ranks, r.bytes, r.time_s});
  for (const json& row : costmodel::to_json(rows)) measured.push_back(row);
  tier["measured"] = measured;
  std::printf(
      "kept the %zu measured sizes of %s: %d-rank %s groups inside a "
      "node take them\n",
      rows.size(), run.file.c_str(), run.ranks, costmodel::to_string(run.collective));
}

// Fits the tier an nccl-tests file exercised, prints the fit, and puts it into
// `cluster` (a cluster file's "cluster" object) with its source; a one-node
// run's timings are kept as well (keep_measured). With `fit` false only the
// timings are kept.
void import_nccl_tests(const std::string& path, const ProbeArgs& a, double min_size_mib, const ClusterSpec& base,
                       json& cluster, bool fit_tier = true) {
  std::optional<Collective> op;
  if (!a.collective.empty()) op = collective_from(a.collective);
  planner::NcclTestsRun run = planner::parse_nccl_tests(read_text_file(path), path, op);
  if (run.nodes == 1) keep_measured(run, cluster);
  if (!fit_tier) return;
  const size_t all_rows = run.rows.size();
  std::erase_if(run.rows, [&](const planner::NcclTestsRow& r) { return r.bytes < min_size_mib * kMiB; });
  if (run.rows.empty())
    throw InputError(path + ": no sizes of " + std::to_string(min_size_mib) + " MiB or more; lower --min-size-mib");
  const planner::TierFit fit = planner::fit_link_tier(base, run);

  std::printf("%s: %s, %d ranks on %d node%s, %zu sizes %s..%s%s\n", path.c_str(), costmodel::to_string(run.collective),
              run.ranks, run.nodes, run.nodes == 1 ? "" : "s", run.rows.size(), size_text(run.rows.front().bytes).c_str(),
              size_text(run.rows.back().bytes).c_str(),
              all_rows > run.rows.size()
                  ? (" (" + std::to_string(all_rows - run.rows.size()) + " below --min-size-mib left out)").c_str()
                  : "");
  if (run.skipped_rows) std::printf("%d rows skipped: size 0 or wrong values\n", run.skipped_rows);
  std::printf("fitted %s of %s by least squares on log time:\n", fit.tier.c_str(), base.name.c_str());
  const json after = tier_figures(fit.cluster, fit.tier);
  print_changes(tier_figures(base, fit.tier), after);
  std::printf("\n%10s %14s %14s %8s %14s %8s\n", "size", "measured (us)", "before (us)", "error", "after (us)", "error");
  for (const auto& r : fit.rows)
    std::printf("%10s %14.1f %14.1f %+7.1f%% %14.1f %+7.1f%%\n", size_text(r.bytes).c_str(), r.measured_s * 1e6,
                r.before_s * 1e6, 100 * (r.before_s / r.measured_s - 1), r.after_s * 1e6,
                100 * (r.after_s / r.measured_s - 1));
  std::printf("rms log error: %.3f before, %.3f after\n", fit.rms_log_error_before, fit.rms_log_error_after);

  json& tier = cluster.at(fit.tier);
  costmodel::put_figures(tier, after);
  char source[512];
  std::snprintf(source, sizeof source,
                "fitted by dplan probe to %s (%s, %d ranks, %d nodes, %zu sizes; rms log error of the time %.3f "
                "before, %.3f after); the rest: ",
                path.c_str(), costmodel::to_string(run.collective), run.ranks, run.nodes, run.rows.size(),
                fit.rms_log_error_before, fit.rms_log_error_after);
  tier["source"] = std::string(source) + tier.value("source", std::string());
}

// Fits the GPU to a dplan-gpu-probe result, prints the fit, and returns the GPU file (the base's
// with the fitted figures and their sources).
json import_gpu_probe(const planner::GpuProbe& probe, const GpuSpec& base, const std::string& base_gpu_file,
                      const std::string& name) {
  const planner::GpuFit fit = planner::fit_gpu(base, probe);
  std::printf("%s: %s x %d, %d SMs, %zu GEMMs, device-to-device copy %.1f GB/s", probe.file.c_str(),
              probe.device_name.c_str(), probe.device_count, probe.sm_count, probe.gemms.size(),
              probe.copy_bytes_per_s / 1e9);
  if (probe.elementwise_bytes_per_s > 0)
    std::printf(", element-wise kernels %.1f GB/s", probe.elementwise_bytes_per_s / 1e9);
  std::printf("\n");
  if (!probe.compute_capability.empty())
    std::printf("compute capability %s, SM clock %.0f MHz, memory clock %.0f MHz, %d-bit bus, L2 %.0f MiB; driver %s, "
                "runtime %s, cuBLAS %s, cuBLASLt %s, NCCL %s\n",
                probe.compute_capability.c_str(), probe.sm_clock_hz / 1e6, probe.memory_clock_hz / 1e6,
                probe.memory_bus_width_bits, probe.l2_bytes / kMiB, probe.driver_version.c_str(),
                probe.runtime_version.c_str(), probe.cublas_version.c_str(), probe.cublaslt_version.c_str(),
                probe.nccl_version.c_str());
  if (!probe.incomplete.empty())
    std::printf("note: the probe did not finish (%s): importing what it measured\n", probe.incomplete.c_str());
  if (fit.fp8_gemms_ignored > 0)
    std::printf("note: %zu fp8 GEMMs left out (neither fitted nor kept): %s has no fp8 peak\n", fit.fp8_gemms_ignored,
                base.name.c_str());
  std::printf(
      "fitted GPU %s by least squares on log time (isolated GEMMs: "
      "sustained_fraction held at 1):\n",
      base.name.c_str());
  print_changes(gpu_figures(base), gpu_figures(fit.gpu));
  if (probe.launch_overhead_s > 0)
    std::printf("  measured launch overhead: %.2f us per back-to-back %s (%d launches; host enqueue %.2f us), beside "
                "the fitted kernel_overhead_us %.3g (per GEMM: launch and tail)\n",
                probe.launch_overhead_s * 1e6, probe.launch_kernel.c_str(), probe.launch_count,
                probe.launch_enqueue_s * 1e6, fit.gpu.kernel_overhead_s * 1e6);
  print_rates(probe, base, fit.gpu);
  // Per precision: how far the model's GEMM times were and are from the measured ones.
  std::map<int, std::array<double, 3>> by_precision;  // count, sum sq before, sum sq after
  for (const auto& r : fit.rows) {
    auto& acc = by_precision[static_cast<int>(r.sample.precision)];
    acc[0] += 1;
    acc[1] += std::pow(std::log(r.before_s / r.sample.time_s), 2);
    acc[2] += std::pow(std::log(r.after_s / r.sample.time_s), 2);
  }
  for (const auto& [p, acc] : by_precision)
    std::printf("  %-5s %3.0f GEMMs: rms log error %.3f before, %.3f after\n",
                costmodel::to_string(static_cast<costmodel::Precision>(p)), acc[0], std::sqrt(acc[1] / acc[0]),
                std::sqrt(acc[2] / acc[0]));
  std::printf("rms log error: %.3f before, %.3f after\n", fit.rms_log_error_before, fit.rms_log_error_after);
  std::printf(
      "the profile keeps the %zu measured GEMMs: the cost model "
      "interpolates their rates, the fitted curve "
      "serves precisions they do not cover\n",
      fit.gpu.matmul_measured.size());

  json file = read_json_file(base_gpu_file);
  json& gpu = file.at("gpu");
  gpu["name"] = name;
  std::vector<std::string> figures = {"matmul.max_efficiency", "matmul.sm_count", "matmul.kernel_overhead_us",
                                      "matmul.measured", "memory_efficiency", "sustained_fraction"};
  if (fit.gpu.fp8_matmul_max_efficiency > 0) figures.push_back("matmul.fp8_max_efficiency");
  costmodel::put_figures(gpu, costmodel::pick_figures(costmodel::to_json(fit.gpu), figures));
  char source[512];
  std::snprintf(source, sizeof source,
                "fitted by dplan probe to %s (%s, %zu GEMMs; rms log error of the time %.3f before, %.3f after); the "
                "rest: ",
                probe.file.c_str(), probe.device_name.c_str(), fit.gpu.matmul_measured.size(), fit.rms_log_error_before,
                fit.rms_log_error_after);
  json& sources = gpu["sources"];
  sources["matmul"] = std::string(source) + sources.value("matmul", std::string());
  std::snprintf(source, sizeof source,
                "1: the GEMM rates are the %zu measured in %s "
                "(matmul.measured), taken with every rank of the node "
                "busy; `dplan calibrate` fits it to measured runs",
                fit.gpu.matmul_measured.size(), probe.file.c_str());
  sources["sustained_fraction"] = source;
  if (probe.elementwise_bytes_per_s > 0)
    std::snprintf(source, sizeof source,
                  "measured by dplan probe (%s): training's element-wise kernels (GELU, "
                  "layer norm, softmax, add) "
                  "%.1f GB/s read + written / datasheet (a copy reaches %.1f GB/s); ",
                  probe.file.c_str(), probe.elementwise_bytes_per_s / 1e9, probe.copy_bytes_per_s / 1e9);
  else
    std::snprintf(source, sizeof source,
                  "measured by dplan-gpu-probe (%s): device-to-device copy "
                  "%.0f GB/s / datasheet; ",
                  probe.file.c_str(), probe.copy_bytes_per_s / 1e9);
  sources["memory_efficiency"] = std::string(source) + sources.value("memory_efficiency", std::string());
  return file;
}

}  // namespace

void add_probe_options(CLI::App& command, ProbeArgs& a) {
  command.add_option("--import-nccl-tests", a.nccl_tests_path,
                     "output of NVIDIA nccl-tests (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
                     "sendrecv_perf) to fit the cluster's link tier to");
  command.add_option("--import-gpu-probe", a.gpu_probe_path,
                     "the JSON dplan-gpu-probe wrote, to fit the GPU's matmul efficiency and memory bandwidth (and the "
                     "intra-node tier to its NCCL sweep)");
  command.add_option("--cluster", a.cluster, "the cluster profile the measurements were taken on (name or path)")
      ->required();
  command.add_option("--collective", a.collective, "the nccl-tests file's collective, if the file does not name it");
  command
      .add_option("--min-size-mib", a.min_size_mib,
                  "fit collective sizes from this many MiB up: NCCL runs "
                  "smaller messages with its LL protocols, "
                  "which the cost model does not have")
      ->default_str("1, or 0 for this machine's Gloo probe");
  command.add_option("--name", a.name, "name of the written cluster profile (default: <cluster>-measured)");
  command.add_option("--ranks", a.ranks,
                     "measuring this machine (no import): local ranks to measure with (default: the cores, at least 2)");
  command.add_option("--timeout-s", a.timeout_s, "measuring this machine: collective timeout")->capture_default_str();
  command.add_option("-o,--output", a.output, "write the fitted cluster profile here (JSON, for --cluster)");
  command.add_flag("--force", a.force, "let -o replace existing files dplan did not write (never an input)");
}

int run_probe(const ProbeArgs& a, const planner::ProfileStore& store) {
  if (!a.nccl_tests_path.empty() && !a.gpu_probe_path.empty())
    throw InputError("give one of --import-nccl-tests FILE or --import-gpu-probe FILE, not both");
  std::string probe_path = a.gpu_probe_path;
  if (a.nccl_tests_path.empty() && probe_path.empty()) {
    // Measure this machine with local ranks of dplan-worker --probe, then import that.
    if (a.output.empty())
      throw InputError("measuring this machine needs -o cluster.json (the measurements go beside it); or import "
                       "--import-nccl-tests FILE or --import-gpu-probe FILE");
    check_output_path(a.output, costmodel::cluster_profile_output(), a.force);  // before minutes of measuring
    const int ranks = a.ranks > 0 ? a.ranks : std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
    probe_path = (fs::path(a.output).parent_path() / (fs::path(a.output).stem().string() + "-probe.json")).string();
    std::printf("measuring this machine with %d local ranks (dplan-worker --probe -o %s)\n", ranks, probe_path.c_str());
    std::fflush(stdout);
    const int status = launch_local_ranks({find_worker(), "--probe", "-o", probe_path, "--timeout-s",
                                           std::to_string(a.timeout_s), "--quiet"},
                                          ranks, a.timeout_s);
    if (status != 0) return status;
    std::printf("\n");
  }
  const bool given = a.min_size_mib != ProbeArgs{}.min_size_mib;
  if (given && !(a.min_size_mib >= 0)) throw InputError("--min-size-mib must be 0 or more");
  const ClusterSpec base = store.load_cluster(a.cluster);
  json profile = read_json_file(store.cluster_path(a.cluster));
  json& cluster = profile.at("cluster");
  const std::string name = a.name.empty() ? base.name + "-measured" : a.name;
  cluster["name"] = name;

  json gpu_file;
  if (!a.nccl_tests_path.empty()) {
    import_nccl_tests(a.nccl_tests_path, a, given ? a.min_size_mib : 1.0, base, cluster);
  } else {
    const planner::GpuProbe probe = planner::parse_gpu_probe(read_json_file(probe_path), probe_path);
    gpu_file = import_gpu_probe(probe, base.gpu, gpu_file_of(store.cluster_path(a.cluster), store), name + "-gpu");
    if (probe.cores > 0) cluster["cores_per_node"] = probe.cores;  // the ranks share this machine's cores
    if (probe.cores > 0 && probe.lone_rank_speedup > 0) {
      char source[512];
      std::snprintf(source, sizeof source,
                    "measured by dplan probe (%s): a layer's GEMMs and attention take %.2f ms on one rank alone, "
                    "%.2f ms with every core running a rank",
                    probe_path.c_str(), probe.lone_rank_alone_s * 1e3, probe.lone_rank_busy_s * 1e3);
      cluster["lone_rank_speedup"] = {{"factor", probe.lone_rank_speedup}, {"source", source}};
      std::printf("\nsharing the machine: a layer's GEMMs and attention take %.2f ms on one rank alone, %.2f ms with "
                  "every core busy (lone_rank_speedup %.3f)\n",
                  probe.lone_rank_alone_s * 1e3, probe.lone_rank_busy_s * 1e3, probe.lone_rank_speedup);
    }
    if (probe.overlap_fraction >= 0) {
      char source[512];
      std::snprintf(source, sizeof source,
                    "measured by dplan probe (%s): a %.0f MiB all-reduce alone "
                    "%.2f ms, GEMMs alone %.2f ms, both at "
                    "once %.2f ms; fraction = (gemm + all-reduce - both) / "
                    "min(gemm, all-reduce)",
                    probe_path.c_str(), probe.overlap_bytes / kMiB, probe.overlap_collective_s * 1e3,
                    probe.overlap_gemm_s * 1e3, probe.overlap_both_s * 1e3);
      cluster["comm_overlap"] = {{"fraction", probe.overlap_fraction}, {"source", source}};
      std::printf(
          "\ncommunication overlap: an all-reduce alone %.2f ms, GEMMs "
          "alone %.2f ms, both %.2f ms: %.0f %% "
          "of it hides under compute (comm_overlap %.3f)\n",
          probe.overlap_collective_s * 1e3, probe.overlap_gemm_s * 1e3, probe.overlap_both_s * 1e3,
          100 * probe.overlap_fraction, probe.overlap_fraction);
    }
    for (const std::string& f : probe.nccl_tests_files) {
      if (probe.device_count < 2) continue;
      const fs::path p = fs::path(f).is_relative() ? fs::path(probe_path).parent_path() / f : fs::path(f);
      std::printf("\n");
      // Gloo over loopback (a CPU probe) has one protocol at every size: fit
      // them all. The tier's figures are fitted to the all-reduce; every
      // collective's timings are kept.
      import_nccl_tests(p.string(), a,
                        given             ? a.min_size_mib
                        : probe.cores > 0 ? 0.0
                                          : 1.0,
                        base, cluster, f.find("all_reduce") != std::string::npos);
    }
  }
  if (a.output.empty()) {
    std::printf("(no -o: the fitted profile is not written)\n");
    return 0;
  }
  write_profiles(profile, gpu_file, a.output, a.force, store);
  return 0;
}

}  // namespace dplan::cli
