#include "trainer.h"

#include <algorithm>
#include <stdexcept>

#include <torch/csrc/autograd/engine.h>

#include "dplan/costmodel/pipeline.h"
#include "memory_meter.h"
#include "phase_clock.h"

namespace dplan::executor {
namespace {

// One step's pipeline on this rank: the forward and backward of each (model chunk, micro-batch)
// in the order the schedule gives, with the activations and gradients they exchange with the
// neighbouring stages, and the loss the head's chunk sums.
//
// Virtual stage c * pp + stage is model chunk c of this rank; its input comes from the virtual
// stage before (the previous rank, or the last rank's chunk c - 1) and its output goes to the one
// after. A boundary's messages carry the downstream virtual stage in their tag, so the chunks'
// messages between one pair of ranks never meet. Each payload is announced by a one-element
// message of its own (tag + 1) sent just before it: the receiver's wait for the announcement is
// the pipeline's bubble (its sender had not yet produced the data), its wait for the payload
// after it the transfer (pp_p2p), as the cost model prices them apart (pipeline.h).
class PipelineStep {
 public:
  PipelineStep(GptStage& stage, ParallelContext& ctx, GradSync& grads, const StepOptions& options,
               const std::vector<Batch>& batches)
      : stage_(stage),
        ctx_(ctx),
        grads_(grads),
        options_(options),
        batches_(batches),
        m_(static_cast<int>(batches.size())),
        pp_(ctx.num_stages),
        prev_((ctx.stage + pp_ - 1) % pp_),
        next_((ctx.stage + 1) % pp_),
        shape_(stage.activation_shape(options.micro_batch)),
        act_options_(at::TensorOptions().dtype(ctx.dtype).device(ctx.device)),
        inputs_(stage.num_chunks(), std::vector<at::Tensor>(m_)),
        outputs_(inputs_),
        loss_sum_(at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(ctx.device))),
        announcement_(at::zeros({1}, act_options_)),
        announced_(at::empty({1}, act_options_)) {}

  void forward(int c, int j);
  void backward(int c, int j);
  // Retires the finished sends; `wait`: also waits for every send (all), or for the forward send of
  // micro-batch `output` of `chunk` (which the next stage has received once its gradient came back).
  void retire_sends(bool wait, int chunk = -1, int output = -1);
  // The summed loss of this rank's head chunk (zero on the other stages).
  at::Tensor& loss_sum() { return loss_sum_; }

 private:
  // Sends in flight. A sent activation's memory goes once its send is done: the output keeps its
  // graph but its data is swapped for an empty tensor (Megatron's deallocate_output_tensor), and
  // backward starts from its graph edge (Megatron's custom_backward). Send and receive buffers
  // are reported to the memory meter as pipeline buffers.
  struct Send {
    Work announce_work, work;
    at::Tensor buffer;
    int chunk = -1, output = -1;  // the chunk and micro-batch whose output this is (forward sends)
  };
  int virtual_stage(int chunk) const { return chunk * pp_ + ctx_.stage; }
  static int forward_tag(int downstream) { return 4 * downstream; }
  static int backward_tag(int downstream) { return 4 * downstream + 2; }
  static int announce_tag(int tag) { return tag + 1; }
  void send(const at::Tensor& t, int peer, int tag, int chunk, int output);
  void receive(at::Tensor& buffer, int peer, int tag);

  GptStage& stage_;
  ParallelContext& ctx_;
  GradSync& grads_;
  const StepOptions& options_;
  const std::vector<Batch>& batches_;
  const int m_, pp_, prev_, next_;
  const std::vector<int64_t> shape_;
  const at::TensorOptions act_options_;
  std::vector<std::vector<at::Tensor>> inputs_, outputs_;  // [chunk][micro-batch], until its backward
  std::vector<Send> sends_;
  at::Tensor loss_sum_;
  // The announcements' one element: one tensor sent by every send (only read), one received into
  // by every receive (each waited for before the next), so the step allocates them once.
  at::Tensor announcement_, announced_;
};

void PipelineStep::retire_sends(bool wait, int chunk, int output) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    const bool must = wait && (output < 0 || (it->chunk == chunk && it->output == output));
    if (!must && !(it->announce_work.completed() && it->work.completed())) {
      ++it;
      continue;
    }
    it->announce_work.wait();
    it->work.wait();
    const int64_t bytes = it->buffer.nbytes();
    if (it->output >= 0 && outputs_[it->chunk][it->output].defined())
      outputs_[it->chunk][it->output].set_data(at::empty({0}, outputs_[it->chunk][it->output].options()));
    it = sends_.erase(it);  // the buffer goes with the send's own reference to it ...
    ctx_.meter.note_buffer_bytes(-bytes);  // ... before it leaves the buffers' count
  }
}

void PipelineStep::send(const at::Tensor& t, int peer, int tag, int chunk, int output) {
  PhaseScope scope(ctx_.clock, Phase::pp_p2p);
  at::Tensor buf = t.detach().contiguous();
  ctx_.meter.note_buffer_bytes(buf.nbytes());
  Work announced = ctx_.pp.send(announcement_, peer, announce_tag(tag));
  sends_.push_back({std::move(announced), ctx_.pp.send(buf, peer, tag), buf, chunk, output});
}

// Into `buffer`: the announcement's wait is bubble, the payload's transfer.
void PipelineStep::receive(at::Tensor& buffer, int peer, int tag) {
  {
    PhaseScope scope(ctx_.clock, Phase::pp_bubble);
    ctx_.pp.recv(announced_, peer, announce_tag(tag)).wait();
  }
  PhaseScope scope(ctx_.clock, Phase::pp_p2p);
  ctx_.pp.recv(buffer, peer, tag).wait();
}

void PipelineStep::forward(int c, int j) {
  const bool first = stage_.has_embedding(c), last = stage_.has_head(c);
  at::Tensor in;
  if (first) {
    in = batches_[j].inputs;
  } else {
    in = at::empty(shape_, act_options_);
    receive(in, prev_, forward_tag(virtual_stage(c)));
    in.requires_grad_(true);
  }
  at::Tensor out;
  {
    PhaseScope scope(ctx_.clock, Phase::forward);
    out = stage_.forward(c, in, batches_[j].targets, options_.loss_scale);
  }
  inputs_[c][j] = in;
  outputs_[c][j] = out;
  if (last)
    loss_sum_ += out.detach().to(at::kDouble);
  else
    send(out, next_, forward_tag(virtual_stage(c) + 1), c, j);
  retire_sends(false);
}

void PipelineStep::backward(int c, int j) {
  const bool first = stage_.has_embedding(c), last = stage_.has_head(c);
  if (j == m_ - 1) grads_.arm_last_microbatch(c);
  at::Tensor grad;
  if (!last) {
    ctx_.meter.note_buffer_bytes(at::elementSize(act_options_.dtype().toScalarType()) * c10::multiply_integers(shape_));
    grad = at::empty(shape_, act_options_);
    receive(grad, next_, backward_tag(virtual_stage(c) + 1));
    PhaseScope scope(ctx_.clock, Phase::pp_p2p);
    retire_sends(true, c, j);  // this micro-batch's forward send is done, and its output can go
  }
  {
    PhaseScope scope(ctx_.clock, Phase::backward);
    if (last) {
      outputs_[c][j].backward();
    } else {
      const int64_t bytes = grad.nbytes();
      torch::autograd::Engine::get_default_engine().execute(
          {torch::autograd::impl::gradient_edge(outputs_[c][j])}, {grad}, false, false, true);
      grad = at::Tensor();
      ctx_.meter.note_buffer_bytes(-bytes);
    }
  }
  if (!first) send(inputs_[c][j].grad(), prev_, backward_tag(virtual_stage(c)), -1, -1);
  inputs_[c][j] = at::Tensor();  // the micro-batch's activations go now
  outputs_[c][j] = at::Tensor();
  retire_sends(false);
}

}  // namespace

Trainer::Trainer(GptStage& stage, ParallelContext& ctx, GradSync& grads, torch::optim::Optimizer& optimizer,
                 StepOptions options)
    : stage_(stage), ctx_(ctx), grads_(grads), optimizer_(optimizer), options_(options) {}

StepResult Trainer::step(const std::vector<Batch>& batches) {
  const int m = static_cast<int>(batches.size()), v = stage_.num_chunks(), pp = ctx_.num_stages;
  grads_.zero();
  PipelineStep pipeline(stage_, ctx_, grads_, options_, batches);
  // The one pipeline order (costmodel/pipeline.h), the one the cost model plays out.
  for (const costmodel::PipelineOp& op : costmodel::pipeline_order(options_.schedule, ctx_.stage, pp, m, v)) {
    if (op.forward)
      pipeline.forward(op.chunk, op.microbatch);
    else
      pipeline.backward(op.chunk, op.microbatch);
  }
  {
    PhaseScope scope(ctx_.clock, Phase::pp_p2p);
    pipeline.retire_sends(true);
  }
  grads_.finish();
  if (observer_) observer_();
  StepResult result;
  {
    PhaseScope scope(ctx_.clock, Phase::optimizer);
    result.grad_norm = grads_.clip_grad_norm(options_.max_grad_norm);
    optimizer_.step();
  }
  grads_.finish_step();  // master weights into the parameters; ZeRO 1, 2: every rank's slice to all
  // The loss lives on the last stage; sum it over data-parallel replicas and share it along the pipeline.
  at::Tensor& loss_sum = pipeline.loss_sum();
  ctx_.dp_cp.all_reduce(loss_sum);  // each cp rank summed the loss of its own chunks
  ctx_.pp.all_reduce(loss_sum);
  result.loss = loss_sum.item<double>();
  return result;
}

}  // namespace dplan::executor
