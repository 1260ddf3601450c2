#include "plan_file.h"

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/costmodel/plan_file.h"

namespace dplan::executor {
using namespace costmodel;

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
  // Every layer once, in the plan's chunk order: virtual stage j * pp + i is chunk j of stage i.
  std::vector<int> owner(plan.model.num_layers, -1);
  for (const PlanStage& s : file.stages) {
    StageSpec spec;
    spec.embedding = s.embedding;
    spec.lm_head = s.lm_head;
    for (const PlanChunk& c : s.chunks) {
      spec.chunks.push_back({c.first_layer, c.num_layers});
      for (int l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
        if (l < 0 || l >= plan.model.num_layers || owner[l] >= 0)
          throw InputError(path + ": /stages: stage " + std::to_string(plan.stages.size()) + " holds layer " +
                           std::to_string(l) + ", which is outside the model or held twice");
        owner[l] = static_cast<int>(plan.stages.size());
      }
    }
    if (spec.chunks.empty())
      throw InputError(path + ": /stages: stage " + std::to_string(plan.stages.size()) + " has no model chunk");
    plan.stages.push_back(spec);
  }
  for (int l = 0; l < plan.model.num_layers; ++l)
    if (owner[l] < 0) throw InputError(path + ": /stages: no stage holds layer " + std::to_string(l));
  return plan;
}

}  // namespace dplan::executor
