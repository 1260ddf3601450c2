#include "dplan/costmodel/plan_file.h"

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/errors.h"
#include "format_version.h"

namespace dplan::costmodel {
namespace {

int index_below(ObjectReader& r, const std::string& key, long long below) {
  return static_cast<int>(r.int_in(key, 0, below - 1));
}

const json& array(ObjectReader& r, const std::string& key, size_t size, const std::string& what) {
  const json& list = r.raw(key);
  if (!list.is_array() || list.size() != size) r.fail(key, "a list of " + std::to_string(size) + " " + what);
  return list;
}

// The rank_layout's ranks, each at the mesh's coordinates (mesh.h): a rank at other coordinates is
// refused, since every reader of the plan takes its groups from the mesh.
std::vector<RankCoordinates> read_rank_layout(ObjectReader& layout, const ParallelConfig& p) {
  const std::string& file = layout.file();
  const int world = p.world_size();
  layout.one_of("order", {"tp-cp-dp-pp"});
  // "dp": a dense model's plan (no expert groups), or one written before MoE parallel folding.
  layout.one_of("ep_within", {"tp-cp-dp", "dp"});
  const bool folded_experts = layout.has("expert_order");
  if (folded_experts) layout.one_of("expert_order", {"etp-ep-edp"});
  const Mesh mesh(p);
  const json& ranks = array(layout, "ranks", world, "ranks (tp*cp*dp*pp)");
  std::vector<RankCoordinates> out(world);
  std::vector<bool> seen(world, false);
  auto at = [](const RankCoordinates& x) {
    return "tp " + std::to_string(x.tp) + ", cp " + std::to_string(x.cp) + ", dp " + std::to_string(x.dp) + ", pp " +
           std::to_string(x.pp);
  };
  for (size_t i = 0; i < ranks.size(); ++i) {
    ObjectReader rank(ranks[i], file, "/rank_layout/ranks/" + std::to_string(i));
    RankCoordinates c;
    c.rank = index_below(rank, "rank", world);
    c.node = index_below(rank, "node", world);
    c.local_rank = index_below(rank, "local_rank", world);
    c.tp = index_below(rank, "tp", p.tp);
    c.cp = index_below(rank, "cp", p.cp);
    c.dp = index_below(rank, "dp", p.dp);
    c.pp = index_below(rank, "pp", p.pp);
    c.ep = index_below(rank, "ep", p.ep);
    // etp and edp are absent in a dense model's plan and in plans written before MoE folding:
    // derived from the rank, as make_plan does; the ep of such a plan ("ep_within": "dp") followed
    // another order and is not compared.
    const RankCoordinates expected = mesh.coordinates(c.rank);
    c.etp = rank.has("etp") ? index_below(rank, "etp", p.expert_tp()) : expected.etp;
    c.edp = rank.has("edp") ? index_below(rank, "edp", p.expert_dp()) : expected.edp;
    rank.finish();
    if (c.tp != expected.tp || c.cp != expected.cp || c.dp != expected.dp || c.pp != expected.pp)
      rank.fail("tp", "rank " + std::to_string(c.rank) + " at " + at(expected) + " (the order tp-cp-dp-pp; it is at " +
                          at(c) + ")");
    if (folded_experts && (c.etp != expected.etp || c.ep != expected.ep || c.edp != expected.edp))
      rank.fail("ep", "rank " + std::to_string(c.rank) + " at etp " + std::to_string(expected.etp) + ", ep " +
                          std::to_string(expected.ep) + ", edp " + std::to_string(expected.edp) +
                          " (the expert order etp-ep-edp)");
    if (seen[c.rank]) rank.fail("rank", "a rank not listed before");
    seen[c.rank] = true;
    out[c.rank] = c;
  }
  layout.finish();
  return out;
}

}  // namespace

Plan make_plan(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
               const ParallelConfig& p, const OverlapOptions& overlap, const MemoryEstimate& memory,
               const TimeBreakdown& time) {
  Plan plan;
  plan.model = model;
  plan.cluster = to_json(cluster);
  plan.training = training;
  plan.parallel = p;
  plan.overlap = overlap;
  plan.num_microbatches = num_microbatches(training, p);
  const Mesh mesh(p, cluster.gpus_per_node);
  for (int r = 0; r < p.world_size(); ++r) plan.ranks.push_back(mesh.coordinates(r));
  // Layers per stage and model chunk, as assign_chunks (training.h) owns them.
  for (const std::vector<ModelChunk>& chunks : assign_chunks(model.num_layers, p)) {
    PlanStage stage;
    for (const ModelChunk& c : chunks) {
      stage.num_layers += c.num_layers;
      stage.embedding = stage.embedding || c.embedding;
      stage.lm_head = stage.lm_head || c.loss;
      stage.chunks.push_back({c.first_layer, c.num_layers});
    }
    plan.stages.push_back(stage);
  }
  plan.prediction = to_json(time);
  plan.prediction["fits"] = memory.fits;
  plan.prediction["memory"] = to_json(memory);
  // The checkpoint's size per rank and its save and load times (checkpoint_cost.h), for comparing
  // with the shards a run writes. Added after format 1's first plans: readers take it as optional
  // (the prediction is read key by key, and older plans lack it).
  plan.prediction["checkpoint"] = to_json(checkpoint_cost(model, cluster, training, p));
  return plan;
}

json to_json(const Plan& plan) {
  const ParallelConfig& p = plan.parallel;
  // The MoE layers' folded groups (etp, ep, edp) exist only in a mixture-of-experts model; a dense
  // model's plan keeps the layout it always had (ep 0 on every rank).
  const bool moe = plan.model.is_moe();
  json ranks = json::array();
  for (const RankCoordinates& c : plan.ranks) {
    json rank{{"rank", c.rank}, {"node", c.node}, {"local_rank", c.local_rank}, {"tp", c.tp},
              {"cp", c.cp},     {"dp", c.dp},     {"pp", c.pp},                 {"ep", c.ep}};
    if (moe) rank.update({{"etp", c.etp}, {"edp", c.edp}});
    ranks.push_back(rank);
  }
  json rank_layout{{"order", "tp-cp-dp-pp"}, {"ep_within", moe ? "tp-cp-dp" : "dp"}, {"ranks", ranks}};
  if (moe) rank_layout["expert_order"] = "etp-ep-edp";
  json stages = json::array();
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const PlanStage& s = plan.stages[i];
    json chunks = json::array();
    for (const PlanChunk& c : s.chunks) chunks.push_back({{"first_layer", c.first_layer}, {"num_layers", c.num_layers}});
    stages.push_back({{"stage", i},
                      {"num_layers", s.num_layers},
                      {"embedding", s.embedding},
                      {"lm_head", s.lm_head},
                      {"chunks", chunks}});
  }
  return json{{"format_version", kPlanFormatVersion},
              {"generator", "dplan"},
              {"model", to_json(plan.model)},
              {"cluster", plan.cluster},
              {"gpus", p.world_size()},
              {"training", to_json(plan.training)},
              {"parallel", to_json(p)},
              {"overlap",
               {{"grad_reduce", plan.overlap.grad_reduce},
                {"param_gather", plan.overlap.param_gather},
                {"tp_comm", plan.overlap.tp_comm}}},
              {"num_microbatches", plan.num_microbatches},
              {"rank_layout", rank_layout},
              {"stages", stages},
              {"prediction", plan.prediction}};
}

Plan plan_from_json(const json& j, const std::string& file) {
  ObjectReader r(j, file);
  check_format_version(r, kPlanFormatVersion, -1, "a plan.json, which dplan -o and dplan estimate -o write");
  r.string("generator");
  Plan plan;
  // The layout first: what every reader needs (and what tells a plan from a run.json).
  plan.parallel = parallel_from_json(r.raw("parallel"), file, "/parallel");
  plan.model = model_from_json(r.raw("model"), file, "/model");
  if (auto problem = pipeline_split_problem(plan.model, plan.parallel)) throw InputError(file + ": /parallel: " + *problem);
  // The prediction's context, kept as written; read with a cluster profile's keys and ranges, so
  // that every command that uses a figure from it can trust its type and range.
  plan.cluster = r.raw("cluster");
  embedded_cluster_from_json(plan.cluster, file, "/cluster");
  plan.training = training_from_json(r.raw("training"), file, "/training");
  if (auto problem = layout_problem(plan.model, plan.training, plan.parallel)) throw InputError(file + ": " + *problem);
  const ParallelConfig& p = plan.parallel;
  const int world = p.world_size();
  if (r.positive_int("gpus") != world) r.fail("gpus", std::to_string(world) + " (tp*cp*dp*pp)");
  ObjectReader overlap = r.object("overlap");
  plan.overlap.grad_reduce = overlap.boolean("grad_reduce");
  plan.overlap.param_gather = overlap.boolean("param_gather");
  plan.overlap.tp_comm = overlap.boolean("tp_comm");
  overlap.finish();
  plan.num_microbatches = static_cast<int>(r.positive_int("num_microbatches"));
  if (plan.num_microbatches != num_microbatches(plan.training, p))
    r.fail("num_microbatches",
           std::to_string(num_microbatches(plan.training, p)) + " (global_batch / (micro_batch * dp))");

  ObjectReader layout = r.object("rank_layout");
  plan.ranks = read_rank_layout(layout, p);

  const json& stages = array(r, "stages", p.pp, "pipeline stages (pp)");
  int layers = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string pointer = "/stages/" + std::to_string(i);
    ObjectReader stage(stages[i], file, pointer);
    if (stage.non_negative_int("stage") != static_cast<long long>(i)) stage.fail("stage", std::to_string(i));
    PlanStage s;
    s.num_layers = static_cast<int>(stage.non_negative_int("num_layers"));
    s.embedding = stage.boolean("embedding");
    s.lm_head = stage.boolean("lm_head");
    const json& chunks = stage.raw("chunks");
    if (!chunks.is_array() || chunks.empty()) stage.fail("chunks", "a non-empty list of model chunks");
    for (size_t c = 0; c < chunks.size(); ++c) {
      ObjectReader chunk(chunks[c], file, pointer + "/chunks/" + std::to_string(c));
      PlanChunk k;
      k.first_layer = static_cast<int>(chunk.non_negative_int("first_layer"));
      k.num_layers = static_cast<int>(chunk.non_negative_int("num_layers"));
      chunk.finish();
      s.chunks.push_back(k);
    }
    stage.finish();
    layers += s.num_layers;
    plan.stages.push_back(s);
  }
  // DualPipe's ranks hold every stage twice (assign_chunks).
  const int copies = p.schedule == Schedule::dualpipe ? 2 : 1;
  if (layers != copies * plan.model.num_layers)
    throw InputError(file + ": /stages: hold " + std::to_string(layers) + " layers, the model has " +
                     std::to_string(plan.model.num_layers) + (copies > 1 ? " (held twice under dualpipe)" : ""));
  plan.prediction = r.raw("prediction");
  if (!plan.prediction.is_object()) r.fail("prediction", "an object");
  r.finish();
  return plan;
}

Plan read_plan(const std::string& path) { return plan_from_json(read_json_file(path), path); }

const OutputKind& plan_output() {
  static const OutputKind kind = json_output_kind("plan", [](const json& j) { plan_from_json(j, "-o"); });
  return kind;
}

}  // namespace dplan::costmodel
