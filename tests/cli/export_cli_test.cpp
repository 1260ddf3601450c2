// dplan export and dplan check through the binary: export writes the engine's files (scripts
// executable) and the launch line, refuses to replace them without --force and the plan itself
// even with it, and with --force replaces only what an earlier export wrote; -o LINK/ is refused
// as -o LINK is; a write that fails part way leaves the earlier export or none; an unknown engine
// or a newer plan format is one error line and exit 2; check prints one line per failed rule and
// exits 1, or one ok line and 0.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "process.h"

namespace {
namespace fs = std::filesystem;
using dplan::testing::read_file;
using dplan::testing::require_one_error_line;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

Result run_dplan(const std::vector<std::string>& args) { return run_program(DPLAN_BINARY, args); }

// `dplan estimate --model MODEL ... -o DIR/NAME`: the plan's path.
std::string make_plan(const TempDir& dir, const std::string& name, const std::vector<std::string>& layout,
                      const std::string& model = "llama-3-8b") {
  const std::string path = (dir.path() / name).string();
  std::vector<std::string> args = {"estimate", "--model", model};
  args.insert(args.end(), layout.begin(), layout.end());
  args.insert(args.end(), {"-o", path, "--json"});
  const Result r = run_dplan(args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return path;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

const std::vector<std::string> kTp2Pp2 = {"--gpus", "16", "--tp", "2", "--pp", "2", "--sp", "--zero", "1",
                                          "--mbs", "1", "--global-batch", "64"};

}  // namespace

TEST_CASE("dplan export writes the engine's files beside the plan and prints them with the launch line", "[cli][export]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", kTp2Pp2);
  const Result r = run_dplan({"export", plan, "--to", "megatron"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  const fs::path out = dir.path() / "plan-megatron";
  for (const char* name : {"megatron.args", "launch-megatron.sh", "README.export"}) {
    CAPTURE(name);
    CHECK(fs::is_regular_file(out / name));
    CHECK_THAT(r.out, Contains("wrote " + (out / name).string()));
  }
  CHECK_THAT(r.out, Contains("launch: cd " + out.string() + " && "));
  CHECK_THAT(r.out, Contains("./launch-megatron.sh"));
  struct stat st {};
  REQUIRE(::stat((out / "launch-megatron.sh").c_str(), &st) == 0);
  CHECK((st.st_mode & S_IXUSR) != 0);
  REQUIRE(::stat((out / "megatron.args").c_str(), &st) == 0);
  CHECK((st.st_mode & S_IXUSR) == 0);
  const std::string args = read_file(out / "megatron.args");
  CHECK_THAT(args, Contains("--tensor-model-parallel-size 2\n"));
  CHECK_THAT(args, Contains("--pipeline-model-parallel-size 2\n"));
  CHECK_THAT(args, Contains("--use-distributed-optimizer\n"));
  // Every engine exports this plan or refuses it with its reasons; -o picks the folder.
  for (const char* engine : {"torchtitan", "deepspeed", "accelerate"}) {
    const Result e = run_dplan({"export", plan, "--to", engine, "-o", (dir.path() / engine).string()});
    CAPTURE(engine, e.out, e.err);
    CHECK(e.status == 2);
    CHECK(e.out.empty());
    for (const std::string& line : lines(e.err)) CHECK_THAT(line, StartsWith(std::string("dplan: error: ") + engine + ": "));
    CHECK(!fs::exists(dir.path() / engine / "README.export"));
  }
  for (const char* engine : {"torchrun", "slurm"}) {
    const Result e = run_dplan({"export", plan, "--to", engine, "-o", (dir.path() / engine).string()});
    CAPTURE(engine, e.err);
    CHECK(e.status == 0);
    CHECK(read_file(dir.path() / engine / "plan.json") == read_file(plan));
  }
  CHECK(fs::is_regular_file(dir.path() / "slurm" / "dplan.sbatch"));
  CHECK(fs::is_regular_file(dir.path() / "torchrun" / "launch-torchrun.sh"));
}

TEST_CASE("dplan export does not replace an earlier export without --force and never the plan", "[cli][export]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "8", "--zero", "3", "--global-batch", "64"});
  const std::string out = (dir.path() / "ds").string();
  REQUIRE(run_dplan({"export", plan, "--to", "deepspeed", "-o", out}).status == 0);
  const fs::path config = fs::path(out) / "ds_config.json";
  {
    std::ofstream(config) << "edited\n";
  }
  const std::string line = require_one_error_line(run_dplan({"export", plan, "--to", "deepspeed", "-o", out}));
  CHECK_THAT(line, Contains("exists"));
  CHECK_THAT(line, Contains("--force"));
  CHECK(read_file(config) == "edited\n");
  const Result forced = run_dplan({"export", plan, "--to", "deepspeed", "-o", out, "--force"});
  INFO(forced.err);
  REQUIRE(forced.status == 0);
  CHECK(nlohmann::json::parse(read_file(config)).at("zero_optimization").at("stage") == 3);
  // The plan itself, in the folder it would be copied to: refused even with --force.
  const std::string before = read_file(plan);
  const std::string self = require_one_error_line(
      run_dplan({"export", plan, "--to", "torchrun", "-o", dir.path().string(), "--force"}));
  CHECK_THAT(self, Contains("one of this command's inputs"));
  CHECK(read_file(plan) == before);
  CHECK(!fs::exists(dir.path() / "launch-torchrun.sh"));
}

TEST_CASE("dplan export and check: an unknown engine is one line naming the valid ones and exit 2", "[cli][export][error]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "8", "--global-batch", "64"});
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"export", plan, "--to", "nemo"}, {"check", plan, "--engine", "nemo"}}) {
    const std::string line = require_one_error_line(run_dplan(args));
    CHECK_THAT(line, Contains("unknown engine \"nemo\""));
    CHECK_THAT(line, Contains("megatron, torchtitan, deepspeed, accelerate, torchrun or slurm"));
  }
  CHECK(!fs::exists(dir.path() / "plan-nemo"));
}

TEST_CASE("dplan export and check: a plan of a newer format is one line saying so and exit 2", "[cli][export][error]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "8", "--global-batch", "64"});
  nlohmann::json j = nlohmann::json::parse(read_file(plan));
  j["format_version"] = 2;
  const std::string newer = dir.write("newer.json", j.dump(1));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"export", newer, "--to", "megatron"}, {"check", newer, "--engine", "megatron"}}) {
    const std::string line = require_one_error_line(run_dplan(args));
    CHECK_THAT(line, Contains("format 2 is newer than this dplan reads (format 1)"));
  }
  const std::string missing = require_one_error_line(run_dplan({"check", (dir.path() / "none.json").string(), "--engine", "slurm"}));
  CHECK_THAT(missing, Contains("none.json"));
}

TEST_CASE("dplan check: one line per failed rule and exit 1 / one ok line and exit 0", "[cli][export]") {
  TempDir dir;
  // Megatron has no GPipe schedule (plan files keep every layout rule of dplan's own, such as the
  // batch divisibility, so the rules a plan file can break are the engines' own).
  const std::string bad = make_plan(dir, "bad.json", {"--gpus", "8", "--pp", "2", "--schedule", "gpipe", "--global-batch", "64"});
  const Result r = run_dplan({"check", bad, "--engine", "megatron"});
  CHECK(r.status == 1);
  CHECK(r.err.empty());
  const std::vector<std::string> out = lines(r.out);
  REQUIRE(out.size() == 1);
  CHECK_THAT(out[0], StartsWith("megatron: cannot express the gpipe schedule"));
  CHECK_THAT(out[0], Contains("use --schedule 1f1b"));
  // Several failures: one line each.
  const std::string many = make_plan(dir, "many.json", {"--gpus", "16", "--tp", "2", "--sp", "--pp", "2", "--global-batch", "64"});
  const Result a = run_dplan({"check", many, "--engine", "accelerate"});
  CHECK(a.status == 1);
  const std::vector<std::string> failures = lines(a.out);
  CHECK(failures.size() == 2);
  for (const std::string& f : failures) CHECK_THAT(f, StartsWith("accelerate: "));
  // The export refuses the same plan with the same lines, as errors, and writes nothing.
  const Result e = run_dplan({"export", many, "--to", "accelerate"});
  CHECK(e.status == 2);
  CHECK(lines(e.err).size() == failures.size());
  for (size_t i = 0; i < failures.size() && i < lines(e.err).size(); ++i) CHECK(lines(e.err)[i] == "dplan: error: " + failures[i]);
  CHECK(!fs::exists(dir.path() / "many-accelerate"));

  const std::string good = make_plan(dir, "good.json", kTp2Pp2);
  const Result ok = run_dplan({"check", good, "--engine", "megatron"});
  INFO(ok.out << ok.err);
  CHECK(ok.status == 0);
  REQUIRE(lines(ok.out).size() == 1);
  CHECK_THAT(ok.out, StartsWith("megatron: ok: "));
  CHECK_THAT(ok.out, Contains("16 ranks = 2 nodes x 8"));
}

namespace {

// The `${NAME:?word}` words of a script: bash reads a quote inside one (within double quotes) as
// the start of a quoted string, so an apostrophe breaks the script or garbles the message.
std::vector<std::string> required_words(const std::string& script) {
  std::vector<std::string> out;
  for (size_t at = script.find(":?"); at != std::string::npos; at = script.find(":?", at + 2)) {
    const size_t end = script.find('}', at);
    if (end != std::string::npos) out.push_back(script.substr(at + 2, end - at - 2));
  }
  return out;
}

}  // namespace

TEST_CASE("every exported launch script of a 1-node and a 2-node plan parses with bash -n", "[cli][export][scripts]") {
  TempDir dir;
  const std::vector<std::string> engines = {"megatron", "torchtitan", "deepspeed", "accelerate", "torchrun", "slurm"};
  std::map<std::string, int> checked;  // engine and node count -> scripts checked
  for (const std::string gpus : {"8", "16"}) {
    // ZeRO-1 (Accelerate runs DeepSpeed) and ZeRO-2 (Accelerate runs FSDP2, torchtitan shards).
    for (const std::string zero : {"1", "2"}) {
      const std::string plan = make_plan(dir, "plan-" + gpus + "-" + zero + ".json",
                                         {"--gpus", gpus, "--zero", zero, "--global-batch", "64"});
      for (const std::string& engine : engines) {
        CAPTURE(gpus, zero, engine);
        const fs::path out = dir.path() / ("out-" + gpus + "-" + zero + "-" + engine);
        const Result r = run_dplan({"export", plan, "--to", engine, "-o", out.string()});
        INFO(r.err);
        if (zero == "2") REQUIRE(r.status == 0);  // every engine expresses this plan
        if (r.status != 0) continue;
        for (const auto& entry : fs::directory_iterator(out)) {
          if ((entry.status().permissions() & fs::perms::owner_exec) == fs::perms::none) continue;
          const std::string script = entry.path().string();
          CAPTURE(script);
          const Result parsed = run_program("/bin/bash", {"-n", script});
          INFO(parsed.err);
          CHECK(parsed.status == 0);
          CHECK(parsed.err.empty());
          for (const std::string& word : required_words(read_file(script))) {
            CAPTURE(word);
            CHECK(word.find('\'') == std::string::npos);
            CHECK(word.find('"') == std::string::npos);
          }
          ++checked[engine + (gpus == "8" ? " 1 node" : " 2 nodes")];
        }
      }
    }
  }
  for (const std::string& engine : engines)
    for (const std::string nodes : {" 1 node", " 2 nodes"}) {
      CAPTURE(engine + nodes);
      CHECK(checked[engine + nodes] >= 1);
    }
}

TEST_CASE("a 2-node launch script without MASTER_ADDR or NODE_RANK stops with its own message intact", "[cli][export][scripts]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "16", "--zero", "2", "--global-batch", "64"});
  for (const std::string engine : {"torchrun", "megatron", "torchtitan", "accelerate"}) {
    CAPTURE(engine);
    const fs::path out = dir.path() / engine;
    const Result r = run_dplan({"export", plan, "--to", engine, "-o", out.string()});
    INFO(r.err);
    REQUIRE(r.status == 0);
    // The variables a launch script reads first are set; the node's own are not (env -u).
    const Result run = run_program("/usr/bin/env", {"-u", "MASTER_ADDR", "-u", "NODE_RANK", "/bin/bash",
                                                    (out / ("launch-" + engine + ".sh")).string()},
                                   {{"MEGATRON_LM", "/nonexistent"}, {"TRAIN_SCRIPT", "train.py"}});
    INFO(run.err);
    CHECK(run.status != 0);
    const std::string expected = engine == "accelerate" ? "NODE_RANK: set NODE_RANK to the index of this node\n"
                                                        : "MASTER_ADDR: set MASTER_ADDR to the address of the first node\n";
    CHECK_THAT(run.err, Contains(expected));
  }
}

TEST_CASE("dplan export -o LINK/ refuses the link as -o LINK does and writes nothing through it", "[cli][export][error]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "8", "--global-batch", "64"});
  fs::create_directory(dir.path() / "real");
  fs::create_directory_symlink("real", dir.path() / "link");
  const std::string link = (dir.path() / "link").string();
  for (const std::string& out : {link, link + "/", link + "//"}) {
    CAPTURE(out);
    const std::string line = require_one_error_line(run_dplan({"export", plan, "--to", "torchrun", "-o", out}));
    CHECK_THAT(line, Contains(link + ": is a symbolic link, not a folder"));
    CHECK(fs::is_empty(dir.path() / "real"));
  }
}

TEST_CASE("dplan export --force replaces the earlier export's files only, never the user's own", "[cli][export][error]") {
  TempDir dir;
  const std::string plan = make_plan(dir, "plan.json", {"--gpus", "8", "--global-batch", "64"});
  // The user's own plan.json (no export wrote it) where the torchrun export would copy the plan.
  const fs::path mine = dir.path() / "mine";
  const std::string own = dir.write("mine/plan.json", "{\"my\": \"own plan\"}\n");
  const std::string line = require_one_error_line(run_dplan({"export", plan, "--to", "torchrun", "-o", mine.string(), "--force"}));
  CHECK_THAT(line, StartsWith("dplan: error: " + own + ": "));
  CHECK_THAT(line, Contains("README.export"));
  CHECK(read_file(own) == "{\"my\": \"own plan\"}\n");
  CHECK(std::vector<fs::path>(fs::directory_iterator(mine), {}) == std::vector<fs::path>{own});
  // A README.export of the user's own is no earlier export either.
  const fs::path notes = dir.path() / "notes";
  const std::string readme = dir.write("notes/README.export", "files:\n  README.export\n");
  CHECK_THAT(require_one_error_line(run_dplan({"export", plan, "--to", "megatron", "-o", notes.string(), "--force"})),
             Contains(readme + ": "));
  CHECK(read_file(readme) == "files:\n  README.export\n");
  // An earlier export's files, edited or not, are replaced; a file of the user's beside them stays.
  const fs::path out = dir.path() / "out";
  REQUIRE(run_dplan({"export", plan, "--to", "torchrun", "-o", out.string()}).status == 0);
  const std::string copy = read_file(out / "plan.json");
  { std::ofstream(out / "plan.json") << "edited\n"; }
  const std::string extra = dir.write("out/train.py", "print('mine')\n");
  const Result forced = run_dplan({"export", plan, "--to", "torchrun", "-o", out.string(), "--force"});
  INFO(forced.err);
  REQUIRE(forced.status == 0);
  CHECK(read_file(out / "plan.json") == copy);
  CHECK(read_file(extra) == "print('mine')\n");
  // The help says so.
  const Result help = run_dplan({"export", "--help"});
  CHECK_THAT(help.out, Contains("README.export lists"));
}

namespace {

// Runs dplan with its files limited to `limit_bytes` each (RLIMIT_FSIZE, SIGXFSZ ignored): a
// write past it fails with EFBIG, as on a full disk.
Result run_dplan_with_file_limit(size_t limit_bytes, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"python3", "-c",
                                  "import os, resource, signal, sys\n"
                                  "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                                  "n = int(sys.argv[1])\n"
                                  "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))\n"
                                  "os.execv(sys.argv[2], sys.argv[2:])\n",
                                  std::to_string(limit_bytes), DPLAN_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  return run_program("/usr/bin/env", all);
}

// Every entry under `dir` (folders too) with its content ("" for a folder).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    out[fs::relative(entry.path(), dir).string()] = entry.is_regular_file() ? read_file(entry.path()) : "";
  return out;
}

}  // namespace

TEST_CASE("dplan export that fails part way leaves the earlier export, or none, and one error line", "[cli][export][error]") {
  TempDir dir;
  const std::string first = make_plan(dir, "first.json", {"--gpus", "8", "--zero", "2", "--global-batch", "64"});
  const std::string second = make_plan(dir, "second.json", {"--gpus", "8", "--zero", "3", "--global-batch", "128"});
  // The files of the second export, in the order written, and their sizes: the limit lets the
  // first through and stops a later one.
  const fs::path scratch = dir.path() / "scratch";
  const Result plain = run_dplan({"export", second, "--to", "torchtitan", "-o", scratch.string()});
  REQUIRE(plain.status == 0);
  std::vector<uintmax_t> sizes;
  for (const std::string& line : lines(plain.out))
    if (line.rfind("wrote ", 0) == 0) sizes.push_back(fs::file_size(line.substr(6)));
  REQUIRE(sizes.size() >= 2);
  const size_t limit_bytes = sizes.front();
  REQUIRE(*std::max_element(sizes.begin() + 1, sizes.end()) > limit_bytes);

  const fs::path out = dir.path() / "out";
  REQUIRE(run_dplan({"export", first, "--to", "torchtitan", "-o", out.string()}).status == 0);
  const auto before = snapshot(out);
  const std::string line =
      require_one_error_line(run_dplan_with_file_limit(limit_bytes, {"export", second, "--to", "torchtitan", "-o", out.string(), "--force"}));
  CHECK_THAT(line, Contains("File too large"));
  CHECK(snapshot(out) == before);  // the earlier export whole, and no temporary left
  // A new folder (and its parent) is not left behind half written, nor empty.
  const fs::path fresh = dir.path() / "new" / "export";
  require_one_error_line(run_dplan_with_file_limit(limit_bytes, {"export", second, "--to", "torchtitan", "-o", fresh.string()}));
  CHECK(!fs::exists(dir.path() / "new"));
}
