#include "dplan/costmodel/rotary.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {
namespace {

// One of the scaling's parameters: a number, `otherwise` where absent (NaN: required).
double param(const ModelSpec& m, const char* key, double otherwise) {
  const json& p = m.rope_scaling_params;
  if (!p.contains(key) || p[key].is_null()) {
    if (std::isnan(otherwise))
      throw InputError("the " + m.rope_scaling + " rotary scaling needs \"" + key + "\" (rope_scaling)");
    return otherwise;
  }
  if (!p[key].is_number() || !std::isfinite(p[key].get<double>()))
    throw InputError("rope_scaling/" + std::string(key) + ": expected a number");
  return p[key].get<double>();
}

constexpr double kRequired = std::numeric_limits<double>::quiet_NaN();
constexpr double kPi = 3.14159265358979323846;

// yarn_get_mscale: the attention temperature's correction for a context `scale` times longer.
double get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// _compute_llama3_parameters.
void llama3(const ModelSpec& m, std::vector<double>& inv) {
  const double factor = param(m, "factor", kRequired), low = param(m, "low_freq_factor", kRequired),
               high = param(m, "high_freq_factor", kRequired);
  const double old_len = param(m, "original_max_position_embeddings", m.max_seq_len);
  if (!(factor > 0) || !(high > low)) throw InputError("rope_scaling: llama3 needs factor > 0 and high_freq_factor > low_freq_factor");
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  for (double& f : inv) {
    const double wavelen = 2 * kPi / f;
    const double scaled = wavelen > low_wavelen ? f / factor : f;
    const double smooth = (old_len / wavelen - low) / (high - low);
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) f = (1 - smooth) * scaled / factor + smooth * scaled;
    else f = scaled;
  }
}

// _compute_yarn_parameters.
double yarn(const ModelSpec& m, std::vector<double>& inv) {
  const double dim = m.rotary_width(), base = m.rope_theta;
  const double original = param(m, "original_max_position_embeddings", m.max_seq_len);
  const double factor = param(m, "factor", m.max_seq_len / original);
  const double mscale = param(m, "mscale", 0), mscale_all_dim = param(m, "mscale_all_dim", 0);
  double attention = param(m, "attention_factor", 0);
  if (attention == 0)
    attention = mscale != 0 && mscale_all_dim != 0 ? get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                                                   : get_mscale(factor, 1);
  const double beta_fast = param(m, "beta_fast", 32), beta_slow = param(m, "beta_slow", 1);
  const json& p = m.rope_scaling_params;
  const bool truncate = !p.contains("truncate") || !p["truncate"].is_boolean() || p["truncate"].get<bool>();
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * kPi)) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1 - ramp;  // share of the unscaled frequency
    inv[i] = inv[i] / factor * (1 - extrapolation) + inv[i] * extrapolation;
  }
  return attention;
}

}  // namespace

const std::vector<std::string>& rotary_scalings() {
  static const std::vector<std::string> names = {"", "linear", "llama3", "yarn"};
  return names;
}

RotaryFrequencies rotary_frequencies(const ModelSpec& m) {
  RotaryFrequencies out;
  const int d = m.rotary_width();
  for (int i = 0; i < d; i += 2) out.inv_freq.push_back(1.0 / std::pow(m.rope_theta, double(i) / d));
  if (m.rope_scaling.empty()) return out;
  if (m.rope_scaling == "linear") {
    const double factor = param(m, "factor", kRequired);
    if (!(factor > 0)) throw InputError("rope_scaling/factor: expected a number above 0");
    for (double& f : out.inv_freq) f /= factor;
  } else if (m.rope_scaling == "llama3") {
    llama3(m, out.inv_freq);
  } else if (m.rope_scaling == "yarn") {
    out.attention_scale = yarn(m, out.inv_freq);
  } else {
    std::string valid;
    for (const std::string& s : rotary_scalings()) valid += s.empty() ? "" : (valid.empty() ? "" : ", ") + s;
    throw InputError("the " + m.rope_scaling + " rotary scaling is not computed; computed: " + valid);
  }
  return out;
}

double softmax_scale(const ModelSpec& m) {
  double scale = 1.0 / std::sqrt(double(m.head_dim));
  if (m.is_mla() && !m.rope_scaling.empty()) {  // DeepSeek's attention, the one that applies it
    const double all_dim = param(m, "mscale_all_dim", 0);
    if (all_dim != 0) {
      const double mscale = get_mscale(param(m, "factor", kRequired), all_dim);
      scale *= mscale * mscale;
    }
  }
  return scale;
}

}  // namespace dplan::costmodel
