// plan.json: the hand-off from planner to executor (../DESIGN.md). Versioned ("format_version": 1).
// Holds the model, cluster, training spec, parallel config, overlap switches, the rank layout
// (each global rank's tp/cp/ep/dp/pp coordinates, node and local rank, in Megatron's order: tp
// fastest, then cp, dp, pp; ep a sub-group of dp), the layer -> stage (and model chunk) assignment,
// and the prediction: memory per stage by component, step time by phase, throughput, MFU.
#pragma once

#include <string>

#include "dplan/costmodel/time.h"

namespace dplan::planner {

constexpr int kPlanFormatVersion = 1;

struct RankCoordinates {
  int rank = 0, node = 0, local_rank = 0;
  int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0;
};
// REQUIRES: 0 <= rank < parallel.world_size().
RankCoordinates rank_coordinates(const costmodel::ParallelConfig& parallel, int gpus_per_node, int rank);

struct PlanInputs {
  costmodel::ModelSpec model;
  costmodel::ClusterSpec cluster;
  costmodel::TrainingSpec training;
  costmodel::ParallelConfig parallel;
  costmodel::OverlapOptions overlap;
};

// The plan as JSON, prediction included.
json plan_to_json(const PlanInputs& inputs, const costmodel::MemoryEstimate& memory,
                  const costmodel::TimeBreakdown& time);

}  // namespace dplan::planner
