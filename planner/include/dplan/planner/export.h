// `dplan export PLAN --to ENGINE`: the plan as the files an engine reads (Megatron-LM arguments,
// a torchtitan TOML, a DeepSpeed config, an Accelerate YAML) or the scripts that launch
// dplan-worker under torchrun or Slurm. Built in memory first (export_plan), after the engine's
// rules (engine_rules.h) pass, every name and text in them through quoting.h; then written
// (write_export) as one: all files or none, none replacing an existing file without --force.
// docs/export.md has the mapping tables and their sources.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engine_rules.h"

namespace dplan::planner {

struct ExportFile {
  std::string name;     // inside the export folder, e.g. "megatron.args"
  std::string content;
  bool executable = false;
};

struct Exported {
  std::vector<ExportFile> files;
  std::string launch_line;  // the command to run, relative to the export folder, e.g. "./launch-megatron.sh"
};

// The files for `engine`. `plan_text` is the plan file as read (torchrun and slurm ship a copy of
// it); `plan_name` names it in the headers. Throws InputError listing every failed rule (one line
// each, joined by newlines) when check_engine_rules fails.
Exported export_plan(const costmodel::Plan& plan, Engine engine, const std::string& plan_text,
                     const std::string& plan_name);

// "<plan file stem>-<engine>" beside the plan: runs/plan.json -> runs/plan-megatron.
std::string default_export_dir(const std::string& plan_path, Engine engine);

// Writes every file under `dir` (made if missing; "dir/" is "dir"). All paths are checked first by
// json_io.h's output rules (an existing file needs `force`; the plan itself and links are never
// replaced), and `force` replaces only the files an earlier export wrote there (its README.export
// lists them). Then the files are written complete into a private folder inside `dir` and moved
// into place together: a failure (a full disk) leaves the earlier files, or no export, and
// throws InputError. Launch scripts get their executable bits. Returns the paths written.
std::vector<std::string> write_export(const Exported& exported, const std::string& dir, bool force);

}  // namespace dplan::planner
