// Optimizer offload (Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model
// Training"): the AdamW step runs on the host over the fp32 weights, moments and gradient copy
// that GradSync::offload_optimizer() placed there. Each step brings the reduced gradients over
// first (GradSync::gradients_to_host) and runs the step under a HostScope, so whatever it
// allocates (the moments on the first step, its temporaries) is counted as host memory; the
// trainer's GradSync::finish_step() then copies the updated weights back to the device.
#pragma once

#include <torch/torch.h>

#include "grad_sync.h"

namespace dplan::executor {

class OffloadedAdamW : public torch::optim::AdamW {
 public:
  // REQUIRES: grads.offloaded(), and `groups` made of grads.optimizer_params().
  OffloadedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
                 GradSync& grads)
      : torch::optim::AdamW(std::move(groups), defaults), grads_(grads) {}
  torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  GradSync& grads_;
};

}  // namespace dplan::executor
