#include "dplan/costmodel/core_sharing.h"

#include <algorithm>
#include <cmath>

namespace dplan::costmodel {

CoreSharing::CoreSharing(const ClusterSpec& cluster, const ParallelConfig& parallel)
    : cluster_(&cluster), world_size_(parallel.world_size()), tp_(parallel.tp), pp_(parallel.pp) {
  if (!fills_waits() || pp_ < 2) return;
  // The speed with k stages running, once per layout rather than once per event.
  const double all = core_share(cluster, world_size_);
  pipeline_speed_.resize(pp_ + 1);
  for (int k = 1; k <= pp_; ++k) pipeline_speed_[k] = core_share(cluster, std::max(1, world_size_ * k / pp_)) / all;
}

GpuSpec CoreSharing::device(const GpuSpec& gpu) const {
  // Ranks that share one machine's cores run at core_share of the probe's pace (every core busy):
  // more ranks than cores time-share them, fewer contend less (the local-cpu cluster; dedicated
  // devices are unaffected). The network scales its collectives by the same share (Network::cost).
  GpuSpec scaled = gpu;
  if (const double share = core_share(*cluster_, world_size_); share != 1) {
    for (auto& [precision, flops] : scaled.peak_flops_per_s) flops *= share;
    for (MeasuredGemm& x : scaled.matmul_measured) x.time_s /= share;
    scaled.kernel_overhead_s /= share;
    scaled.hbm_bandwidth_bytes_per_s *= share;
  }
  return scaled;
}

// Ranks beyond the cores in several tensor-parallel groups (pp 1): between the data-parallel
// syncs the groups run independently, and while one waits in its collectives the others compute
// on the cores it leaves (the processor sharing the pipeline play-out assumes too). A group's
// waits stay as they are, which time-sharing stretches (a partner that has no core does not
// answer); its compute C (at the pace its group has alone) takes wall time Tc, during which each
// of the other k - 1 groups computes at random with the probability q = Tc / (Tc + W) that it is
// not waiting, their phases being independent. With j of them computing beside it, the group runs
// at s(j) = share((1 + j) tp ranks) / share(tp ranks) of its alone pace, so
//     C = Tc * E[s(J)],  J ~ Binomial(k - 1, q),
// solved for Tc. No waits (W = 0) gives the even share (every group always computing); long waits
// give the group's alone pace. (Measured tp 2 x dp 2 over tp 2 on 2 cores, gpt-small: 0.61-1.05
// of the step over 30 runs, averaging 0.85; this gives 0.81 and 0.83 from two probes here, the
// even share 1.0, the group's alone pace plus its waits 0.69-0.81.)
double CoreSharing::tensor_parallel_pace(double compute_s, double wait_s) const {
  if (!fills_waits() || pp_ != 1 || !(wait_s > 0)) return 1;
  const ClusterSpec& cluster = *cluster_;
  const int ranks = std::min(world_size_, cluster.gpus_per_node);
  const int groups = ranks / tp_;
  if (ranks <= cluster.cores_per_node || groups <= 1) return 1;
  const double alone = core_share(cluster, tp_);
  const double alone_s = compute_s * core_share(cluster, world_size_) / alone;
  std::vector<double> weighted_speed(groups);  // C(k - 1, j) s(j), once per layout
  double pick = 1;
  for (int j = 0; j < groups; ++j) {
    weighted_speed[j] = pick * core_share(cluster, tp_ * (1 + j)) / alone;
    pick = pick * (groups - 1 - j) / (j + 1);
  }
  // E[s(J)] for a given Tc; Tc * E[s(J)] grows with Tc, from <= C at Tc = C to >= C at the
  // even share, so bisection finds the one root.
  auto mean_speed = [&](double tc_s) {
    const double q = tc_s / (tc_s + wait_s);
    double mean = 0;
    for (int j = 0; j < groups; ++j) mean += weighted_speed[j] * std::pow(q, j) * std::pow(1 - q, groups - 1 - j);
    return mean;
  };
  double lo_s = alone_s, hi_s = std::max(alone_s, compute_s);
  for (int i = 0; i < 60 && hi_s - lo_s > 1e-9 * hi_s; ++i) {
    const double mid_s = (lo_s + hi_s) / 2;
    (mid_s * mean_speed(mid_s) < alone_s ? lo_s : hi_s) = mid_s;
  }
  return compute_s > 0 ? hi_s / compute_s : 1;
}

}  // namespace dplan::costmodel
