// `dplan calibrate RUN.json... --profile CLUSTER [-o CLUSTER2]`: the profile's efficiency figures
// fitted to measured runs (planner/calibrate.h); prints each run's error before and after, and
// writes the fitted cluster (and its GPU) with the runs it was fitted on in their sources.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dplan/planner/profiles.h"

namespace dplan::cli {

struct CalibrateArgs {
  std::vector<std::string> runs;
  std::string profile;
  std::string name;  // empty: <profile>-calibrated
  std::string output;
  bool force = false;  // -o may replace a file dplan did not write
};

void add_calibrate_options(CLI::App& command, CalibrateArgs& args);
int run_calibrate(const CalibrateArgs& args, const planner::ProfileStore& store);

}  // namespace dplan::cli
