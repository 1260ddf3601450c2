#include "rank_setup.h"

#include <string>
#include <utility>

#include "dplan/costmodel/mesh.h"
#include "offload.h"

namespace dplan::executor {

ContextGroups context_groups(const ExecPlan& plan, int rank) {
  using costmodel::Dim;
  const costmodel::ParallelConfig& p = plan.parallel;
  const costmodel::Mesh mesh = plan.mesh();
  ContextGroups g;
  g.tp = mesh.group(Dim::tp, rank);
  g.dp = mesh.group(Dim::dp, rank);
  g.pp = mesh.group(Dim::pp, rank);
  g.cp = mesh.group(Dim::cp, rank);
  g.dp_cp = p.cp == 1 ? g.dp : mesh.data_parallel_group(rank);
  // The expert groups, folded over each stage's tp * cp * dp ranks (mesh.h).
  if (plan.model.is_moe()) {
    g.etp = mesh.group(Dim::etp, rank);
    g.ep = mesh.group(Dim::ep, rank);
    g.edp = mesh.group(Dim::edp, rank);
  }
  const int stage = mesh.coordinates(rank).pp;
  if (last_stage_uses_embedding(plan.model) && p.pp > 1 && (stage == 0 || stage == p.pp - 1))
    g.embedding = mesh.embedding_group(rank);
  return g;
}

Group world_group(const StorePtr& store, int rank, int world, const GroupOptions& go) {
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  return Group::create(store, "world", all, rank, go);
}

ParallelContext build_parallel_context(const ExecPlan& plan, int rank, at::Device device, at::ScalarType dtype,
                                       const StorePtr& store, const GroupOptions& go, PhaseClock& clock,
                                       MemoryMeter& meter) {
  const costmodel::ParallelConfig& p = plan.parallel;
  const ContextGroups members = context_groups(plan, rank);
  // Every member names its group the same: the axis and the group's first rank (the groups of one
  // axis are disjoint). Every rank creates its groups in the same order of axes.
  auto group = [&](const std::string& axis, const std::vector<int>& ranks) {
    return Group::create(store, axis + "-" + std::to_string(ranks.front()), ranks, rank, go);
  };
  ParallelContext ctx(clock, meter);
  ctx.device = device;
  ctx.stage = plan.mesh().coordinates(rank).pp;
  ctx.num_stages = p.pp;
  ctx.sequence_parallel = p.sequence_parallel;
  ctx.recompute = p.recompute;
  ctx.attention = plan.training.attention;
  ctx.dtype = dtype;
  ctx.world = world_group(store, rank, plan.world_size(), go);
  ctx.tp = group("tp", members.tp);
  ctx.dp = group("dp", members.dp);
  ctx.pp = group("pp", members.pp);
  ctx.cp = group("cp", members.cp);
  ctx.dp_cp = p.cp == 1 ? ctx.dp : group("dpcp", members.dp_cp);
  if (!members.etp.empty()) {
    ctx.etp = group("etp", members.etp);
    ctx.ep = group("ep", members.ep);
    ctx.edp = group("edp", members.edp);
  }
  if (!members.embedding.empty()) {
    ctx.embedding = group("embedding", members.embedding);
    ctx.has_embedding_group = true;
  }
  return ctx;
}

GptStage build_model(const ExecPlan& plan, ParallelContext& ctx, uint64_t seed, int rank) {
  torch::manual_seed(seed + 7919 * rank);  // dropout streams differ by rank
  return GptStage(plan.model, plan.stages[ctx.stage], plan.training.seq_len,
                  costmodel::padded_vocab(plan.model, plan.training, ctx.tp.size()), ctx, seed);
}

std::unique_ptr<torch::optim::AdamW> build_optimizer(GradSync& grads, double lr, bool offload) {
  if (offload) grads.offload_optimizer();
  std::vector<at::Tensor> decay, no_decay;
  for (auto& op : grads.optimizer_params()) (op.weight_decay ? decay : no_decay).push_back(op.tensor);
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr).betas({kAdamBeta1, kAdamBeta2}).eps(kAdamEps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, adamw(kWeightDecay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, adamw(0.0));
  if (offload) return std::make_unique<OffloadedAdamW>(groups, torch::optim::AdamWOptions(lr), grads);
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lr));
}

StepOptions step_options(const ExecPlan& plan, double max_grad_norm) {
  const auto& p = plan.parallel;
  StepOptions so;
  so.schedule = p.schedule;
  so.micro_batch = p.micro_batch;
  so.loss_scale = 1.0 / (double(plan.training.global_batch) * plan.training.seq_len);
  so.max_grad_norm = max_grad_norm;
  return so;
}

}  // namespace dplan::executor
