#include "dplan/costmodel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {

std::vector<PipelineOp> pipeline_order(Schedule schedule, int stage, int stages, int microbatches, int chunks) {
  if (schedule == Schedule::dualpipe)
    throw InputError("the dualpipe schedule has no order to play or run: its time is a closed form (time_phases.cpp)");
  if (schedule != Schedule::interleaved) chunks = 1;
  std::vector<PipelineOp> ops;
  if (schedule == Schedule::gpipe) {
    for (int j = 0; j < microbatches; ++j) ops.push_back({true, 0, j});
    for (int j = 0; j < microbatches; ++j) ops.push_back({false, 0, j});
    return ops;
  }
  // Forwards run micro-batches in groups of `stages` through chunk 0, 1, ..., v-1 in turn;
  // backwards the same groups through the chunks in reverse (with one chunk, plain 1F1B).
  std::vector<PipelineOp> forwards, backwards;
  for (int group = 0; group * stages < microbatches; ++group) {
    const int first = group * stages, size = std::min(stages, microbatches - first);
    for (int c = 0; c < chunks; ++c)
      for (int j = 0; j < size; ++j) {
        forwards.push_back({true, c, first + j});
        backwards.push_back({false, chunks - 1 - c, first + j});
      }
  }
  const int total = microbatches * chunks;
  // Megatron-Core schedules.py get_pp_rank_microbatches (NVIDIA/Megatron-LM@d98e8a64dd): capped
  // at every forward, with no special case for m == pp (earlier versions ran all-warm-up there).
  int warmup = chunks == 1 ? stages - stage - 1 : 2 * (stages - stage - 1) + (chunks - 1) * stages;
  warmup = std::min(warmup, total);
  for (int k = 0; k < warmup; ++k) ops.push_back(forwards[k]);
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(forwards[warmup + k]);
    ops.push_back(backwards[k]);
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(backwards[k]);
  return ops;
}

namespace {

// The play-out's state: each stage's operations in order, which of them are done, and how much
// work the running ones have left.
class PipelinePlay {
 public:
  PipelinePlay(const std::vector<PipelineStage>& stages, int microbatches, Schedule schedule, int chunks)
      : stages_(stages),
        p_(static_cast<int>(stages.size())),
        microbatches_(microbatches),
        chunks_(chunks),
        order_(p_),
        done_(p_, std::vector<char>(2 * chunks * microbatches, 0)),
        next_(p_, 0),
        left_(p_, -1) {
    for (int i = 0; i < p_; ++i) order_[i] = pipeline_order(schedule, i, p_, microbatches, chunks);
  }

  size_t num_operations() const {
    size_t operations = 0;
    for (const auto& ops : order_) operations += ops.size();
    return operations;
  }

  // The stages running an operation: each continues its own, or starts its next one once its
  // input is ready.
  void start_ready(std::vector<int>& running) {
    running.clear();
    for (int i = 0; i < p_; ++i) {
      if (next_[i] == order_[i].size()) continue;
      const PipelineOp op = order_[i][next_[i]];
      if (left_[i] < 0) {
        if (!ready(i, op)) continue;
        left_[i] = work_s(i, op);
      }
      running.push_back(i);
    }
  }

  double left_s(int i) const { return left_[i]; }

  // Stage i does `work_s` of its running operation, which finishes when (almost) none is left.
  void work(int i, double work_s) {
    left_[i] -= work_s;
    if (left_[i] <= 1e-12 * (stages_[i].forward_s + stages_[i].backward_s)) {
      const PipelineOp op = order_[i][next_[i]++];
      done_[i][index(!op.forward, op.chunk, op.microbatch)] = 1;
      left_[i] = -1;
    }
  }

  bool finished() const {
    for (int i = 0; i < p_; ++i)
      if (next_[i] != order_[i].size()) return false;
    return true;
  }

 private:
  int index(bool backward, int chunk, int microbatch) const {
    return (2 * chunk + (backward ? 1 : 0)) * microbatches_ + microbatch;
  }

  // Its input: a forward takes the activation of the chunk before it in the model (the previous
  // stage's, or the last stage's previous chunk), a backward the gradient of the chunk after it
  // (the next stage's, or stage 0's next chunk), and its own forward.
  bool ready(int i, const PipelineOp& op) const {
    const int j = op.microbatch, c = op.chunk;
    if (op.forward) {
      if (i > 0) return done_[i - 1][index(false, c, j)] != 0;
      return c == 0 || done_[p_ - 1][index(false, c - 1, j)] != 0;
    }
    if (!done_[i][index(false, c, j)]) return false;
    if (i < p_ - 1) return done_[i + 1][index(true, c, j)] != 0;
    return c == chunks_ - 1 || done_[0][index(true, c + 1, j)] != 0;
  }

  // The operation's work in seconds at full speed: its chunk's, or the stage's split evenly.
  double work_s(int i, const PipelineOp& op) const {
    const PipelineStage& s = stages_[i];
    const std::vector<double>& per_chunk = op.forward ? s.chunk_forward_s : s.chunk_backward_s;
    return int(per_chunk.size()) == chunks_ ? per_chunk[op.chunk] : (op.forward ? s.forward_s : s.backward_s) / chunks_;
  }

  const std::vector<PipelineStage>& stages_;
  int p_, microbatches_, chunks_;
  std::vector<std::vector<PipelineOp>> order_;
  std::vector<std::vector<char>> done_;  // done_[i][index(op)]: stage i finished that operation
  std::vector<size_t> next_;             // the next operation of each stage
  std::vector<double> left_;             // work seconds left of the running operation; < 0: not started
};

// Every operation of the step, in order.
PipelineTimeline play_all(const std::vector<PipelineStage>& stages, int microbatches, Schedule schedule, int chunks,
                          const std::function<double(int)>& speed) {
  PipelinePlay play(stages, microbatches, schedule, chunks);
  PipelineTimeline out;
  out.busy_s.assign(stages.size(), 0);
  std::vector<int> running;
  // Every round finishes at least one operation (the one with the least work left), so the
  // rounds are at most the operations; the count is checked so that no figure can make it spin.
  size_t rounds = 0;
  const size_t operations = play.num_operations();
  for (;;) {
    play.start_ready(running);
    if (running.empty()) break;
    const double v = speed(static_cast<int>(running.size()));
    double first = std::numeric_limits<double>::infinity();
    for (int i : running) first = std::min(first, play.left_s(i));
    const double dt = first / v;
    DPLAN_CHECK(std::isfinite(dt) && dt >= 0 && ++rounds <= operations);
    out.makespan_s += dt;
    for (int i : running) {
      out.busy_s[i] += dt;
      play.work(i, first);
    }
  }
  if (!play.finished()) throw std::logic_error("play_pipeline: the schedule deadlocked");
  return out;
}

}  // namespace

PipelineTimeline play_pipeline(const std::vector<PipelineStage>& stages, int microbatches, Schedule schedule,
                               int chunks, const std::function<double(int)>& speed, bool extrapolate) {
  if (schedule != Schedule::interleaved) chunks = 1;
  const int p = static_cast<int>(stages.size());
  // Past 1F1B's fill, every further group of p micro-batches adds the same time to the step (the
  // steady state repeats), so a long step is played for two lengths that keep its last, possibly
  // partial, group and extended linearly: the planner's cost stays that of ~4p micro-batches.
  // (GPipe's forwards queue up in front of a slower stage, so its step is not linear in them.)
  const int shorter = 3 * p + microbatches % p, longer = shorter + p;
  const bool all = !extrapolate || schedule == Schedule::gpipe || microbatches < longer + p;
  const double operations = 2.0 * p * chunks * (all ? microbatches : longer);
  if (operations > kMaxPlayedOperations)
    throw InputError("a pipeline of " + std::to_string(p) + " stages x " + std::to_string(chunks) + " chunks and " +
                     std::to_string(microbatches) + " micro-batches" + (all ? "" : " (played for fewer)") + " is " +
                     std::to_string(static_cast<long long>(operations)) + " operations to play out, more than " +
                     std::to_string(kMaxPlayedOperations) + "; use fewer micro-batches or stages, or 1f1b");
  if (all) return play_all(stages, microbatches, schedule, chunks, speed);
  const PipelineTimeline a = play_all(stages, shorter, schedule, chunks, speed);
  PipelineTimeline out = play_all(stages, longer, schedule, chunks, speed);
  const double periods = double(microbatches - longer) / p;
  out.makespan_s += periods * (out.makespan_s - a.makespan_s);
  for (int i = 0; i < p; ++i) out.busy_s[i] += periods * (out.busy_s[i] - a.busy_s[i]);
  return out;
}

}  // namespace dplan::costmodel
