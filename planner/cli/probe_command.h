// `dplan probe --import-nccl-tests FILE --cluster BASE [-o profile.json]`: the link tier an
// nccl-tests run exercised, fitted to its measured times (planner/nccl_tests.h), printed against
// the base profile's prediction and written as a cluster profile that --cluster accepts.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "dplan/planner/profiles.h"

namespace dplan::cli {

struct ProbeArgs {
  std::string nccl_tests_path;
  std::string cluster;
  std::string collective;  // empty: from the file
  std::string name;        // of the written profile; empty: BASE-measured
  std::string output;
  double min_size_mib = 1;  // smaller messages run NCCL's LL protocols, which the model lacks
};

void add_probe_options(CLI::App& command, ProbeArgs& args);
// Returns the exit status. Bad input throws InputError.
int run_probe(const ProbeArgs& args, const planner::ProfileStore& store);

}  // namespace dplan::cli
