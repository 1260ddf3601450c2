// What one rank of a plan is made of, built the same way by dplan-worker (one rank per process)
// and by the tests that run ranks as threads of one process over real Gloo groups: its process
// groups in the plan's rank layout (costmodel/mesh.h), its pipeline stage of the model, its
// optimizer and its step's options.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "comm.h"
#include "gpt.h"
#include "grad_sync.h"
#include "plan_file.h"
#include "trainer.h"

namespace dplan::executor {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// The members of `rank`'s groups (global ranks, in group order), from the plan's mesh. MoE groups
// only for MoE models, the embedding group only on the first and last stage of a tied model with
// pp > 1 (empty otherwise); dp_cp is the dp group when cp is 1.
struct ContextGroups {
  std::vector<int> tp, dp, pp, cp, dp_cp, etp, ep, edp, embedding;
};
ContextGroups context_groups(const ExecPlan& plan, int rank);

// Every rank of `world`, over `store`.
Group world_group(const StorePtr& store, int rank, int world, const GroupOptions& go);

// This rank's process groups (created in one order on every rank, each named after its axis and
// first member) and the layout choices the model follows.
ParallelContext build_parallel_context(const ExecPlan& plan, int rank, at::Device device, at::ScalarType dtype,
                                       const StorePtr& store, const GroupOptions& go, PhaseClock& clock,
                                       MemoryMeter& meter);

// This rank's pipeline stage of the model, its weights drawn from the seed alone.
GptStage build_model(const ExecPlan& plan, ParallelContext& ctx, uint64_t seed, int rank);

// AdamW's hyper-parameters besides the learning rate (GPT-3's betas; Megatron's defaults).
inline constexpr double kAdamBeta1 = 0.9, kAdamBeta2 = 0.95, kAdamEps = 1e-8, kWeightDecay = 0.1;

// AdamW over what `grads` gives the optimizer: weight decay on matrices and embeddings, none on
// norms and biases. Offloaded (the plan's offload_optimizer), on the host (offload.h).
std::unique_ptr<torch::optim::AdamW> build_optimizer(GradSync& grads, double lr, bool offload);

StepOptions step_options(const ExecPlan& plan, double max_grad_norm);

}  // namespace dplan::executor
