// Prediction vs measurement: a plan.json's prediction (planner) next to a run.json (executor,
// docs/run-json.md) for the same layout. Step time, tokens/s, time by phase and memory per
// pipeline stage, each with its relative error (predicted - measured) / measured. The predicted
// phases and memory components are summed into the executor's coarser buckets first.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"

namespace dplan::planner {

// (predicted - measured) / measured; nullopt when measured is 0 (no meaningful ratio).
std::optional<double> relative_error(double predicted, double measured);

struct ComparedValue {
  double predicted = 0;
  double measured = 0;
  std::optional<double> rel_error() const { return relative_error(predicted, measured); }
};

// One measured bucket (a phase or a memory component) and what was predicted for it.
struct NamedComparison {
  std::string name;  // the run.json name: "forward", "pp_wait", "activations", "peak", ...
  ComparedValue value;
};

// Memory of one pipeline stage, bytes. Measured values are the max over the stage's ranks.
struct StageMemoryComparison {
  int stage = 0;
  std::vector<int> ranks;                     // the ranks run.json's stage_of_rank puts on it
  std::vector<NamedComparison> components;    // weights, gradients, optimizer, activations, buffers, peak
  double predicted_reserve_bytes = 0;         // left out of the predicted peak (see compare.cpp)
};

struct Comparison {
  int tp = 1, pp = 1, dp = 1, cp = 1;         // the layout both files share
  int ep = 1, vpp = 1;                        // the plan's expert parallel and model chunks per rank
  long long measured_steps = 0;               // run.json step_time_s.count; 0 if absent
  ComparedValue step_time_s;                  // measured: the median over timed steps
  ComparedValue tokens_per_s;
  std::vector<NamedComparison> phases;        // seconds: forward, backward, tp_comm, pp_wait, dp_comm, optimizer, other
  std::vector<StageMemoryComparison> memory;  // one per pipeline stage, in stage order
};

// Compares a plan with a run record (file names for error messages only). Throws InputError
// naming the file and JSON pointer when a key of the prediction compare needs is missing or has
// the wrong type, or when the two layouts (tp, pp, dp, cp) differ, naming both.
Comparison compare_plan_and_run(const costmodel::Plan& plan, const std::string& plan_file,
                                const costmodel::RunRecord& run, const std::string& run_file);
// The same on parsed plan.json and run.json, read by their strict readers first (plan_from_json,
// run_record_from_json: a format_version other than 1, a missing key or a wrong type throws).
Comparison compare_plan_and_run(const json& plan, const std::string& plan_file, const json& run,
                                const std::string& run_file);

// Reads both files (read_json_file: missing or malformed files throw InputError) and compares them.
Comparison compare_files(const std::string& plan_path, const std::string& run_path);

// {"step_time_s": {"predicted", "measured", "rel_error"}, "tokens_per_s": {...},
//  "phases": {name: {...}}, "memory": [{"stage": i, component: {...}}, ...]};
// rel_error is null where the measured value is 0.
json to_json(const Comparison& comparison);

}  // namespace dplan::planner
