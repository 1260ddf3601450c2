// Internal to the exporters (export*.cpp): each engine's files, and the pieces they share (the
// file header, the launch-script preamble, the torchrun line).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dplan/planner/export.h"

namespace dplan::planner::detail {

// What every exporter is given.
struct ExportInput {
  const costmodel::Plan& plan;
  Engine engine;
  std::string plan_text;  // the plan file as read
  std::string plan_name;  // its file name, for the headers
};

// The provenance lines every file carries (each prefixed by `comment`, e.g. "# "): the plan, the
// engine and the version whose spellings the file uses, the layout.
std::string header(const ExportInput& in, const std::string& comment);

// "#!/usr/bin/env bash", the header, "set -euo pipefail" and `here`, the script's own folder.
std::string script_preamble(const ExportInput& in);

// The torchrun launch (torch/distributed/run.py): the underscore spellings, which torchrun of
// PyTorch 1.13 (Debian's) and 2.x both accept (2.x adds the dashed ones). One node needs no
// address (127.0.0.1 by default); several need MASTER_ADDR. "--redirects 1 --tee 1" (stdout to
// torchrun's log files and the console): Debian's torchrun 1.13 on Python 3.11 cannot parse its
// default 0 nor 3 (Std is an IntFlag that 3.11 no longer iterates; tests/executor/executor_test.cpp).
std::string torchrun_command(const LaunchShape& shape);

// "%g" of a value, the way the files write numbers.
std::string number(double x);

// The DeepSpeed config JSON (also Accelerate's when it runs DeepSpeed, whose YAML then has no
// mixed_precision: the JSON's bf16 / fp16 section, or neither for fp32, is the precision).
nlohmann::ordered_json deepspeed_config(const costmodel::Plan& plan);

// The README.export of an export: the engine and version, the files, the launch line, and what the
// plan does not say that the engine needs (data, tokenizer, training length). `where` says where
// to run the launch line; empty: "run (one node):" or "run (on every node):".
ExportFile readme(const ExportInput& in, const std::vector<ExportFile>& files, const std::string& launch_line,
                  const std::vector<std::string>& notes, const std::string& where = "");

// Each engine's files (the engine table, engines.cpp, names these).
Exported export_megatron(const ExportInput& in);
Exported export_torchtitan(const ExportInput& in);
Exported export_deepspeed(const ExportInput& in);
Exported export_accelerate(const ExportInput& in);
Exported export_torchrun(const ExportInput& in);
Exported export_slurm(const ExportInput& in);

}  // namespace dplan::planner::detail
