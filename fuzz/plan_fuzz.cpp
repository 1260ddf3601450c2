// Fuzz target: plan.json (costmodel::plan_from_json), as `dplan run`, `dplan compare` and
// `dplan calibrate` read it. A plan that reads is asked whether the executor runs it, written and
// read back, and compared with a stored run.json of its layout (fuzz::run_like) as `dplan compare`
// does.
#include "dplan/costmodel/executor_support.h"
#include "dplan/planner/compare.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const Plan plan = plan_from_json(fuzz::json_of(data, size), "plan.json");
    executor_refusal(plan.model, plan.training, plan.parallel);
    fuzz::expect_reads_back("plan to_json", [&] { plan_from_json(to_json(plan), "plan.json"); });
    planner::to_json(planner::compare_plan_and_run(plan, "plan.json", fuzz::run_like(plan), "run.json"));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
