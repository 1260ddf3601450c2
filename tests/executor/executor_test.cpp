// The executor end to end, through the real binaries: `dplan estimate -o plan.json` writes a
// layout, `dplan run plan.json -o run.json` trains it with real ranks over Gloo on this machine.
//  - Parity: with the same seed, data and global batch (fp32 on CPU), every step's loss of every
//    (tp, pp, dp) layout, under GPipe and 1F1B, matches the single-process run within 1e-4
//    relative, and data-parallel replicas end with bit-identical weights.
//  - torchrun launches the same worker; a killed rank stops the run within the timeout, named;
//    bad input gives one error line.
//  - The launcher: a stopped rank is the one named; its ranks die with it; a signal to it is
//    reported as such (exit 128 + signal); a local run listens on loopback only.
//  - run.json has the documented keys, and its exact byte counts match the model.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/costmodel/phases.h"
#include "harness.h"
#include "process.h"

namespace {
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;
using namespace dplan::testing::executor;

}  // namespace

TEST_CASE("parity: GPipe on the seven layouts matches the single-process loss every step", "[executor][parity]") {
  check_layouts("gpt-tiny", issue_layouts("gpipe"));
}

TEST_CASE("parity: 1F1B on the seven layouts matches the single-process loss every step", "[executor][parity]") {
  check_layouts("gpt-tiny", issue_layouts("1f1b"));
}

TEST_CASE("parity: sequence parallel, and a Llama-style model (GQA, SwiGLU, RMSNorm, rotary, untied, padded vocab)",
          "[executor][parity]") {
  check_layouts("gpt-tiny", {{2, 2, 2, "1f1b", true}});
  check_layouts(kLlamaTiny, {{2, 1, 1, "1f1b", true}, {2, 2, 2, "1f1b", true}, {1, 2, 2, "gpipe"}, {2, 2, 1, "1f1b"}});
}

TEST_CASE("parity: full and selective recompute", "[executor][parity]") {
  check_layouts("gpt-tiny", {{2, 2, 2, "1f1b", true, 1, "full"},
                             {1, 2, 2, "gpipe", false, 1, "full"},
                             {2, 1, 2, "1f1b", false, 1, "selective"},
                             {1, 2, 2, "1f1b", false, 1, "selective"}});
  check_layouts(kLlamaTiny, {{2, 2, 1, "1f1b", true, 1, "full"}, {2, 2, 1, "gpipe", false, 1, "selective"}});
}

TEST_CASE("recompute with dropout draws the same masks again: the same losses as without recompute",
          "[executor][recompute]") {
  // gpt-tiny with dropout 0.1 on attention probabilities, residuals and embeddings, under standard
  // and flash attention (whose blockwise kernel draws its masks from a seed taken at forward). Each
  // layout's ranks draw their own masks, so the comparison is within one layout: recompute none
  // against full and selective.
  const std::string model = std::string(DPLAN_VALIDATION_DIR) + "/executor/gpt-tiny-dropout/config.json";
  TempDir dir;
  for (const auto& [layout, attention] : std::vector<std::pair<Layout, std::string>>{
           {{1, 1, 1}, "standard"}, {{2, 2, 1, "1f1b", true}, "standard"}, {{1, 2, 1}, "flash"},
           {with_cp({1, 1, 1}, 2), "flash"}}) {  // the ring's masks, from a seed drawn in the layer
    const std::vector<std::string> flags = {"--attention", attention};
    const std::vector<double> plain = losses(run_plan(write_plan(dir, model, layout, 8, flags), {}, 4));
    for (const std::string recompute : {"full", "selective"}) {
      Layout again = layout;
      again.recompute = recompute;
      const std::vector<double> got = losses(run_plan(write_plan(dir, model, again, 8, flags), {}, 4));
      INFO(again.describe() << " " << attention << " attention");
      REQUIRE(got.size() == plain.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - plain[i]) <= 1e-6 * std::abs(plain[i]));
    }
  }
}

TEST_CASE("parity: ZeRO-1 and the distributed optimizer shard the optimizer state over dp", "[executor][parity]") {
  const std::vector<double>& ref = reference("gpt-tiny", 8);
  TempDir dir;
  for (auto [layout, flag] : std::vector<std::pair<Layout, std::string>>{{{1, 1, 4}, "--zero"},
                                                                         {{2, 1, 2}, "--zero"},
                                                                         {{2, 2, 2, "gpipe"}, "--zero"},
                                                                         {{1, 2, 2}, "--dist-opt"}}) {
    std::vector<std::string> extra = flag == "--zero" ? std::vector<std::string>{"--zero", "1"}
                                                       : std::vector<std::string>{"--dist-opt"};
    json run = run_plan(write_plan(dir, "gpt-tiny", layout, 8, extra));
    require_parity(run, ref, layout.describe() + " " + flag);
    // Each rank holds AdamW's two fp32 moments for 1/dp of its stage's parameters (the slices
    // are cut at equal sizes, padding included: within dp elements of an exact 1/dp).
    for (const auto& [rank, m] : run["memory"].items()) {
      INFO(layout.describe() << " rank " << rank);
      const double params = m["weights"].get<double>() / 4;
      CHECK(std::abs(m["optimizer"].get<double>() - 8 * params / layout.dp) <= 8.0 * layout.dp);
    }
  }
}

TEST_CASE("parity: ZeRO-2 and ZeRO-3 shard gradients, then parameters, over dp", "[executor][parity]") {
  // (1,1,4) and (2,1,2) accumulate 2 and 4 micro-batches per rank and (1,2,2) pipelines 4: ZeRO-2
  // and 3 reduce-scatter every micro-batch's gradients into the shards, ZeRO-3 gathers each
  // layer's parameters before its forward and its backward.
  const std::vector<double>& ref = reference("gpt-tiny", 8);
  TempDir dir;
  for (int zero : {2, 3}) {
    for (Layout layout : std::vector<Layout>{{1, 1, 4}, {2, 1, 2}, {1, 2, 2, "gpipe"}}) {
      json run = run_plan(write_plan(dir, "gpt-tiny", layout, 8, {"--zero", std::to_string(zero)}));
      require_parity(run, ref, layout.describe() + " ZeRO-" + std::to_string(zero));
      for (const auto& [rank, m] : run["memory"].items()) {
        INFO(layout.describe() << " ZeRO-" << zero << " rank " << rank);
        // Shards of 1/dp (padding: under dp elements per bucket): gradients from ZeRO-2 on,
        // weights from ZeRO-3 on; AdamW's moments are twice the gradient shard.
        const double grads = m["gradients"].get<double>(), weights = m["weights"].get<double>();
        CHECK(m["optimizer"].get<double>() == 2 * grads);
        if (zero == 3) {
          CHECK(weights == grads);
        } else {
          CHECK(std::abs(grads - weights / layout.dp) <= 4.0 * layout.dp * 8);
        }
        CHECK(m["buffers"].get<double>() > 0);  // unsharded gradients (and gathered layers) in flight
      }
    }
  }
  // Accumulation of 4 micro-batches on one rank, with ZeRO-3's gather and release around each.
  json run = run_plan(write_plan(dir, "gpt-tiny", {1, 1, 2}, 8, {"--zero", "3"}));
  require_parity(run, ref, "tp 1 pp 1 dp 2, 4 micro-batches, ZeRO-3");
  // Everything at once: tp, pp, dp, sequence parallel and full recompute, on both models.
  run = run_plan(write_plan(dir, "gpt-tiny", {2, 2, 2, "1f1b", true, 1, "full"}, 8, {"--zero", "2"}));
  require_parity(run, ref, "tp 2 pp 2 dp 2 sp full ZeRO-2");
  run = run_plan(write_plan(dir, kLlamaTiny, {2, 2, 2, "1f1b", true, 1, "full"}, 8, {"--zero", "3"}));
  require_parity(run, reference(kLlamaTiny, 8), "llama-tiny tp 2 pp 2 dp 2 sp full ZeRO-3");
}

TEST_CASE("memory: measured weights, gradients and optimizer states match the prediction within 1 %, "
          "activations within 15 %, on ten layouts", "[executor][memory]") {
  // Qwen3's q/k norms (qwen3-tiny: head_dim 32 over hidden 64, rope_theta 1e6, eps 1e-6) with tp,
  // sequence parallel and pp: the term they add to the activations (costmodel/src/activations.cpp).
  const std::string qwen3_tiny = std::string(DPLAN_VALIDATION_DIR) + "/executor/qwen3-tiny/config.json";
  check_memory_cases({
      {qwen3_tiny, {1, 1, 1}, {}},
      {qwen3_tiny, {2, 2, 1, "1f1b", true}, {"--zero", "1"}},
      {"gpt-tiny", {1, 1, 1}, {"--zero", "0"}},
      {"gpt-tiny", {1, 2, 2}, {"--zero", "1"}},
      {"gpt-tiny", {2, 1, 2, "1f1b", false, 1, "selective"}, {"--zero", "2", "--attention", "standard"}},
      {"gpt-tiny", {1, 1, 4}, {"--zero", "3"}},
      {"gpt-tiny", {1, 2, 2, "gpipe", false, 1, "full"}, {"--zero", "3"}},
      {"gpt-tiny", {2, 2, 2, "1f1b", true, 1, "full"}, {"--zero", "1"}},
      {"gpt-tiny", {1, 2, 1}, {"--attention", "standard"}},
      {kLlamaTiny, {2, 2, 1, "1f1b", true}, {"--zero", "2"}},
  });
}

TEST_CASE("mixed precision: bf16 parameters and activations, fp32 master weights, gradients and AdamW states",
          "[executor][precision]") {
  // On CPU only when forced (--precision bf16); by default a bf16 plan trains fp32 there and says so.
  const std::vector<double>& ref = reference("gpt-tiny", 8);
  TempDir dir;
  for (auto [layout, zero] : std::vector<std::pair<Layout, std::string>>{
           {{1, 1, 1, "1f1b", false, 2}, "0"}, {{2, 1, 2, "1f1b", true}, "1"}, {{1, 2, 2}, "3"}}) {
    std::string plan = write_plan(dir, "gpt-tiny", layout, 8, {"--precision", "bf16", "--fp32-grads", "--zero", zero});
    json run = run_plan(plan, {"--precision", "bf16"});
    INFO(layout.describe() << " ZeRO-" << zero);
    CHECK(run["config"]["precision"] == "bf16");
    CHECK(run["config"]["grad_dtype"] == "fp32");
    // bf16 rounding moves the loss a little off the fp32 trajectory (5e-5 relative seen), not more.
    std::vector<double> got = losses(run);
    for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - ref[i]) <= 1e-3 * ref[i]);
    CHECK(run["replicas"]["identical"].get<bool>());
    // 2-byte weights, 4-byte gradients, 12 bytes of master weights and moments per parameter, as
    // the plan predicts (activations are not compared: CPU bf16 GEMMs allocate fp32 workspaces).
    Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
    REQUIRE(r.status == 0);
    for (const auto& stage : json::parse(r.out)["memory"])
      for (const char* part : {"weights", "gradients", "optimizer"}) {
        INFO(part << " stage " << stage["stage"]);
        CHECK(std::abs(stage[part]["measured"].get<double>() - stage[part]["predicted"].get<double>()) <=
              0.01 * stage[part]["predicted"].get<double>());
      }
  }
  // Not forced: fp32, with a note.
  json run = run_plan(write_plan(dir, "gpt-tiny", {1, 1, 2}, 8, {"--precision", "bf16"}), {}, 3);
  CHECK(run["config"]["precision"] == "fp32");
  CHECK(run["config"]["planned_precision"] == "bf16");
  CHECK_THAT(run["config"]["precision_note"].get<std::string>(), Contains("CUDA"));
}

TEST_CASE("gradient clipping by the global norm: the same norm and losses on every layout", "[executor][parity]") {
  // gpt-tiny's gradient norm is about 0.5-0.7 in its first steps: 0.05 clips every step.
  TempDir dir;
  const std::vector<std::string> clip = {"--max-grad-norm", "0.05"};
  json single = run_plan(write_plan(dir, "gpt-tiny", {1, 1, 1, "1f1b", false, 2}, 8), clip);
  json unclipped = run_plan(write_plan(dir, "gpt-tiny", {1, 1, 1, "1f1b", false, 2}, 8), {"--max-grad-norm", "0"});
  std::vector<double> norms;
  for (const auto& s : single["steps"]) norms.push_back(s["grad_norm"].get<double>());
  CHECK(norms.front() > 0.05);
  // Clipping engaged: the trajectory leaves the unclipped one.
  CHECK(std::abs(losses(single).back() - losses(unclipped).back()) > 1e-6 * losses(unclipped).back());
  // ZeRO-2 and 3 sum the norm over the dp shards of the gradient as well.
  for (auto [l, zero] : std::vector<std::pair<Layout, std::string>>{
           {{2, 2, 2, "1f1b", true}, "0"}, {{1, 2, 2, "gpipe"}, "0"}, {{2, 1, 2}, "0"}, {{1, 1, 4}, "2"}, {{2, 2, 2}, "3"}}) {
    json run = run_plan(write_plan(dir, "gpt-tiny", l, 8, {"--zero", zero}), clip);
    require_parity(run, losses(single), "clipped " + l.describe() + " ZeRO-" + zero);
    for (size_t i = 0; i < norms.size(); ++i) {
      INFO(l.describe() << " step " << i);
      CHECK(run["steps"][i]["grad_norm"].get<double>() == Approx(norms[i]).epsilon(kParityTolerance));
    }
  }
}

TEST_CASE("run.json has the documented keys, and weights, gradients and optimizer bytes are exact",
          "[executor][run-json]") {
  TempDir dir;
  std::string plan = write_plan(dir, "gpt-tiny", {1, 2, 2}, 8);
  json run = run_plan(plan);
  for (const char* key : {"format_version", "layout", "config", "environment", "steps", "step_time_s",
                          "tokens_per_s", "phases_s", "phases_by_rank_s", "memory", "stage_of_rank", "replicas"})
    CHECK(run.contains(key));
  REQUIRE(run["steps"].size() == kSteps);
  for (const auto& s : run["steps"]) {
    CHECK(s.contains("step"));
    CHECK(s["time_s"].get<double>() > 0);
    CHECK(s.contains("warmup"));
  }
  CHECK(run["steps"][0]["warmup"] == true);
  CHECK(run["steps"][kSteps - 1]["warmup"] == false);
  CHECK(run["step_time_s"]["count"] == kSteps - 2);
  CHECK(run["format_version"] == 2);
  // Every phase of the prediction (costmodel/phases.h), and no other name.
  REQUIRE(run["phases_s"].size() == dplan::costmodel::kNumPhases);
  for (const auto& info : dplan::costmodel::phase_table()) CHECK(run["phases_s"].contains(info.name));
  CHECK(run["phases_s"]["forward"].get<double>() > 0);
  CHECK(run["phases_s"]["pp_bubble"].get<double>() > 0);  // pp 2: the bubble is real
  CHECK(run["phases_s"]["pp_p2p"].get<double>() > 0);     // and so are the transfers
  // Phases of a rank add up to its step time (exclusive accounting). Why ±50 %: phases_s averages the
  // ranks' per-phase medians while the step is the median of the slowest rank's steps, so they differ
  // by the steps' spread (tens of percent on a shared 2-core machine); a phase lost or counted twice
  // (the backward is over a third of this step) still falls outside.
  double sum = 0;
  for (const auto& [k, v] : run["phases_s"].items()) sum += v.get<double>();
  CHECK(sum == Approx(run["step_time_s"]["median"].get<double>()).epsilon(0.5));

  // gpt-tiny, stage 0 holds the embedding (256 x 64 + 128 x 64 positions) and layer 0; stage 1
  // layer 1, the final norm and its own copy of the tied embedding. fp32: 4 bytes each.
  const double layer = 4 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64;  // norms, qkv, proj, mlp
  const double wte = 256 * 64, wpe = 128 * 64, final_norm = 2 * 64;
  REQUIRE(run["memory"].size() == 4);
  for (const auto& [rank, m] : run["memory"].items()) {
    int stage = run["stage_of_rank"][std::stoi(rank)];
    double params = stage == 0 ? wte + wpe + layer : layer + final_norm + wte;
    INFO("rank " << rank);
    CHECK(m["weights"].get<double>() == 4 * params);
    CHECK(m["gradients"].get<double>() == 4 * params);
    CHECK(m["optimizer"].get<double>() == 8 * params);  // AdamW: two fp32 moments
    CHECK(m["activations"].get<double>() > 0);
    CHECK(m["peak"].get<double>() >= m["weights"].get<double>() * 4);
  }

  // dplan compare reads it.
  Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json c = json::parse(r.out);
  CHECK(c["step_time_s"]["measured"].get<double>() == run["step_time_s"]["median"].get<double>());
}

// The phases the cost model prices apart are timed apart: each layout's own communication and
// work lands in its own phase, and a phase the layout does not have gets at most the
// microseconds of opening its scope around a collective of one rank (under 1 % of the step).
TEST_CASE("each phase a layout has is measured in its own name", "[executor][run-json]") {
  TempDir dir;
  json p;
  double step_s = 0;
  auto run = [&](const std::string& model, const Layout& l, const std::vector<std::string>& extra) {
    const json r = run_plan(write_plan(dir, model, l, 8, extra), {}, 3);
    REQUIRE(r["phases_s"].size() == dplan::costmodel::kNumPhases);
    p = r["phases_s"];
    step_s = r["step_time_s"]["median"].get<double>();
  };
  auto absent = [&](const char* phase) { return p[phase].get<double>() < 0.01 * step_s; };
  SECTION("recompute: the recomputed forwards, apart from backward") {
    run("gpt-tiny", {1, 1, 1, "1f1b", false, 1, "full"}, {});
    CHECK(p["recompute"].get<double>() > 0.05 * step_s);
    CHECK(p["backward"].get<double>() > 0.05 * step_s);
    for (const char* none : {"tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble", "dp_comm", "param_gather", "offload"})
      CHECK(absent(none));
  }
  SECTION("context parallel: the ring's transfers in cp_comm, not tp_comm") {
    Layout cp2;
    cp2.cp = 2;
    run("gpt-tiny", cp2, {});
    CHECK(p["cp_comm"].get<double>() > 0);
    CHECK(absent("tp_comm"));
    CHECK(p["recompute"].get<double>() == 0);
  }
  SECTION("ZeRO-3: the parameter gathers in param_gather, the reductions in dp_comm") {
    run("gpt-tiny", {1, 1, 2}, {"--zero", "3"});
    CHECK(p["param_gather"].get<double>() > 0);
    CHECK(p["dp_comm"].get<double>() > 0);
  }
  SECTION("optimizer offload: the copies between device and host in offload") {
    run("gpt-tiny", {1, 1, 2}, {"--zero", "1", "--offload"});
    CHECK(p["offload"].get<double>() > 0);
    CHECK(p["optimizer"].get<double>() > 0);
    CHECK(p["param_gather"].get<double>() > 0);  // ZeRO-1: every rank's updated slice to every rank
  }
}

TEST_CASE("dplan --runnable picks a layout that dplan run trains", "[executor][search]") {
  TempDir dir;
  std::string plan = (dir.path() / "searched.json").string();
  Result r = run_program(DPLAN_BINARY, {"--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "4", "--global-batch",
                                        "8", "--precision", "fp32", "--runnable", "-o", plan});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json run = run_plan(plan);
  CHECK(run["steps"].size() == kSteps);
}

TEST_CASE("a byte-level text file trains, the same whatever the data-parallel size", "[executor][data]") {
  TempDir dir;
  std::string text;
  for (int i = 0; text.size() < 40000; ++i)
    text += "the quick brown fox " + std::to_string(i % 97) + " jumps over the lazy dog; ";
  std::string data = dir.write("corpus.txt", text);
  // Ten steps: at lr 0.01 the loss climbs over the first few before it falls below where it began.
  constexpr int steps = 10;
  json one = run_plan(write_plan(dir, "gpt-tiny", {1, 1, 1, "1f1b", false, 2}, 8), {"--data", data, "--lr", "0.01"}, steps);
  json two = run_plan(write_plan(dir, "gpt-tiny", {1, 2, 2}, 8), {"--data", data, "--lr", "0.01"}, steps);
  CHECK(one["config"]["data"] == data);
  CHECK(losses(one).back() < losses(one).front() - 0.5);
  require_parity(two, losses(one), "pp 2 dp 2 on the text file");
}

TEST_CASE("torchrun launches the same worker and it trains the same losses", "[executor][launch]") {
  std::string torchrun;
  for (const char* dir : {"/usr/bin", "/usr/local/bin"})
    if (fs::exists(fs::path(dir) / "torchrun")) torchrun = (fs::path(dir) / "torchrun").string();
  // ./setup.sh --all installs it (Debian's python3-torch): missing, this test fails rather than skips.
  INFO("torchrun is not installed in /usr/bin or /usr/local/bin (Debian package python3-torch; ./setup.sh --all)");
  REQUIRE(!torchrun.empty());
  TempDir dir;
  std::string plan = write_plan(dir, "gpt-tiny", {1, 1, 2}, 8);
  std::string out = (dir.path() / "torchrun.run.json").string();
  // Debian's torchrun 1.13 on Python 3.11 cannot parse its default --redirects/--tee of 0 (Std is an
  // IntFlag and 3.11 no longer iterates its zero member), so give it values it can read.
  Result r = run_program(torchrun, {"--standalone", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
                                    "--log_dir", (dir.path() / "logs").string(), "--no_python", DPLAN_WORKER_BINARY,
                                    plan, "--steps", std::to_string(kSteps), "--quiet", "-o", out});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json run = json::parse(read_file(out));
  CHECK(run["config"]["launcher"] == "torchrun");
  CHECK(run["environment"]["world_size"] == 2);
  require_parity(run, reference("gpt-tiny", 8), "torchrun dp 2");
}

// A `dplan run` of pp 2 × dp 2 that is training, started the way a shell starts a job: in a
// process group of its own (the launcher's pid is its id), stderr to a file.
struct LiveRun {
  pid_t launcher = 0;
  std::map<int, pid_t> pid_of;  // rank -> pid
  std::string err_path;
};
constexpr double kFaultTimeout = 20;

// Starts it with --steps `steps` (and -o `output` when given), waits until rank 0 has printed
// step 3, and finds each rank by its RANK in /proc/<pid>/environ.
LiveRun start_run(const TempDir& dir, double timeout_s, int steps = 100000, const std::string& output = "") {
  std::string plan = write_plan(dir, "gpt-tiny", {1, 2, 2}, 8);
  LiveRun run;
  run.err_path = (dir.path() / "stderr").string();
  std::vector<std::string> args = {DPLAN_BINARY, "run", plan, "--steps", std::to_string(steps), "--timeout-s",
                                   std::to_string(timeout_s)};
  if (!output.empty()) args.insert(args.end(), {"-o", output});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  fs::remove(run.err_path);  // a previous run's "step 3/" must not count
  run.launcher = ::fork();
  REQUIRE(run.launcher >= 0);
  if (run.launcher == 0) {
    ::setpgid(0, 0);
    int fd = ::open(run.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::setenv("DPLAN_PROFILES", DPLAN_PROFILES_DIR, 1);
    ::execv(DPLAN_BINARY, argv.data());
    ::_exit(127);
  }
  ::setpgid(run.launcher, run.launcher);  // either side may get there first
  auto started = std::chrono::steady_clock::now();
  while (read_file(run.err_path).find("step 3/") == std::string::npos) {
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(60)) {
      ::kill(-run.launcher, SIGKILL);
      FAIL("dplan run did not reach step 3 in 60 s:\n" << read_file(run.err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string children = read_file("/proc/" + std::to_string(run.launcher) + "/task/" + std::to_string(run.launcher) +
                                   "/children");
  std::istringstream pids(children);
  for (pid_t pid; pids >> pid;) {
    const std::string nul(1, '\0');
    std::string environ_text = nul + read_file("/proc/" + std::to_string(pid) + "/environ");
    for (int r = 0; r < 4; ++r)
      if (environ_text.find(nul + "RANK=" + std::to_string(r) + nul) != std::string::npos) run.pid_of[r] = pid;
  }
  REQUIRE(run.pid_of.size() == 4);
  return run;
}

// What the launcher left behind.
struct Killed {
  std::string err;
  int wstatus = 0;
  double took_s = 0;  // from the first signal to the launcher's exit
  std::map<int, pid_t> pid_of;
};

// Waits for the launcher to exit, at most `limit` after `since` (then kills it, and fails).
Killed wait_for_launcher(const LiveRun& run, std::chrono::steady_clock::time_point since,
                         std::chrono::seconds limit) {
  Killed k;
  k.pid_of = run.pid_of;
  pid_t done = 0;
  while ((done = ::waitpid(run.launcher, &k.wstatus, WNOHANG)) == 0) {
    if (std::chrono::steady_clock::now() - since > limit) {
      ::kill(-run.launcher, SIGKILL);
      ::waitpid(run.launcher, &k.wstatus, 0);
      FAIL("dplan run still running " << limit.count() << " s after the signal:\n" << read_file(run.err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  k.took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  k.err = read_file(run.err_path);
  return k;
}

// Starts a run for good, sends each listed rank its signal (in order, `gap` apart), and waits for
// the launcher to stop.
Killed kill_ranks_mid_run(const TempDir& dir, const std::vector<std::pair<int, int>>& rank_signals,
                          std::chrono::milliseconds gap = std::chrono::milliseconds(0),
                          double timeout_s = kFaultTimeout) {
  LiveRun run = start_run(dir, timeout_s);
  auto killed_at = std::chrono::steady_clock::now();
  for (const auto& [rank, sig] : rank_signals) {
    REQUIRE(::kill(run.pid_of[rank], sig) == 0);
    std::this_thread::sleep_for(gap);
  }
  return wait_for_launcher(run, killed_at, std::chrono::seconds(int(timeout_s) + 15));
}

TEST_CASE("a rank killed mid-run stops the others within the timeout, and the error names it",
          "[executor][fault]") {
  TempDir dir;
  Killed k = kill_ranks_mid_run(dir, {{1, SIGKILL}});
  INFO(k.err);
  CHECK(WIFEXITED(k.wstatus));
  CHECK(WEXITSTATUS(k.wstatus) == 1);
  CHECK(k.took_s < kFaultTimeout);
  CHECK_THAT(k.err, Contains("dplan: error: rank 1 (pid " + std::to_string(k.pid_of[1]) + ") was killed by signal 9"));
  // The survivors name the dead rank too, each in one line: rank 1 alone, unless the launcher saw
  // another rank crash in the cascade (then both stopped beating, and both are named).
  if (k.err.find(" then was killed by signal") == std::string::npos)
    CHECK_THAT(k.err, Contains("rank 1 stopped (no heartbeat"));
  else
    CHECK_THAT(k.err, Contains("ranks 1, "));
}

TEST_CASE("a second rank that dies in the cascade is named by the launcher and by the survivors",
          "[executor][fault]") {
  TempDir dir;
  // Rank 2 is frozen first (so it beats no more before the survivors look), then rank 1 dies, then
  // rank 2: the launcher reaps them in that order.
  Killed k = kill_ranks_mid_run(dir, {{2, SIGSTOP}, {1, SIGKILL}, {2, SIGSEGV}, {2, SIGCONT}},
                                std::chrono::milliseconds(150));
  INFO(k.err);
  CHECK(WEXITSTATUS(k.wstatus) == 1);
  CHECK(k.took_s < kFaultTimeout);
  CHECK_THAT(k.err, Contains("dplan: error: rank 1 (pid " + std::to_string(k.pid_of[1]) +
                             ") was killed by signal 9 (Killed); rank 2 then was killed by signal 11"));
  CHECK_THAT(k.err, Contains("ranks 1, 2 stopped (no heartbeat"));
}

TEST_CASE("a stopped rank is the one the launcher names, not the first peer to time out", "[executor][fault]") {
  // Rank 2 freezes: its peers' collectives time out after --timeout-s, and one of them (not rank 2)
  // is the first to exit. The launcher names rank 2, from the survivors' heartbeat diagnosis.
  TempDir dir;
  const double timeout_s = 10;
  Killed k = kill_ranks_mid_run(dir, {{2, SIGSTOP}}, std::chrono::milliseconds(0), timeout_s);
  INFO(k.err);
  CHECK(WIFEXITED(k.wstatus));
  CHECK(WEXITSTATUS(k.wstatus) == 1);
  CHECK_THAT(k.err, Contains("dplan: error: rank 2 (pid " + std::to_string(k.pid_of[2]) + ") stopped making progress"));
  CHECK_THAT(k.err,
             Contains("rank 2 was in state T (stopped by a signal); the launcher killed rank 2; the run stopped"));
  // It is killed as soon as it is named, not after another timeout.
  CHECK(k.took_s < timeout_s + 8);
}

TEST_CASE("the ranks die with the launcher: SIGKILL of dplan run leaves no rank and no run.json",
          "[executor][fault]") {
  TempDir dir;
  // The ranks become this process's children when the launcher dies, so it can reap them (and
  // know they are gone, whatever init does with orphans).
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  const std::string out = (dir.path() / "run.json").string();
  LiveRun run = start_run(dir, kFaultTimeout, 40, out);  // 40 steps: a few seconds more to run.json
  // The run's private folder (the store): only its owner may enter it. A killed launcher cannot
  // remove it, so this test does.
  std::string run_dir;
  std::istringstream environ_text(read_file("/proc/" + std::to_string(run.pid_of[0]) + "/environ"));
  for (std::string var; std::getline(environ_text, var, '\0');)
    if (var.rfind("DPLAN_RUN_DIR=", 0) == 0) run_dir = var.substr(14);
  REQUIRE(!run_dir.empty());
  CHECK((fs::status(run_dir).permissions() & fs::perms::all) == fs::perms::owner_all);
  REQUIRE(::kill(run.launcher, SIGKILL) == 0);
  int wstatus = 0;
  REQUIRE(::waitpid(run.launcher, &wstatus, 0) == run.launcher);
  const auto killed_at = std::chrono::steady_clock::now();
  std::map<int, int> status_of;  // rank -> wait status, once reaped
  while (status_of.size() < run.pid_of.size() &&
         std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(5)) {
    for (const auto& [rank, pid] : run.pid_of)
      if (!status_of.count(rank) && ::waitpid(pid, &wstatus, WNOHANG) == pid) status_of[rank] = wstatus;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string survivors;
  for (const auto& [rank, pid] : run.pid_of)
    if (!status_of.count(rank)) {
      survivors += " " + std::to_string(rank);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  fs::remove_all(run_dir);
  INFO("ranks still running 5 s after the launcher was killed:" << survivors << "\n" << read_file(run.err_path));
  CHECK(survivors.empty());
  for (const auto& [rank, status] : status_of) {
    INFO("rank " << rank);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
  }
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("a signal to dplan run stops the ranks, is reported as such, and the exit status is 128 + signal",
          "[executor][fault]") {
  TempDir dir;
  {
    INFO("SIGTERM to the launcher alone");
    LiveRun run = start_run(dir, kFaultTimeout);
    auto sent = std::chrono::steady_clock::now();
    REQUIRE(::kill(run.launcher, SIGTERM) == 0);
    Killed k = wait_for_launcher(run, sent, std::chrono::seconds(15));
    INFO(k.err);
    CHECK(WIFEXITED(k.wstatus));
    CHECK(WEXITSTATUS(k.wstatus) == 128 + SIGTERM);
    CHECK_THAT(k.err, Contains("dplan: error: stopped by SIGTERM sent to the launcher; ranks 0-3 were stopped\n"));
    CHECK(k.err.find("was killed") == std::string::npos);
  }
  {
    INFO("SIGINT to the whole process group, as a terminal's Ctrl-C sends it");
    LiveRun run = start_run(dir, kFaultTimeout);
    auto sent = std::chrono::steady_clock::now();
    REQUIRE(::kill(-run.launcher, SIGINT) == 0);
    Killed k = wait_for_launcher(run, sent, std::chrono::seconds(15));
    INFO(k.err);
    CHECK(WIFEXITED(k.wstatus));
    CHECK(WEXITSTATUS(k.wstatus) == 128 + SIGINT);
    CHECK_THAT(k.err, Contains("dplan: error: stopped by SIGINT sent to the launcher; ranks 0-3 were stopped\n"));
    CHECK(k.err.find("was killed") == std::string::npos);
  }
}

// The TCP sockets that the processes `pids` hold, each as "<local address> <state>" in the hex
// of /proc/net/tcp{,6} ("0100007F:9C41 0A": 127.0.0.1:40001, listening).
std::vector<std::string> tcp_sockets(const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      std::string target = fs::read_symlink(fd.path(), ec).string();
      if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(read_file(table));
    std::string line;
    std::getline(lines, line);  // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (inodes.count(inode)) out.push_back(local + " " + state);
    }
  }
  return out;
}

TEST_CASE("a local run's sockets are all on loopback: the store opens no port, Gloo binds 127.0.0.1",
          "[executor][fault]") {
  // While it trains: every TCP socket of the launcher and the ranks, listening or connected, has a
  // loopback address (127.0.0.1, ::1 or ::ffff:127.0.0.1), never 0.0.0.0 or ::. Gloo's connections
  // between the ranks are there to look at (the Gloo of Debian's LibTorch 1.13 keeps no listening
  // socket once the ranks are connected).
  TempDir dir;
  LiveRun run = start_run(dir, kFaultTimeout);
  std::vector<pid_t> pids = {run.launcher};
  for (const auto& [rank, pid] : run.pid_of) pids.push_back(pid);
  const std::vector<std::string> sockets = tcp_sockets(pids);
  auto sent = std::chrono::steady_clock::now();
  ::kill(run.launcher, SIGTERM);
  wait_for_launcher(run, sent, std::chrono::seconds(15));
  REQUIRE(!sockets.empty());
  for (const std::string& socket : sockets) {
    INFO(socket);
    const std::string host = socket.substr(0, socket.find(':'));
    CHECK((host == "0100007F" || host == "00000000000000000000000001000000" ||
           host == "0000000000000000FFFF00000100007F"));
  }
}

TEST_CASE("dplan scale plans and runs each size and prints and draws predicted against measured scaling",
          "[executor][scale]") {
  TempDir dir;
  const std::string out = (dir.path() / "scale").string();
  Result r = run_program(DPLAN_BINARY, {"scale", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "1,2",
                                        "--global-batch", "8", "--precision", "fp32", "--steps", "3", "-o", out});
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Contains("scale: run 1/2: 1 rank"));  // progress
  CHECK_THAT(r.err, Contains("scale: run 2/2: 2 ranks"));
  CHECK_THAT(r.out, Contains("predicted tok/s"));
  CHECK_THAT(r.out, Contains("100.0%"));  // the first size is the efficiency's reference
  for (const char* f : {"plan-1.json", "plan-2.json", "run-1.json", "run-2.json"})
    CHECK(fs::exists(fs::path(out) / f));
  const std::string svg = read_file((fs::path(out) / "scaling.svg").string());
  CHECK_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  // Two panels (throughput, efficiency), each with a dashed predicted and a solid measured line.
  size_t predicted = 0, measured = 0;
  auto tag_at = [&](size_t at) { return svg.substr(at, svg.find('>', at) - at); };
  for (size_t at = 0; (at = svg.find("<polyline class=\"predicted\"", at)) != std::string::npos; ++at) {
    ++predicted;
    CHECK_THAT(tag_at(at), Contains("stroke-dasharray"));
  }
  for (size_t at = 0; (at = svg.find("<polyline class=\"measured\"", at)) != std::string::npos; ++at) {
    ++measured;
    CHECK_FALSE(tag_at(at).find("stroke-dasharray") != std::string::npos);
  }
  CHECK(predicted == 2);
  CHECK(measured == 2);
  r = run_program(DPLAN_BINARY, {"scale", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "2,1", "-o", out});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("increasing order"));
}

TEST_CASE("dplan run: bad input gives one error line naming the problem, and exit status 2", "[executor][errors]") {
  TempDir dir;
  auto one_line = [](const Result& r) {
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    REQUIRE(!r.err.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, StartsWith("dplan: error: "));
    return r.err;
  };
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", (dir.path() / "nope.json").string()})), Contains("nope.json"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", dir.write("bad.json", "{\"parallel\": ")})), Contains("bad.json"));
  std::string plan = write_plan(dir, "gpt-tiny", {1, 1, 2}, 8);
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "--data", (dir.path() / "missing.txt").string()})),
             Contains("missing.txt"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "--data", dir.write("small.txt", "too short")})),
             Contains("fewer than the global batch"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "--device", "tpu"})), Contains("auto, cpu, cuda"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "--precision", "fp8"})), Contains("auto, fp32, bf16"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "--steps", "0"})), Contains("--steps"));
  CHECK_THAT(one_line(run_program(DPLAN_BINARY, {"run", plan, "-o", (dir.path() / "no/such/dir/run.json").string()})),
             Contains("does not exist"));
}

TEST_CASE("a run whose -o cannot be written after training keeps its measurements in the temp folder",
          "[executor][output]") {
  TempDir dir;
  const fs::path out_dir = dir.path() / "out";
  fs::create_directories(out_dir);
  LiveRun run = start_run(dir, kFaultTimeout, 40, (out_dir / "run.json").string());
  fs::remove_all(out_dir);  // checked before the ranks started; gone when rank 0 writes
  Killed k = wait_for_launcher(run, std::chrono::steady_clock::now(), std::chrono::seconds(120));
  INFO(k.err);
  REQUIRE(WIFEXITED(k.wstatus));
  CHECK(WEXITSTATUS(k.wstatus) == 2);
  CHECK_THAT(k.err, Contains("final loss"));  // the summary line, which says no "wrote" then
  CHECK_THAT(k.err, !Contains("; wrote " + (out_dir / "run.json").string()));
  const std::string marker = "the measurements were saved to ";
  const auto at = k.err.find(marker);
  REQUIRE(at != std::string::npos);
  const std::string rescue = k.err.substr(at + marker.size(), k.err.find(" instead", at) - at - marker.size());
  const json saved = json::parse(read_file(rescue));
  CHECK(saved["steps"].size() == 40);
  CHECK(saved["generator"] == "dplan");
  fs::remove(rescue);
}
