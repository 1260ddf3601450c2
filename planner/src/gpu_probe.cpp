#include "dplan/planner/gpu_probe.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

GpuProbe parse_gpu_probe(const json& j, const std::string& file) {
  auto fail = [&](const std::string& what) -> InputError {
    return InputError(file + ": " + what + " (expected the JSON dplan-gpu-probe or dplan-worker --probe writes)");
  };
  const std::string generator = j.is_object() ? j.value("generator", "") : "";
  if (generator != "dplan-gpu-probe" && generator != "dplan-cpu-probe") throw fail("not a dplan-gpu-probe result");
  GpuProbe p;
  p.file = file;
  try {
    const json& device = j.at("device");
    p.device_name = device.at("name").get<std::string>();
    p.sm_count = device.at("sm_count").get<int>();
    p.device_count = device.at("count").get<int>();
    p.cores = device.value("cores", 0);
    p.copy_bytes_per_s = j.at("memory").at("bytes_per_s").get<double>();
    p.elementwise_bytes_per_s = j.at("memory").value("elementwise_bytes_per_s", 0.0);
    for (const auto& g : j.at("gemm")) {
      GemmSample s{costmodel::precision_from_string(g.at("precision").get<std::string>()), g.at("m").get<double>(),
                   g.at("n").get<double>(), g.at("k").get<double>(), g.at("time_s").get<double>()};
      if (g.contains("op")) s.op = costmodel::gemm_op_from_string(g.at("op").get<std::string>());
      if (g.contains("batch")) s.batch = g.at("batch").get<double>();
      if (!(s.m > 0 && s.n > 0 && s.k > 0 && s.batch >= 1 && s.time_s > 0))
        throw fail("/gemm: a non-positive shape, batch or time");
      p.gemms.push_back(s);
    }
    if (j.contains("overlap")) {
      const json& o = j.at("overlap");
      p.overlap_fraction = o.at("fraction").get<double>();
      p.overlap_bytes = o.at("bytes").get<double>();
      p.overlap_gemm_s = o.at("gemm_s").get<double>();
      p.overlap_collective_s = o.at("collective_s").get<double>();
      p.overlap_both_s = o.at("both_s").get<double>();
      if (!(p.overlap_fraction >= 0 && p.overlap_fraction <= 1)) throw fail("/overlap/fraction: not in [0, 1]");
    }
    if (j.contains("lone_rank")) {
      const json& l = j.at("lone_rank");
      p.lone_rank_speedup = l.at("speedup").get<double>();
      p.lone_rank_alone_s = l.at("alone_s").get<double>();
      p.lone_rank_busy_s = l.at("all_busy_s").get<double>();
      if (!(p.lone_rank_speedup > 0)) throw fail("/lone_rank/speedup: not a positive number");
    }
    if (j.contains("nccl_tests_files"))
      for (const auto& f : j.at("nccl_tests_files")) p.nccl_tests_files.push_back(f.get<std::string>());
  } catch (const json::exception& e) {
    throw fail(std::string("malformed: ") + e.what());
  } catch (const InputError& e) {
    throw fail(std::string("/gemm: ") + e.what());
  }
  if (p.sm_count < 1 || !(p.copy_bytes_per_s > 0)) throw fail("/device/sm_count and /memory/bytes_per_s must be positive");
  return p;
}

GpuFit fit_gpu(const GpuSpec& base, const GpuProbe& probe) {
  const std::vector<GemmSample> gemms = curve_gemms(probe);
  if (gemms.size() < 2)
    throw InputError(probe.file + ": " + std::to_string(gemms.size()) +
                     " GEMMs cannot determine 2 parameters (max_efficiency, "
                     "kernel_overhead)");
  for (const auto& s : probe.gemms) costmodel::peak_flops_per_s(base, s.precision);  // throws for a missing unit
  GpuFit fit;
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
  const std::vector<double> x = detail::minimize_in_box(
      [&](const std::vector<double>& v) {
        GpuSpec trial = g;
        trial.matmul_max_efficiency = v[0];
        trial.kernel_overhead_s = v[1];
        return detail::rms_log_error(gemm_times(trial, gemms), measured);
      },
      {base.matmul_max_efficiency, std::max(base.kernel_overhead_s, 1e-7)}, {{0.02, 1.0}, {1e-7, 1e-3}});
  g.matmul_max_efficiency = x[0];
  g.kernel_overhead_s = x[1];
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
