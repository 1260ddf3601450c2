#include "plan_file.h"

#include "dplan/costmodel/errors.h"

namespace dplan::executor {
using namespace costmodel;

int ExecPlan::rank_at(int tp, int cp, int dp, int pp) const {
  for (const auto& r : ranks)
    if (r.tp == tp && r.cp == cp && r.dp == dp && r.pp == pp) return r.rank;
  throw InputError(path + ": rank_layout has no rank at tp " + std::to_string(tp) + ", cp " + std::to_string(cp) +
                   ", dp " + std::to_string(dp) + ", pp " + std::to_string(pp));
}

ExecPlan read_plan(const std::string& path) {
  json j = read_json_file(path);
  if (!j.is_object()) throw InputError(path + ": expected a plan object (written by dplan -o plan.json)");
  for (const char* key : {"format_version", "model", "training", "parallel", "rank_layout", "stages", "num_microbatches"})
    if (!j.contains(key)) throw InputError(path + ": missing key \"" + key + "\"; is this a plan written by dplan -o?");
  if (j["format_version"] != 1)
    throw InputError(path + ": format_version " + j["format_version"].dump() + " is not supported; valid: 1");
  ExecPlan plan;
  plan.path = path;
  plan.model = model_from_json(j["model"], path, "/model");
  plan.training = training_from_json(j["training"], path, "/training");
  plan.parallel = parallel_from_json(j["parallel"], path, "/parallel");
  plan.num_microbatches = j["num_microbatches"].get<int>();
  const ParallelConfig& p = plan.parallel;

  // What this executor runs; everything else is refused up front rather than run differently.
  auto refuse = [&](const std::string& what) {
    throw InputError(path + ": the executor does not run " + what +
                     " yet; it runs tp, pp (gpipe, 1f1b), dp, sequence parallel, ZeRO 0-3, the distributed optimizer, recompute "
                     "(dplan --runnable searches only those)");
  };
  if (p.cp > 1) refuse("context parallel (cp " + std::to_string(p.cp) + ")");
  if (p.ep > 1 || plan.model.is_moe()) refuse("mixture-of-experts models");
  if (p.schedule == Schedule::interleaved) refuse("the interleaved schedule");
  if (p.offload_optimizer) refuse("optimizer offload");
  if (p.recompute != Recompute::none && (plan.model.attention_dropout > 0 || plan.model.hidden_dropout > 0))
    throw InputError(path + ": recompute with dropout is not run: the recomputed forward would draw other masks; "
                            "use recompute none or a model with dropout 0");
  if (plan.training.attention == Attention::flash && plan.model.attention_dropout > 0)
    throw InputError(path + ": flash attention with attention dropout " + std::to_string(plan.model.attention_dropout) +
                     " is not run (the executor's flash attention has no dropout); plan with --attention standard");
  if (plan.num_microbatches != num_microbatches(plan.training, p))
    throw InputError(path + ": num_microbatches " + std::to_string(plan.num_microbatches) +
                     " disagrees with global_batch / (micro_batch * dp) = " +
                     std::to_string(num_microbatches(plan.training, p)));

  const json& ranks = j["rank_layout"].value("ranks", json::array());
  if (!ranks.is_array() || static_cast<int>(ranks.size()) != p.world_size())
    throw InputError(path + ": /rank_layout/ranks must list " + std::to_string(p.world_size()) + " ranks (tp*cp*dp*pp)");
  plan.ranks.resize(ranks.size());
  for (const auto& r : ranks) {
    RankPlace place{r.at("rank").get<int>(), r.at("tp").get<int>(), r.at("cp").get<int>(), r.at("dp").get<int>(),
                    r.at("pp").get<int>()};
    if (place.rank < 0 || place.rank >= p.world_size() || place.tp >= p.tp || place.dp >= p.dp || place.pp >= p.pp ||
        place.cp >= p.cp)
      throw InputError(path + ": /rank_layout/ranks: rank " + std::to_string(place.rank) + " has coordinates outside the layout");
    plan.ranks[place.rank] = place;
  }
  const json& stages = j["stages"];
  if (!stages.is_array() || static_cast<int>(stages.size()) != p.pp)
    throw InputError(path + ": /stages must list " + std::to_string(p.pp) + " pipeline stages");
  int next_layer = 0;
  for (const auto& s : stages) {
    const json& chunks = s.at("chunks");
    if (chunks.size() != 1) refuse("more than one model chunk per stage");
    StageSpec spec{chunks[0].at("first_layer").get<int>(), chunks[0].at("num_layers").get<int>(),
                   s.at("embedding").get<bool>(), s.at("lm_head").get<bool>()};
    if (spec.first_layer != next_layer || spec.num_layers < 0)
      throw InputError(path + ": /stages: stage " + std::to_string(plan.stages.size()) + " starts at layer " +
                       std::to_string(spec.first_layer) + ", expected " + std::to_string(next_layer));
    next_layer += spec.num_layers;
    plan.stages.push_back(spec);
  }
  if (next_layer != plan.model.num_layers)
    throw InputError(path + ": /stages hold " + std::to_string(next_layer) + " layers, the model has " +
                     std::to_string(plan.model.num_layers));
  return plan;
}

}  // namespace dplan::executor
