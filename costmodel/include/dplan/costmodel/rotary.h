// Rotary position embedding's frequencies (Su et al. 2021, RoFormer, arXiv 2104.09864) at the
// model's base, over its rotary dims (ModelSpec::rotary_width), with the scalings transformers
// applies (5.23, modeling_rope_utils.py: ROPE_INIT_FUNCTIONS), so that the executor's positions are
// those of the Hugging Face model it starts from:
//   linear   position interpolation (Chen et al. 2023, arXiv 2306.15595): every frequency / factor;
//   llama3   Llama 3.1's: wavelengths above original_max_position_embeddings / low_freq_factor
//            divided by factor, below .. / high_freq_factor kept, a smooth blend between;
//   yarn     YaRN (Peng et al. 2023, arXiv 2309.00071): interpolation blended into extrapolation
//            over the correction range of beta_fast .. beta_slow rotations, and cos and sin scaled by
//            the attention factor (0.1 ln(factor) + 1, or DeepSeek's mscale / mscale_all_dim ratio).
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/model.h"

namespace dplan::costmodel {

struct RotaryFrequencies {
  std::vector<double> inv_freq;  // rotary_width / 2 of them
  double attention_scale = 1.0;  // multiplies cos and sin (yarn's attention factor)
};

// The rotary scalings rotary_frequencies computes ("" is the plain one).
const std::vector<std::string>& rotary_scalings();

// Throws InputError naming the parameter for a scaling outside rotary_scalings() or a parameter
// missing or out of range in model.rope_scaling_params.
RotaryFrequencies rotary_frequencies(const ModelSpec& model);

// The attention's softmax scale: 1 / sqrt(head_dim) (the query/key width; MLA's nope + rope dims),
// times DeepSeek's yarn_get_mscale(factor, mscale_all_dim)^2 where its scaled rotary gives
// mscale_all_dim (transformers 5.23 yarn_apply_mscale, in DeepseekV2/V3Attention only).
double softmax_scale(const ModelSpec& model);

}  // namespace dplan::costmodel
