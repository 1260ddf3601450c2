// Loads a Hugging Face checkpoint (hf_checkpoint.h) into one rank's parameters: each parameter's
// global tensor assembled from the checkpoint's tensors (GPT-2's Conv1D weights transposed; q, k and
// v stacked into the fused QKV), converted to fp32 and cut to this rank's slice (GlobalSlice: its tp
// or etp part, its experts, the vocabulary padded), then copied into the parameter's dtype.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "gpt.h"
#include "hf_checkpoint.h"

namespace dplan::executor {

// Throws InputError naming the file if a tensor cannot be read; std::logic_error if a parameter has
// no source in `checkpoint` (the mapping and the model disagree: a bug, not input).
void load_hf_checkpoint(const HfCheckpoint& checkpoint, std::vector<Parameter>& params);

// The inverse: each checkpoint tensor (by its name in the checkpoint, with its stored shape, fp32)
// assembled from the executor's global tensors `global` (by executor name, as a one-rank run holds
// them): the fused QKV split back into q, k and v, transposes undone, stacked experts stacked
// again. gradients: the tensors are gradients (an offset such as LayerNorm1P's does not apply).
std::map<std::string, at::Tensor> to_hf_tensors(const HfCheckpoint& checkpoint,
                                                const std::map<std::string, at::Tensor>& global, bool gradients);

}  // namespace dplan::executor
