// Prediction vs measurement: a plan.json's prediction (planner) next to a run.json (executor,
// docs/run-json.md) or an engine's training log (engine_logs.h) for the same layout. Step time,
// tokens/s, time by phase and memory per pipeline stage, each with its relative error
// (predicted - measured) / measured. The predicted phases and memory components are summed into
// the executor's coarser buckets first. What an engine log does not measure (most phases, memory
// per stage and component) is marked not measured, never filled in.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/planner/engine_logs.h"

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
  std::string name;  // a phase (costmodel/phases.h) or a run.json memory component: "forward", "peak", ...
  ComparedValue value;
  bool measured = true;  // false: the measurement does not have it (value.measured is 0, no error)
  // Phases a format-1 run.json timed inside this one; their predictions are added to its own.
  std::vector<std::string> includes;
};

// Memory of one pipeline stage, bytes. Measured values are the max over the stage's ranks.
struct StageMemoryComparison {
  int stage = 0;
  std::vector<int> ranks;                     // the ranks run.json's stage_of_rank puts on it
  std::vector<NamedComparison> components;    // weights, gradients, optimizer, activations, buffers, peak
  double predicted_reserve_bytes = 0;         // left out of the predicted peak (see compare.cpp)
};

// One rank's matrix-multiply FLOPs per step by part (costmodel::FlopPart names): what
// costmodel::rank_step_flops predicts for its stage's layers against what the executor counted
// (run.json "flops").
struct RankFlopsComparison {
  int rank = 0, stage = 0;
  std::vector<NamedComparison> forward, recompute;  // every part, in FlopPart order
};

struct Comparison {
  int tp = 1, pp = 1, dp = 1, cp = 1;         // the layout both files share
  int ep = 1, vpp = 1;                        // the plan's expert parallel and model chunks per rank
  long long measured_steps = 0;               // run.json step_time_s.count; 0 if absent
  ComparedValue step_time_s;                  // measured: the median over timed steps
  ComparedValue tokens_per_s;
  std::vector<NamedComparison> phases;        // seconds, in the order of costmodel/phases.h
  std::vector<StageMemoryComparison> memory;  // one per pipeline stage, in stage order; empty for engine logs
  std::vector<RankFlopsComparison> flops;     // one per rank; empty where the measurement counts none
  // What was read: LogFormat::run for a run.json, else the engine log's format and description.
  LogFormat format = LogFormat::run;
  std::string measured_by = "dplan run (run.json)";
  bool step_time_from_rate = false;           // the log states a rate; the step time is derived
  // Engine logs only (absent where the log does not state them):
  std::optional<ComparedValue> tflops_per_gpu;  // predicted: mfu x the plan's GPU peak for its precision
  std::optional<ComparedValue> mfu;             // fractions; the engine's own peak FLOP/s, not the plan's
  // The largest per-GPU peak the log reports against the largest predicted stage peak less reserve.
  std::optional<ComparedValue> peak_memory_bytes;
  int peak_memory_stage = 0;                    // the stage with the largest predicted peak
  std::string peak_memory_what;                 // "max allocated" / "max reserved"
  std::string memory_not_comparable;            // why the log's memory figure is left out, or empty
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

// A plan against an engine log read by parse_engine_log (measure_log's refusals apply).
Comparison compare_plan_and_log(const costmodel::Plan& plan, const std::string& plan_file, const EngineLog& log);

// Reads both files and compares them. The measurement is a run.json or an engine log, told apart
// by content (engine_logs.h) unless `format` forces one. Missing, empty, malformed or foreign
// files throw InputError.
Comparison compare_files(const std::string& plan_path, const std::string& run_path,
                         std::optional<LogFormat> format = std::nullopt);

// {"format": "run"|"megatron"|..., "measured_by": text, "step_time_s": {"predicted", "measured",
//  "rel_error"}, "tokens_per_s": {...}, "phases": {name: {...}}, "memory": [{"stage": i,
//  component: {...}}, ...], "flops": [{"rank", "stage", "forward": {part: {...}}, "recompute": {...}}, ...]
//  where the run counted them}, plus "tflops_per_gpu", "mfu", "peak_memory_bytes" (with "stage")
// where an engine log states them; rel_error is null where the measured value is 0, measured and
// rel_error are null where it was not measured.
json to_json(const Comparison& comparison);

}  // namespace dplan::planner
