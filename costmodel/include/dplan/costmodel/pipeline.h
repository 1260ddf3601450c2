// One step of a pipeline schedule played out in time, for ranks that share a machine's cores.
//
// On dedicated devices a stage that waits leaves its device idle, and the closed forms of
// Narayanan et al. 2021 (Sec. 2.2) give the step. Where ranks outnumber cores (local CPU ranks), a
// waiting stage hands its cores to the stages that work, so they run faster: 1F1B's fill, drain and
// the waits inside its steady state are partly filled, and no closed form says by how much. This
// plays the schedule out as processor sharing: every stage whose next operation's input has arrived
// runs, at the speed that number of running stages gets.
#pragma once

#include <functional>
#include <vector>

#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// One step of a stage's pipeline order: the forward or the backward of a micro-batch through one
// of its model chunks.
struct PipelineOp {
  bool forward = true;
  int chunk = 0;  // model chunk (virtual stage chunk * stages + stage); 0 unless interleaved
  int microbatch = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The order in which `stage` of `stages` runs `microbatches` micro-batches through its `chunks`
// model chunks: the one schedule the cost model plays out (play_pipeline) and the executor runs
// (executor/src/trainer.cpp). As Megatron-Core runs them (pipeline_parallel/schedules.py):
//   - GPipe: every forward, then every backward;
//   - 1F1B: stages - stage - 1 warm-up forwards, then one forward and one backward at a time, then
//     the remaining backwards (at most stages - stage micro-batches in flight);
//   - interleaved 1F1B (chunks > 1; forward_backward_pipelining_with_interleaving and
//     get_schedule_table with microbatch_group_size_per_vp_stage = stages): the forwards take the
//     micro-batches in groups of `stages`, every chunk in turn per group, the backwards the same
//     groups with the chunks reversed; warm-up 2 (stages - stage - 1) + (chunks - 1) stages
//     forwards, capped at all of them (Megatron-Core at d98e8a64dd; earlier versions ran every
//     forward as warm-up when there were only `stages` micro-batches).
// Every (chunk, micro-batch) appears once forward and once backward, each chunk's micro-batches in
// increasing order. `chunks` counts only for the interleaved schedule.
std::vector<PipelineOp> pipeline_order(Schedule schedule, int stage, int stages, int microbatches, int chunks);

struct PipelineStage {
  double forward_s = 0;   // one micro-batch's forward, at the pace of every stage running
  double backward_s = 0;  // and its backward (with recompute)
  // Per model chunk where they differ (uneven layer counts): each chunk's forward and backward;
  // empty: every chunk takes forward_s / chunks and backward_s / chunks.
  std::vector<double> chunk_forward_s, chunk_backward_s;
};

struct PipelineTimeline {
  double makespan_s = 0;       // first forward starts to last backward ends
  std::vector<double> busy_s;  // per stage: the wall time it computed (the rest of makespan_s it waited)
};

// `speed(k)`: how much faster than the all-stages pace each stage runs while k of them run
// (speed(stages) = 1). Schedules as Megatron-LM runs them: GPipe (all forwards, then all
// backwards), 1F1B (pp - i - 1 warm-up forwards on stage i, then alternating; the executor's too)
// and interleaved 1F1B over `chunks` model chunks per stage, each with 1/chunks of its work.
// A 1F1B or interleaved step of more than about 5 pp micro-batches is played for about 4 pp and
// its steady state extended (`extrapolate` = false plays every one, for tests).
// REQUIRES: stages non-empty, microbatches >= 1 (>= stages interleaved), chunks >= 1, speed(k) > 0.
// At most this many forward and backward operations are played (about 14 bytes each); a longer
// schedule is refused (InputError) rather than allocated.
inline constexpr long long kMaxPlayedOperations = 1LL << 24;
PipelineTimeline play_pipeline(const std::vector<PipelineStage>& stages, int microbatches, Schedule schedule,
                               int chunks, const std::function<double(int)>& speed, bool extrapolate = true);

}  // namespace dplan::costmodel
