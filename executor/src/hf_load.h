// Loads a Hugging Face checkpoint (hf_checkpoint.h) into one rank's parameters: each parameter's
// global tensor assembled from the checkpoint's tensors (GPT-2's Conv1D weights transposed; q, k and
// v stacked into the fused QKV), converted to fp32 and cut to this rank's slice (GlobalSlice: its tp
// or etp part, its experts, the vocabulary padded), then copied into the parameter's dtype.
#pragma once

#include <vector>

#include "gpt.h"
#include "hf_checkpoint.h"

namespace dplan::executor {

// Throws InputError naming the file if a tensor cannot be read; std::logic_error if a parameter has
// no source in `checkpoint` (the mapping and the model disagree: a bug, not input).
void load_hf_checkpoint(const HfCheckpoint& checkpoint, std::vector<Parameter>& params);

}  // namespace dplan::executor
