// The engines dplan hands plans to and reads logs from, one descriptor each (DESIGN.md: "each
// engine is one descriptor"): its name on the command line, its display name, the version whose
// spellings and rules dplan follows, the launch file its export writes, its exporter, its rules
// and, where dplan reads its training logs, its log reader. The one table of them is in
// planner/src/engines.cpp; `dplan export --to`, `dplan check --engine`, the --format of
// `dplan compare`, the CLI's help, the log-format detection and the exporter dispatch all read
// it. docs/export.md, "Adding an engine", says what a new one needs.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dplan/costmodel/engine.h"
#include "dplan/costmodel/plan_file.h"

namespace dplan::planner {

struct Exported;
struct EngineLog;
struct LogStep;
namespace detail {
struct ExportInput;  // planner/src/export_engines.h
class Rules;         // planner/src/engine_parts.h
}  // namespace detail

// An engine's id (costmodel/engine.h owns the ids and names): the index of its descriptor here.
using costmodel::Engine;

// How a log's step lines give the step time.
enum class StepTime {
  logged,                     // the line states it (Megatron-LM's elapsed time per iteration)
  from_tokens_per_s_per_gpu,  // the plan's tokens per step / (tokens per second per device x world size)
  from_global_samples_per_s,  // the plan's global batch / global samples per second
};

// How dplan reads an engine's training log (engine_logs.h has the formats and their sources).
struct LogReader {
  const char* step_line;         // what one step's line is called: "iteration line"
  const char* step_line_source;  // where the engine prints it: "megatron/training/training.py training_log"
  const char* log_file;          // the file of that code: "megatron/training/training.py"
  const char* format_as_of;      // the versions whose format it reads; "{version}" is the engine's version
  StepTime step_time;
  const char* peak_memory_what;  // what the log's memory figure is: "max allocated"
  // Why the memory figure is left out on a cluster of CPU cores, or nullptr when it is comparable there.
  const char* cpu_memory_not_comparable;
  // Whether a line is one of the engine's (counted to tell the format; the most such lines wins).
  bool (*signature)(const std::string& line);
  // The step lines (possibly one per rank) and what the log states of the layout, into `log`.
  void (*read)(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps);
};

struct EngineDescriptor {
  Engine id;                 // its name on the command line (--to, --engine, --format) is costmodel's
  const char* display_name;  // in messages: "Megatron-LM"
  const char* version;       // the engine version whose spellings and rules dplan follows: "core_v0.15.0"
  const char* head_version;  // a later version an export also writes spellings of, or nullptr
  // The "spellings:" line of every exported file's header; "{version}" and "{head}" are the two above.
  const char* spellings;
  const char* launch_file;  // the script an export writes to start it: "launch-megatron.sh"
  bool runs_dplan_worker;   // a launcher of dplan's own worker (torchrun, Slurm), not an engine's files
  Exported (*export_files)(const detail::ExportInput& in);
  void (*rules)(const costmodel::Plan& plan, detail::Rules& rules);  // the engine's own, after the launch rules
  const LogReader* log;  // nullptr: dplan reads no log of this engine
};

// Every descriptor, in the order of Engine (the order of every list of engines dplan prints).
std::span<const EngineDescriptor> engines();
const EngineDescriptor& descriptor(Engine engine);

// "megatron", "torchtitan", "deepspeed", "accelerate", "torchrun", "slurm": the names in table order.
using costmodel::engine_from_string;
using costmodel::engine_names;
using costmodel::to_string;

// The version line of `engine`'s files: its spellings with the versions filled in, e.g.
// "Megatron-LM core_v0.15.0 (megatron/training/arguments.py)".
std::string engine_version(Engine engine);

// `text` with "{version}" and "{head}" replaced by the descriptor's version and head_version.
std::string with_versions(const std::string& text, const EngineDescriptor& d);

}  // namespace dplan::planner
