#include "plan_file.h"

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/costmodel/plan_file.h"

namespace dplan::executor {
using namespace costmodel;

int ExecPlan::rank_at(int tp, int cp, int dp, int pp) const {
  for (const auto& r : ranks)
    if (r.tp == tp && r.cp == cp && r.dp == dp && r.pp == pp) return r.rank;
  throw InputError(path + ": rank_layout has no rank at tp " + std::to_string(tp) + ", cp " + std::to_string(cp) +
                   ", dp " + std::to_string(dp) + ", pp " + std::to_string(pp));
}

ExecPlan read_plan(const std::string& path) {
  const Plan file = costmodel::read_plan(path);  // strict: the format's own reader
  ExecPlan plan;
  plan.path = path;
  plan.model = file.model;
  plan.training = file.training;
  plan.parallel = file.parallel;
  plan.num_microbatches = file.num_microbatches;
  // What this executor runs (executor_support.h); everything else is refused up front rather than
  // run differently.
  if (auto why = executor_refusal(plan.model, plan.training, plan.parallel)) throw InputError(path + ": " + *why);
  plan.ranks = file.ranks;
  int next_layer = 0;
  for (const PlanStage& s : file.stages) {
    if (s.chunks.size() != 1) throw InputError(path + ": " + executor_does_not_run("more than one model chunk per stage"));
    StageSpec spec{s.chunks[0].first_layer, s.chunks[0].num_layers, s.embedding, s.lm_head};
    if (spec.first_layer != next_layer)
      throw InputError(path + ": /stages: stage " + std::to_string(plan.stages.size()) + " starts at layer " +
                       std::to_string(spec.first_layer) + ", expected " + std::to_string(next_layer));
    next_layer += spec.num_layers;
    plan.stages.push_back(spec);
  }
  return plan;
}

}  // namespace dplan::executor
