#include "dplan/planner/plan.h"

namespace dplan::planner {

json plan_to_json(const PlanInputs& in, const costmodel::MemoryEstimate& memory, const costmodel::TimeBreakdown& time) {
  return to_json(costmodel::make_plan(in.model, in.cluster, in.training, in.parallel, in.overlap, memory, time));
}

}  // namespace dplan::planner
