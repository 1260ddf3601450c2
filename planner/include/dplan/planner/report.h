// Human-readable reports: the layout in one line and the per-stage memory table. The CLI prints
// these; --json prints the same facts as JSON instead.
#pragma once

#include <optional>
#include <string>

#include <vector>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/time.h"

namespace dplan::planner {

// "tp 8 · pp 4 · dp 2 · cp 1, micro-batch 1, global batch 512 (256 micro-batches), ..."
std::string describe_layout(const costmodel::ModelSpec& model, const costmodel::TrainingSpec& training,
                            const costmodel::ParallelConfig& parallel);

// The per-stage memory table (GiB, against the GPU's capacity) and the fit verdict with reasons.
std::string memory_table(const costmodel::ClusterSpec& cluster, const costmodel::MemoryEstimate& memory);

// Step time by phase (ms and share of the step), exposed vs hidden communication, throughput, MFU.
std::string time_table(const costmodel::TimeBreakdown& time, const costmodel::TrainingSpec& training);

// Warnings our users look for: bubble > 20 %, fewer than 4*pp micro-batches, tensor parallel
// across nodes, under 10 % memory headroom, data-parallel scaling efficiency under 80 %.
std::vector<std::string> layout_warnings(const costmodel::ParallelConfig& parallel, const costmodel::TrainingSpec& training,
                                         const costmodel::Network& network, const costmodel::MemoryEstimate& memory,
                                         const costmodel::TimeBreakdown& time);

// A plan's checkpoint and, where the cluster has storage bandwidths, its goodput: what the report's
// "checkpoints and failures" block and --json's "checkpoint" and "goodput" keys show.
struct CheckpointReport {
  costmodel::CheckpointCost cost;
  std::optional<costmodel::Goodput> goodput;  // nullopt: the cluster profile has no storage block
  costmodel::FailureModel failures;
};
CheckpointReport checkpoint_report(const costmodel::ModelSpec& model, const costmodel::ClusterSpec& cluster,
                                   const costmodel::TrainingSpec& training, const costmodel::ParallelConfig& parallel,
                                   const costmodel::TimeBreakdown& time, const costmodel::FailureModel& failures,
                                   double tokens);
// The text block: checkpoint size by state, largest shard and node, save and load times, the
// failure rate, the interval, the fraction of time lost and the time to train with failures.
std::string checkpoint_block(const CheckpointReport& report, double tokens);
// {"checkpoint": ..., "goodput": ... or null}; per_rank as costmodel::to_json(CheckpointCost).
json to_json(const CheckpointReport& report, bool per_rank);

// "70.55 B" style parameter count.
std::string format_params(double params);

// "expected run time: about 4.2 min (10 steps x 25.10 s predicted)", the line dplan run and dplan
// scale print before they train: `step_s` the predicted step, `steps` how many run.
std::string expected_run_time(double step_s, int steps);
// "45 s", "4.2 min", "3.1 hours" for a span of `seconds`.
std::string format_duration(double seconds);

}  // namespace dplan::planner
