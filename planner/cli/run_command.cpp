#include "run_command.h"

#include "dplan/costmodel/errors.h"

namespace dplan::cli {

void add_run_options(CLI::App& command, RunArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
}

int run_run(const RunArgs&) { throw dplan::InputError("run: not built yet"); }

}  // namespace dplan::cli
