// `dplan calibrate RUN... --profile CLUSTER [--plan PLAN]... [--format F] [-o CLUSTER2]`: the
// profile's efficiency figures fitted to measured runs (planner/calibrate.h); a RUN is a run.json
// (it names its plan) or an engine's training log (its plan by --plan: one for all logs, or one
// per log in order). Prints each run's error before and after, and writes the fitted cluster (and
// its GPU) with the runs it was fitted on in their sources.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dplan/planner/profiles.h"

namespace dplan::cli {

struct CalibrateArgs {
  std::vector<std::string> runs;
  std::vector<std::string> plans;  // --plan: the plans the engine logs ran
  std::string format;              // --format: empty = told by content
  std::string profile;
  std::string name;  // empty: <profile>-calibrated
  std::string output;
  bool force = false;  // -o may replace a file dplan did not write
};

void add_calibrate_options(CLI::App& command, CalibrateArgs& args);
int run_calibrate(const CalibrateArgs& args, const planner::ProfileStore& store);

}  // namespace dplan::cli
