// The options of `dplan run`, declared once (executor/include/dplan/executor/run_options.h): what
// the launcher hands each rank reads back, on the worker's command line, as exactly what the user
// gave; and a dplan built without the executor says how to get it.
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "dplan/executor/run_options.h"
#include "process.h"

namespace {
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using dplan::executor::RunOptions;

// Parses `argv` (after the program name) as dplan-worker does: the plan, then the run flags.
RunOptions parse_as_worker(const std::vector<std::string>& argv) {
  RunOptions o;
  CLI::App app;
  app.add_option("plan", o.plan_path);
  dplan::executor::add_run_flags(app, o);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  return o;
}

}  // namespace

TEST_CASE("the run flags the launcher passes on read back as what was given", "[cli][run-options]") {
  RunOptions given;
  given.plan_path = "plan.json";
  given.data_path = "corpus with spaces.txt";
  given.output = "out/run.json";
  given.device = "cpu";
  given.precision = "bf16";
  given.steps = 7;
  given.warmup = 3;
  given.log_every = 5;
  given.seed = 18446744073709551615ULL;  // the largest: no narrowing on the way
  given.timeout_s = 0.1 + 0.2;           // not exactly representable in few digits
  given.lr = 3e-4;
  given.max_grad_norm = 0;
  given.quiet = true;
  given.save_reference = "ref.safetensors";
  given.checkpoint_dir = "ck dir";
  given.resume = "older ck";
  given.save_every = 25;
  given.keep = 3;
  given.sync_save = true;
  std::vector<std::string> argv = {given.plan_path};
  for (const std::string& a : dplan::executor::run_flags_argv(given)) argv.push_back(a);
  const RunOptions got = parse_as_worker(argv);
  CHECK(got.plan_path == given.plan_path);
  CHECK(got.data_path == given.data_path);
  CHECK(got.output == given.output);
  CHECK(got.device == given.device);
  CHECK(got.precision == given.precision);
  CHECK(got.steps == given.steps);
  CHECK(got.warmup == given.warmup);
  CHECK(got.log_every == given.log_every);
  CHECK(got.seed == given.seed);
  CHECK(got.timeout_s == given.timeout_s);  // bit for bit
  CHECK(got.lr == given.lr);
  CHECK(got.max_grad_norm == given.max_grad_norm);
  CHECK(got.quiet == given.quiet);
  CHECK(got.save_reference == given.save_reference);
  CHECK(got.checkpoint_dir == given.checkpoint_dir);
  CHECK(got.resume == given.resume);
  CHECK(got.save_every == given.save_every);
  CHECK(got.keep == given.keep);
  CHECK(got.sync_save == given.sync_save);
}

TEST_CASE("the checkpoint flags are checked: --save-every needs --checkpoint-dir and --keep at least 1",
          "[cli][run-options]") {
  RunOptions o;
  o.save_every = 10;
  CHECK(dplan::executor::run_options_problem(o) == "--save-every needs --checkpoint-dir DIR");
  o.checkpoint_dir = "ck";
  CHECK(dplan::executor::run_options_problem(o).empty());
  o.keep = 0;
  CHECK(dplan::executor::run_options_problem(o) == "--keep must be at least 1, got 0");
  o.keep = 1;
  o.save_every = -1;
  CHECK_THAT(dplan::executor::run_options_problem(o), Contains("--save-every must be 0"));
}

TEST_CASE("the defaults survive the trip too, an unset flag stays unset", "[cli][run-options]") {
  const RunOptions defaults;
  std::vector<std::string> argv = {"p.json"};
  for (const std::string& a : dplan::executor::run_flags_argv(defaults)) argv.push_back(a);
  const RunOptions got = parse_as_worker(argv);
  CHECK(got.data_path.empty());
  CHECK(got.output.empty());
  CHECK(got.steps == defaults.steps);
  CHECK(got.timeout_s == defaults.timeout_s);
  CHECK_FALSE(got.quiet);
}

TEST_CASE("dplan run without the executor beside it names the command that builds it", "[cli][run-options]") {
  dplan::testing::TempDir dir;
  const fs::path alone = dir.path() / "dplan";  // a dplan with no dplan-worker next to it
  fs::copy_file(DPLAN_BINARY, alone);
  const std::string plan = std::string(DPLAN_VALIDATION_DIR) + "/compare/plan.json";  // a plan dplan wrote
  dplan::testing::Result r = dplan::testing::run_program(alone.string(), {"run", plan}, {{"DPLAN_WORKER", ""}});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("./setup.sh --all"));
}

TEST_CASE("the default warm-up is 2 steps, or all but the last when there are fewer steps", "[cli][run-options]") {
  RunOptions o;
  CHECK(o.warmup_steps() == 2);  // --steps 20
  o.steps = 2;
  CHECK(o.warmup_steps() == 1);
  CHECK(dplan::executor::run_options_problem(o).empty());
  o.steps = 1;
  CHECK(o.warmup_steps() == 0);
  CHECK(dplan::executor::run_options_problem(o).empty());
  o.warmup = 1;  // given: kept, and checked against --steps
  CHECK(o.warmup_steps() == 1);
  CHECK_THAT(dplan::executor::run_options_problem(o), Contains("--warmup must be at least 0 and below --steps (1)"));
}
