// Fuzz target: a Hugging Face config.json (costmodel::model_from_hf_config), as `dplan --model
// config.json` reads it. A model that reads is estimated on a fixed cluster and must survive
// dplan's own model JSON (the form plan.json carries).
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const ModelSpec model = model_from_hf_config(fuzz::json_of(data, size), "config.json", "fuzzed");
    num_params(model);
    num_active_params(model);
    fuzz::expect_reads_back("model to_json", [&] { model_from_json(to_json(model), "plan.json", "/model"); });
    fuzz::estimate_layouts(model, fuzz::fixed_cluster("dgx-h100"));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
