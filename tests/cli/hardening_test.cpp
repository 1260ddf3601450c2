// The dplan binary against hostile input, end to end: each case exits 2 with one bounded, escaped
// error line, quickly, and leaves the user's files as they were. (The readers' own cases are in
// tests/costmodel/input_limits_test.cpp; the launcher's in tests/executor.)
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "process.h"

namespace {
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using dplan::testing::require_one_error_line;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using nlohmann::json;
namespace fs = std::filesystem;

Result run_dplan(const std::vector<std::string>& args) { return run_program(DPLAN_BINARY, args); }


// A plan dplan wrote, in `dir`.
std::string make_plan(const TempDir& dir, const std::string& name = "plan.json") {
  const std::string path = (dir.path() / name).string();
  const Result r = run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "--runnable", "-o", path});
  INFO(r.err);
  REQUIRE(r.status == 0);
  return path;
}

const std::string kTiny = std::string(DPLAN_PROFILES_DIR) + "/models/gpt-tiny.json";

}  // namespace

TEST_CASE("A --gpus beyond what a cluster could hold is refused at once, not searched", "[cli][limits]") {
  const auto start = std::chrono::steady_clock::now();
  const std::string line = require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "1000000000"}));
  CHECK(line == "dplan: error: --gpus: must be a positive integer up to 1048576, got 1000000000");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  // Too large for int: refused, not wrapped to 2.
  CHECK_THAT(require_one_error_line(run_dplan({"estimate", "--model", "gpt-tiny", "--gpus", "4294967298"})),
             Contains("got 4294967298"));
}

TEST_CASE("A FIFO given as a model, a profile or a plan is refused without blocking", "[cli][limits]") {
  TempDir dir;
  const std::string fifo = (dir.path() / "config.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string expected = "dplan: error: " + fifo + ": is a FIFO (named pipe), expected a regular file";
  CHECK(require_one_error_line(run_dplan({"estimate", "--model", fifo, "--gpus", "8"})) == expected);
  CHECK(require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", fifo, "--gpus", "8"})) == expected);
  CHECK(require_one_error_line(run_dplan({"run", fifo})) == expected);
  CHECK(require_one_error_line(run_dplan({"compare", fifo, fifo})) == expected);
}

TEST_CASE("Writing -o: a plan over an earlier plan, --force over another file, never over an input or a link", "[cli][limits]") {
  TempDir dir;
  const std::string plan = make_plan(dir);
  const std::string first = read_file(plan);
  // Again: an earlier plan is replaced.
  make_plan(dir);
  // A file the user wrote: refused, kept; --force replaces it.
  const std::string notes = dir.write("notes.txt", "mine\n");
  CHECK(require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "-o", notes})) ==
        "dplan: error: " + notes + ": exists and is not a plan dplan wrote; give --force to replace it, or another path");
  CHECK(read_file(notes) == "mine\n");
  const Result forced = run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "-o", notes, "--force"});
  CHECK(forced.status == 0);
  CHECK(json::parse(read_file(notes)).at("generator") == "dplan");
  // Its own input, --force or not: the model config and the plan.
  const std::string config = dir.write("c.json", read_file(kTiny));
  CHECK_THAT(require_one_error_line(run_dplan({"estimate", "--model", config, "--gpus", "2", "-o", config, "--force"})),
             Contains(config + ": is one of this command's inputs"));
  CHECK(read_file(config) == read_file(kTiny));
  CHECK(require_one_error_line(run_dplan({"run", plan, "-o", plan})) ==
        "dplan: error: " + plan + ": is one of this command's inputs; write the run record to another path");
  CHECK(json::parse(read_file(plan)).contains("prediction"));
  // A link to a file, a device.
  fs::create_symlink(plan, dir.path() / "link.json");
  CHECK_THAT(require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "-o",
                                   (dir.path() / "link.json").string(), "--force"})),
             Contains("is a symbolic link"));
  CHECK_THAT(require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "-o", "/dev/null"})),
             Contains("/dev/null: is a character device"));
  // Nothing left behind.
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  (void)first;
}

TEST_CASE("A plan whose sizes overflow int is refused before a rank starts", "[cli][limits]") {
  TempDir dir;
  const std::string plan = make_plan(dir);
  for (long long dp : {2147483648LL, 4294967298LL}) {
    json j = json::parse(read_file(plan));
    j["parallel"]["dp"] = dp;
    const std::string bad = dir.write("dp.json", j.dump());
    CHECK(require_one_error_line(run_dplan({"run", bad})) == "dplan: error: " + bad +
                                                   ": /parallel/dp: expected an integer from 1 to 1048576, got " +
                                                   std::to_string(dp));
  }
  json j = json::parse(read_file(plan));
  j["gpus"] = 4;
  const std::string bad = dir.write("gpus.json", j.dump());
  CHECK(require_one_error_line(run_dplan({"run", bad})) == "dplan: error: " + bad + ": /gpus: expected 2 (tp*cp*dp*pp), got 4");
}

TEST_CASE("Number overflow, duplicate keys and wrong types are input errors naming the file, exit 2", "[cli][limits]") {
  TempDir dir;
  const std::string overflow = dir.write("o.json", R"({"model_type": "llama", "hidden_size": 1e400})");
  CHECK(require_one_error_line(run_dplan({"estimate", "--model", overflow, "--gpus", "8"})) ==
        "dplan: error: " + overflow + ": malformed JSON: number overflow parsing '1e400'");
  json config = json::parse(read_file(kTiny));
  std::string text = config.dump();
  text.insert(1, R"("vocab_size": 7, )");
  const std::string twice = dir.write("twice.json", text);
  CHECK(require_one_error_line(run_dplan({"estimate", "--model", twice, "--gpus", "8"})) ==
        "dplan: error: " + twice + ": /: key \"vocab_size\" appears twice in one object");
  const std::string plan = make_plan(dir);
  const std::string run_text = read_file(std::string(DPLAN_VALIDATION_DIR) + "/compare/run.json");
  json run = json::parse(run_text);
  run["step_time_s"]["median"] = "fast";
  const std::string bad_run = dir.write("run.json", run.dump());
  CHECK(require_one_error_line(run_dplan({"compare", std::string(DPLAN_VALIDATION_DIR) + "/compare/plan.json", bad_run})) ==
        "dplan: error: " + bad_run + ": /step_time_s/median: expected a number >= 0, got \"fast\"");
}

TEST_CASE("Values echoed in errors are escaped and shortened: no terminal escape, one short line", "[cli][limits]") {
  TempDir dir;
  json config = json::parse(read_file(kTiny));
  config["activation_function"] = "\x1b[2J\x1b[31mgotcha\n" + std::string(200000, 'A');
  const std::string path = dir.write("evil.json", config.dump());
  const std::string line = require_one_error_line(run_dplan({"estimate", "--model", path, "--gpus", "8"}));
  CHECK(line.find('\x1b') == std::string::npos);
  CHECK_THAT(line, Contains("got \"\\x1b[2J\\x1b[31mgotcha\\nAAA"));
  CHECK(line.size() < 600);
  // A key.
  config = json::parse(read_file(kTiny));
  config["\x1b]0;title\x07"] = 1;
  const std::string key = dir.write("key.json", config.dump());
  const std::string key_line = require_one_error_line(run_dplan({"estimate", "--model", key, "--gpus", "8"}));
  CHECK(key_line.find('\x1b') == std::string::npos);
  CHECK_THAT(key_line, Contains("unknown key \"\\x1b]0;title\\x07\""));
}

TEST_CASE("Model fields that name something take only its names", "[cli][limits]") {
  TempDir dir;
  json config = json::parse(read_file(kTiny));
  config["activation_function"] = "banana";
  const std::string path = dir.write("act.json", config.dump());
  CHECK_THAT(require_one_error_line(run_dplan({"estimate", "--model", path, "--gpus", "8"})),
             Contains("/activation_function: expected one of gelu, "));
}

TEST_CASE("The --profiles option works after the subcommand too", "[cli][limits]") {
  const Result r = run_dplan({"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "--profiles",
                          DPLAN_PROFILES_DIR});
  INFO(r.err);
  CHECK(r.status == 0);
  const Result list = run_dplan({"list", "--profiles", DPLAN_PROFILES_DIR});
  CHECK(list.status == 0);
}

TEST_CASE("dplan run: options out of range are refused before a rank starts", "[cli][limits]") {
  TempDir dir;
  const std::string plan = make_plan(dir);
  CHECK(require_one_error_line(run_dplan({"run", plan, "--steps", "0"})) == "dplan: error: --steps must be from 1 to 10000000, got 0");
  CHECK(require_one_error_line(run_dplan({"run", plan, "--lr", "nan"})) == "dplan: error: --lr must be from 1e-12 to 10, got nan");
  CHECK(require_one_error_line(run_dplan({"run", plan, "--timeout-s", "inf"})) ==
        "dplan: error: --timeout-s must be from 0.1 to 604800 seconds, got inf");
  // The output is checked before training, not after it.
  const std::string notes = dir.write("notes.txt", "mine\n");
  CHECK_THAT(require_one_error_line(run_dplan({"run", plan, "-o", notes})), Contains("exists and is not a run record dplan wrote"));
  CHECK(read_file(notes) == "mine\n");
}

TEST_CASE("A plan's embedded cluster block is read with a cluster profile's keys and ranges by every command", "[cli][limits]") {
  TempDir dir;
  const std::string plan_path = make_plan(dir);
  const json plan = json::parse(read_file(plan_path));
  struct Damage {
    const char* pointer;
    json value;
    const char* expected;
  };
  const std::vector<Damage> damages = {
      {"/cluster/gpus_per_node", "x", "/cluster/gpus_per_node: expected an integer from 1 to 4096, got \"x\""},
      {"/cluster/cores_per_node", "x", "/cluster/cores_per_node: expected an integer from 1 to 100000, got \"x\""},
      {"/cluster/name", 5, "/cluster/name: expected a string, got 5"},
      {"/cluster/gpu/peak_tflops/fp32", -1, "/cluster/gpu/peak_tflops/fp32: expected a number from"},
      {"/cluster/intra_node/latency_us", "fast", "/cluster/intra_node/latency_us: expected a number from"},
  };
  for (const Damage& d : damages) {
    json damaged = plan;
    damaged[json::json_pointer(d.pointer)] = d.value;
    const std::string path = (dir.path() / "damaged.json").string();
    std::ofstream(path) << damaged.dump(1);
    const std::vector<std::vector<std::string>> commands = {
        {"check", path, "--engine", "torchrun"},
        {"export", path, "--to", "torchrun", "-o", (dir.path() / "out").string()},
        {"explain", path},
        {"compare", path, path},
        {"run", path}};
    for (const auto& args : commands) {
      INFO(args[0] << " with " << d.pointer << " = " << d.value.dump());
      CHECK_THAT(require_one_error_line(run_dplan(args)), Contains(path + ": " + d.expected));
    }
    CHECK(!fs::exists(dir.path() / "out"));
  }
}

TEST_CASE("A GPU, cluster or model name of any length is one short error line, not a filesystem error", "[cli][limits]") {
  TempDir dir;
  json cluster = json::parse(read_file(std::string(DPLAN_PROFILES_DIR) + "/clusters/local-cpu.json"));
  cluster["cluster"]["gpu"] = std::string(300, 'g');
  const std::string cluster_path = (dir.path() / "cluster.json").string();
  std::ofstream(cluster_path) << cluster.dump(1);
  const std::string gpu_line = require_one_error_line(run_dplan({"--model", "gpt-tiny", "--cluster", cluster_path, "--gpus", "2"}));
  CHECK_THAT(gpu_line, StartsWith("dplan: error: unknown GPU \"gggg"));
  CHECK_THAT(gpu_line, Contains("...\"; choose "));
  CHECK(gpu_line.size() < 600);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--model", "gpt-tiny", "--cluster", std::string(300, 'c'), "--gpus", "2"},
        std::vector<std::string>{"--model", std::string(300, 'm'), "--gpus", "2"}}) {
    const std::string line = require_one_error_line(run_dplan(args));
    CHECK_THAT(line, Contains("...\"; choose "));
    CHECK(line.size() < 1000);
  }
}
