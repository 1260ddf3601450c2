// What dplan's executor (dplan run) trains, in one place: the plan reader refuses everything else
// up front rather than run it differently, and `dplan --runnable` searches only what it accepts.
#pragma once

#include <optional>
#include <string>

#include "dplan/costmodel/model.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Why the executor does not run this model, training spec and layout (a sentence without the
// file name, e.g. "the executor does not run the interleaved schedule yet; it runs ..."), or
// nullopt when it runs it.
std::optional<std::string> executor_refusal(const ModelSpec& model, const TrainingSpec& training,
                                            const ParallelConfig& parallel);

// The GELU a plain MLP's activation names, as ATen's gelu approximation: "none" (erf: gelu,
// gelu_python) or "tanh" (gelu_new, gelu_pytorch_tanh, gelu_fast: the same formula,
// transformers' activations.py); nullopt for any other activation.
std::optional<std::string> gelu_approximation(const std::string& activation);

// Whether the executor runs a plain (ungated) MLP with this activation: the GELUs above, relu and
// relu2 (squared ReLU, Nemotron's).
bool runs_plain_activation(const std::string& activation);

// "the executor does not run <what> yet; it runs <what it runs> (dplan --runnable searches only
// those)": the sentence for a feature the executor lacks.
std::string executor_does_not_run(const std::string& what);

}  // namespace dplan::costmodel
