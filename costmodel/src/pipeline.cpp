#include "dplan/costmodel/pipeline.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace dplan::costmodel {
namespace {

struct Op {
  bool backward;
  int microbatch;
};

std::vector<Op> stage_order(int stage, int stages, int microbatches, Schedule schedule) {
  std::vector<Op> ops;
  if (schedule == Schedule::gpipe) {
    for (int j = 0; j < microbatches; ++j) ops.push_back({false, j});
    for (int j = 0; j < microbatches; ++j) ops.push_back({true, j});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, microbatches);
  for (int j = 0; j < warmup; ++j) ops.push_back({false, j});
  for (int j = 0; j < microbatches - warmup; ++j) {
    ops.push_back({false, warmup + j});
    ops.push_back({true, j});
  }
  for (int j = microbatches - warmup; j < microbatches; ++j) ops.push_back({true, j});
  return ops;
}

}  // namespace

PipelineTimeline play_pipeline(const std::vector<PipelineStage>& stages, int microbatches, Schedule schedule,
                               const std::function<double(int)>& speed) {
  if (schedule == Schedule::interleaved) throw std::logic_error("play_pipeline: interleaved is not played out");
  const int p = static_cast<int>(stages.size());
  std::vector<std::vector<Op>> order(p);
  for (int i = 0; i < p; ++i) order[i] = stage_order(i, p, microbatches, schedule);
  // done[i][2j] / done[i][2j+1]: stage i finished micro-batch j's forward / backward.
  std::vector<std::vector<char>> done(p, std::vector<char>(2 * microbatches, 0));
  std::vector<size_t> next(p, 0);
  std::vector<double> left(p, -1);  // work seconds left of the running operation; < 0: not started
  PipelineTimeline out;
  out.busy_s.assign(p, 0);
  std::vector<int> running;
  for (;;) {
    running.clear();
    for (int i = 0; i < p; ++i) {
      if (next[i] == order[i].size()) continue;
      const Op op = order[i][next[i]];
      // A forward needs the previous stage's activation, a backward the next stage's gradient
      // (the last stage's backward follows its own forward, earlier in its order).
      const bool ready = op.backward ? (i == p - 1 || done[i + 1][2 * op.microbatch + 1])
                                     : (i == 0 || done[i - 1][2 * op.microbatch]);
      if (!ready) continue;
      if (left[i] < 0) left[i] = op.backward ? stages[i].backward_s : stages[i].forward_s;
      running.push_back(i);
    }
    if (running.empty()) break;
    const double v = speed(static_cast<int>(running.size()));
    double first = std::numeric_limits<double>::infinity();
    for (int i : running) first = std::min(first, left[i]);
    const double dt = first / v;
    out.makespan_s += dt;
    for (int i : running) {
      out.busy_s[i] += dt;
      left[i] -= first;
      if (left[i] <= 1e-12 * (stages[i].forward_s + stages[i].backward_s)) {
        const Op op = order[i][next[i]++];
        done[i][2 * op.microbatch + (op.backward ? 1 : 0)] = 1;
        left[i] = -1;
      }
    }
  }
  for (int i = 0; i < p; ++i)
    if (next[i] != order[i].size()) throw std::logic_error("play_pipeline: the schedule deadlocked");
  return out;
}

}  // namespace dplan::costmodel
