// The pipeline orders (costmodel/pipeline.h pipeline_order: the one order the cost model plays out
// and the executor's trainer runs), checked without processes: every
// (chunk, micro-batch) runs forward once and backward once after it, each chunk's micro-batches in
// order (interleaved: m a multiple of pp, as the planner requires), the warm-up as Megatron-LM counts it, and the ranks' orders together never deadlock when a
// receive waits for its sender's forward (or backward) and sends do not wait.
#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "dplan/costmodel/pipeline.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {
// How Catch prints an op in a failed check.
std::ostream& operator<<(std::ostream& out, const PipelineOp& op) {
  return out << (op.forward ? "F" : "B") << "(chunk " << op.chunk << ", mb " << op.microbatch << ")";
}
}  // namespace dplan::costmodel

namespace {
using dplan::costmodel::PipelineOp;
using dplan::costmodel::Schedule;

std::vector<PipelineOp> pipeline_schedule(Schedule schedule, int m, int chunks, int pp, int stage) {
  return dplan::costmodel::pipeline_order(schedule, stage, pp, m, chunks);
}

// Plays the ranks' orders out together: an op runs once what it receives has been produced (a
// forward of virtual stage s > 0 needs the forward of s - 1 for that micro-batch; a backward of s <
// last needs the backward of s + 1; and a backward needs its own forward). Returns false on a deadlock.
bool plays_out(Schedule schedule, int m, int chunks, int pp) {
  std::vector<std::vector<PipelineOp>> orders;
  for (int r = 0; r < pp; ++r) orders.push_back(pipeline_schedule(schedule, m, chunks, pp, r));
  const int stages = pp * chunks;
  std::set<std::tuple<bool, int, int>> done;  // (forward, virtual stage, micro-batch)
  std::vector<size_t> next(pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < orders[r].size()) {
        const PipelineOp& op = orders[r][next[r]];
        const int s = op.chunk * pp + r;
        const bool ready = op.forward ? (s == 0 || done.count({true, s - 1, op.microbatch}))
                                      : (done.count({true, s, op.microbatch}) &&
                                         (s == stages - 1 || done.count({false, s + 1, op.microbatch})));
        if (!ready) break;
        done.insert({op.forward, s, op.microbatch});
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < pp; ++r)
    if (next[r] != orders[r].size()) return false;
  return true;
}

}  // namespace

TEST_CASE("pipeline schedules: each op once, in order, and the ranks never deadlock", "[pipeline][schedule]") {
  for (auto schedule : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved}) {
    for (int pp : {1, 2, 3, 4, 8}) {
      for (int chunks : {1, 2, 3, 4}) {
        if ((schedule == Schedule::interleaved) != (chunks > 1) || (chunks > 1 && pp < 2)) continue;
        for (int m = (chunks > 1 ? pp : 1); m <= 3 * pp + 2; m += (chunks > 1 ? pp : 1)) {
          INFO("schedule " << int(schedule) << " pp " << pp << " chunks " << chunks << " m " << m);
          for (int r = 0; r < pp; ++r) {
            const auto ops = pipeline_schedule(schedule, m, chunks, pp, r);
            REQUIRE(ops.size() == static_cast<size_t>(2 * m * chunks));
            std::map<std::pair<int, int>, int> forwards, backwards;  // (chunk, mb) -> position
            std::vector<int> last_forward(chunks, -1), last_backward(chunks, -1);
            for (size_t i = 0; i < ops.size(); ++i) {
              const PipelineOp& op = ops[i];
              auto& seen = op.forward ? forwards : backwards;
              REQUIRE(seen.count({op.chunk, op.microbatch}) == 0);
              seen[{op.chunk, op.microbatch}] = static_cast<int>(i);
              int& last = (op.forward ? last_forward : last_backward)[op.chunk];
              REQUIRE(op.microbatch == last + 1);  // a chunk's micro-batches in order
              last = op.microbatch;
              if (!op.forward) REQUIRE(forwards.count({op.chunk, op.microbatch}) == 1);
            }
          }
          CHECK(plays_out(schedule, m, chunks, pp));
        }
      }
    }
  }
}

TEST_CASE("interleaved schedule: Megatron's warm-up and order", "[pipeline][schedule]") {
  // pp 2, 2 chunks, 4 micro-batches, stage 0: warm-up 2 (2 - 0 - 1) + (2 - 1) 2 = 4 forwards, in
  // groups of pp micro-batches per chunk: (0,c0) (1,c0) (0,c1) (1,c1); then forward (2,c0) and the
  // first backward, which runs the last chunk first: (0,c1).
  const auto ops = pipeline_schedule(Schedule::interleaved, 4, 2, 2, 0);
  const std::vector<PipelineOp> head = {{true, 0, 0},  {true, 0, 1}, {true, 1, 0},
                                        {true, 1, 1},  {true, 0, 2}, {false, 1, 0}};
  CHECK(std::vector<PipelineOp>(ops.begin(), ops.begin() + 6) == head);
  // The last stage warms up with (chunks - 1) pp = 2 forwards.
  const auto last = pipeline_schedule(Schedule::interleaved, 4, 2, 2, 1);
  CHECK(last[2] == PipelineOp{true, 1, 0});
  CHECK(last[3] == PipelineOp{false, 1, 0});
  // With only pp micro-batches the warm-up is still 2(pp - stage - 1) + (v - 1) pp, capped at every
  // forward (Megatron-Core's schedules.py at d98e8a64dd; earlier versions ran all of them first):
  // stage 0 runs all 4 forwards first, the last stage 2 and then alternates.
  const auto first = pipeline_schedule(Schedule::interleaved, 2, 2, 2, 0);
  for (int k = 0; k < 4; ++k) CHECK(first[k].forward);
  const auto few = pipeline_schedule(Schedule::interleaved, 2, 2, 2, 1);
  const std::vector<PipelineOp> last_order = {{true, 0, 0},  {true, 0, 1},  {true, 1, 0},  {false, 1, 0},
                                              {true, 1, 1},  {false, 1, 1}, {false, 0, 0}, {false, 0, 1}};
  CHECK(few == last_order);
}

TEST_CASE("memory's micro-batches in flight are the pipeline order's peak of forwards awaiting their backward",
          "[pipeline][schedule]") {
  // The memory model counts in flight with a closed form (training.h microbatches_in_flight); the
  // order the executor runs and the cost model plays out holds, at its peak, exactly that many
  // (chunk, micro-batch) forwards whose backward has not run.
  using dplan::costmodel::ParallelConfig;
  for (auto schedule : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved}) {
    for (int pp : {2, 3, 4, 8}) {
      for (int v : {1, 2, 3}) {
        if ((schedule == Schedule::interleaved) != (v > 1)) continue;
        for (int m = (v > 1 ? pp : 1); m <= 4 * pp; m += (v > 1 ? pp : 1)) {
          ParallelConfig p;
          p.pp = pp;
          p.vpp = v;
          p.schedule = schedule;
          for (int stage = 0; stage < pp; ++stage) {
            INFO("schedule " << int(schedule) << " pp " << pp << " v " << v << " m " << m << " stage " << stage);
            int open = 0, peak = 0;
            for (const PipelineOp& op : pipeline_schedule(schedule, m, v, pp, stage)) {
              open += op.forward ? 1 : -1;
              peak = std::max(peak, open);
            }
            CHECK(dplan::costmodel::microbatches_in_flight(p, stage, m) * v == Approx(peak));
          }
        }
      }
    }
  }
}
