// `dplan probe`: a profile fitted to measurements.
//   --import-nccl-tests FILE --cluster BASE [-o cluster.json]: the link tier an nccl-tests run
//     exercised (planner/nccl_tests.h), written as BASE's cluster profile with those figures.
//   --import-gpu-probe FILE --cluster BASE [-o cluster.json]: dplan-gpu-probe's GEMMs and copy
//     bandwidth fitted into BASE's GPU profile (planner/gpu_probe.h), written beside the cluster
//     as <cluster>-gpu.json, and its NCCL all-reduce sweep (if it ran on 2+ GPUs) fitted into
//     the intra-node tier.
//   neither, --cluster BASE [--ranks N] -o cluster.json: measures this machine first with N local
//     ranks of `dplan-worker --probe` (LibTorch GEMMs, copy bandwidth, Gloo collectives; written as
//     <cluster>-probe.json beside the output), then imports that as a probe file.
// Each prints the measurements against the base profile's prediction and the fitted one.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "dplan/planner/profiles.h"

namespace dplan::cli {

struct ProbeArgs {
  std::string nccl_tests_path;
  std::string gpu_probe_path;
  std::string cluster;
  std::string collective;  // empty: from the file
  std::string name;        // of the written profile; empty: BASE-measured
  std::string output;
  // Collective sizes fitted: NCCL runs smaller messages than 1 MiB with its LL
  // protocols, which the model lacks; Gloo (a CPU probe) has one protocol at
  // every size. Negative: 1 for NCCL, 0 for Gloo.
  double min_size_mib = -1;
  int ranks = 0;  // measuring this machine: local ranks (0: the number of cores,
                  // at least 2)
  double timeout_s = 120;
  bool force = false;  // -o may replace files dplan did not write
};

void add_probe_options(CLI::App& command, ProbeArgs& args);
// Returns the exit status. Bad input throws InputError.
int run_probe(const ProbeArgs& args, const planner::ProfileStore& store);

}  // namespace dplan::cli
