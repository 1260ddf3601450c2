// The layout `dplan --model M --gpus N` reports until the search lands: tensor parallel inside a
// node (largest divisor of the heads up to the node size), then the fewest pipeline stages that
// fit in memory, data parallel over the rest; 1F1B, micro-batch 1, selective recompute,
// sequence parallel when tp > 1.
#pragma once

#include "dplan/costmodel/memory.h"

namespace dplan::planner {

struct DefaultLayout {
  costmodel::ParallelConfig parallel;
  costmodel::TrainingSpec training;   // global batch rounded to a multiple of micro_batch * dp
  costmodel::MemoryEstimate memory;
};

// Global batch (sequences) closest to `tokens` tokens that is a multiple of `multiple`, >= multiple.
int global_batch_for_tokens(double tokens, int seq_len, int multiple);

// Throws InputError if no layout of this shape exists for `gpus` (e.g. a prime GPU count larger
// than the layer count).
DefaultLayout default_layout(const costmodel::ModelSpec& model, const costmodel::ClusterSpec& cluster,
                             const costmodel::TrainingSpec& training, int gpus, double tokens_per_batch);

}  // namespace dplan::planner
