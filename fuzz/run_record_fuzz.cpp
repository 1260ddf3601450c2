// Fuzz target: run.json (costmodel::run_record_from_json), as `dplan compare` and `dplan calibrate`
// read it. A record that reads is written and read back, and compared with a stored plan.json of
// its layout (fuzz::plan_like) as `dplan compare` does.
#include "dplan/planner/compare.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;
using namespace dplan::costmodel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const RunRecord run = run_record_from_json(fuzz::json_of(data, size), "run.json");
    fuzz::expect_reads_back("run record to_json", [&] { run_record_from_json(to_json(run), "run.json"); });
    planner::to_json(planner::compare_plan_and_run(fuzz::plan_like(run), "plan.json", run, "run.json"));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_json)
