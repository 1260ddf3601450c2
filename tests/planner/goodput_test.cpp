// Goodput in the planner: the report's "checkpoints and failures" block and --json's "checkpoint"
// and "goodput" keys, ranking the search by time to train with failures (--rank-by goodput), and
// the bad flags, each one line and exit 2.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/errors.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/search.h"
#include "process.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;
using dplan::testing::read_file;
using dplan::testing::require_one_error_line;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::store;
using dplan::testing::TempDir;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;
using nlohmann::json;

namespace {

Result run_dplan(const std::vector<std::string>& args) { return run_program(DPLAN_BINARY, args); }

json run_json(const std::vector<std::string>& args) {
  const Result r = run_dplan(args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return json::parse(r.out);
}

// A copy of dgx-h100 whose filesystem moves 50 MB/s: restarts are then dominated by reading the
// checkpoint back, which sharded layouts do in a fraction of the time.
std::string slow_storage_cluster(const TempDir& dir) {
  json cluster = json::parse(read_file(std::string(DPLAN_PROFILES_DIR) + "/clusters/dgx-h100.json"));
  for (const char* key : {"node_read_gbytes_per_s", "node_write_gbytes_per_s", "aggregate_read_gbytes_per_s",
                          "aggregate_write_gbytes_per_s"})
    cluster["cluster"]["storage"][key] = 0.05;
  return dir.write("slow-storage.json", cluster.dump(2));
}

}  // namespace

TEST_CASE("search ranks by time to train with failures when asked and can disagree with step time", "[goodput]") {
  // A toy cost model: layout A steps faster, layout B trains sooner once failures count.
  const ParallelConfig a{.dp = 2}, b{.dp = 2, .zero_stage = 1};
  const CostFunction cost = [&](const ParallelConfig& p) {
    Evaluation e;
    e.fits = true;
    const bool is_a = p == a;
    e.step_time_s = is_a ? 1.0 : 1.1;
    e.time_to_train_with_failures_s = is_a ? 200 : 150;
    return e;
  };
  const SearchResult by_step = search({a, b}, cost, 2);
  const SearchResult by_goodput = search({a, b}, cost, 2, RankBy::goodput);
  CHECK(by_step.ranked[0].parallel == a);
  CHECK(by_goodput.ranked[0].parallel == b);
  CHECK(by_goodput.ranked[1].parallel == a);
}

TEST_CASE("the cost function prices goodput only when asked and the ranked winner has the least", "[goodput]") {
  const ModelSpec m = store().load_model("llama-3-8b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  const Network net(c, 16);
  const std::vector<ParallelConfig> layouts = enumerate_layouts(m, t, SearchSpace{.gpus = 16, .allow_offload = false});
  const CostFunction plain = dplan_cost_function(m, net, t, OverlapOptions{});
  const CostFunction priced =
      dplan_cost_function(m, net, t, OverlapOptions{}, kDefaultHeadroomFraction, GoodputInputs{FailureModel{}, 1e12});
  const SearchResult r = search(layouts, priced, 3, RankBy::goodput);
  REQUIRE_FALSE(r.ranked.empty());
  for (const ParallelConfig& p : layouts) {
    const Evaluation e = priced(p);
    if (!e.fits) continue;
    CHECK(e.time_to_train_with_failures_s > 0);
    CHECK(r.ranked[0].evaluation.time_to_train_with_failures_s <= e.time_to_train_with_failures_s);
    CHECK(plain(p).time_to_train_with_failures_s == 0);
  }
}

TEST_CASE("rank-by names are step-time and goodput", "[goodput]") {
  CHECK(rank_by_from_string("step-time") == RankBy::step_time);
  CHECK(rank_by_from_string("goodput") == RankBy::goodput);
  CHECK_THROWS_AS(rank_by_from_string("mfu"), InputError);
}

TEST_CASE("the default report and --json carry the checkpoints and failures block", "[goodput][cli]") {
  const Result text = run_dplan({"--model", "70B", "--gpus", "64"});
  INFO(text.err);
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Contains("checkpoints and failures"));
  CHECK_THAT(text.out, Contains("(Llama 3's)"));
  CHECK_THAT(text.out, Contains("of time lost"));
  CHECK_THAT(text.out, Contains("tokens with failures:"));

  const json out = run_json({"--model", "70B", "--gpus", "64", "--json"});
  const json& checkpoint = out.at("checkpoint");
  // llama-3-70b in bf16: 2 + 4 + 8 bytes per parameter.
  CHECK_THAT(checkpoint.at("total_bytes").get<double>(), WithinRel(checkpoint.at("num_params").get<double>() * 14, 1e-12));
  CHECK_THAT(checkpoint.at("num_params").get<double>(),
             WithinRel(num_params(store().load_model("llama-3-70b")), 1e-12));
  CHECK(checkpoint.at("times").at("write_s").get<double>() > 0);
  CHECK_FALSE(checkpoint.contains("rank_bytes"));  // the search's output leaves the per-rank list out
  const json& g = out.at("goodput");
  CHECK_THAT(g.at("failures_per_gpu_hour").get<double>(), WithinRel(kLlama3FailuresPerGpuHour, 1e-12));
  CHECK(g.at("restart_overhead_s").get<double>() == kDefaultRestartOverheadS);
  CHECK(g.at("time_to_train_with_failures_s").get<double>() > g.at("time_to_train_s").get<double>());
  CHECK(g.at("interval_steps").get<int>() >= 1);

  SECTION("the flags change it") {
    const json more = run_json({"--model", "70B", "--gpus", "64", "--json", "--failure-rate-per-gpu-hour", "1e-3",
                                "--restart-s", "60"});
    CHECK(more.at("goodput").at("failures_per_gpu_hour").get<double>() == 1e-3);
    CHECK(more.at("goodput").at("restart_overhead_s").get<double>() == 60);
    CHECK(more.at("goodput").at("mtbf_s").get<double>() < g.at("mtbf_s").get<double>());
  }
}

TEST_CASE("dplan estimate --json lists each rank's checkpoint bytes", "[goodput][cli]") {
  // gpt-tiny fp32 (124,672 parameters, 12 bytes each) on local-cpu as tp 2 x dp 2, ZeRO-1.
  const json out = run_json({"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "4", "--tp", "2",
                             "--zero", "1", "--precision", "fp32", "--global-batch", "8", "--json"});
  const json& ranks = out.at("checkpoint").at("rank_bytes");
  REQUIRE(ranks.size() == 4);
  double total = 0;
  for (const json& bytes : ranks) total += bytes.get<double>();
  CHECK(total == 124672.0 * 12);
  CHECK(out.at("goodput").is_object());
  const Result text = run_dplan({"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "4", "--tp",
                                 "2", "--precision", "fp32", "--global-batch", "8"});
  CHECK_THAT(text.out, Contains("checkpoints and failures"));
}

TEST_CASE("ranking by goodput orders the search by time to train with failures", "[goodput][cli]") {
  // mistral-7b on 8 H100s with a 50 MB/s filesystem and a failure every 12.5 GPU-hours: the
  // fastest step (cp 2 x dp 4) is not the layout that trains soonest, which takes a slower step
  // for a restart that reads back less per rank (a pipeline split or ZeRO-3 shards what each
  // rank loads).
  TempDir dir;
  const std::string cluster = slow_storage_cluster(dir);
  const std::vector<std::string> common = {"--model", "mistral-7b", "--gpus", "8", "--cluster", cluster,
                                           "--failure-rate-per-gpu-hour", "0.01", "--top", "5", "--json"};
  std::vector<std::string> by_goodput = common, by_step = common;
  by_goodput.insert(by_goodput.end(), {"--rank-by", "goodput"});
  const json g = run_json(by_goodput), s = run_json(by_step);
  CHECK(g.at("search").at("rank_by") == "goodput");
  CHECK(s.at("search").at("rank_by") == "step-time");
  const json& ranked = g.at("search").at("ranked");
  REQUIRE(ranked.size() >= 2);
  for (size_t i = 1; i < ranked.size(); ++i)
    CHECK(ranked[i - 1].at("time_to_train_with_failures_s").get<double>() <=
          ranked[i].at("time_to_train_with_failures_s").get<double>());
  CHECK(g.at("search").at("ranked")[0].at("parallel") != s.at("search").at("ranked")[0].at("parallel"));
  CHECK(g.at("search").at("ranked")[0].at("step_time_s").get<double>() >
        s.at("search").at("ranked")[0].at("step_time_s").get<double>());
  CHECK(g.at("parallel") == g.at("search").at("ranked")[0].at("parallel"));  // the plan is the goodput winner
}

TEST_CASE("bad goodput flags are one line and exit 2", "[goodput][cli]") {
  const std::vector<std::string> base = {"--model", "70B", "--gpus", "64"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dplan(args);
  };
  CHECK_THAT(require_one_error_line(with({"--rank-by", "mfu"})), Contains("--rank-by") && Contains("goodput"));
  CHECK_THAT(require_one_error_line(with({"--failure-rate-per-gpu-hour", "0"})), Contains("--failure-rate-per-gpu-hour"));
  CHECK_THAT(require_one_error_line(with({"--failure-rate-per-gpu-hour", "x"})), Contains("--failure-rate-per-gpu-hour"));
  CHECK_THAT(require_one_error_line(with({"--restart-s", "-5"})), Contains("--restart-s"));
  // A cluster without a storage block cannot rank by goodput: the one line says what to add.
  TempDir dir;
  json cluster = json::parse(read_file(std::string(DPLAN_PROFILES_DIR) + "/clusters/dgx-h100.json"));
  cluster["cluster"].erase("storage");
  const std::string path = dir.write("no-storage.json", cluster.dump(2));
  CHECK_THAT(require_one_error_line(with({"--cluster", path, "--rank-by", "goodput"})), Contains("storage"));
  // Without --rank-by the same cluster plans, and its report says why there are no times.
  const Result r = with({"--cluster", path});
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Contains("no storage bandwidths"));
}

TEST_CASE("plan.json carries the checkpoint prediction and plans without it still read", "[goodput][cli]") {
  TempDir dir;
  const std::string plan = (dir.path() / "plan.json").string();
  const Result r = run_dplan({"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "4", "--pp", "2",
                              "--zero", "3", "--precision", "fp32", "--global-batch", "8", "-o", plan});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json j = json::parse(read_file(plan));
  const json& ranks = j.at("prediction").at("checkpoint").at("rank_bytes");
  REQUIRE(ranks.size() == 4);
  // pp 2 x dp 2, ZeRO-3, fp32: stage 0 (embedding, positions, layer 0: 74,560 parameters) and
  // stage 1 (layer 1, final norm: 50,112) halved over dp, 12 bytes each.
  CHECK(ranks == json::array({74560 * 6.0, 74560 * 6.0, 50112 * 6.0, 50112 * 6.0}));
  // A plan written before the checkpoint prediction existed reads as before.
  j["prediction"].erase("checkpoint");
  const std::string old_plan = dir.write("old-plan.json", j.dump(1));
  const Result explained = run_dplan({"explain", old_plan});
  INFO(explained.err);
  CHECK(explained.status == 0);
}
