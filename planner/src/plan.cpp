#include "dplan/planner/plan.h"

namespace dplan::planner {
using namespace costmodel;

RankCoordinates rank_coordinates(const ParallelConfig& p, int gpus_per_node, int rank) {
  RankCoordinates c;
  c.rank = rank;
  c.node = rank / gpus_per_node;
  c.local_rank = rank % gpus_per_node;
  int r = rank;
  c.tp = r % p.tp;
  r /= p.tp;
  c.cp = r % p.cp;
  r /= p.cp;
  c.dp = r % p.dp;
  r /= p.dp;
  c.pp = r;
  c.ep = c.dp % p.ep;
  return c;
}

json plan_to_json(const PlanInputs& in, const MemoryEstimate& memory, const TimeBreakdown& time) {
  const ParallelConfig& p = in.parallel;
  json ranks = json::array();
  for (int r = 0; r < p.world_size(); ++r) {
    RankCoordinates c = rank_coordinates(p, in.cluster.gpus_per_node, r);
    ranks.push_back({{"rank", c.rank}, {"node", c.node}, {"local_rank", c.local_rank}, {"tp", c.tp},
                     {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}, {"ep", c.ep}});
  }
  // Layers per stage; with v model chunks, chunk j of stage i holds the (j*pp + i)-th block of
  // L/(pp*v) consecutive layers (Megatron's interleaved assignment).
  json stages = json::array();
  std::vector<int> layers = assign_layers(in.model.num_layers, p);
  const int v = p.schedule == Schedule::interleaved ? p.vpp : 1;
  int first = 0;
  for (int i = 0; i < p.pp; ++i) {
    json chunks = json::array();
    if (v == 1) {
      chunks.push_back({{"first_layer", first}, {"num_layers", layers[i]}});
    } else {
      int per_chunk = layers[i] / v;
      for (int j = 0; j < v; ++j) chunks.push_back({{"first_layer", (j * p.pp + i) * per_chunk}, {"num_layers", per_chunk}});
    }
    stages.push_back({{"stage", i},
                      {"num_layers", layers[i]},
                      {"embedding", i == 0},
                      {"lm_head", i == p.pp - 1},
                      {"chunks", chunks}});
    first += layers[i];
  }
  json prediction = to_json(time);
  prediction["fits"] = memory.fits;
  prediction["memory"] = to_json(memory);
  return json{{"format_version", kPlanFormatVersion},
              {"generator", "dplan"},
              {"model", to_json(in.model)},
              {"cluster", to_json(in.cluster)},
              {"gpus", p.world_size()},
              {"training", to_json(in.training)},
              {"parallel", to_json(p)},
              {"overlap",
               {{"grad_reduce", in.overlap.grad_reduce},
                {"param_gather", in.overlap.param_gather},
                {"tp_comm", in.overlap.tp_comm}}},
              {"num_microbatches", num_microbatches(in.training, p)},
              {"rank_layout", {{"order", "tp-cp-dp-pp"}, {"ep_within", "dp"}, {"ranks", ranks}}},
              {"stages", stages},
              {"prediction", prediction}};
}

}  // namespace dplan::planner
