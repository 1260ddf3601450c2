#include "dplan/costmodel/power_cap.h"

#include <cmath>
#include <cstdio>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {
namespace {

std::string watts(double w) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", w);
  return buf;
}

// The datasheet profile's name: a derived one's without its "@<limit>w".
std::string base_name(const std::string& name) {
  const auto at = name.rfind('@');
  return at == std::string::npos ? name : name.substr(0, at);
}

std::string base_description(const std::string& description) {
  const auto at = description.rfind(", power limit ");
  return at == std::string::npos ? description : description.substr(0, at);
}

}  // namespace

double power_cap_throughput_fraction(double limit_w, double tdp_w) {
  DPLAN_CHECK(limit_w > 0 && limit_w <= tdp_w);
  // A power-bound kernel runs at the clock whose power fits the limit; throughput follows the
  // clock. (limit / tdp)^b, b fitted to measured training throughput under power limits
  // (Zeus, You et al., NSDI '23, traces at ml-energy/zeus@75a8b93; profiles/gpus/SOURCES.md
  // section 6).
  return std::pow(limit_w / tdp_w, kPowerCapThroughputExponent);
}

std::string power_limit_range(const GpuSpec& gpu) {
  if (gpu.tdp_w <= 0 || gpu.min_power_limit_w <= 0) return "";
  return watts(gpu.min_power_limit_w) + "-" + watts(gpu.tdp_w) + " W";
}

GpuSpec power_capped(const GpuSpec& gpu, double limit_w) {
  const std::string base = base_name(gpu.name);
  if (gpu.tdp_w <= 0 || gpu.min_power_limit_w <= 0)
    throw InputError("GPU " + base + " gives no power range in its profile (power.tdp_w and power.min_limit_w), " +
                     "so no power limit can be derived for it");
  if (!(limit_w >= gpu.min_power_limit_w && limit_w <= gpu.tdp_w))
    throw InputError("a power limit of " + watts(limit_w) + " W is outside " + base + "'s range, " +
                     power_limit_range(gpu));
  const double current_w = gpu.power_limit_w > 0 ? gpu.power_limit_w : gpu.tdp_w;
  if (limit_w == current_w) return gpu;
  // The profile's figures hold at current_w: scale them by the ratio of the two limits' fractions.
  const double scale =
      power_cap_throughput_fraction(limit_w, gpu.tdp_w) / power_cap_throughput_fraction(current_w, gpu.tdp_w);
  GpuSpec g = gpu;
  for (auto& [precision, flops_per_s] : g.peak_flops_per_s) flops_per_s *= scale;
  for (MeasuredGemm& x : g.matmul_measured) x.time_s /= scale;  // compute-bound kernels, timed at current_w
  const bool at_tdp = limit_w == gpu.tdp_w;
  g.power_limit_w = at_tdp ? 0 : limit_w;
  g.name = at_tdp ? base : base + "@" + watts(limit_w) + "w";
  g.description = base_description(gpu.description);
  if (!at_tdp) g.description += ", power limit " + watts(limit_w) + " W";
  if (!g.sources.is_object()) g.sources = json::object();
  if (at_tdp) {
    g.sources.erase("power_limit");
  } else {
    char line[512];
    std::snprintf(line, sizeof line,
                  "derived: compute peaks x (%s / %s)^%.2f = %.3f of the TDP's (costmodel/src/power_cap.cpp; a "
                  "power law fitted to measured training throughput under power limits, rms error 7.6 %% at "
                  "limits of half the TDP and above, optimistic below; profiles/gpus/SOURCES.md section 6); "
                  "HBM bandwidth and every efficiency as at the TDP",
                  watts(limit_w).c_str(), watts(gpu.tdp_w).c_str(), kPowerCapThroughputExponent,
                  power_cap_throughput_fraction(limit_w, gpu.tdp_w));
    g.sources["power_limit"] = line;
  }
  return g;
}

}  // namespace dplan::costmodel
