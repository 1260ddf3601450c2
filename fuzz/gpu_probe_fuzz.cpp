// Fuzz target: what dplan-gpu-probe or dplan-worker --probe wrote (planner::parse_gpu_probe), as
// `dplan probe --import-gpu-probe FILE --cluster BASE` reads it, and the import past the parser
// (planner/cli/probe_command.cpp, import_gpu_probe): the GEMMs fitted to the base's GPU
// (planner::fit_gpu), the fitted figures put into the base's GPU file, which must read back
// (gpu_from_json), and the cluster file beside it (cores, lone-rank speed-up and overlap as the
// import sets them) must read back too and have a small model estimated on it. BASE is dgx-h100
// for inputs of odd length, local-cpu for even ones.
#include "dplan/costmodel/profile_edit.h"
#include "dplan/planner/gpu_probe.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string base = size % 2 ? "dgx-h100" : "local-cpu";
  fuzz::run_one([&] {
    const planner::GpuProbe probe = planner::parse_gpu_probe(fuzz::json_of(data, size), "gpu-probe.json");
    const ClusterSpec& cluster = fuzz::fixed_cluster(base);
    const planner::GpuFit fit = planner::fit_gpu(cluster.gpu, probe);
    fuzz::check_finite(fit.gpu, "fit_gpu on " + base);
    json file = fuzz::fixed_gpu_file_of_cluster(base);
    put_figures(file.at("gpu"), pick_figures(to_json(fit.gpu), {"matmul.max_efficiency", "matmul.sm_count",
                                                                "matmul.kernel_overhead_us", "matmul.measured",
                                                                "memory_efficiency", "sustained_fraction"}));
    GpuSpec gpu;
    fuzz::expect_reads_back("the GPU file dplan probe writes from a fit on " + base,
                            [&] { gpu = gpu_from_json(file, "gpu.json"); });
    // The cluster file beside it: this machine's cores, a lone rank's speed-up, the overlap measured.
    json profile = fuzz::fixed_cluster_file(base);
    json& c = profile.at("cluster");
    c["gpu"] = "gpu.json";
    if (probe.cores > 0) c["cores_per_node"] = probe.cores;
    if (probe.cores > 0 && probe.lone_rank_speedup > 0)
      c["lone_rank_speedup"] = {{"factor", probe.lone_rank_speedup}, {"source", "fuzz"}};
    if (probe.overlap_fraction >= 0) c["comm_overlap"] = {{"fraction", probe.overlap_fraction}, {"source", "fuzz"}};
    ClusterSpec measured;
    fuzz::expect_reads_back("the cluster file dplan probe writes from a fit on " + base, [&] {
      measured = cluster_from_json(profile, "cluster.json", [&](const std::string&) { return gpu; });
    });
    fuzz::estimate_layouts(fuzz::small_model(), measured);
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
