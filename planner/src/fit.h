// Least squares for the probe fits: minimise an error over a few positive parameters, each kept
// in [lo, hi] and searched on its logarithm, by coordinate descent: per coordinate a coarse scan,
// then Brent's method (boost::math::tools::brent_find_minima) in the best basin, until a sweep
// stops improving.
#pragma once

#include <functional>
#include <vector>

namespace dplan::planner::detail {

struct Bounds {
  double lo, hi;
};

// `error` takes the parameters themselves (not their logs); `start` is clamped into the bounds.
// Returns the best parameters found.
std::vector<double> minimize_in_box(const std::function<double(const std::vector<double>&)>& error,
                                    std::vector<double> start, const std::vector<Bounds>& bounds);

}  // namespace dplan::planner::detail
