// Fuzz target: `dplan probe --import-nccl-tests FILE --cluster BASE` past the parser
// (planner/cli/probe_command.cpp, import_nccl_tests): a run that parses has its timings kept in the
// base's intra-node tier (one host), its sizes below the import's --min-size-mib left out, the tier
// it exercised fitted (planner::fit_link_tier), and the fitted figures put into the base's cluster
// file, which must read back (cluster_from_json) and have a small model estimated on it. BASE is
// dgx-h100 (NVLS, --min-size-mib 1) for inputs of odd length, local-cpu (ranks sharing two cores,
// --min-size-mib 0 as for a CPU probe) for even ones.
#include "dplan/costmodel/profile_edit.h"
#include "dplan/costmodel/units.h"
#include "dplan/planner/nccl_tests.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string base = size % 2 ? "dgx-h100" : "local-cpu";
  const double min_size_bytes = size % 2 ? kMiB : 0;
  fuzz::run_one([&] {
    planner::NcclTestsRun run = planner::parse_nccl_tests(fuzz::text_of(data, size), "nccl-tests.txt");
    json profile = fuzz::fixed_cluster_file(base);
    json& intra = profile.at("cluster").at("intra_node");
    if (run.nodes == 1) {  // keep_measured: replaces the rows of this collective and group size
      json measured = json::array();
      for (const json& row : intra.value("measured", json::array()))
        if (!(row.at("collective") == to_string(run.collective) && row.at("ranks") == run.ranks))
          measured.push_back(row);
      std::vector<MeasuredCollective> rows;
      for (const auto& r : run.rows) rows.push_back({run.collective, run.ranks, r.bytes, r.time_s});
      for (const json& row : to_json(rows)) measured.push_back(row);
      intra["measured"] = measured;
    }
    std::erase_if(run.rows, [&](const planner::NcclTestsRow& r) { return r.bytes < min_size_bytes; });
    if (run.rows.empty()) return;  // the import's InputError: no sizes of --min-size-mib or more
    const planner::TierFit fit = planner::fit_link_tier(fuzz::fixed_cluster(base), run);
    fuzz::check_finite(fit.cluster, "fit_link_tier on " + base);
    std::vector<std::string> keys = {"efficiency", "half_bandwidth_mib", "latency_us"};
    if (fit.tier != "inter_node" && fit.cluster.nvls) keys.insert(keys.end(), {"nvls_efficiency", "nvls_half_bandwidth_mib"});
    put_figures(profile.at("cluster").at(fit.tier), pick_figures(to_json(fit.cluster).at(fit.tier), keys));
    ClusterSpec written;
    fuzz::expect_reads_back("the cluster file dplan probe writes from a fit on " + base, [&] {
      written = cluster_from_json(profile, "cluster.json", fuzz::gpu_named);
    });
    fuzz::estimate_layouts(fuzz::small_model(), written);
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_lines)
