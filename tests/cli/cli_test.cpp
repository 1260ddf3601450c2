// End-to-end tests of the dplan binary: bad input gives exit status 2 and exactly one
// "dplan: error: ..." line on stderr that names the problem and the valid choices, with nothing on
// stdout; good input prints the memory table or JSON; the examples in examples/ run.
// Each test runs DPLAN_BINARY as a child process with DPLAN_PROFILES=DPLAN_PROFILES_DIR.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
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
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using dplan::testing::require_one_error_line;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using nlohmann::json;

Result run_dplan(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  return run_program(DPLAN_BINARY, args, env);
}


// A copy of a preset's config.json with `edit` applied, written as dir/<folder>/config.json.
std::string edited_preset(const TempDir& dir, const std::string& folder, const std::string& preset,
                          const std::function<void(json&)>& edit) {
  json config = json::parse(read_file(fs::path(DPLAN_PROFILES_DIR) / "models" / (preset + ".json")));
  edit(config);
  return dir.write(folder + "/config.json", config.dump(2));
}

std::vector<std::string> profile_names(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(DPLAN_PROFILES_DIR) / folder))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The layout the JSON tests read: llama-3-70b (80 layers) on 64 GPUs as tp 8 x pp 4 x dp 2,
// 512 sequences of micro-batch 1, so 256 micro-batches per pipeline and 20 layers per stage.
const std::vector<std::string> kEstimate70b = {"--gpus", "64", "--tp", "8", "--pp", "4", "--dp", "2",
                                               "--mbs", "1", "--global-batch", "512", "--json"};

json estimate_json(const std::string& model) {
  std::vector<std::string> args = {"estimate", "--model", model};
  args.insert(args.end(), kEstimate70b.begin(), kEstimate70b.end());
  Result r = run_dplan(args);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  return json::parse(r.out);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Bad input

TEST_CASE("An unknown model is an error that lists the presets and the size shorthands", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"--model", "llama-9-99b", "--gpus", "8"}));
  CHECK_THAT(line, Contains("unknown model \"llama-9-99b\""));
  CHECK_THAT(line, Contains("llama-3-70b"));
  CHECK_THAT(line, Contains("mixtral-8x7b"));
  CHECK_THAT(line, Contains("70B"));
  CHECK_THAT(line, Contains("config.json"));
}

TEST_CASE("a misspelt model, cluster, GPU, engine or flag is one line with the nearest choice, extras in the order given",
          "[cli][error]") {
  auto line = [](const std::vector<std::string>& args) { return require_one_error_line(run_dplan(args)); };
  CHECK_THAT(line({"--model", "llama-3-8", "--gpus", "8"}), Contains("unknown model \"llama-3-8\" (did you mean llama-3-8b?)"));
  CHECK_THAT(line({"--model", "70b", "--gpus", "8", "--cluster", "dgx-h10"}),
             Contains("unknown cluster \"dgx-h10\" (did you mean dgx-h100?)"));
  CHECK_THAT(line({"--model", "70b", "--gpus", "8", "--engine", "megatrom"}),
             Contains("unknown engine \"megatrom\" (did you mean megatron?)"));
  CHECK_THAT(line({"--model", "70b", "--gpus", "8", "--tpp", "8"}),
             Contains("unexpected arguments: --tpp 8 (did you mean --tp?); dplan --help lists the options"));
  CHECK_THAT(line({"estimate", "--model", "70b", "--gpus", "8", "--mbz", "2"}),
             Contains("unexpected arguments: --mbz 2 (did you mean --mbs?); dplan estimate --help lists the options"));
  // Nothing near: no guess.
  const std::string far = line({"--model", "qqqqqqqq", "--gpus", "8"});
  CHECK_THAT(far, !Contains("did you mean"));
  CHECK_THAT(line({"--model", "70b", "--gpus", "8", "--zzz"}), Contains("unexpected argument: --zzz; dplan --help"));
}

TEST_CASE("a config.json where a plan.json belongs is one line saying what the file should be", "[cli][error]") {
  TempDir dir;
  const std::string config = dir.write("config.json", R"({"model_type": "llama", "hidden_size": 64})");
  for (const char* command : {"explain", "export"}) {
    std::vector<std::string> args = {command, config};
    if (std::string(command) == "export") args.insert(args.end(), {"--to", "megatron", "-o", (dir.path() / "out").string()});
    CHECK(require_one_error_line(run_dplan(args)) ==
          "dplan: error: " + config + ": not a plan.json, which dplan -o and dplan estimate -o write (it has no \"format_version\")");
  }
}

TEST_CASE("An unknown cluster is an error that lists the clusters", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--cluster", "dgx-h900"}));
  CHECK_THAT(line, Contains("unknown cluster \"dgx-h900\""));
  for (const auto& name : profile_names("clusters")) CHECK_THAT(line, Contains(name));
}

TEST_CASE("A config.json that is not valid JSON is an error naming the file", "[cli][error]") {
  TempDir dir;
  std::string path = dir.write("broken/config.json", "{\"model_type\": \"llama\",\n \"hidden_size\": }\n");
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains(path));
  CHECK_THAT(line, Contains("malformed JSON"));
  CHECK_THAT(line, Contains("line 2"));
}

TEST_CASE("A --model path that does not exist is an error naming the path", "[cli][error]") {
  TempDir dir;
  std::string path = (dir.path() / "no-such-model" / "config.json").string();
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains(path));
  CHECK_THAT(line, Contains("no such file"));
}

TEST_CASE("A model whose every fitting layout the engine refuses is one line with the engine's reason and the way out",
          "[cli][error]") {
  // Megatron's export has no multi-head latent attention flags: dplan's own executor runs it.
  const std::string model = std::string(DPLAN_VALIDATION_DIR) + "/executor/deepseek-v3-tiny/config.json";
  Result r = run_dplan({"--model", model, "--cluster", "local-cpu", "--gpus", "8"});
  CHECK(r.status != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Contains("can be run by megatron"));
  CHECK_THAT(r.err, Contains("multi-head latent attention"));
  CHECK_THAT(r.err, Contains("--engine torchrun"));
  CHECK_THAT(r.err, !Contains("fits in memory"));
  CHECK(run_dplan({"--model", model, "--cluster", "local-cpu", "--gpus", "8", "--engine", "torchrun"}).status == 0);
}

TEST_CASE("A config.json of an unsupported model type is an error listing the supported types", "[cli][error]") {
  TempDir dir;
  std::string path = edited_preset(dir, "bert", "llama-3-8b", [](json& c) { c["model_type"] = "bert"; });
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains(path));
  CHECK_THAT(line, Contains("\"bert\""));
  for (const char* family : {"llama", "mistral", "mixtral", "qwen2", "gpt_neox", "gpt2"})
    CHECK_THAT(line, Contains(family));
}

TEST_CASE("A config.json with a key the loader does not know is an error listing the valid keys", "[cli][error]") {
  TempDir dir;
  // A stray misspelt key next to the real one.
  std::string path = edited_preset(dir, "typo", "llama-3-8b", [](json& c) { c["num_hidden_layer"] = 32; });
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains(path));
  CHECK_THAT(line, Contains("unknown key \"num_hidden_layer\""));
  CHECK_THAT(line, Contains("valid keys"));
  CHECK_THAT(line, Contains("num_hidden_layers"));
  CHECK_THAT(line, Contains("num_attention_heads"));
}

// Required keys are read before unknown keys are looked for, so the missing-key message must
// point at the near-miss the user typed.
TEST_CASE("A config.json whose required key is misspelt names the misspelling", "[cli][error]") {
  TempDir dir;
  std::string path = edited_preset(dir, "typo", "llama-3-8b", [](json& c) {
    c["num_hidden_layer"] = c["num_hidden_layers"];
    c.erase("num_hidden_layers");
  });
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains("num_hidden_layers"));
  CHECK_THAT(line, Contains("\"num_hidden_layer\""));
}

TEST_CASE("A config.json without a required key is an error naming the key", "[cli][error]") {
  TempDir dir;
  std::string path = edited_preset(dir, "no-vocab", "llama-3-8b", [](json& c) { c.erase("vocab_size"); });
  std::string line = require_one_error_line(run_dplan({"--model", path, "--gpus", "8"}));
  CHECK_THAT(line, Contains(path));
  CHECK_THAT(line, Contains("missing key \"vocab_size\""));
}

TEST_CASE("A tensor-parallel size that does not divide the heads is an error listing the valid sizes",
          "[cli][error]") {
  // llama-3-70b: 64 heads, 8 kv heads; tp must divide both: 1, 2, 4 or 8.
  std::string line =
      require_one_error_line(run_dplan({"estimate", "--model", "llama-3-70b", "--gpus", "48", "--tp", "3", "--pp", "1"}));
  CHECK_THAT(line, Contains("tp 3"));
  CHECK_THAT(line, Contains("heads"));
  CHECK_THAT(line, Contains("valid tp: 1, 2, 4 or 8"));
}

TEST_CASE("Parallel sizes whose product is not the GPU count are an error that gives the right dp",
          "[cli][error]") {
  // 8 * 4 * 4 * 1 = 128 != 64; with tp 8, pp 4 the dp that fills 64 GPUs is 2.
  std::string line = require_one_error_line(
      run_dplan({"estimate", "--model", "llama-3-70b", "--tp", "8", "--pp", "4", "--dp", "4", "--gpus", "64"}));
  CHECK_THAT(line, Contains("128"));
  CHECK_THAT(line, Contains("64"));
  CHECK_THAT(line, Contains("--dp 2"));
}

TEST_CASE("A global batch not divisible by micro-batch times dp is an error", "[cli][error]") {
  // micro-batch 3 * dp 2 = 6 does not divide 512.
  std::string line = require_one_error_line(run_dplan({"estimate", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8",
                                                   "--pp", "4", "--dp", "2", "--mbs", "3", "--global-batch", "512"}));
  CHECK_THAT(line, Contains("512"));
  CHECK_THAT(line, Contains("6"));
  CHECK_THAT(line, Contains("multiple"));
}

TEST_CASE("Zero or negative sizes are errors naming the flag and the value", "[cli][error]") {
  struct Case {
    std::vector<std::string> args;
    std::string flag, value;
  };
  const std::vector<Case> cases = {
      {{"estimate", "--model", "70B", "--gpus", "0"}, "--gpus", "0"},
      {{"--model", "70B", "--gpus", "-8"}, "--gpus", "-8"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "0"}, "--tp", "0"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp", "0"}, "--pp", "0"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--dp", "0"}, "--dp", "0"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--mbs", "-1"}, "--mbs", "-1"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--mbs", "0"}, "--mbs", "0"},
      {{"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--global-batch", "0"}, "--global-batch", "0"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.flag << " " << c.value) {
      std::string line = require_one_error_line(run_dplan(c.args));
      CHECK_THAT(line, Contains(c.flag));
      CHECK_THAT(line, Contains("positive"));
      CHECK_THAT(line, Contains("got " + c.value));
    }
  }
}

TEST_CASE("dplan --gpus 0 without a subcommand says the GPU count must be positive", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"--model", "70B", "--gpus", "0"}));
  CHECK_THAT(line, Contains("--gpus"));
  CHECK_THAT(line, Contains("positive"));
}

TEST_CASE("An unknown choice for an option is an error listing the choices", "[cli][error]") {
  const std::vector<std::string> layout = {"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp", "4"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = layout;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  SECTION("--precision") {
    std::string line = require_one_error_line(run_dplan(with({"--precision", "fp7"})));
    CHECK_THAT(line, Contains("\"fp7\""));
    CHECK_THAT(line, Contains("bf16, fp16, fp8 or fp32"));
  }
  SECTION("--precision without a subcommand") {
    std::string line = require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--precision", "fp7"}));
    CHECK_THAT(line, Contains("bf16, fp16, fp8 or fp32"));
  }
  SECTION("--recompute") {
    std::string line = require_one_error_line(run_dplan(with({"--recompute", "some"})));
    CHECK_THAT(line, Contains("\"some\""));
    CHECK_THAT(line, Contains("none, selective or full"));
  }
  SECTION("--schedule") {
    std::string line = require_one_error_line(run_dplan(with({"--schedule", "zigzag"})));
    CHECK_THAT(line, Contains("\"zigzag\""));
    CHECK_THAT(line, Contains("gpipe, 1f1b, interleaved or dualpipe"));
  }
  SECTION("--attention") {
    std::string line = require_one_error_line(run_dplan(with({"--attention", "sparse"})));
    CHECK_THAT(line, Contains("\"sparse\""));
    CHECK_THAT(line, Contains("flash or standard"));
  }
  SECTION("--zero") {
    std::string line = require_one_error_line(run_dplan(with({"--zero", "4"})));
    CHECK_THAT(line, Contains("--zero"));
    CHECK_THAT(line, Contains("ZeRO stage: 0, 1, 2 or 3, got 4"));
  }
}

TEST_CASE("fp8 on an A100 cluster is an error naming the GPU and its precisions", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp",
                                                   "4", "--cluster", "dgx-a100-80g", "--precision", "fp8"}));
  CHECK_THAT(line, Contains("a100-sxm4-80gb"));
  CHECK_THAT(line, Contains("fp8"));
  CHECK_THAT(line, Contains("bf16"));
}

TEST_CASE("Virtual pipeline stages without the interleaved schedule are an error", "[cli][error]") {
  std::string schedule = GENERATE("1f1b", "gpipe");
  std::string line = require_one_error_line(run_dplan({"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp",
                                                   "4", "--vpp", "2", "--schedule", schedule}));
  CHECK_THAT(line, Contains("--vpp 2"));
  CHECK_THAT(line, Contains("interleaved"));
}

TEST_CASE("Megatron's first/last stage counts with the accounting flags are one error naming both ways", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp",
                                                       "4", "--first-stage-layers", "18", "--account-for-loss"}));
  CHECK_THAT(line, Contains("--first-stage-layers"));
  CHECK_THAT(line, Contains("--account-for-embedding"));
}

TEST_CASE("fp32 gradients and a bf16 gradient reduce together are one error naming both", "[cli][error]") {
  std::string line = require_one_error_line(
      run_dplan({"--model", "8B", "--gpus", "8", "--fp32-grads", "--grad-reduce-in-bf16"}));
  CHECK_THAT(line, Contains("--grad-reduce-in-bf16"));
  CHECK_THAT(line, Contains("--fp32-grads"));
}

TEST_CASE("a bf16 gradient reduce (--grad-reduce-in-bf16) halves the gradients Megatron holds and reaches the plan", "[cli]") {
  auto grads = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"estimate", "--model", "8B", "--gpus", "8", "--dp", "8", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run_dplan(args);
    REQUIRE(r.status == 0);
    const json j = json::parse(r.out);
    return std::pair{j.at("memory").at("stages").at(0).at("grads_bytes").get<double>(),
                     j.at("training").value("grad_reduce_in_bf16", false)};
  };
  const auto [fp32, off] = grads({});
  const auto [bf16, on] = grads({"--grad-reduce-in-bf16"});
  CHECK(bf16 == Approx(fp32 / 2));
  CHECK_FALSE(off);
  CHECK(on);
}

TEST_CASE("bf16 Adam moments (--bf16-adam-moments) keep 6 bytes of optimizer state per parameter, not 12, and reach the plan", "[cli]") {
  auto optimizer = [](bool bf16) {
    std::vector<std::string> args = {"estimate", "--model", "8B", "--gpus", "8", "--dp", "8", "--dist-opt", "--json"};
    if (bf16) args.push_back("--bf16-adam-moments");
    const Result r = run_dplan(args);
    REQUIRE(r.status == 0);
    const json j = json::parse(r.out);
    CHECK(j.at("training").value("bf16_adam_moments", false) == bf16);
    return j.at("memory").at("stages").at(0).at("optimizer_bytes").get<double>();
  };
  CHECK(optimizer(true) == Approx(optimizer(false) * 6 / 12));
}

TEST_CASE("Megatron's recompute modules (--recompute-modules) reach the plan, save memory and are checked", "[cli]") {
  auto run = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"estimate", "--model", "8B", "--gpus", "8", "--dp", "8", "--recompute", "selective",
                                     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dplan(args);
  };
  const Result core = run({});
  const Result mlp = run({"--recompute-modules", "core_attn,mlp"});
  REQUIRE(core.status == 0);
  REQUIRE(mlp.status == 0);
  const json a = json::parse(core.out), b = json::parse(mlp.out);
  CHECK_FALSE(a.at("training").contains("recompute_modules"));
  CHECK(b.at("training").at("recompute_modules") == json({"core_attn", "mlp"}));
  auto activations = [](const json& j) { return j.at("memory").at("stages").at(0).at("activations_bytes").get<double>(); };
  CHECK(activations(b) < activations(a));
  CHECK(b.at("time").at("recompute").get<double>() > a.at("time").at("recompute").get<double>());
  const Result unknown = run({"--recompute-modules", "mlp,attention"});
  CHECK(unknown.status != 0);
  CHECK_THAT(unknown.err, Contains("unknown recompute module \"attention\"") && Contains("core_attn, moe_act"));
  const Result full = run_dplan({"estimate", "--model", "8B", "--gpus", "8", "--dp", "8", "--recompute", "full",
                                 "--recompute-modules", "mlp"});
  CHECK(full.status != 0);
  CHECK_THAT(full.err, Contains("give --recompute selective"));
}

TEST_CASE("the model's multi-token prediction modules, overridden by --mtp-layers", "[cli]") {
  auto run = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"estimate", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "8",
                                     "--ep", "64", "--etp", "1", "--dist-opt", "--sp", "--seq", "4096",
                                     "--global-batch", "8192", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run_dplan(args);
    REQUIRE(r.status == 0);
    return json::parse(r.out);
  };
  const json own = run({}), none = run({"--mtp-layers", "0"}), two = run({"--mtp-layers", "2"});
  CHECK(own.at("model").at("mtp_layers") == 1);
  CHECK_FALSE(none.at("model").contains("mtp_layers"));
  CHECK(two.at("model").at("mtp_layers") == 2);
  auto last = [](const json& j) { return j.at("memory").at("stages").back().at("weights_bytes").get<double>(); };
  CHECK(last(none) < last(own));
  CHECK(last(own) < last(two));
  CHECK(none.at("step_time_s").get<double>() < own.at("step_time_s").get<double>());
  const Result bad = run_dplan({"--model", "8B", "--gpus", "8", "--mtp-layers", "-1"});
  CHECK(bad.status != 0);
  CHECK_THAT(bad.err, Contains("--mtp-layers"));
}

TEST_CASE("Megatron's fused cross-entropy and deferred embedding weight gradients reach the plan and its memory", "[cli]") {
  auto run = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"estimate", "--model", "8B", "--gpus", "8", "--tp", "2", "--pp", "2", "--sp",
                                     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run_dplan(args);
    REQUIRE(r.status == 0);
    return json::parse(r.out);
  };
  const json plain = run({}), both = run({"--cross-entropy-fusion", "--defer-embedding-wgrad", "2"});
  CHECK_FALSE(plain.at("training").contains("cross_entropy_fusion"));
  CHECK(both.at("training").at("cross_entropy_fusion") == true);
  CHECK(both.at("training").at("embedding_wgrad_deferral") == 2);
  auto last = [](const json& j) { return j.at("memory").at("stages").back().at("logits_bytes").get<double>(); };
  CHECK(last(both) > last(plain));
  const Result bad = run_dplan({"estimate", "--model", "8B", "--gpus", "8", "--defer-embedding-wgrad", "-2"});
  CHECK(bad.status != 0);
  CHECK_THAT(bad.err, Contains("--defer-embedding-wgrad"));
}

TEST_CASE("the closest call names the 16-bit model states that would admit it, and they do", "[cli]") {
  // Llama 3 70B on 16 H100: the fastest layout rejected for memory (tp 4 pp 4, ZeRO 0) holds
  // Megatron's fp32 gradients; with bf16 ones it fits and the search picks it.
  const std::vector<std::string> args = {"--model", "70B", "--gpus", "16", "--seq", "8192", "--global-batch", "64"};
  const Result r = run_dplan(args);
  REQUIRE(r.status == 0);
  const auto at = r.out.find("closest call: ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  CHECK_THAT(line, Contains("or as it is with --grad-reduce-in-bf16"));
  REQUIRE_THAT(line, Contains("closest call: tp 4 pp 4 dp 1 vpp 5, mbs 1, zero 0, full recompute, sp,"));
  auto fits = [](bool bf16) {
    std::vector<std::string> est = {"estimate", "--model", "70B", "--gpus", "16", "--tp", "4", "--pp", "4", "--vpp", "5",
                                    "--schedule", "interleaved", "--sp", "--recompute", "full", "--seq", "8192",
                                    "--global-batch", "64", "--json"};
    if (bf16) est.push_back("--grad-reduce-in-bf16");
    const Result e = run_dplan(est);
    REQUIRE(e.status == 0);
    return json::parse(e.out).at("fits").get<bool>();
  };
  CHECK_FALSE(fits(false));
  CHECK(fits(true));
}

TEST_CASE("estimate runs Llama-3.1-405B's 126 layers on pp 8 x vpp 8 with the embedding and loss accounted", "[cli]") {
  TempDir dir;
  const std::string plan = (fs::path(dir.path()) / "plan.json").string();
  Result r = run_dplan({"estimate", "--model", "llama-3.1-405b", "--gpus", "1024", "--tp", "8", "--pp", "8", "--vpp",
                        "8", "--account-for-embedding", "--account-for-loss", "--global-batch", "1024", "--json",
                        "-o", plan});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  std::vector<int> layers;
  for (const json& stage : j["memory"]["stages"]) layers.push_back(stage["num_layers"].get<int>());
  CHECK(layers == std::vector<int>{15, 16, 16, 16, 16, 16, 16, 15});
  CHECK(j["parallel"]["account_for_loss"] == true);
  const json written = json::parse(read_file(plan));
  CHECK(written["stages"][0]["chunks"][0] == json{{"first_layer", 0}, {"num_layers", 1}});
}

TEST_CASE("A GPU profile with a negative HBM size is an error naming the file and the key", "[cli][error]") {
  // A copy of the profiles tree whose H100 claims -80 GB; dgx-h100 (the default cluster) uses it.
  TempDir dir;
  fs::path profiles = dir.path() / "profiles";
  fs::copy(DPLAN_PROFILES_DIR, profiles, fs::copy_options::recursive);
  fs::path gpu_file = profiles / "gpus" / "h100-sxm5-80gb.json";
  json gpu = json::parse(read_file(gpu_file));
  gpu["gpu"]["hbm_gb"] = -80;
  std::ofstream(gpu_file) << gpu.dump(2);

  SECTION("found through --profiles") {
    std::string line =
        require_one_error_line(run_dplan({"--profiles", profiles.string(), "--model", "70B", "--gpus", "64"}));
    CHECK_THAT(line, Contains(gpu_file.string()));
    CHECK_THAT(line, Contains("/gpu/hbm_gb: expected a number from 0.01 to 100000, got -80"));
  }
  SECTION("found through DPLAN_PROFILES") {
    std::string line = require_one_error_line(
        run_dplan({"estimate", "--model", "70B", "--gpus", "64", "--tp", "8", "--pp", "4"},
              {{"DPLAN_PROFILES", profiles.string()}}));
    CHECK_THAT(line, Contains("/gpu/hbm_gb: expected a number from 0.01 to 100000, got -80"));
  }
}

TEST_CASE("A non-numeric size is an error naming the flag and the value", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"estimate", "--model", "70B", "--gpus", "64", "--tp", "eight"}));
  CHECK_THAT(line, Contains("--tp"));
  CHECK_THAT(line, Contains("eight"));
}

TEST_CASE("An unknown flag is an error naming it", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--bogus"}));
  CHECK_THAT(line, Contains("--bogus"));
}

TEST_CASE("estimate without --model is an error naming the missing flag", "[cli][error]") {
  std::string line = require_one_error_line(run_dplan({"estimate", "--gpus", "64"}));
  CHECK_THAT(line, Contains("--model"));
}

// ---------------------------------------------------------------------------------------------
// Good input

TEST_CASE("dplan --model 70B --gpus 64 prints a memory table per pipeline stage that fits", "[cli]") {
  Result r = run_dplan({"--model", "70B", "--gpus", "64"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("llama-3-70b"));
  CHECK_THAT(r.out, Contains("stage"));
  CHECK_THAT(r.out, Contains("fits"));
}

TEST_CASE("estimate --json gives per-stage memory whose worst stage is the peak", "[cli]") {
  json j = estimate_json("llama-3-70b");
  REQUIRE(j.contains("fits"));
  CHECK(j["fits"].is_boolean());
  REQUIRE(j.contains("memory"));
  const json& mem = j["memory"];
  REQUIRE(mem.contains("peak_bytes"));
  REQUIRE(mem.contains("stages"));
  REQUIRE(mem["stages"].is_array());
  CHECK(mem["stages"].size() == 4);  // pp 4
  CHECK(j["fits"] == mem["fits"]);

  double max_total = 0;
  int layers = 0;
  for (const json& stage : mem["stages"]) {
    for (const char* key :
         {"weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes", "total_bytes"}) {
      INFO("stage " << stage.value("stage", -1) << " key " << key);
      REQUIRE(stage.contains(key));
      CHECK(stage[key].get<double>() >= 0);
    }
    // total = weights + grads + optimizer + activations + other
    double sum = stage["weights_bytes"].get<double>() + stage["grads_bytes"].get<double>() +
                 stage["optimizer_bytes"].get<double>() + stage["activations_bytes"].get<double>() +
                 stage["other_bytes"].get<double>();
    CHECK_THAT(stage["total_bytes"].get<double>(), Catch::Matchers::WithinRel(sum, 1e-12));
    max_total = std::max(max_total, stage["total_bytes"].get<double>());
    layers += stage.value("num_layers", 0);
  }
  CHECK(layers == 80);  // llama-3-70b's 80 layers, split over the 4 stages
  CHECK(mem["peak_bytes"].get<double>() == max_total);
  // the fit verdict agrees with the numbers
  CHECK(j["fits"].get<bool>() ==
        (max_total <= mem["capacity_bytes"].get<double>() * (1 - j["headroom_fraction"].get<double>())));
}

TEST_CASE("A preset, its size shorthand and its config.json path give the same estimate", "[cli]") {
  double by_name = estimate_json("llama-3-70b")["memory"]["peak_bytes"].get<double>();
  std::string other = GENERATE(as<std::string>{}, "70B", "70b", "LLaMA-3-70B",
                               std::string(DPLAN_PROFILES_DIR) + "/models/llama-3-70b.json");
  INFO("--model " << other);
  CHECK(estimate_json(other)["memory"]["peak_bytes"].get<double>() == by_name);
}

TEST_CASE("dplan list names every cluster and every model preset", "[cli]") {
  Result r = run_dplan({"list"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (const auto& name : profile_names("clusters")) CHECK_THAT(r.out, Contains(name));
  for (const auto& name : profile_names("models")) CHECK_THAT(r.out, Contains(name));
  CHECK_THAT(r.out, Contains("70b"));
}

TEST_CASE("dplan list names every GPU with its memory, dense bf16 peak and TDP", "[cli]") {
  Result r = run_dplan({"list"});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  const auto gpus = r.out.find("GPUs (");
  REQUIRE(gpus != std::string::npos);
  const std::string table = r.out.substr(gpus);
  CHECK_THAT(table, Contains("HBM (GB)  bf16 (TFLOP/s)  TDP (W)  description"));
  for (const auto& name : profile_names("gpus")) CHECK_THAT(table, Contains("\n  " + name + " "));
  // Rows as profiles/gpus/SOURCES.md section 2 and section 6 give them: name, GB, dense bf16, W.
  for (const char* row : {"  h100-sxm5-80gb                80           989.0      700  NVIDIA H100 SXM5 80GB",
                          "  h100-nvl-94gb                 94           835.0      400  NVIDIA H100 NVL 94GB",
                          "  h800-sxm5-80gb                80           989.0      700  NVIDIA H800 SXM5 80GB",
                          "  h100-sxm5-96gb-hbm2e          96           989.0      700  NVIDIA H100 SXM5 96GB HBM2e",
                          "  a100-sxm4-40gb                40           312.0      400  NVIDIA A100 SXM4 40GB",
                          "  b200                         180          2250.0     1000  NVIDIA B200",
                          "  mi300x                       192          1300.0      750  AMD Instinct MI300X"})
    CHECK_THAT(table, Contains(row));
  CHECK_THAT(table, Contains("  cpu-core                      24"));  // no TDP: a dash
}

// ---------------------------------------------------------------------------------------------
// Examples

TEST_CASE("The custom-model example's config.json loads as a qwen2 model of 1.54 B parameters", "[cli][examples]") {
  // hidden 1536, ffn 8960, 28 layers, 12 heads of 128, 2 kv heads, vocab 151936, tied embeddings:
  //   attention 1536*(1536 + 2*256) + 1536*1536 + (1536 + 2*256) q/k/v biases = 5,507,072
  //   mlp 3*1536*8960 = 41,287,680; norms 2*1536 = 3,072; layer = 46,797,824; x 28 = 1,310,339,072
  //   + embedding 151936*1536 = 233,373,696 + final norm 1,536 = 1,543,714,304
  std::string config = std::string(DPLAN_EXAMPLES_DIR) + "/custom-model/config.json";
  Result r = run_dplan({"estimate", "--model", config, "--cluster", "dgx-a100-80g", "--gpus", "8", "--tp", "2", "--dp",
                    "4", "--json"});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  json j = json::parse(r.out);
  CHECK(j["model"]["family"] == "qwen2");
  CHECK(j["model"]["name"] == "custom-model");
  CHECK(j["model"]["num_params"].get<double>() == 1543714304.0);
  CHECK(j["fits"] == true);
}

// The walk-through's training, probing and calibrating examples (6 to 8) run in bench/run.sh: how
// long they take and what they measure depend on the machine's pace.
TEST_CASE("Every planning example in examples/run_all.sh runs", "[cli][examples]") {
  Result r = run_program("/bin/bash", {std::string(DPLAN_EXAMPLES_DIR) + "/run_all.sh", "--plan-only"},
                         {{"DPLAN", DPLAN_BINARY}});
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Contains("run_all: all planning examples ran"));
  CHECK_THAT(r.out, Contains("\"fits\": true"));
}

TEST_CASE("examples/run_all.sh refuses an unknown option", "[cli][examples]") {
  Result r = run_program("/bin/bash", {std::string(DPLAN_EXAMPLES_DIR) + "/run_all.sh", "--bogus"},
                         {{"DPLAN", DPLAN_BINARY}});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("valid: --plan-only"));
}

TEST_CASE("examples/run_all.sh fails when a dplan command fails", "[cli][examples]") {
  // /bin/false stands in for a dplan whose every command fails: the script must stop, not carry on.
  Result r = run_program("/bin/bash", {std::string(DPLAN_EXAMPLES_DIR) + "/run_all.sh"}, {{"DPLAN", "/bin/false"}});
  CHECK(r.status != 0);
  CHECK_THAT(r.out, !Contains("run_all: all examples ran"));
}

TEST_CASE("the search takes constraints: --tp and the others fix a dimension, a list allowed, and the report says "
          "how they narrowed it", "[cli]") {
  const Result r = run_dplan({"--model", "70B", "--gpus", "64", "--tp", "8"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Contains("layout  tp 8 "));
  CHECK_THAT(r.out, Contains("constrained to tp 8: "));
  const Result j = run_dplan({"--model", "70B", "--gpus", "64", "--tp", "4,8", "--zero", "1", "--recompute",
                              "none,selective", "--json"});
  INFO(j.err);
  REQUIRE(j.status == 0);
  const json out = json::parse(j.out);
  CHECK(out.at("search").at("constraints").at("fixed") == "tp 4,8 · zero 1 · recompute none,selective");
  CHECK(out.at("search").at("constraints").at("unconstrained_layouts").get<long>() > out.at("search").at("evaluated").get<long>());
  const json& p = out.at("parallel");
  CHECK((p.at("tp") == 4 || p.at("tp") == 8));
  CHECK((p.value("zero_stage", 0) == 1 || p.value("distributed_optimizer", false)));
  CHECK(p.value("recompute", std::string("none")) != "full");
  // None takes it: one line naming the constraint and the values the space has.
  const std::string line = require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--tp", "3"}));
  CHECK_THAT(line, Contains("has tp 3"));
  CHECK_THAT(line, Contains("tp takes 1, 2, 4, 8"));
  CHECK_THAT(require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--recompute", "some"})),
             Contains("--recompute"));
}

TEST_CASE("dplan --runnable refuses a model the executor cannot train, with the executor's own reason", "[cli][error]") {
  // A rotary scaling the executor does not compute (transformers' dynamic NTK): --runnable says so
  // before searching.
  TempDir dir;
  const std::string dynamic = dir.write("llama-dynamic.json", R"({"model_type": "llama", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
      "vocab_size": 256, "max_position_embeddings": 128, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})");
  std::string line = require_one_error_line(run_dplan({"--model", dynamic, "--cluster", "local-cpu", "--gpus", "2",
                                                       "--global-batch", "8", "--precision", "fp32", "--runnable"}));
  CHECK_THAT(line, Contains("dynamic rotary scaling"));
  CHECK_THAT(line, Contains("the executor's rotary embedding"));
  // A model with attention dropout plans the same with --runnable as without: the executor runs
  // every layout of it, context parallel's ring included.
  const std::string model = dir.write("gpt-dropout.json", R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2,
      "n_head": 4, "n_inner": 256, "vocab_size": 256, "n_positions": 128, "attn_pdrop": 0.1, "resid_pdrop": 0.0,
      "embd_pdrop": 0.0, "tie_word_embeddings": true})");
  const std::string plan = (dir.path() / "plan.json").string(), any = (dir.path() / "any.json").string();
  for (const auto& [path, runnable] : {std::pair{plan, true}, std::pair{any, false}}) {
    std::vector<std::string> args = {"--model", model, "--cluster", "local-cpu", "--gpus", "2", "--global-batch", "8",
                                     "--precision", "fp32", "--attention", "standard", "-o", path};
    if (runnable) args.push_back("--runnable");
    Result r = run_dplan(args);
    INFO(r.err);
    REQUIRE(r.status == 0);
  }
  CHECK(json::parse(read_file(plan))["parallel"] == json::parse(read_file(any))["parallel"]);
}

// dplan explain and --headroom (planner/explain.h): structure, not figures.
TEST_CASE("dplan explain re-estimates a plan.json and its losses add up to the step", "[cli][explain]") {
  TempDir dir;
  const std::string plan = (dir.path() / "plan.json").string();
  Result w = run_dplan({"estimate", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "8", "--mbs", "2",
                        "--global-batch", "32", "--seq", "4096", "--sp", "-o", plan});
  INFO("stderr: " << w.err);
  REQUIRE(w.status == 0);

  Result text = run_dplan({"explain", plan});
  INFO("explain stderr: " << text.err);
  CHECK(text.status == 0);
  CHECK(text.err.empty());
  CHECK_THAT(text.out, Contains("why MFU is"));
  CHECK_THAT(text.out, Contains("pipeline bubble"));
  CHECK_THAT(text.out, Contains("dplan estimate --model llama-3-70b"));
  CHECK_THAT(text.out, Contains("--headroom"));

  Result r = run_dplan({"explain", plan, "--json"});
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  double sum = j["explain"]["ideal_s"].get<double>();
  for (const json& loss : j["explain"]["losses"]) sum += loss["seconds"].get<double>();
  CHECK_THAT(sum, Catch::Matchers::WithinRel(j["step_time_s"].get<double>(), 1e-9));
  REQUIRE(j["suggestions"].is_array());
  REQUIRE_FALSE(j["suggestions"].empty());  // a 30 % bubble has a remedy
  for (const json& s : j["suggestions"]) {
    CHECK(s["gain"].get<double>() > 0);
    CHECK_THAT(s["estimate_flags"].get<std::string>(), StartsWith("--model llama-3-70b"));
  }
  CHECK_FALSE(j.contains("note"));  // written and explained by the same cost model
  CHECK_THAT(text.out, Contains("micro-batches per pipeline"));  // the bubble's terms

  // A stored prediction that is not today's is named, and today's is explained.
  json stored = json::parse(read_file(plan));
  stored["prediction"]["step_time_s"] = 2 * j["step_time_s"].get<double>();
  const std::string edited = dir.write("edited/plan.json", stored.dump(1));
  Result n = run_dplan({"explain", edited, "--json"});
  REQUIRE(n.status == 0);
  const json k = json::parse(n.out);
  REQUIRE(k.contains("note"));
  CHECK_THAT(k["note"].get<std::string>(), Contains("differs"));
  CHECK(k["step_time_s"] == j["step_time_s"]);
}

TEST_CASE("dplan explain of a missing or foreign file is one error line naming it", "[cli][explain][error]") {
  TempDir dir;
  const std::string missing = (dir.path() / "nope.json").string();
  CHECK_THAT(require_one_error_line(run_dplan({"explain", missing})), Contains("nope.json"));
  const std::string foreign = dir.write("cluster.json", read_file(fs::path(DPLAN_PROFILES_DIR) / "clusters" / "dgx-h100.json"));
  CHECK_THAT(require_one_error_line(run_dplan({"explain", foreign})), Contains("cluster.json"));
  const std::string broken = dir.write("broken.json", "{\"format_version\": 1,");
  CHECK_THAT(require_one_error_line(run_dplan({"explain", broken})), Contains("broken.json"));
}

TEST_CASE("the search's pick keeps --headroom free and the report states it", "[cli][headroom]") {
  Result text = run_dplan({"--model", "70B", "--gpus", "64"});
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Contains("plans keep 5 % of HBM free"));
  CHECK_THAT(text.out, Contains("why MFU is"));
  for (const char* headroom : {"0.05", "0.25"}) {
    Result r = run_dplan({"--model", "70B", "--gpus", "64", "--headroom", headroom, "--json", "--top", "3"});
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    const json j = json::parse(r.out);
    const double fraction = std::stod(headroom);
    CHECK(j["headroom_fraction"].get<double>() == fraction);
    const double capacity = j["prediction"]["memory"]["capacity_bytes"].get<double>();
    for (const json& c : j["search"]["ranked"]) CHECK(c["peak_bytes"].get<double>() <= capacity * (1 - fraction));
    CHECK(j.contains("explain"));
  }
  CHECK_THAT(require_one_error_line(run_dplan({"--model", "70B", "--gpus", "64", "--headroom", "1.5"})),
             Contains("--headroom"));
}

TEST_CASE("dplan plans Mixtral 8x7B on 64 GPUs and writes etp into the plan", "[cli][moe]") {
  // Before MoE parallel folding this search failed: an ep group larger than dp did not tile.
  TempDir dir;
  const std::string plan = (dir.path() / "plan.json").string();
  Result r = run_dplan({"--model", "8x7B", "--gpus", "64", "-o", plan});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Contains("etp"));
  const json written = json::parse(read_file(plan));
  CHECK(written["parallel"].contains("etp"));
  CHECK(written["rank_layout"]["expert_order"] == "etp-ep-edp");
}

TEST_CASE("dplan estimate --etp that breaks the folding rule is one error line naming the valid sizes",
          "[cli][error][moe]") {
  std::string line = require_one_error_line(
      run_dplan({"estimate", "--model", "8x7B", "--gpus", "16", "--tp", "2", "--ep", "8", "--etp", "4"}));
  CHECK_THAT(line, Contains("ep*etp = 8*4 must divide tp*cp*dp = 16"));
  CHECK_THAT(line, Contains("valid ep*etp: 1, 2, 4, 8 or 16"));
}

// ---------------------------------------------------------------------------------------------
// Defaults a CPU user can live with (issue 20): the batch, the expected time, the probe

namespace {
const std::string kProbedMachine = std::string(DPLAN_VALIDATION_DIR) + "/accuracy/machine.json";
constexpr const char* kNeverProbed = "local-cpu has never been probed";
constexpr const char* kProbeCommand = "`dplan probe --cluster local-cpu -o my-machine.json`";
}  // namespace

TEST_CASE("a search and an estimate on the shipped local-cpu say it was never probed and name dplan probe",
          "[cli][defaults]") {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2"},
        std::vector<std::string>{"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2"}}) {
    const Result r = run_dplan(args);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Contains(kNeverProbed));
    CHECK_THAT(r.out, Contains(kProbeCommand));
    // The batch is sized to the machine: a step of about a second, not 32768 sequences of 128 tokens.
    CHECK_FALSE(r.out.find("global batch 32768") != std::string::npos);
  }
  for (const std::string& cluster : {kProbedMachine, std::string("dgx-h100")}) {
    INFO(cluster);
    const Result r = run_dplan({"--model", "gpt-tiny", "--cluster", cluster, "--gpus", "2"});
    REQUIRE(r.status == 0);
    CHECK_FALSE(r.out.find("never been probed") != std::string::npos);
  }
  // A GPU cluster keeps the 4M-token default: 4194304 / 128.
  CHECK_THAT(run_dplan({"--model", "gpt-tiny", "--cluster", "dgx-h100", "--gpus", "2"}).out,
             Contains("global batch 32768"));
}

TEST_CASE("dplan run and dplan scale print the expected run time before the ranks start", "[cli][defaults]") {
  TempDir dir;
  const std::string plan = (dir.path() / "plan.json").string();
  REQUIRE(run_dplan({"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2", "--runnable", "-o", plan}).status == 0);
  const double step_s = json::parse(read_file(plan))["prediction"]["step_time_s"].get<double>();
  CHECK_THAT(run_dplan({"explain", plan}).out, Contains(kProbeCommand));  // explain re-estimates on local-cpu
  // A worker that fails at once: what the launcher printed before starting it is all there is.
  const std::map<std::string, std::string> failing_worker = {{"DPLAN_WORKER", "/bin/false"}};
  Result r = run_dplan({"run", plan, "--steps", "7"}, failing_worker);
  INFO(r.out << r.err);
  CHECK(r.status != 0);
  char expected[64];
  std::snprintf(expected, sizeof expected, "(7 steps x %.2f s predicted)", step_s);
  CHECK_THAT(r.out, StartsWith("expected run time: about "));
  CHECK_THAT(r.out, Contains(expected));
  CHECK_THAT(r.out, Contains(kProbeCommand));

  const std::string probed_plan = (dir.path() / "probed.json").string();
  REQUIRE(run_dplan({"--model", "gpt-tiny", "--cluster", kProbedMachine, "--gpus", "2", "--runnable", "-o", probed_plan})
              .status == 0);
  r = run_dplan({"run", probed_plan, "--steps", "3"}, failing_worker);
  CHECK_THAT(r.out, StartsWith("expected run time: about "));
  CHECK_FALSE(r.out.find("never been probed") != std::string::npos);

  r = run_dplan({"scale", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "1,2,4", "-o",
                 (dir.path() / "scale").string()},
                failing_worker);
  CHECK(r.status != 0);
  const size_t expected_at = r.err.find("scale: expected run time: about ");
  REQUIRE(expected_at != std::string::npos);
  CHECK(expected_at < r.err.find("scale: run 1/3"));
  CHECK_THAT(r.err, Contains("(3 runs x 10 steps"));
  CHECK_THAT(r.err, Contains(kNeverProbed));
  // One batch for every size, sized to the machine and divisible by each.
  const int batch = json::parse(read_file((dir.path() / "scale" / "plan-4.json").string()))["training"]["global_batch"];
  CHECK(batch % 4 == 0);
  CHECK(batch <= 1024);
  for (const char* f : {"plan-1.json", "plan-2.json"})
    CHECK(json::parse(read_file((dir.path() / "scale" / f).string()))["training"]["global_batch"] == batch);
}
