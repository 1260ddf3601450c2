// Activation recompute (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
// Korthikanti et al. 2022 for the selective form): forward runs `fn` without recording a graph
// and keeps only its inputs; backward runs `fn` again with the graph on and backpropagates
// through it, so gradients reach the inputs and every parameter `fn` uses (through their
// gradient accumulators, as in a normal backward). Collectives inside `fn` run again in backward,
// in the same order on every rank. The random state `fn` started from in forward is restored
// for the recomputation (torch.utils.checkpoint's preserve_rng_state), so dropout draws the same
// masks twice. With a clock, the recomputation is timed into the recompute phase (its collectives
// into their own, nested).
#pragma once

#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace dplan::executor {

class PhaseClock;
using Recomputable = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

at::Tensor recompute(Recomputable fn, const std::vector<at::Tensor>& inputs, PhaseClock* clock = nullptr);

}  // namespace dplan::executor
