// The planner and the executor share one space of layouts: layouts drawn at random (seeded) from
// the planner's own enumeration (planner::enumerate_layouts, what `dplan` searches) for the tiny
// test models on 1 to 8 ranks are written as plans by `dplan estimate` with the flags the planner
// gives them (planner::estimate_flags) and trained 3 steps by `dplan run`; every one runs, and every
// step's loss matches the single-process run of the same model, seed, data and global batch within
// 1e-4 relative. A layout the search may pick that the executor refuses or runs differently fails
// here: this is the test that keeps the two halves from drifting apart.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/planner/explain.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/search.h"
#include "harness.h"
#include "process.h"

namespace {
using namespace dplan;
using namespace dplan::testing::executor;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;

constexpr int kPlanSteps = 3;
constexpr int kGlobalBatch = 8;
constexpr uint64_t kSeed = 20;  // the draw; fixed so that a failure reproduces

struct Drawn {
  std::string model;
  costmodel::ParallelConfig parallel;
};

// The flags `dplan estimate` takes for this layout, split into arguments.
std::vector<std::string> estimate_args(const planner::PlanCase& c, const std::string& model_arg) {
  std::istringstream in(planner::estimate_flags(c));
  std::vector<std::string> args = {"estimate"};
  for (std::string word; in >> word;) args.push_back(word);
  // estimate_flags names the model by its spec name; the test models are files.
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--model") args[i + 1] = model_arg;
  return args;
}

}  // namespace

TEST_CASE("random plans: layouts drawn from the planner's enumeration run and match the single-process losses",
          "[executor][random-plans]") {
  const planner::ProfileStore store(DPLAN_PROFILES_DIR);
  std::vector<std::string> models = {"gpt-tiny", kLlamaTiny};
  for (const char* tiny :
       {"mixtral-tiny", "qwen3-tiny", "nemotron-tiny", "gpt-neox-tiny", "gpt-oss-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny",
        "deepseek-v3-mtp-tiny"})
    models.push_back(std::string(DPLAN_VALIDATION_DIR) + "/executor/" + tiny + "/config.json");
  const int per_model = 3;  // layouts drawn per model, over 1..8 ranks
  std::mt19937_64 rng(kSeed);
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  int ran = 0;
  for (const std::string& model_arg : models) {
    const costmodel::ModelSpec model = store.load_model(model_arg);
    const costmodel::ClusterSpec cluster = store.load_cluster("local-cpu");
    costmodel::TrainingSpec training;
    training.global_batch = kGlobalBatch;
    training.seq_len = std::min(model.max_seq_len, 64);
    training.precision = costmodel::Precision::fp32;
    std::vector<costmodel::ParallelConfig> space;
    for (int gpus = 1; gpus <= 8; ++gpus) {
      for (const auto& p : planner::enumerate_layouts(model, training, planner::SearchSpace{gpus})) space.push_back(p);
    }
    INFO(model_arg << ": " << space.size() << " layouts on 1..8 ranks");
    REQUIRE(space.size() > static_cast<size_t>(per_model));
    std::shuffle(space.begin(), space.end(), rng);
    space.resize(per_model);
    const std::vector<double> reference_losses = [&] {
      // The reference has the same sequence length as the drawn plans.
      Layout one;
      const std::string plan = write_plan(dir, model_arg, one, kGlobalBatch, {"--seq", std::to_string(training.seq_len)});
      return losses(run_plan(plan, {}, kPlanSteps));
    }();
    for (size_t i = 0; i < space.size(); ++i) {
      planner::PlanCase c;
      c.model = model;
      c.cluster = cluster;
      c.training = training;
      c.parallel = space[i];
      std::vector<std::string> args = estimate_args(c, model_arg);
      const std::string plan = (dir.path() / ("random-" + std::to_string(ran) + ".json")).string();
      args.insert(args.end(), {"-o", plan});
      std::string command;
      for (const auto& a : args) command += " " + a;
      INFO("dplan" << command);
      Result r = run_program(DPLAN_BINARY, args);
      INFO(r.err);
      REQUIRE(r.status == 0);
      require_parity(run_plan(plan, {}, kPlanSteps), reference_losses, "dplan" + command);
      check_flops(plan, "dplan" + command);  // the FLOPs it ran are the ones the cost model counts
      ++ran;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("random plans: %d layouts trained %d steps each in %.0f s\n", ran, kPlanSteps, seconds);
}
