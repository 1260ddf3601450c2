// plan.json as the planner writes it: the format itself (type, writer, strict reader) is
// costmodel's (dplan/costmodel/plan_file.h), shared with the executor; this is the planner's
// entry point from its inputs and prediction.
#pragma once

#include <string>

#include "dplan/costmodel/plan_file.h"

namespace dplan::planner {

constexpr int kPlanFormatVersion = costmodel::kPlanFormatVersion;
using costmodel::RankCoordinates;
using costmodel::Mesh;

struct PlanInputs {
  costmodel::ModelSpec model;
  costmodel::ClusterSpec cluster;
  costmodel::TrainingSpec training;
  costmodel::ParallelConfig parallel;
  costmodel::OverlapOptions overlap;
};

// The plan as JSON, prediction included: to_json(costmodel::make_plan(...)).
json plan_to_json(const PlanInputs& inputs, const costmodel::MemoryEstimate& memory,
                  const costmodel::TimeBreakdown& time);

}  // namespace dplan::planner
