#include "trainer.h"

#include <algorithm>

#include <torch/csrc/autograd/engine.h>

#include "memory_meter.h"
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
  const auto act_options = at::TensorOptions().dtype(ctx_.dtype).device(ctx_.device);
  grads_.zero();

  std::vector<at::Tensor> inputs(m), outputs(m);
  // Sends in flight. A sent activation's memory goes once its send is done: the output keeps its
  // graph but its data is swapped for an empty tensor (Megatron's deallocate_output_tensor), and
  // backward starts from its graph edge (Megatron's custom_backward). Send and receive buffers
  // are reported to the memory meter as pipeline buffers.
  struct Send {
    Work work;
    at::Tensor buffer;
    int output = -1;  // the micro-batch whose output this is (forward sends)
  };
  std::vector<Send> sends;
  // Retires the finished sends; `wait`: also waits for every send (all), or for the forward send of
  // micro-batch `output` (which the next stage has received once its gradient came back).
  auto retire_sends = [&](bool wait, int output = -1) {
    for (auto it = sends.begin(); it != sends.end();) {
      const bool must = wait && (output < 0 || it->output == output);
      if (!must && !it->work.completed()) {
        ++it;
        continue;
      }
      it->work.wait();
      const int64_t bytes = it->buffer.nbytes();
      if (it->output >= 0 && outputs[it->output].defined())
        outputs[it->output].set_data(at::empty({0}, outputs[it->output].options()));
      it = sends.erase(it);  // the buffer goes with the send's own reference to it ...
      ctx_.meter.note_buffer_bytes(-bytes);  // ... before it leaves the buffers' count
    }
  };
  auto send = [&](const at::Tensor& t, int peer, int tag, int output) {
    PhaseScope wait(ctx_.clock, Phase::pp_wait);
    at::Tensor buf = t.detach().contiguous();
    ctx_.meter.note_buffer_bytes(buf.nbytes());
    sends.push_back({ctx_.pp.send(buf, peer, tag), buf, output});
  };
  at::Tensor loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(ctx_.device));

  auto forward = [&](int j) {
    at::Tensor in;
    if (first) {
      in = batches[j].inputs;
    } else {
      PhaseScope wait(ctx_.clock, Phase::pp_wait);
      in = at::empty(shape, act_options);
      ctx_.pp.recv(in, ctx_.stage - 1, kForwardTag).wait();
      in.requires_grad_(true);
    }
    at::Tensor out;
    {
      PhaseScope scope(ctx_.clock, Phase::forward);
      out = stage_.forward(in, batches[j].targets, options_.loss_scale);
    }
    inputs[j] = in;
    outputs[j] = out;
    if (last)
      loss_sum += out.detach().to(at::kDouble);
    else
      send(out, ctx_.stage + 1, kForwardTag, j);
    retire_sends(false);
  };

  auto backward = [&](int j) {
    if (j == m - 1) grads_.arm_last_microbatch();
    at::Tensor grad;
    if (!last) {
      PhaseScope wait(ctx_.clock, Phase::pp_wait);
      ctx_.meter.note_buffer_bytes(at::elementSize(act_options.dtype().toScalarType()) * c10::multiply_integers(shape));
      grad = at::empty(shape, act_options);
      ctx_.pp.recv(grad, ctx_.stage + 1, kBackwardTag).wait();
      retire_sends(true, j);  // this micro-batch's forward send is done, and its output can go
    }
    {
      PhaseScope scope(ctx_.clock, Phase::backward);
      if (last) {
        outputs[j].backward();
      } else {
        const int64_t bytes = grad.nbytes();
        torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(outputs[j])},
                                                              {grad}, false, false, true);
        grad = at::Tensor();
        ctx_.meter.note_buffer_bytes(-bytes);
      }
    }
    if (!first) send(inputs[j].grad(), ctx_.stage - 1, kBackwardTag, -1);
    inputs[j] = at::Tensor();  // the micro-batch's activations go now
    outputs[j] = at::Tensor();
    retire_sends(false);
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
    PhaseScope wait(ctx_.clock, Phase::pp_wait);
    retire_sends(true);
  }
  grads_.finish();
  StepResult result;
  {
    PhaseScope scope(ctx_.clock, Phase::optimizer);
    result.grad_norm = grads_.clip_grad_norm(options_.max_grad_norm);
    optimizer_.step();
  }
  grads_.finish_step();  // master weights into the parameters; ZeRO 1, 2: every rank's slice to all
  // The loss lives on the last stage; sum it over data-parallel replicas and share it along the pipeline.
  ctx_.dp_cp.all_reduce(loss_sum);  // each cp rank summed the loss of its own chunks
  ctx_.pp.all_reduce(loss_sum);
  result.loss = loss_sum.item<double>();
  return result;
}

}  // namespace dplan::executor
