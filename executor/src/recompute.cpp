#include "recompute.h"

#include <memory>
#include <mutex>
#include <optional>

#include <torch/torch.h>

#include "phase_clock.h"

namespace dplan::executor {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The default generator's state on `device` (CPU, or the CUDA device's own generator).
at::Tensor rng_state(const at::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct Recompute : torch::autograd::Function<Recompute> {
  // The inputs come as a TensorList: autograd makes an edge for each tensor of a TensorList (a
  // std::vector argument would count as one non-tensor argument, and gradients would stop here).
  static variable_list forward(AutogradContext* ctx, Recomputable* fn, PhaseClock* clock, at::TensorList inputs) {
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    ctx->saved_data["clock"] = reinterpret_cast<int64_t>(clock);
    ctx->save_for_backward(inputs.vec());
    // The random state the forward starts from (dropout's masks), so that the recomputation draws
    // the same masks: torch.utils.checkpoint's preserve_rng_state.
    ctx->saved_data["rng"] = rng_state(inputs[0].device());
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> detached;
      for (const auto& t : inputs) detached.push_back(t.detach());
      out = (*fn)(detached);
    }
    return {out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    std::unique_ptr<Recomputable> fn(reinterpret_cast<Recomputable*>(ctx->saved_data["fn"].toInt()));
    std::vector<at::Tensor> inputs;
    for (const auto& t : ctx->get_saved_variables()) inputs.push_back(t.detach().requires_grad_(t.requires_grad()));
    at::Tensor out;
    {
      auto* clock = reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt());
      std::optional<PhaseScope> timed;
      if (clock) timed.emplace(*clock, Phase::recompute);
      const at::Device device = inputs[0].device();
      const at::Tensor now = rng_state(device);
      set_rng_state(device, ctx->saved_data["rng"].toTensor());
      at::AutoGradMode grad_on(true);
      out = (*fn)(inputs);
      set_rng_state(device, now);  // the rest of backward and the next forwards draw as without recompute
    }
    torch::autograd::backward({out}, {grad[0]});
    variable_list grads = {at::Tensor(), at::Tensor()};  // for the function and clock pointers
    for (const auto& t : inputs) grads.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    return grads;
  }
};
}  // namespace

at::Tensor recompute(Recomputable fn, const std::vector<at::Tensor>& inputs, PhaseClock* clock) {
  // Owned by the graph node until its backward runs (or leaked with a graph that never runs
  // backward, which the trainer never builds).
  auto* owned = new Recomputable(std::move(fn));
  return Recompute::apply(owned, clock, at::TensorList(inputs))[0];
}

}  // namespace dplan::executor
