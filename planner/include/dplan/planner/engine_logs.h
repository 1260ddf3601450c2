// Engines' own training logs as measurements, for `dplan compare` and `dplan calibrate`
// (docs/compare.md, "Engine logs"). A log is read into an EngineLog (what its lines state, in the
// engine's units), then put into the plan's terms by measure_log (a LogMeasurement: step time,
// global tokens/s, TFLOP/s per GPU, MFU, peak memory, the phases the engine timed). Nothing the
// log does not state is invented: what it lacks stays absent.
//
// The formats, read from the engines' logging code (none of their code is here):
//   megatron    Megatron-LM, megatron/training/training.py training_log (tag core_v0.15.0, and the
//               same fields at HEAD d98e8a64dd): " [date] iteration N/ M | consumed samples: ... |
//               elapsed time per iteration (ms): X | throughput per GPU (TFLOP/s/GPU): Y | ... |
//               global batch size: B | lm loss: L | ..."; each line is the mean over the
//               --log-interval iterations since the previous one. Memory:
//               megatron/training/utils.py report_memory: "[Rank R] (after N iterations) memory
//               (MB) | allocated: ... | max allocated: X | reserved: ... | max reserved: ..."
//               (MB = 2^20 bytes; megatron/training/utils/common_utils.py at HEAD). The argument dump (megatron/training/arguments.py _print_args:
//               "  name ..... value") gives the layout when the log has it.
//   torchtitan  torchtitan, torchtitan/components/metrics.py MetricsProcessor.log (tags v0.2.2 and
//               HEAD b5bcd76c66): "step: N  loss: L  grad_norm: G  memory: X GiB(P%)  tps: T
//               tflops: F  mfu: M%" with ANSI colours (torchtitan/tools/utils.py Color), mfu "N/A"
//               at HEAD under quantisation. tps is tokens per second per device:
//               tokens of one data-parallel rank / (seconds x non-data-parallel size), so the global
//               rate is tps x world size. memory is the allocator's max reserved GiB of the
//               logging rank. The batch: torchtitan/train.py (v0.2.2) "Trainer is initialized
//               with local batch size b, global batch size B, ..., sequence length S, ..." and
//               torchtitan/trainer.py (HEAD) "... N tokens per train step, ...".
//   deepspeed   DeepSpeed, deepspeed/utils/timer.py (tag v0.19.5; timer.py and utils/logging.py
//               unchanged at HEAD edaa722126): ThroughputTimer.stop
//               "epoch=E/micro_step=M/global_step=N, RunningAvgSamplesPerSec=X,
//               CurrSamplesPerSec=Y, MemAllocated=AGB, MaxMemAllocated=BGB" every steps_per_print
//               steps, its batch_size being train_batch_size (deepspeed/runtime/engine.py), so
//               Y is global samples per second of step N; SynchronizedWallClockTimer.log
//               "time (ms) | fwd: ... | bwd: ... | bwd_inner: ... | bwd_allreduce: ... | step: ..."
//               per global step with wall_clock_breakdown (engine.py, the timer names in
//               timer.py); engine.py _report_progress "step=N, skipped=S, lr=..., mom=..."; the
//               config dump (runtime/config.py DeepSpeedConfig.print "  name .... value": its
//               world_size is the data-parallel size, train_batch_size the global batch).
//   run         dplan run's run.json (docs/run-json.md), read by costmodel::read_run_record.
//
// Warm-up: the first kWarmupLogLines step lines of a log are left out (the first holds start-up,
// compilation and allocator growth; Megatron's first line averages over its first interval), as
// run.json leaves out its warm-up steps; the step time is the median over the rest, as run.json's
// step_time_s.median. One step logged by several ranks (torchtitan and DeepSpeed log on every
// rank unless filtered) counts once: its slowest rank's rate and its largest memory.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/units.h"
#include "dplan/planner/engines.h"

namespace dplan::planner {

// What a measurement file is: a run.json (dplan run, dplan-worker), or the training log of an
// engine whose descriptor has a log reader (engines.h: Megatron-LM, torchtitan, DeepSpeed).
struct LogFormat {
  std::optional<Engine> engine;  // none: a run.json
  static const LogFormat run;
  bool operator==(const LogFormat&) const = default;
};
inline constexpr LogFormat LogFormat::run{};

// The engine's name ("megatron", "torchtitan", "deepspeed") or "run": the --format spellings.
const char* to_string(LogFormat format);
// Those names: the engines with a log reader in table order, then "run".
std::vector<std::string> log_format_names();
// Throws InputError naming the valid choices.
LogFormat log_format_from_string(const std::string& name);
// The engine's display name ("Megatron-LM", "torchtitan", "DeepSpeed"), or "dplan run".
const char* engine_name(LogFormat format);

inline constexpr int kWarmupLogLines = 2;

// The physical range of each figure a log states (docs/compare.md, "What a log may state"), in
// SI units. A line stating a value outside its range, or a figure that is no finite number, is
// refused (InputError "FILE:LINE: ..." naming the field, the value as written and the range), not
// averaged in: a log that yields nonsense gives no measurement. The ceilings are those of the GPU
// profile reader (costmodel::kMaxHbmGB, costmodel::kMaxPeakTflops). Memory,
// TFLOP/s and MFU may be 0: the engines print them to two decimals (or one), so a small model's
// figures print as 0; a rate may not (it gives the step time, which must be positive).
struct LoggedFigure {
  const char* what;   // "a step time", in messages
  const char* unit;   // of min_value and max_value
  double min_value;   // excluded unless min_included
  bool min_included;
  double max_value;   // included
};
inline constexpr LoggedFigure kLoggedStepTime{"a step time", "s", 1e-6, true, 1e6};  // a kernel launch .. 11.6 days
inline constexpr LoggedFigure kLoggedPhaseTime{"a phase time", "s", 0, true, 1e6};
inline constexpr LoggedFigure kLoggedMemory{"a GPU's memory", "bytes", 0, true, costmodel::kMaxHbmGB * kGB};
inline constexpr LoggedFigure kLoggedTflops{"a GPU's TFLOP/s", "TFLOP/s", 0, true, costmodel::kMaxPeakTflops};
inline constexpr LoggedFigure kLoggedMfu{"an MFU", "%", 0, true, 100};
inline constexpr LoggedFigure kLoggedRate{"a rate", "per s", 0, false, 1e12};  // tokens/s per GPU, samples/s
inline constexpr LoggedFigure kLoggedLoss{"a loss", "", std::numeric_limits<double>::lowest(), true,
                                          std::numeric_limits<double>::max()};  // any finite value
// Whether `value` lies in the figure's range (false for NaN and infinities).
bool in_range(double value, const LoggedFigure& figure);
// "1e-06 to 1e+06 s", "above 0 and at most 100 %": the range, for messages.
std::string range_text(const LoggedFigure& figure);

// One logged step, as the line states it (engine units converted to seconds and bytes only).
struct LogStep {
  long long step = 0;  // the engine's iteration / step number
  long long line = 0;  // the log's line (from 1) that stated it: the one kept of several ranks' lines
  bool warmup = false;
  std::optional<double> time_s;                // megatron: elapsed time per iteration
  std::optional<double> tokens_per_s_per_gpu;  // torchtitan: tps
  std::optional<double> samples_per_s;         // deepspeed: CurrSamplesPerSec (global samples)
  std::optional<double> tflops_per_gpu;        // megatron: throughput per GPU; torchtitan: tflops
  std::optional<double> mfu_percent;           // torchtitan: mfu
  std::optional<double> loss;                  // megatron: lm loss; torchtitan: loss
  std::optional<double> peak_memory_bytes;     // torchtitan: max reserved; deepspeed: MaxMemAllocated
};

struct EngineLog {
  LogFormat format{Engine::megatron};
  std::string file;
  std::string lines_read;         // which lines gave the steps, e.g. "iteration lines"
  std::vector<LogStep> steps;     // one per logged step, in step order
  // What the log states of the layout (absent where it does not say).
  std::optional<long long> global_batch, micro_batch, seq_len, tokens_per_step;
  std::optional<long long> world_size, tp, pp, cp, dp;
  // Megatron's report_memory: the largest max allocated over the ranks that reported.
  std::optional<double> peak_memory_bytes;
  // DeepSpeed's wall-clock timers, seconds per step, median over the timer lines after warm-up,
  // by run.json phase name (forward <- fwd, backward <- bwd_inner or bwd, dp_comm <- bwd_allreduce,
  // optimizer <- step).
  std::map<std::string, double> phases_s;
};

// The format the text's lines show, or nullopt. A JSON object is a run.json.
std::optional<LogFormat> detect_log_format(const std::string& text);

// Reads an engine log (not a run.json). `forced` is --format; without it the format is detected.
// Refuses (InputError, one line naming the file): text of no known format (naming the formats),
// a log of another format than the forced one, a log with no complete step line (empty or
// truncated), fewer complete step lines than warm-up plus one, a figure outside its LoggedFigure
// range (naming the line too). Linear in the text and in constant stack: each line is scanned
// once, left to right, whatever its length.
EngineLog parse_engine_log(const std::string& text, const std::string& file,
                           std::optional<LogFormat> forced = std::nullopt);

// The log in the plan's terms. Throws InputError when the log contradicts the plan where it
// states the layout (global batch, micro batch, sequence length, tokens per step, world size,
// tp, pp, cp, dp), naming both values, and when a rate gives a step time outside kLoggedStepTime
// for the plan's tokens (or samples) per step, naming the line.
struct LogMeasurement {
  LogFormat format{Engine::megatron};
  std::string description;       // "Megatron-LM log, iteration lines (megatron/training/training.py, ...)"
  long long measured_steps = 0;  // step lines after warm-up
  double step_time_s = 0;        // median over them
  bool step_time_from_rate = false;  // derived from a rate and the plan's tokens (or samples) per step
  double tokens_per_s = 0;           // global: the plan's tokens per step / step_time_s
  std::optional<double> tflops_per_gpu;  // median
  std::optional<double> mfu;             // fraction, median
  std::optional<double> peak_memory_bytes;
  std::string peak_memory_what;          // "max allocated", "max reserved"
  std::string memory_not_comparable;     // why a memory figure the log has is left out, or empty
  std::map<std::string, double> phases_s;
};
LogMeasurement measure_log(const EngineLog& log, const costmodel::Plan& plan, const std::string& plan_file);

// Reads a measurement file's text and tells which format it holds (forced or detected); for
// callers that accept a run.json or a log alike. Throws InputError for an empty or foreign file.
LogFormat measurement_format(const std::string& text, const std::string& file, std::optional<LogFormat> forced);

}  // namespace dplan::planner
