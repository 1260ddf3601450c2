// `dplan compare plan.json RUN [--format F] [--json]`: the plan's prediction next to what the
// executor measured (run.json) or an engine logged (engine_logs.h), phase by phase and for
// memory where measured, with the relative error of each.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace dplan::cli {

struct CompareArgs {
  std::string plan_path;
  std::string run_path;
  std::string format;  // --format: empty = told by content
  bool json = false;
};

void add_compare_options(CLI::App& command, CompareArgs& args);
// Prints the comparison; returns the exit status. Bad input throws costmodel::InputError.
int run_compare(const CompareArgs& args);

}  // namespace dplan::cli
