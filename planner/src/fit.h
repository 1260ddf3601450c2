// Least squares for the probe fits: minimise an error over a few positive parameters, each kept
// in [lo, hi] and searched on its logarithm, by coordinate descent: per coordinate a coarse scan,
// then Brent's method (boost::math::tools::brent_find_minima) in the best basin, until a sweep
// stops improving.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"

namespace dplan::planner::detail {

struct Bounds {
  double lo, hi;
};

// How hard minimize_in_box searches: sweeps over the coordinates (it stops earlier when a sweep
// stops improving), points of the coarse scan per coordinate, and Brent's precision (bits of the
// logarithm) and iterations.
struct SearchEffort {
  int sweeps = 30;
  int grid = 24;
  int brent_bits = 40;
  std::uintmax_t brent_iterations = 200;
};

// `error` takes the parameters themselves (not their logs); `start` is clamped into the bounds.
// Returns the best parameters found.
std::vector<double> minimize_in_box(const std::function<double(const std::vector<double>&)>& error,
                                    std::vector<double> start, const std::vector<Bounds>& bounds,
                                    const SearchEffort& effort = {});

// sqrt(mean(ln(model / measured)^2)): the error every probe fit and calibration minimises.
double rms_log_error(const std::vector<double>& model, const std::vector<double>& measured);

// One figure of a cluster profile to fit.
struct ClusterParameter {
  std::string name;
  std::function<double&(costmodel::ClusterSpec&)> ref;
  Bounds bounds;
};

// `base` with the values of `params` that minimise `error` (of a candidate cluster), searched from
// base's own values.
costmodel::ClusterSpec fit_cluster(const costmodel::ClusterSpec& base, const std::vector<ClusterParameter>& params,
                                   const std::function<double(const costmodel::ClusterSpec&)>& error);

}  // namespace dplan::planner::detail
