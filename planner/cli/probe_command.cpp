#include "probe_command.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/planner/nccl_tests.h"

namespace dplan::cli {
namespace {
using costmodel::ClusterSpec;
using costmodel::Collective;
using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the file (missing or not readable)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Collective collective_from(const std::string& name) {
  for (Collective op : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                        Collective::all_to_all, Collective::send_recv})
    if (name == costmodel::to_string(op)) return op;
  throw InputError("--collective " + name + " is not one of: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv");
}

std::string size_text(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * kMiB) std::snprintf(buf, sizeof buf, "%.0f GiB", bytes / (1024.0 * kMiB));
  else if (bytes >= kMiB) std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / kMiB);
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.0f KiB", bytes / 1024);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

// The fitted figures as they appear in a cluster file, by tier.
json tier_figures(const ClusterSpec& c, const std::string& tier) {
  if (tier == "inter_node")
    return {{"efficiency", c.nic_efficiency_fraction},
            {"half_bandwidth_mib", c.inter_node_half_bandwidth_bytes / kMiB},
            {"latency_us", c.inter_node_latency_s * 1e6}};
  json j = {{"efficiency", c.intra_node.efficiency_fraction},
            {"half_bandwidth_mib", c.intra_node.half_bandwidth_bytes / kMiB},
            {"latency_us", c.intra_node.latency_s * 1e6}};
  if (c.nvls) {
    j["nvls_efficiency"] = c.nvls_efficiency_fraction;
    j["nvls_half_bandwidth_mib"] = c.nvls_half_bandwidth_bytes / kMiB;
  }
  return j;
}

}  // namespace

void add_probe_options(CLI::App& command, ProbeArgs& a) {
  command.add_option("--import-nccl-tests", a.nccl_tests_path,
                     "output of NVIDIA nccl-tests (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
                     "sendrecv_perf) to fit the cluster's link tier to")
      ->required();
  command.add_option("--cluster", a.cluster, "the cluster profile the run was measured on (name or path)")->required();
  command.add_option("--collective", a.collective, "the test's collective, if the file does not name it");
  command.add_option("--min-size-mib", a.min_size_mib,
                     "fit sizes from this many MiB up: NCCL runs smaller messages with its LL protocols, which the cost "
                     "model does not have")
      ->capture_default_str();
  command.add_option("--name", a.name, "name of the written profile (default: <cluster>-measured)");
  command.add_option("-o,--output", a.output, "write the fitted cluster profile here (JSON, for --cluster)");
}

int run_probe(const ProbeArgs& a, const planner::ProfileStore& store) {
  const std::string base_path = store.cluster_path(a.cluster);
  const ClusterSpec base = store.load_cluster(a.cluster);
  std::optional<Collective> op;
  if (!a.collective.empty()) op = collective_from(a.collective);
  if (!(a.min_size_mib >= 0)) throw InputError("--min-size-mib must be 0 or more");
  planner::NcclTestsRun run = planner::parse_nccl_tests(read_text(a.nccl_tests_path), a.nccl_tests_path, op);
  const size_t all_rows = run.rows.size();
  std::erase_if(run.rows, [&](const planner::NcclTestsRow& r) { return r.bytes < a.min_size_mib * kMiB; });
  if (run.rows.empty())
    throw InputError(a.nccl_tests_path + ": no sizes of " + std::to_string(a.min_size_mib) +
                     " MiB or more; lower --min-size-mib");
  const planner::TierFit fit = planner::fit_link_tier(base, run);

  std::printf("%s: %s, %d ranks on %d node%s, %zu sizes %s..%s%s\n", a.nccl_tests_path.c_str(),
              costmodel::to_string(run.collective), run.ranks, run.nodes, run.nodes == 1 ? "" : "s", run.rows.size(),
              size_text(run.rows.front().bytes).c_str(), size_text(run.rows.back().bytes).c_str(),
              all_rows > run.rows.size() ? (" (" + std::to_string(all_rows - run.rows.size()) + " below --min-size-mib left out)").c_str() : "");
  if (run.skipped_rows) std::printf("%d rows skipped: size 0 or wrong values\n", run.skipped_rows);
  std::printf("fitted %s of %s by least squares on log time:\n", fit.tier.c_str(), base.name.c_str());
  const json before = tier_figures(base, fit.tier), after = tier_figures(fit.cluster, fit.tier);
  for (const auto& [key, value] : after.items())
    std::printf("  %-24s %12.4g -> %.4g\n", key.c_str(), before[key].get<double>(), value.get<double>());
  std::printf("\n%10s %14s %14s %8s %14s %8s\n", "size", "measured (us)", "before (us)", "error", "after (us)", "error");
  for (const auto& r : fit.rows)
    std::printf("%10s %14.1f %14.1f %+7.1f%% %14.1f %+7.1f%%\n", size_text(r.bytes).c_str(), r.measured_s * 1e6,
                r.before_s * 1e6, 100 * (r.before_s / r.measured_s - 1), r.after_s * 1e6,
                100 * (r.after_s / r.measured_s - 1));
  std::printf("rms log error: %.3f before, %.3f after\n", fit.rms_log_error_before, fit.rms_log_error_after);

  if (a.output.empty()) {
    std::printf("(no -o: the fitted profile is not written)\n");
    return 0;
  }
  // The base file with the fitted figures and their source, so everything else keeps its own.
  json profile = read_json_file(base_path);
  json& cluster = profile.at("cluster");
  cluster["name"] = a.name.empty() ? base.name + "-measured" : a.name;
  json& tier = cluster.at(fit.tier);
  for (const auto& [key, value] : after.items()) tier[key] = value;
  char source[512];
  std::snprintf(source, sizeof source,
                "fitted by dplan probe --import-nccl-tests to %s (%s, %d ranks, %d nodes, %zu sizes; rms log error of "
                "the time %.3f before, %.3f after); the rest: ",
                a.nccl_tests_path.c_str(), costmodel::to_string(run.collective), run.ranks, run.nodes, run.rows.size(),
                fit.rms_log_error_before, fit.rms_log_error_after);
  tier["source"] = std::string(source) + tier.value("source", std::string());
  costmodel::cluster_from_json(profile, a.output, [&](const std::string& gpu) { return store.load_gpu(gpu); });
  write_file_atomically(a.output, profile.dump(2) + "\n");
  std::printf("wrote %s (cluster \"%s\"; use --cluster %s)\n", a.output.c_str(), cluster["name"].get<std::string>().c_str(),
              a.output.c_str());
  return 0;
}

}  // namespace dplan::cli
