// `dplan explain plan.json [--headroom F] [--cluster NAME] [--top N] [--json]`: why the plan's MFU
// is what it is (the step against its ideal, as named losses) and the few changes that recover the
// most, each re-estimated. The plan is re-estimated from its model, cluster, training and layout;
// its stored prediction is only compared with that.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "dplan/costmodel/memory.h"
#include "dplan/planner/profiles.h"

namespace dplan::cli {

struct ExplainArgs {
  std::string plan_path;
  std::optional<std::string> cluster;  // default: the profile of the name the plan records
  double headroom_fraction = costmodel::kDefaultHeadroomFraction;
  int top = 5;
  bool json = false;
};

void add_explain_options(CLI::App& command, ExplainArgs& args);
// Prints the explanation; returns the exit status. Bad input throws costmodel::InputError.
int run_explain(const ExplainArgs& args, const planner::ProfileStore& store);

}  // namespace dplan::cli
