#include "export_command.h"

#include <filesystem>
#include <iostream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engine_rules.h"
#include "dplan/planner/engines.h"
#include "dplan/planner/export.h"
#include "dplan/planner/quoting.h"

namespace dplan::cli {
using namespace costmodel;
using namespace planner;

namespace {

// The engine option: one of engine_names(), else "unknown engine "x"; valid: megatron, ...".
CLI::Validator engine_choice() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (engine_from_string(text)) return "";
        return "unknown engine " + quote_for_message("\"" + text + "\"") + "; valid: " + join_choices(engine_names());
      },
      "ENGINE");
}

Engine engine_of(const std::string& name) {
  const std::optional<Engine> engine = engine_from_string(name);
  if (!engine) throw InputError("unknown engine \"" + quote_for_message(name) + "\"; valid: " + join_choices(engine_names()));
  return *engine;
}

}  // namespace

void add_export_options(CLI::App& command, ExportArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
  command.add_option("--to", args.engine, "engine: " + join_choices(engine_names()))->required()->check(engine_choice());
  command.add_option("-o,--output", args.output, "folder for the files (default: <plan stem>-<engine> beside the plan)");
  command.add_flag("--force", args.force,
                   "replace the files an earlier export wrote in that folder (those its README.export lists); never "
                   "the plan itself nor any other file");
}

int run_export(const ExportArgs& args) {
  const Engine engine = engine_of(args.engine);
  const Plan plan = read_plan(args.plan_path);  // strict: a foreign or newer file is one error line
  const std::string plan_text = read_text_file(args.plan_path);
  // The engine's rules first: every failure is a line, and nothing is written.
  const RuleReport report = check_engine_rules(plan, engine);
  if (!report.ok()) {
    for (const std::string& failure : report.failures) std::cerr << "dplan: error: " << error_line(failure) << "\n";
    return 2;
  }
  const std::string dir = args.output.empty() ? default_export_dir(args.plan_path, engine) : args.output;
  const Exported exported =
      export_plan(plan, engine, plan_text, std::filesystem::path(args.plan_path).filename().string());
  const std::vector<std::string> written = write_export(exported, dir, args.force);
  // Paths as shell words: one line each, and the launch line can be pasted into a shell.
  for (const std::string& path : written) std::cout << "wrote " << shell_word(path) << "\n";
  std::cout << "launch: cd " << shell_word(dir) << " && " << exported.launch_line << "\n";
  // The plan's prediction priced one engine's implementation (costmodel/engine.h); exported to
  // another, the same layout runs at that engine's pace: said, not refused.
  const costmodel::Engine priced = plan.training.engine.engine;
  if (priced != engine && !descriptor(engine).runs_dplan_worker)
    std::cout << "note: the plan was priced for " << costmodel::engine_label(plan.training.engine) << ", not "
              << to_string(engine) << "; for " << to_string(engine) << "'s step time re-estimate with --engine "
              << to_string(engine) << "\n";
  return 0;
}

void add_check_options(CLI::App& command, CheckArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
  command.add_option("--engine", args.engine, "engine: " + join_choices(engine_names()))->required()->check(engine_choice());
}

int run_check(const CheckArgs& args) {
  const Engine engine = engine_of(args.engine);
  const Plan plan = read_plan(args.plan_path);
  const RuleReport report = check_engine_rules(plan, engine);
  if (report.ok()) {
    std::cout << rules_ok_line(plan, engine, report) << "\n";
    return 0;
  }
  for (const std::string& failure : report.failures) std::cout << error_line(failure) << "\n";
  return 1;
}

}  // namespace dplan::cli
