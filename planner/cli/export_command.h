// `dplan export PLAN --to ENGINE [-o DIR] [--force]`: the plan as the engine's own files (after its
// rules pass), and `dplan check PLAN --engine ENGINE`: those rules alone, one line per failure.
// planner/include/dplan/planner/export.h and engine_rules.h do the work; docs/export.md maps each
// plan item to each engine.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace dplan::cli {

struct ExportArgs {
  std::string plan_path;
  std::string engine;
  std::string output;  // the folder; default <plan stem>-<engine> beside the plan
  bool force = false;
};

void add_export_options(CLI::App& command, ExportArgs& args);
// Writes the files and prints them with the launch line: 0. A failed rule or a feature the engine
// cannot express: one "dplan: error: ..." line each on stderr, nothing written, 2. Other bad input
// throws InputError.
int run_export(const ExportArgs& args);

struct CheckArgs {
  std::string plan_path;
  std::string engine;
};

void add_check_options(CLI::App& command, CheckArgs& args);
// One line per failed rule on stdout and 1, or one "ok" line and 0. Bad input throws InputError.
int run_check(const CheckArgs& args);

}  // namespace dplan::cli
