// NVIDIA nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf,
// sendrecv_perf: the numbers users already have for their cluster) read into dplan's network
// model: `dplan probe --import-nccl-tests FILE --cluster BASE` fits the link tier the run
// exercised (inside one node: the NVLink/PCIe tier; across nodes: the NICs) so that the cost
// model's collective time (costmodel/src/collectives.cpp) reproduces the measured times, and
// writes BASE's profile with those figures.
//
// Output format (nccl-tests README, doc/PERFORMANCE.md, src/util.cu writeResultHeader):
// "#  Rank  r Group g Pid p on HOST device d ..." lines name the ranks and their hosts; each
// result row is `size count type redop root time algbw busbw #wrong` out-of-place, then the same
// four in-place; time in microseconds, bandwidths in GB/s (1e9 B/s). Newer versions print
// "# Collective test starting: all_reduce_perf".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/network.h"

namespace dplan::planner {

struct NcclTestsRow {
  double bytes = 0;     // the size column: the buffer as nccl-tests counts it (network.h's `bytes`)
  double time_s = 0;    // out-of-place
  double busbw_bytes_per_s = 0;
};

struct NcclTestsRun {
  std::string file;
  costmodel::Collective collective = costmodel::Collective::all_reduce;
  int ranks = 0;
  int nodes = 0;  // distinct hosts of the rank lines
  std::vector<NcclTestsRow> rows;  // sizes > 0 with no wrong values, in file order
  int skipped_rows = 0;            // rows with #wrong > 0 or size 0
};

// Parses nccl-tests text. `collective` overrides (or supplies) the test's collective. Throws
// InputError naming the file and the problem (no rank lines, no result rows, an unknown test).
NcclTestsRun parse_nccl_tests(const std::string& text, const std::string& file,
                              std::optional<costmodel::Collective> collective = std::nullopt);

struct TierFitRow {
  double bytes = 0, measured_s = 0, before_s = 0, after_s = 0;
};

struct TierFit {
  costmodel::ClusterSpec cluster;  // the base with the fitted tier
  std::string tier;                // "intra_node" or "inter_node"
  std::vector<std::string> parameters;  // what was fitted, e.g. "intra_node.efficiency"
  std::vector<TierFitRow> rows;
  double rms_log_error_before = 0, rms_log_error_after = 0;  // sqrt(mean(ln(model / measured)^2))
};

// Least squares on log time over the run's rows: a single-node run fits the intra-node tier's
// efficiency, half-bandwidth size and per-hop latency (and NVLS's efficiency and half size for an
// all-reduce on a cluster with NVLS); a multi-node run fits the NICs' efficiency, half size and
// latency, the intra-node tier kept. The run's ranks must fit the base's nodes (ranks / nodes ==
// gpus_per_node across nodes, at most gpus_per_node on one). Throws InputError when they do not,
// or when there are fewer rows than parameters (the fit would be underdetermined).
TierFit fit_link_tier(const costmodel::ClusterSpec& base, const NcclTestsRun& run);

}  // namespace dplan::planner
