#include "trainer.h"

#include <algorithm>

#include "phase_clock.h"

namespace dplan::executor {
namespace {
constexpr int kForwardTag = 0, kBackwardTag = 1;
}

Trainer::Trainer(GptStage& stage, ParallelContext& ctx, GradSync& grads, torch::optim::Optimizer& optimizer,
                 StepOptions options)
    : stage_(stage), ctx_(ctx), grads_(grads), optimizer_(optimizer), options_(options) {}

StepResult Trainer::step(const std::vector<Batch>& batches) {
  const int m = static_cast<int>(batches.size());
  const bool first = ctx_.stage == 0, last = ctx_.stage == ctx_.num_stages - 1;
  const auto shape = stage_.activation_shape(options_.micro_batch);
  const auto act_options = at::TensorOptions().dtype(at::kFloat).device(ctx_.device);
  grads_.zero();

  std::vector<at::Tensor> inputs(m), outputs(m);
  std::vector<Work> sends;
  std::vector<at::Tensor> in_flight;  // send buffers, alive until their send completes
  at::Tensor loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(ctx_.device));

  auto forward = [&](int j) {
    at::Tensor in;
    if (first) {
      in = batches[j].inputs;
    } else {
      PhaseScope wait(Phase::pp_wait);
      in = at::empty(shape, act_options);
      ctx_.pp.recv(in, ctx_.stage - 1, kForwardTag).wait();
      in.requires_grad_(true);
    }
    at::Tensor out;
    {
      PhaseScope scope(Phase::forward);
      out = stage_.forward(in, batches[j].targets, options_.loss_scale);
    }
    if (last) {
      loss_sum += out.detach().to(at::kDouble);
    } else {
      PhaseScope wait(Phase::pp_wait);
      at::Tensor buf = out.detach().contiguous();
      sends.push_back(ctx_.pp.send(buf, ctx_.stage + 1, kForwardTag));
      in_flight.push_back(buf);
    }
    inputs[j] = in;
    outputs[j] = out;
  };

  auto backward = [&](int j) {
    if (j == m - 1) grads_.arm_last_microbatch();
    at::Tensor grad;
    if (!last) {
      PhaseScope wait(Phase::pp_wait);
      grad = at::empty(shape, act_options);
      ctx_.pp.recv(grad, ctx_.stage + 1, kBackwardTag).wait();
    }
    {
      PhaseScope scope(Phase::backward);
      if (last)
        outputs[j].backward();
      else
        outputs[j].backward(grad);
    }
    if (!first) {
      PhaseScope wait(Phase::pp_wait);
      at::Tensor buf = inputs[j].grad().contiguous();
      sends.push_back(ctx_.pp.send(buf, ctx_.stage - 1, kBackwardTag));
      in_flight.push_back(buf);
    }
    inputs[j] = at::Tensor();  // the micro-batch's activations go now
    outputs[j] = at::Tensor();
  };

  if (options_.schedule == PipelineSchedule::gpipe) {
    for (int j = 0; j < m; ++j) forward(j);
    for (int j = 0; j < m; ++j) backward(j);
  } else {
    // 1F1B: stage i runs pp - i - 1 warm-up forwards, then alternates one forward and one
    // backward, then drains the remaining backwards; at most pp - i micro-batches are in flight.
    const int warmup = std::min(ctx_.num_stages - ctx_.stage - 1, m);
    for (int j = 0; j < warmup; ++j) forward(j);
    for (int j = 0; j < m - warmup; ++j) {
      forward(warmup + j);
      backward(j);
    }
    for (int j = m - warmup; j < m; ++j) backward(j);
  }
  {
    PhaseScope wait(Phase::pp_wait);
    for (auto& s : sends) s.wait();
  }
  grads_.finish();
  StepResult result;
  {
    PhaseScope scope(Phase::optimizer);
    result.grad_norm = grads_.clip_grad_norm(options_.max_grad_norm);
    optimizer_.step();
  }
  if (options_.sharded_optimizer) grads_.gather_parameters();
  // The loss lives on the last stage; sum it over data-parallel replicas and share it along the pipeline.
  ctx_.dp.all_reduce(loss_sum);
  ctx_.pp.all_reduce(loss_sum);
  result.loss = loss_sum.item<double>();
  return result;
}

}  // namespace dplan::executor
