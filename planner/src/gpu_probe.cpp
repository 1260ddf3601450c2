#include "dplan/planner/gpu_probe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/training.h"
#include "fit.h"

namespace dplan::planner {
namespace {
using costmodel::GpuSpec;
using costmodel::Precision;

std::vector<double> gemm_times(const GpuSpec& g, const std::vector<GemmSample>& gemms) {
  std::vector<double> t;
  for (const auto& s : gemms) t.push_back(costmodel::gemm_time_s(g, s.precision, s.m, s.n, s.k, s.batch, s.op));
  return t;
}

std::vector<double> measured_times(const std::vector<GemmSample>& gemms) {
  std::vector<double> t;
  for (const auto& s : gemms) t.push_back(s.time_s);
  return t;
}

// The GEMMs the curve is fitted to: not whole attention kernels, which the
// table alone serves.
std::vector<GemmSample> curve_gemms(const GpuProbe& probe) {
  std::vector<GemmSample> out;
  for (const auto& s : probe.gemms)
    if (!costmodel::is_whole_attention(s.op)) out.push_back(s);
  return out;
}

// "major.minor", digits only: a compute capability as the probe writes it.
bool is_compute_capability(const std::string& s) {
  const size_t dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == s.size() || s.size() > 8) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != dot && !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// A note the probe leaves in a file it did not finish ("incomplete", "error"): any string,
// escaped for printing (an error text is no figure, so it is not held to the strict reader).
std::string probe_note(ObjectReader& r, const std::string& key) {
  const json& v = r.raw(key);
  if (!v.is_string()) r.fail(key, "a string");
  return quote_for_message(v.get<std::string>(), 300);
}

// The device: its name, counts, what the driver reports and the library versions.
void read_device(ObjectReader device, GpuProbe& p) {
  p.device_name = device.string("name");
  p.sm_count = static_cast<int>(device.int_in("sm_count", 1, 100000));
  p.device_count = static_cast<int>(device.int_in("count", 1, costmodel::kMaxGpus));
  p.cores = device.has("cores") ? static_cast<int>(device.int_in("cores", 1, 100000)) : 0;
  // What the driver reports (dplan-gpu-probe from the FP8 release on; older files lack them).
  if (device.has("compute_capability")) {
    p.compute_capability = device.string("compute_capability");
    if (!is_compute_capability(p.compute_capability))
      device.fail("compute_capability", "\"major.minor\", such as \"9.0\"");
  }
  if (device.has("sm_clock_hz")) p.sm_clock_hz = device.number_in("sm_clock_hz", 0, 1e11);
  if (device.has("memory_clock_hz")) p.memory_clock_hz = device.number_in("memory_clock_hz", 0, 1e11);
  if (device.has("memory_bus_width_bits"))
    p.memory_bus_width_bits = static_cast<int>(device.int_in("memory_bus_width_bits", 0, 1 << 20));
  if (device.has("l2_bytes")) p.l2_bytes = device.number_in("l2_bytes", 0, 1e12);
  for (auto [key, field] : {std::pair{"driver_version", &p.driver_version},
                            {"runtime_version", &p.runtime_version},
                            {"cublas_version", &p.cublas_version},
                            {"cublaslt_version", &p.cublaslt_version},
                            {"nccl_version", &p.nccl_version}})
    if (device.has(key)) *field = device.string(key);
}

// The measured GEMMs, each with its shape, precision, time and (where given) operation and batch.
std::vector<GemmSample> read_gemms(ObjectReader& r, const std::string& file) {
  const json& gemms = r.raw("gemm");
  if (!gemms.is_array()) r.fail("gemm", "a list of measured GEMMs");
  std::vector<GemmSample> out;
  for (size_t i = 0; i < gemms.size(); ++i) {
    ObjectReader g(gemms[i], file, "/gemm/" + std::to_string(i));
    GemmSample s;
    s.precision = costmodel::precision_from_string(g.one_of("precision", {"fp32", "bf16", "fp16", "fp8"}));
    s.m = g.number_in("m", 1, 1e9);
    s.n = g.number_in("n", 1, 1e9);
    s.k = g.number_in("k", 1, 1e9);
    s.time_s = g.number_in("time_s", 1e-9, 1e4);
    if (g.has("op"))
      s.op = costmodel::gemm_op_from_string(
          g.one_of("op", {"forward", "dgrad", "wgrad", "batched", "attention_forward", "attention_backward"}));
    if (g.has("batch")) s.batch = static_cast<double>(g.int_in("batch", 1, 1000000));
    out.push_back(s);
  }
  return out;
}

// The optional sections: compute/communication overlap, kernel launches, the shared-core speedup.
void read_overlap_launch_lone_rank(ObjectReader& r, GpuProbe& p) {
  if (r.has("overlap")) {
    ObjectReader o = r.object("overlap");
    p.overlap_fraction = o.fraction("fraction");
    p.overlap_bytes = o.number_in("bytes", 1, 1e15);
    p.overlap_gemm_s = o.number_in("gemm_s", 0, 1e4);
    p.overlap_collective_s = o.number_in("collective_s", 0, 1e4);
    p.overlap_both_s = o.number_in("both_s", 0, 1e4);
  }
  if (r.has("launch")) {
    ObjectReader l = r.object("launch");
    p.launch_kernel = l.string("kernel");
    p.launch_count = static_cast<int>(l.int_in("launches", 1, 1000000000));
    p.launch_overhead_s = l.number_in("time_per_launch_s", 1e-9, 1);
    p.launch_enqueue_s = l.number_in("enqueue_per_launch_s", 1e-9, 1);
  }
  if (r.has("incomplete")) p.incomplete = probe_note(r, "incomplete");
  if (r.has("error")) p.incomplete = "it failed: " + probe_note(r, "error");
  if (r.has("lone_rank")) {
    ObjectReader l = r.object("lone_rank");
    p.lone_rank_speedup = l.number_in("speedup", 0.01, 100);
    p.lone_rank_alone_s = l.number_in("alone_s", 0, 1e4);
    p.lone_rank_busy_s = l.number_in("all_busy_s", 0, 1e4);
  }
}

// The nccl-tests files the probe wrote beside its JSON, by name.
std::vector<std::string> read_nccl_tests_files(ObjectReader& r, const std::string& file) {
  std::vector<std::string> names;
  if (!r.has("nccl_tests_files")) return names;
  const json& files = r.raw("nccl_tests_files");
  if (!files.is_array()) r.fail("nccl_tests_files", "a list of file names");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = "/nccl_tests_files/" + std::to_string(i);
    if (!files[i].is_string() || !is_printable_text(files[i].get<std::string>()))
      throw InputError(file + ": " + where + ": expected a file name, got " + describe_json_value(files[i]));
    names.push_back(files[i].get<std::string>());
  }
  return names;
}

}  // namespace

// The probe writers add metadata (rounds, per-kernel rows, sample counts) that no fit reads: only
// the keys read below are checked, each against its range, so unknown keys are left alone.
GpuProbe parse_gpu_probe(const json& j, const std::string& file) {
  const std::string generator = j.is_object() && j.contains("generator") && j["generator"].is_string()
                                    ? j["generator"].get<std::string>()
                                    : "";
  if (generator != "dplan-gpu-probe" && generator != "dplan-cpu-probe")
    throw InputError(file + ": not a dplan-gpu-probe result (expected the JSON dplan-gpu-probe or dplan-worker "
                            "--probe writes, with \"generator\": \"dplan-gpu-probe\" or \"dplan-cpu-probe\")");
  ObjectReader r(j, file);
  GpuProbe p;
  p.file = file;
  read_device(r.object("device"), p);
  ObjectReader memory = r.object("memory");
  p.copy_bytes_per_s = memory.number_in("bytes_per_s", 1e3, 1e16);
  p.elementwise_bytes_per_s = memory.has("elementwise_bytes_per_s")
                                  ? memory.number_in("elementwise_bytes_per_s", 1e3, 1e16)
                                  : 0.0;
  p.gemms = read_gemms(r, file);
  read_overlap_launch_lone_rank(r, p);
  p.nccl_tests_files = read_nccl_tests_files(r, file);
  return p;
}

GpuFit fit_gpu(const GpuSpec& base, const GpuProbe& measured_probe) {
  // FP8 GEMMs need an fp8 peak to be priced against, and a profile keeps measured GEMMs only in
  // precisions it has a peak for (hardware.cpp): without one they are left out, not fatal.
  GpuProbe probe = measured_probe;
  const size_t fp8_ignored =
      base.peak_flops_per_s.count("fp8")
          ? 0
          : std::erase_if(probe.gemms, [](const GemmSample& s) { return s.precision == Precision::fp8; });
  const std::vector<GemmSample> gemms = curve_gemms(probe);
  if (gemms.size() < 2)
    throw InputError(probe.file + ": " + std::to_string(gemms.size()) +
                     " GEMMs cannot determine 2 parameters (max_efficiency, "
                     "kernel_overhead)" +
                     (fp8_ignored ? " (" + std::to_string(fp8_ignored) + " fp8 GEMMs left out: " + base.name +
                                        " has no fp8 peak)"
                                  : std::string()));
  for (const auto& s : probe.gemms) costmodel::peak_flops_per_s(base, s.precision);  // throws for a missing unit
  // FP8 GEMMs reach their own fraction of their peak (GpuSpec::fp8_matmul_max_efficiency): fitted
  // beside the 16-bit one when measured, from the base's (or, without one, the 16-bit) value.
  const bool fit_fp8 = std::any_of(gemms.begin(), gemms.end(),
                                   [](const GemmSample& s) { return s.precision == Precision::fp8; });
  GpuFit fit;
  fit.fp8_gemms_ignored = fp8_ignored;
  const std::vector<double> measured = measured_times(gemms);
  GpuSpec isolated = base;
  isolated.sustained_fraction = 1;   // isolated GEMMs: the maximum achievable rate
  isolated.matmul_measured.clear();  // the curve is fitted, not an earlier probe's table
  const std::vector<double> before = gemm_times(isolated, gemms);
  GpuSpec g = isolated;
  g.sm_count = probe.sm_count;
  const double memory_bytes_per_s =
      probe.elementwise_bytes_per_s > 0 ? probe.elementwise_bytes_per_s : probe.copy_bytes_per_s;
  g.memory_efficiency = std::min(1.0, memory_bytes_per_s / base.hbm_bandwidth_bytes_per_s);
  // What the import writes must read back (gpu_from_json): a bandwidth under kMinEfficiency of the
  // base's HBM is not a measurement of that GPU (a probe of another machine, or a broken one).
  if (g.memory_efficiency < costmodel::kMinEfficiency) {
    char line[320];
    std::snprintf(line, sizeof line,
                  ": /memory: %.3g bytes/s is %.3g of %s's HBM bandwidth (%.3g bytes/s); a probe of that GPU "
                  "measures at least %g of it: give the --cluster that was probed",
                  memory_bytes_per_s, g.memory_efficiency, base.name.c_str(), base.hbm_bandwidth_bytes_per_s,
                  costmodel::kMinEfficiency);
    throw InputError(probe.file + line);
  }
  std::vector<double> start = {base.matmul_max_efficiency, std::max(base.kernel_overhead_s, 1e-7)};
  std::vector<detail::Bounds> bounds = {{0.02, 1.0}, {1e-7, 1e-3}};
  if (fit_fp8) {
    start.push_back(base.fp8_matmul_max_efficiency > 0 ? base.fp8_matmul_max_efficiency : base.matmul_max_efficiency);
    bounds.push_back({0.02, 1.0});
  }
  auto apply = [&](GpuSpec& trial, const std::vector<double>& v) {
    trial.matmul_max_efficiency = v[0];
    trial.kernel_overhead_s = v[1];
    if (fit_fp8) trial.fp8_matmul_max_efficiency = v[2];
  };
  const std::vector<double> x = detail::minimize_in_box(
      [&](const std::vector<double>& v) {
        GpuSpec trial = g;
        apply(trial, v);
        return detail::rms_log_error(gemm_times(trial, gemms), measured);
      },
      start, bounds);
  apply(g, x);
  const std::vector<double> after = gemm_times(g, gemms);
  for (const GemmSample& s : probe.gemms)
    g.matmul_measured.push_back({s.precision, s.op, s.m, s.n, s.k, s.batch, s.time_s});
  for (size_t i = 0; i < gemms.size(); ++i) fit.rows.push_back({gemms[i], before[i], after[i]});
  fit.rms_log_error_before = detail::rms_log_error(before, measured);
  fit.rms_log_error_after = detail::rms_log_error(after, measured);
  fit.gpu = g;
  return fit;
}

}  // namespace dplan::planner
