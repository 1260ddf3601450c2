// Hostile names through every exporter: a plan file name and a model name holding newlines,
// quotes, $(...), backticks, backslashes, YAML's other line breaks and bytes that are not UTF-8
// go through dplan export (and through export_plan directly, for what the plan reader refuses);
// every shell script must pass bash -n, every TOML, YAML and JSON file its format's own parser
// (python3's tomllib, yaml and json), and each launch script, run with stand-in launchers first on
// PATH that only record their arguments, must run exactly the launcher with the arguments
// expected and nothing else: no INJECTED file appears anywhere.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engines.h"
#include "dplan/planner/export.h"
#include "process.h"

namespace {
namespace fs = std::filesystem;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

Result run_dplan(const std::vector<std::string>& args) { return run_program(DPLAN_BINARY, args); }

const std::vector<std::string> kEngines = {"megatron", "torchtitan", "deepspeed", "accelerate", "torchrun", "slurm"};

// Each would run `touch INJECTED` (in the folder the script runs in) if any exported file let it
// out of its quoting. U+2028 and U+0085 end a comment for YAML 1.1 (PyYAML); the key after them
// would become one of accelerate.yaml's.
const std::string kHostileModel =
    "m'\"$(touch INJECTED)`touch INJECTED`\\q\\ \xe2\x80\xa8" "distributed_type: NO\xc2\x85x; touch INJECTED";
const std::vector<std::string> kHostilePlanNames = {
    "p\ntouch INJECTED\n.json",
    "q'$(touch INJECTED)`touch INJECTED`\\\"; touch INJECTED #.json",
    "r\xff\xfe\r\x1b[2J\n#SBATCH --wrap=touch INJECTED\n.json",
};

// The arguments the launch scripts are given after their own: passed through untouched.
const std::vector<std::string> kExtraArgs = {"--steps", "2", "$(touch INJECTED)", "a b", "x\ny"};

// The stand-in launchers: each writes its arguments, NUL-separated, to $RECORD/<name>.argv.
// scontrol answers `show hostnames` the way Slurm does for a one-node job.
void install_launchers(const fs::path& bin) {
  fs::create_directories(bin);
  const std::string record =
      "#!/bin/sh\n"
      "for a in \"$@\"; do printf '%s\\0' \"$a\"; done >\"$RECORD/$(basename \"$0\").argv\"\n";
  for (const char* name : {"torchrun", "deepspeed", "accelerate", "srun", "python", "python3", "sbatch"}) {
    std::ofstream(bin / name) << record;
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  std::ofstream(bin / "scontrol") << record << "if [ \"$1 $2\" = 'show hostnames' ]; then echo node1; fi\n";
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
}

std::vector<std::string> recorded_argv(const fs::path& file) {
  const std::string text = read_file(file);
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\0', at);
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// The files called INJECTED under `root` (the plan files' own names only hold the word).
std::vector<std::string> injected_files(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    if (entry.path().filename() == "INJECTED") out.push_back(entry.path().string());
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// megatron.args as the launch script reads it: the words of every line that is not a comment.
std::vector<std::string> megatron_words(const fs::path& file) {
  std::vector<std::string> out;
  for (const std::string& line : lines_of(read_file(file))) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    for (std::string w; words >> w;) out.push_back(w);
  }
  return out;
}

const std::vector<std::string> kTorchrunOneNode = {"--nnodes", "1", "--nproc_per_node", "8", "--rdzv_backend", "c10d",
                                                   "--rdzv_endpoint", "127.0.0.1:29400", "--rdzv_id", "dplan",
                                                   "--redirects", "1", "--tee", "1"};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The launcher each engine's script runs (one node of 8 GPUs, ZeRO-2: every engine exports it)
// and its arguments.
std::pair<std::string, std::vector<std::string>> expected_launch(const std::string& engine, const fs::path& here) {
  const std::string dir = here.string();
  if (engine == "megatron")
    return {"torchrun", concat(concat(kTorchrunOneNode, {"/nonexistent-megatron/pretrain_gpt.py"}),
                               concat(megatron_words(here / "megatron.args"), kExtraArgs))};
  if (engine == "torchtitan")
    return {"torchrun", concat(kTorchrunOneNode, concat({"-m", "torchtitan.train", "--job.config_file",
                                                          dir + "/torchtitan.toml"},
                                                         kExtraArgs))};
  if (engine == "deepspeed")
    return {"deepspeed", concat({"--num_nodes", "1", "--num_gpus", "8", "--master_port", "29500", "train.py",
                                 "--deepspeed", "--deepspeed_config", dir + "/ds_config.json"},
                                kExtraArgs)};
  if (engine == "accelerate")
    return {"accelerate", concat({"launch", "--config_file", dir + "/accelerate.yaml", "train.py"}, kExtraArgs)};
  if (engine == "torchrun")
    return {"torchrun", concat(kTorchrunOneNode, concat({"--no_python", "dplan-worker", dir + "/plan.json", "-o",
                                                          "run.json"},
                                                         kExtraArgs))};
  return {"srun", concat({"dplan-worker", dir + "/plan.json", "-o", "run.json"}, kExtraArgs)};
}

// Parses every TOML, YAML and JSON file of the folders given after the model's name with
// python3's own parsers and checks what they read: torchtitan's job description is the model's
// name (a byte that is not UTF-8 as the text \xNN), accelerate.yaml holds its own keys alone.
const char* kParseScript = R"PY(
import json, pathlib, sys, tomllib, yaml
model = sys.argv[1].encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
keys = {"compute_environment", "distributed_type", "mixed_precision", "num_machines", "num_processes",
        "machine_rank", "rdzv_backend", "same_network", "main_training_function", "use_cpu", "deepspeed_config",
        "fsdp_config", "parallelism_config"}
failed = False
for f in sorted(f for folder in sys.argv[2:] for f in pathlib.Path(folder).iterdir()):
    try:
        if f.suffix == ".toml":
            with open(f, "rb") as h:
                t = tomllib.load(h)
            assert t["job"]["description"] == "dplan plan for " + model, repr(t["job"]["description"])
        elif f.suffix == ".yaml":
            with open(f, "rb") as h:
                y = yaml.safe_load(h)
            assert set(y) <= keys, sorted(set(y) - keys)
            assert y["distributed_type"] in ("FSDP", "DEEPSPEED"), repr(y["distributed_type"])
            assert y["num_processes"] == 8
        elif f.suffix == ".json":
            json.loads(f.read_bytes())
        else:
            continue
        print("parsed", f)
    except Exception as e:
        failed = True
        print("FAILED", f, repr(e))
sys.exit(1 if failed else 0)
)PY";

// Everything one export folder must hold to but its parsed formats (parse_exports): `engine`'s
// files of a one-node ZeRO-2 plan, exported from a plan file called `plan_name`. `root` holds the
// launchers' records and is searched for INJECTED.
void check_export_folder(const fs::path& root, const fs::path& out, const std::string& engine,
                         const std::string& plan_name) {
  const fs::path here = out;  // absolute: the folder the scripts find themselves in
  CAPTURE(engine, here.string());
  int scripts = 0;
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    const std::string text = read_file(entry.path());
    const std::vector<std::string> lines = lines_of(text);
    REQUIRE(!lines.empty());
    if (name == "plan.json" || name == "ds_config.json") continue;  // JSON: parse_exports
    // The header is four lines, each a comment (README.export's: plain lines).
    const bool readme = name == "README.export";
    size_t first = 0;
    while (first < lines.size() && lines[first].rfind(readme ? "dplan export" : "# dplan export", 0) != 0) ++first;
    REQUIRE(first < lines.size());
    CHECK_THAT(lines[first], Contains(" of "));
    CHECK_THAT(lines[first + 1], StartsWith(readme ? "spellings: " : "# spellings: "));
    CHECK_THAT(lines[first + 2], StartsWith(readme ? "layout: " : "# layout: "));
    CHECK_THAT(lines[first + 3], StartsWith(readme ? "launch: " : "# launch: "));
    if (name == "megatron.args" || name == "torchtitan.overrides")
      for (const std::string& line : lines)
        CHECK((line.rfind("#", 0) == 0 || line.rfind("--", 0) == 0 || line.rfind("activation-checkpoint:", 0) == 0));
    if (name == "dplan.sbatch")
      for (const std::string& line : lines)
        if (line.rfind("#SBATCH --job-name=", 0) == 0) {
          const std::string job = line.substr(std::string("#SBATCH --job-name=").size());
          CAPTURE(job);
          CHECK(!job.empty());
          CHECK(job.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                std::string::npos);
        }
    if (readme) {
      // Its `dplan check PLAN --engine ENGINE` hint, run by bash with a stand-in dplan: the plan's
      // name comes back as one argument.
      const size_t begin = text.find("`dplan check ");
      const size_t end = text.rfind("` applies");
      REQUIRE(begin != std::string::npos);
      REQUIRE(end != std::string::npos);
      const std::string command = text.substr(begin + 1, end - begin - 1);
      CAPTURE(command);
      CHECK(command.find('\n') == std::string::npos);
      fs::create_directories(root / "hint-bin");
      std::ofstream(root / "hint-bin" / "dplan")
          << "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >\"$RECORD/dplan.argv\"\n";
      fs::permissions(root / "hint-bin" / "dplan", fs::perms::owner_all);
      const Result hint = run_program("/bin/bash", {"-c", "cd \"$1\" && eval \"$2\"", "bash", root.string(), command},
                                      {{"PATH", (root / "hint-bin").string() + ":/usr/bin:/bin"},
                                       {"RECORD", root.string()}});
      INFO(hint.err);
      CHECK(hint.status == 0);
      CHECK(recorded_argv(root / "dplan.argv") == std::vector<std::string>{"check", plan_name, "--engine", engine});
      fs::remove(root / "dplan.argv");
    }
    if ((entry.status().permissions() & fs::perms::owner_exec) == fs::perms::none) continue;
    ++scripts;
    const Result syntax = run_program("/bin/bash", {"-n", entry.path().string()});
    INFO(syntax.err);
    CHECK(syntax.status == 0);
    CHECK(syntax.err.empty());
    // Run it (from `root`, where `touch INJECTED` would land) with the stand-in launchers.
    const fs::path bin = root / "bin";
    install_launchers(bin);
    // The variables a launch script would take from the environment are unset: the defaults run.
    std::vector<std::string> args = {"-c",
                                     "unset MASTER_ADDR MASTER_PORT RUN_ID HOSTFILE NODE_RANK DPLAN_WORKER RUN_JSON "
                                     "SLURM_JOB_ID SLURM_SUBMIT_DIR; cd \"$1\" && shift && exec /bin/bash \"$@\"",
                                     "bash", root.string(), entry.path().string()};
    args.insert(args.end(), kExtraArgs.begin(), kExtraArgs.end());
    const Result run = run_program("/bin/bash", args,
                                   {{"PATH", bin.string() + ":/usr/bin:/bin"},
                                    {"RECORD", root.string()},
                                    {"MEGATRON_LM", "/nonexistent-megatron"},
                                    {"TRAIN_SCRIPT", "train.py"},
                                    {"SLURM_JOB_NODELIST", "node1"}});
    INFO(run.out << run.err);
    CHECK(run.status == 0);
    const auto [launcher, expected] = expected_launch(engine, here);
    std::set<std::string> ran;
    for (const auto& r : fs::directory_iterator(root))
      if (r.path().extension() == ".argv") ran.insert(r.path().stem().string());
    CHECK(ran == (engine == "slurm" ? std::set<std::string>{"srun", "scontrol"} : std::set<std::string>{launcher}));
    CHECK(recorded_argv(root / (launcher + ".argv")) == expected);
    for (const std::string& name : ran) fs::remove(root / (name + ".argv"));
  }
  CHECK(scripts == 1);
  CHECK(injected_files(root).empty());
}

// How many TOML, YAML and JSON files each engine's export of a one-node ZeRO-2 plan holds.
const std::map<std::string, int> kParsedFiles = {{"megatron", 0},   {"torchtitan", 1}, {"deepspeed", 1},
                                                 {"accelerate", 1}, {"torchrun", 1},   {"slurm", 1}};

// kParseScript over the export folders (one python3 for them all), each of a plan whose model is
// `model` to `engines` in turn.
void parse_exports(const fs::path& root, const std::string& model, const std::vector<fs::path>& folders,
                   const std::vector<std::string>& engines) {
  std::vector<std::string> args = {"python3", (root / "parse.py").string(), model};
  int expected = 0;
  for (size_t i = 0; i < folders.size(); ++i) {
    args.push_back(folders[i].string());
    expected += kParsedFiles.at(engines[i]);
  }
  const Result parse = run_program("/usr/bin/env", args);
  INFO(parse.out << parse.err);
  CHECK(parse.status == 0);
  int parsed = 0;
  for (const std::string& line : lines_of(parse.out)) parsed += line.rfind("parsed ", 0) == 0;
  CHECK(parsed == expected);
}

// A one-node ZeRO-2 plan (every engine exports it) whose model is called `model`.
std::string hostile_plan_text(const TempDir& dir, const std::string& model) {
  const std::string path = (dir.path() / "made.json").string();
  const Result r = run_dplan({"estimate", "--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--global-batch", "64",
                              "-o", path, "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  nlohmann::json j = nlohmann::json::parse(read_file(path));
  fs::remove(path);
  j["model"]["name"] = model;
  return j.dump(1) + "\n";
}

}  // namespace

TEST_CASE("dplan export: hostile plan file and model names stay inside every format's quoting", "[cli][export][quoting]") {
  TempDir dir;
  dir.write("parse.py", kParseScript);
  const std::string text = hostile_plan_text(dir, kHostileModel);
  std::vector<fs::path> folders;
  std::vector<std::string> engines;
  for (size_t i = 0; i < kHostilePlanNames.size(); ++i) {
    const std::string& name = kHostilePlanNames[i];
    const std::string plan = dir.write(name, text);
    for (const std::string& engine : kEngines) {
      CAPTURE(i, engine);
      const fs::path out = dir.path() / ("out-" + std::to_string(i) + "-" + engine);
      const Result r = run_dplan({"export", plan, "--to", engine, "-o", out.string()});
      INFO(r.err);
      REQUIRE(r.status == 0);
      // One line per file written, the launch line and at most a note: no name broke a line.
      for (const std::string& line : lines_of(r.out))
        CHECK((line.rfind("wrote ", 0) == 0 || line.rfind("launch: ", 0) == 0 || line.rfind("note: ", 0) == 0));
      check_export_folder(dir.path(), out, engine, name);
      folders.push_back(out);
      engines.push_back(engine);
    }
  }
  parse_exports(dir.path(), kHostileModel, folders, engines);
  // Without -o the folder is named after the plan file: the launch line's `cd` word is that name.
  const std::string plan = (dir.path() / kHostilePlanNames[0]).string();
  const Result r = run_dplan({"export", plan, "--to", "megatron"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  const std::string expected = (dir.path() / "p\ntouch INJECTED\n-megatron").string();
  CHECK(fs::is_regular_file(fs::path(expected) / "launch-megatron.sh"));
  const std::vector<std::string> out = lines_of(r.out);
  REQUIRE(!out.empty());
  const std::string launch = out.back().rfind("note: ", 0) == 0 && out.size() > 1 ? out[out.size() - 2] : out.back();
  REQUIRE(launch.rfind("launch: cd ", 0) == 0);
  const std::string word = launch.substr(11, launch.find(" && ") - 11);
  const Result back = run_program("/bin/bash", {"-c", "eval \"set -- $1\"; printf '%s' \"$#:$1\"", "bash", word});
  CHECK(back.out == "1:" + expected);
  CHECK(injected_files(dir.path()).empty());
}

TEST_CASE("export_plan: model names the plan reader refuses (control bytes, not UTF-8) stay quoted too", "[export][quoting]") {
  TempDir dir;
  dir.write("parse.py", kParseScript);
  const std::string text = hostile_plan_text(dir, "llama-3-8b");
  const std::string plan_path = dir.write("plan.json", text);
  const dplan::costmodel::Plan read = dplan::costmodel::read_plan(plan_path);
  const std::vector<std::string> models = {"a\nb\rc\x01\x7f $(touch INJECTED)\n#SBATCH --wrap=touch INJECTED",
                                           "\xff\xfe\xe6\xa8 `touch INJECTED`\\x \xed\xa0\x80"};
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string& model = models[i];
    dplan::costmodel::Plan plan = read;
    plan.model.name = model;
    std::vector<fs::path> folders;
    for (const std::string& engine : kEngines) {
      CAPTURE(engine);
      const auto id = dplan::planner::engine_from_string(engine);
      REQUIRE(id);
      const fs::path out = dir.path() / ("unit-" + std::to_string(i) + "-" + engine);
      dplan::planner::write_export(dplan::planner::export_plan(plan, *id, text, "plan\n.json"), out.string(), false);
      check_export_folder(dir.path(), out, engine, "plan\n.json");
      folders.push_back(out);
    }
    parse_exports(dir.path(), model, folders, kEngines);
  }
}
