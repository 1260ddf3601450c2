// run.json: what `dplan run` measured (docs/run-json.md), written by rank 0 of the executor and
// read by `dplan compare` and `dplan calibrate`. One type, one writer, one strict reader.
// Versioned ("format_version": 1). Times are seconds, memory bytes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/phases.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Format 2 names its phases as phases.h does; format 1 (eight phases of its own) is still read,
// and written back as it was read.
constexpr int kRunFormatVersion = 2;
constexpr int kOldestRunFormatVersion = 1;

// The layout that ran, as the plan gave it.
struct RunLayout {
  int tp = 1, pp = 1, dp = 1, cp = 1;
  int micro_batch = 1, num_microbatches = 1, global_batch = 1, seq_len = 1;
  Schedule schedule = Schedule::one_f_one_b;
  int zero_stage = 0;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  bool operator==(const RunLayout&) const = default;
};

struct RunStep {
  int step = 0;
  double loss = 0;
  std::optional<double> grad_norm;  // the global norm before clipping; absent in older files
  double time_s = 0;                // the slowest rank's
  bool warmup = false;
  double tokens_per_s = 0;
  bool operator==(const RunStep&) const = default;
};

// Over the steps that are not warm-up.
struct StepTimeStats {
  double median_s = 0, mean_s = 0, min_s = 0, max_s = 0, p10_s = 0, p90_s = 0, stdev_s = 0;
  long long count = 0;
  bool operator==(const StepTimeStats&) const = default;
};

// One checkpoint save (docs/run-json.md, "checkpoints"), over the ranks.
struct CheckpointSave {
  int step = 0;                // the optimizer steps done when it was saved
  double blocking_s = 0;       // the step loop's stall, the slowest rank's (waiting for the previous write included)
  double wait_s = 0;           // of which waiting for the previous save's write to finish, the slowest rank's
  double write_s = 0;          // the write (serialise, checksum, write; rank 0: the manifest), the slowest rank's
  std::vector<long long> file_bytes_by_rank;   // each rank's shard file
  std::vector<long long> state_bytes_by_rank;  // of which weights, master weights and AdamW moments
  bool operator==(const CheckpointSave&) const = default;
};

struct RunCheckpoints {
  std::string dir;                         // --checkpoint-dir ("" when the run only resumed)
  bool async = true;                       // written by a background thread (else within the step loop)
  std::optional<int> resumed_from_step;    // the checkpoint this run continued from (--resume)
  std::string resumed_from;                // its folder
  std::optional<int> stopped_by_signal;    // the signal (SIGTERM 15, SIGINT 2) after which the run saved and stopped
  std::vector<CheckpointSave> saves;
  bool operator==(const RunCheckpoints&) const = default;
};

struct RunRecord {
  int format_version = kRunFormatVersion;  // as read; what to_json writes
  std::string plan;  // the plan.json path it ran, as given
  RunLayout layout;
  json config;       // free-form: how it ran (steps, seed, device, precision, ...)
  json environment;  // free-form: torch version, host, cpu, cores, ...
  std::vector<RunStep> steps;
  StepTimeStats step_time;
  double tokens_per_s = 0;                 // global tokens per step / median step time
  std::map<std::string, double> phases_s;  // phase -> seconds, averaged over ranks (measured_phases)
  json phases_by_rank_s;                   // [{"rank", "stage", phase: seconds, ...}, ...]
  std::map<int, std::map<std::string, long long>> memory_bytes;  // rank -> component -> bytes
  // rank -> its matrix-multiply FLOPs per step by part (compute.h FlopPart), forward and recomputed,
  // as the executor counted them (the mean over the run's steps); empty in older files.
  std::map<int, RankStepFlops> flops_by_rank;
  std::string memory_source;
  std::vector<int> stage_of_rank;
  bool replicas_identical = true;
  std::vector<std::string> weights_hash_by_rank;
  std::optional<RunCheckpoints> checkpoints;  // absent in older files and in runs that neither saved nor resumed
  // The start-up of the rank that took longest, part -> seconds, "total" their sum (the executor's
  // StartupClock parts: launch_to_main under dplan run, setup, rendezvous, groups, model,
  // optimizer, before_first_step); empty in older files.
  std::map<std::string, double> startup_s;
  bool operator==(const RunRecord&) const = default;
};

// Exactly the JSON the executor writes (docs/run-json.md).
json to_json(const RunRecord& run);

// Strict, as plan_from_json: errors name `file` and the JSON pointer. stage_of_rank must list
// tp*cp*dp*pp stages in 0..pp-1, each stage held by some rank; memory must list every rank.
RunRecord run_record_from_json(const json& j, const std::string& file);
RunRecord read_run_record(const std::string& path);

// The run's phases in the vocabulary of phases.h, in its order: each measured phase, with the
// phases a format-1 file timed inside it (its backward holds recompute, tp_comm holds cp_comm,
// pp_wait is pp_bubble holding pp_p2p, ...). Format 2: every phase, none inside another. Throws
// InputError naming `file` when a format-1 file lacks one of its phases.
struct MeasuredPhase {
  Phase phase;
  double seconds = 0;
  std::vector<Phase> includes;
};
std::vector<MeasuredPhase> measured_phases(const RunRecord& run, const std::string& file);

// -o's rules for a run record (json_io.h check_output_path): an earlier run record is replaced
// without --force.
const OutputKind& run_record_output();

}  // namespace dplan::costmodel
