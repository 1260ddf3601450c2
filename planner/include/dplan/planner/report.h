// Human-readable reports: the layout in one line and the per-stage memory table. The CLI prints
// these; --json prints the same facts as JSON instead.
#pragma once

#include <string>

#include <vector>

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

// "70.55 B" style parameter count.
std::string format_params(double params);

// "expected run time: about 4.2 min (10 steps x 25.10 s predicted)", the line dplan run and dplan
// scale print before they train: `step_s` the predicted step, `steps` how many run.
std::string expected_run_time(double step_s, int steps);
// "45 s", "4.2 min", "3.1 hours" for a span of `seconds`.
std::string format_duration(double seconds);

}  // namespace dplan::planner
