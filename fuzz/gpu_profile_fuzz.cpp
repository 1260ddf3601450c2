// Fuzz target: a GPU profile ({"format_version": 1, "gpu": {...}}, costmodel::gpu_from_json). A
// GPU that reads is put into two fixed clusters, dedicated GPUs (dgx-h100) and ranks sharing a
// machine's cores (local-cpu: the pipeline play-out), and a small model estimated on each.
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const GpuSpec gpu = gpu_from_json(fuzz::json_of(data, size), "gpu.json");
    fuzz::check_finite(gpu, "gpu_from_json");
    fuzz::expect_reads_back("GPU to_json", [&] {
      gpu_from_json(json{{"format_version", 1}, {"gpu", to_json(gpu)}}, "gpu.json");
    });
    fuzz::estimate_layouts(fuzz::small_model(), fuzz::with_gpu(fuzz::fixed_cluster("dgx-h100"), gpu));
    fuzz::estimate_layouts(fuzz::small_model(), fuzz::with_gpu(fuzz::fixed_cluster("local-cpu"), gpu));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
