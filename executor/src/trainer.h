// One training step of one rank: the pipeline order of costmodel/pipeline.h over the step's
// micro-batches (GPipe, 1F1B or interleaved 1F1B over model chunks, Narayanan et al. 2021 §2.2,
// over send/recv with the neighbouring stages), the gradient synchronisation, and the optimizer
// step. Time goes to the phases of the context's PhaseClock.
#pragma once

#include <functional>

#include <torch/torch.h>

#include "data.h"
#include "dplan/costmodel/training.h"
#include "gpt.h"
#include "grad_sync.h"

namespace dplan::executor {

struct StepOptions {
  costmodel::Schedule schedule = costmodel::Schedule::one_f_one_b;  // the order: costmodel::pipeline_order
  int micro_batch = 1;
  double loss_scale = 1.0;  // 1 / tokens per global batch: the loss is the mean over the global batch
  double max_grad_norm = 1.0;  // clip the global gradient norm to this; 0: no clipping
};

struct StepResult {
  double loss = 0;       // the global batch's mean loss, the same on every rank
  double grad_norm = 0;  // the global gradient norm before clipping
};

class Trainer {
 public:
  Trainer(GptStage& stage, ParallelContext& ctx, GradSync& grads, torch::optim::Optimizer& optimizer,
          StepOptions options);
  // Runs one step on this rank's micro-batches.
  StepResult step(const std::vector<Batch>& microbatches);
  // Called in each step once the gradients are complete, before clipping and the optimizer
  // (--save-reference); an empty function: none.
  void observe_gradients(std::function<void()> observer) { observer_ = std::move(observer); }

 private:
  GptStage& stage_;
  ParallelContext& ctx_;
  GradSync& grads_;
  torch::optim::Optimizer& optimizer_;
  StepOptions options_;
  std::function<void()> observer_;
};

}  // namespace dplan::executor
