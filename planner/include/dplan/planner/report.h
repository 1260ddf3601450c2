// Human-readable reports: the layout in one line and the per-stage memory table. The CLI prints
// these; --json prints the same facts as JSON instead.
#pragma once

#include <string>

#include "dplan/costmodel/memory.h"

namespace dplan::planner {

// "tp 8 · pp 4 · dp 2 · cp 1, micro-batch 1, global batch 512 (256 micro-batches), ..."
std::string describe_layout(const costmodel::ModelSpec& model, const costmodel::TrainingSpec& training,
                            const costmodel::ParallelConfig& parallel);

// The per-stage memory table (GiB, against the GPU's capacity) and the fit verdict with reasons.
std::string memory_table(const costmodel::ClusterSpec& cluster, const costmodel::MemoryEstimate& memory);

// "70.55 B" style parameter count.
std::string format_params(double params);

}  // namespace dplan::planner
