// A table of dplan's figures against measurements, printed in Markdown and held to bounds: each
// row to its own bound on |dplan / measured - 1| (a known miss carries a looser one, marked "miss"
// in the table, so that a change making it worse still fails), and the mean to the table's bound.
// Shared by the component tests and the memory tests against measured values.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace dplan::testing {

// One printed and checked row: dplan's figure, the measurement, and the bound on |error|.
struct Compared {
  std::string label;
  double dplan = 0, measured = 0;
  double bound_fraction = 0;  // |dplan / measured - 1| must stay within this
  bool miss = false;          // a known miss: bound looser than the case's own
  double error() const { return dplan / measured - 1; }
};

// Prints `rows` as a Markdown table and checks each row's bound and the mean |error|.
inline void report(const std::string& title, const std::string& unit, const std::vector<Compared>& rows,
                   double mean_bound_fraction) {
  REQUIRE(!rows.empty());
  std::printf("\n### %s\n\n| inputs | dplan (%s) | measured (%s) | error | bound |\n|---|---:|---:|---:|---:|\n",
              title.c_str(), unit.c_str(), unit.c_str());
  double sum = 0;
  for (const Compared& r : rows) {
    std::printf("| %s | %.4g | %.4g | %+.1f %% | %s%.0f %% |\n", r.label.c_str(), r.dplan, r.measured, 100 * r.error(),
                r.miss ? "miss, " : "", 100 * r.bound_fraction);
    sum += std::abs(r.error());
  }
  const double mean = sum / rows.size();
  std::printf("\nmean |error| %.1f %% over %zu rows (bound %.0f %%)\n", 100 * mean, rows.size(),
              100 * mean_bound_fraction);
  for (const Compared& r : rows) {
    INFO(title << ": " << r.label << ": dplan " << r.dplan << ", measured " << r.measured);
    CHECK(std::isfinite(r.dplan));
    CHECK(std::abs(r.error()) <= r.bound_fraction);
  }
  INFO(title);
  CHECK(mean <= mean_bound_fraction);
}

}  // namespace dplan::testing
