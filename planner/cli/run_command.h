// `dplan run plan.json [--steps N] [--data FILE] [--seed S] [-o run.json]`: the local launcher.
// Spawns the plan's ranks of the executor (dplan-worker) on this machine with a TCPStore
// rendezvous on loopback, watches them, and returns non-zero when any rank fails.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dplan::cli {

struct RunArgs {
  std::string plan_path;
  std::vector<std::string> worker_args;  // passed through to every rank
  int port = 0;                          // 0: pick a free loopback port
  double timeout_s = 60;                 // collective timeout; a dead rank is reported within it
};

void add_run_options(CLI::App& command, RunArgs& args);
int run_run(const RunArgs& args);

}  // namespace dplan::cli
