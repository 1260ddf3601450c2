// Ranks that share one machine's cores (the local-cpu cluster, cores_per_node > 0): how much of
// the cores each rank gets, and the two places where a rank that waits hands its cores to the ranks
// that work. Dedicated devices (every GPU cluster, cores_per_node 0) make all of it the identity:
// the GPU as profiled, no pipeline play-out, the tensor-parallel groups at their own pace. The time
// model's closed forms (time_phases.h) take what this gives and never speak of cores.
#pragma once

#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

class CoreSharing {
 public:
  // REQUIRES: `cluster` outlives this object.
  CoreSharing(const ClusterSpec& cluster, const ParallelConfig& parallel);

  // True where ranks share cores, so that a waiting rank's cores go to the ranks that work.
  bool fills_waits() const { return cluster_->cores_per_node > 0; }

  // The device as the layout's ranks see it: every rate at core_share(world size) of the probe's
  // pace (hardware.h); `gpu` itself on dedicated devices.
  GpuSpec device(const GpuSpec& gpu) const;

  // How much faster than the all-stages pace each pipeline stage runs while `running_stages` of
  // the pp stages compute (play_pipeline's speed; 1 with every stage running).
  // REQUIRES: fills_waits(), pp >= 2, 1 <= running_stages <= pp.
  double pipeline_speed(int running_stages) const { return pipeline_speed_[running_stages]; }

  // The factor on the compute of one of several tensor-parallel groups (pp 1) whose ranks
  // outnumber the cores, given its compute `compute_s` at the all-ranks pace and its waits
  // `wait_s` in its collectives (see core_sharing.cpp); 1 wherever the groups do not meet.
  double tensor_parallel_pace(double compute_s, double wait_s) const;

 private:
  const ClusterSpec* cluster_;
  int world_size_, tp_, pp_;
  std::vector<double> pipeline_speed_;  // by running stages, 1..pp; empty on dedicated devices
};

}  // namespace dplan::costmodel
