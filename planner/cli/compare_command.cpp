#include "compare_command.h"

#include "dplan/costmodel/errors.h"

namespace dplan::cli {

void add_compare_options(CLI::App& command, CompareArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
  command.add_option("run", args.run_path, "run.json written by dplan run -o")->required();
  command.add_flag("--json", args.json, "print JSON");
}

int run_compare(const CompareArgs&) { throw dplan::InputError("compare: not built yet"); }

}  // namespace dplan::cli
