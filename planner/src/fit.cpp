#include "fit.h"

#include <algorithm>
#include <cmath>

#include <boost/math/tools/minima.hpp>

namespace dplan::planner::detail {

std::vector<double> minimize_in_box(const std::function<double(const std::vector<double>&)>& error,
                                    std::vector<double> start, const std::vector<Bounds>& bounds,
                                    const SearchEffort& effort) {
  std::vector<double> x;  // logs
  for (size_t i = 0; i < start.size(); ++i) x.push_back(std::log(std::clamp(start[i], bounds[i].lo, bounds[i].hi)));
  auto at = [&](const std::vector<double>& logs) {
    std::vector<double> v;
    for (double l : logs) v.push_back(std::exp(l));
    return error(v);
  };
  double best = at(x);
  for (int sweep = 0; sweep < effort.sweeps; ++sweep) {
    const double before = best;
    for (size_t i = 0; i < x.size(); ++i) {
      auto along = [&](double value) {
        std::vector<double> v = x;
        v[i] = value;
        return at(v);
      };
      // The error need not be unimodal along one parameter (the model takes the fastest of ring,
      // tree and NVLS): a coarse scan picks the basin, Brent's method refines inside it.
      const int kGrid = effort.grid;
      const double lo = std::log(bounds[i].lo), hi = std::log(bounds[i].hi), step = (hi - lo) / kGrid;
      int best_k = 0;
      double best_grid = along(lo);
      for (int k = 1; k <= kGrid; ++k) {
        const double e = along(lo + k * step);
        if (e < best_grid) {
          best_grid = e;
          best_k = k;
        }
      }
      std::uintmax_t iterations = effort.brent_iterations;
      auto [value, err] = boost::math::tools::brent_find_minima(along, lo + std::max(0, best_k - 1) * step,
                                                                lo + std::min(kGrid, best_k + 1) * step,
                                                                effort.brent_bits, iterations);
      if (err < best) {
        best = err;
        x[i] = value;
      }
    }
    if (before - best < 1e-9) break;
  }
  for (double& l : x) l = std::exp(l);
  return x;
}

double rms_log_error(const std::vector<double>& model, const std::vector<double>& measured) {
  double sum = 0;
  for (size_t i = 0; i < model.size(); ++i) sum += std::pow(std::log(model[i] / measured[i]), 2);
  return std::sqrt(sum / model.size());
}

costmodel::ClusterSpec fit_cluster(const costmodel::ClusterSpec& base, const std::vector<ClusterParameter>& params,
                                   const std::function<double(const costmodel::ClusterSpec&)>& error) {
  costmodel::ClusterSpec c = base;
  std::vector<double> start;
  std::vector<Bounds> bounds;
  for (const auto& p : params) {
    start.push_back(p.ref(c));
    bounds.push_back(p.bounds);
  }
  auto with = [&](const std::vector<double>& v) {
    costmodel::ClusterSpec trial = base;
    for (size_t i = 0; i < params.size(); ++i) params[i].ref(trial) = v[i];
    return trial;
  };
  return with(minimize_in_box([&](const std::vector<double>& v) { return error(with(v)); }, start, bounds));
}

}  // namespace dplan::planner::detail
