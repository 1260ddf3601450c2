// Fuzz target: a cluster profile ({"format_version": 1, "cluster": {...}},
// costmodel::cluster_from_json); its "gpu" resolves to a fixed GPU profile (fuzz::gpu_named). A
// cluster that reads has a small model estimated on it: one node and two, 1F1B and interleaved.
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const ClusterSpec cluster = cluster_from_json(fuzz::json_of(data, size), "cluster.json", fuzz::gpu_named);
    fuzz::check_finite(cluster, "cluster_from_json");
    fuzz::estimate_layouts(fuzz::small_model(), cluster);
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
