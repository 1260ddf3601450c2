// Fuzz target: nccl-tests output (planner::parse_nccl_tests, text), as `dplan probe
// --import-nccl-tests FILE` reads it. What it returns must keep the header's promise: rows of a
// positive, finite size and time, from 1 or more ranks on 1 or more hosts. The fit the import runs
// next is nccl_import_fuzz's (it takes a tenth of a second a run, this a millisecond).
#include <cmath>

#include "dplan/planner/nccl_tests.h"
#include "mutators.h"
#include "support.h"

using namespace dplan;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const planner::NcclTestsRun run = planner::parse_nccl_tests(fuzz::text_of(data, size), "nccl-tests.txt");
    if (run.ranks < 1 || run.nodes < 1 || run.nodes > run.ranks || run.rows.empty())
      fuzz::finding("parse_nccl_tests: " + std::to_string(run.ranks) + " ranks on " + std::to_string(run.nodes) +
                    " hosts, " + std::to_string(run.rows.size()) + " rows");
    for (const planner::NcclTestsRow& row : run.rows)
      if (!(std::isfinite(row.bytes) && row.bytes > 0 && std::isfinite(row.time_s) && row.time_s > 0 &&
            std::isfinite(row.busbw_bytes_per_s)))
        fuzz::finding("parse_nccl_tests: a row of " + std::to_string(row.bytes) + " bytes in " +
                      std::to_string(row.time_s) + " s, busbw " + std::to_string(row.busbw_bytes_per_s));
  });
  return 0;
}

DPLAN_FUZZ_CUSTOM_MUTATOR(dplan::fuzz::mutate_lines)
