// The three file formats' owners (costmodel): plan.json (plan_file.h), run.json (run_record.h) and
// the profile figures dplan probe and dplan calibrate write (profile_edit.h). Each: write, strict
// read, write again gives the same JSON; a newer format_version, a missing key and a wrong type are
// one error line naming the file and the JSON pointer. Fixtures: tests/data/compare (a plan
// `dplan estimate -o` wrote), tests/data/accuracy (plans and runs dplan wrote), profiles/.
#include <filesystem>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/profile_edit.h"
#include "dplan/costmodel/run_record.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
namespace fs = std::filesystem;

namespace {

const std::string kData = DPLAN_VALIDATION_DIR;

std::vector<std::string> fixtures(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(kData + "/accuracy"))
    if (entry.path().filename().string().starts_with(prefix)) out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the InputError `read` throws; one line.
template <typename Read>
std::string error_of(Read read) {
  try {
    read();
  } catch (const InputError& e) {
    std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    return what;
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("plan.json: every plan dplan wrote reads strictly and writes back the same JSON, byte for byte", "[formats]") {
  std::vector<std::string> files = fixtures("plan-");
  files.push_back(kData + "/compare/plan.json");
  REQUIRE(files.size() == 10);
  for (const auto& f : files) {
    INFO(f);
    const json written = read_json_file(f);
    const Plan plan = read_plan(f);
    CHECK(to_json(plan).dump() == written.dump());
    CHECK(plan_from_json(to_json(plan), f) == plan);
  }
}

TEST_CASE("plan.json: gradient-accumulation fusion is written only where it is off, and reads back", "[formats]") {
  Plan plan = dplan::testing::local_plan("gpt-small", {.dp = 2}, 128, 8);
  CHECK_FALSE(to_json(plan)["training"].contains("gradient_accumulation_fusion"));
  plan.training.gradient_accumulation_fusion = false;
  const json j = to_json(plan);
  CHECK(j["training"]["gradient_accumulation_fusion"] == false);
  CHECK_FALSE(plan_from_json(j, "plan.json").training.gradient_accumulation_fusion);
  CHECK(plan_from_json(to_json(dplan::testing::local_plan("gpt-small", {.dp = 2}, 128, 8)), "plan.json")
            .training.gradient_accumulation_fusion);
}

TEST_CASE("plan.json: the written plan of an interleaved layout round-trips with its model chunks", "[formats]") {
  const ModelSpec model = dplan::testing::store().load_model("gpt-small");
  const Plan plan = dplan::testing::local_plan(
      "gpt-small", {.tp = 1, .pp = 2, .dp = 2, .vpp = 2, .schedule = Schedule::interleaved, .layers_per_stage = {}}, 128, 8);
  REQUIRE(plan.stages.size() == 2);
  const int per_chunk = model.num_layers / 4;  // Megatron's interleaving: chunk j of stage i is block j*pp + i
  CHECK(plan.stages[1].chunks == std::vector<PlanChunk>{{per_chunk, per_chunk}, {3 * per_chunk, per_chunk}});
  CHECK(plan.ranks.size() == 4);
  CHECK(plan_from_json(to_json(plan), "plan.json") == plan);
}

TEST_CASE("plan.json: a newer format, a missing key and a wrong type are one line naming file and pointer", "[formats]") {
  const json good = read_json_file(kData + "/compare/plan.json");
  json j = good;
  j["format_version"] = 2;
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) ==
        "plan.json: /format_version: format 2 is newer than this dplan reads (format 1); use a newer dplan, or write the file again with this one");
  // Another file in a plan's place (a config.json, say): what it should be, not a missing key.
  CHECK(error_of([&] { plan_from_json(json::parse(R"({"model_type": "llama", "hidden_size": 64})"), "config.json"); }) ==
        "config.json: not a plan.json, which dplan -o and dplan estimate -o write (it has no \"format_version\")");
  CHECK(error_of([&] { run_record_from_json(json::parse(R"({"model_type": "llama"})"), "config.json"); }) ==
        "config.json: not a run.json, which dplan run -o writes (it has no \"format_version\")");
  j = good;
  j["parallel"]["tp"] = "x";
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) == "plan.json: /parallel/tp: expected an integer from 1 to 1048576, got \"x\"");
  j = good;
  j["parallel"].erase("tp");
  CHECK_THAT(error_of([&] { plan_from_json(j, "plan.json"); }), Catch::StartsWith("plan.json: /parallel: missing key \"tp\""));
  j = good;
  j.erase("stages");
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) == "plan.json: /: missing key \"stages\"");
  j = good;
  j["rank_layout"]["ranks"][3]["dp"] = 7;
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) ==
        "plan.json: /rank_layout/ranks/3/dp: expected an integer from 0 to 1, got 7");
  j = good;
  j["stages"][1]["chunks"][0]["num_layers"] = true;
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) ==
        "plan.json: /stages/1/chunks/0/num_layers: expected an integer from 0 to 2147483647, got true");
  j = good;
  j["num_microbatches"] = 3;
  CHECK_THAT(error_of([&] { plan_from_json(j, "plan.json"); }), Catch::StartsWith("plan.json: /num_microbatches: expected 4"));
  j = good;
  j["overlap"]["tp_comm"] = 1;
  CHECK(error_of([&] { plan_from_json(j, "plan.json"); }) == "plan.json: /overlap/tp_comm: expected true or false, got 1");
}

TEST_CASE("run.json: every run the executor wrote reads strictly, and the writer gives back its JSON", "[formats]") {
  std::vector<std::string> files = fixtures("run-");
  files.push_back(kData + "/compare/run.json");
  files.push_back(kData + "/compare/run-format1.json");  // format 1 is written back as format 1
  REQUIRE(files.size() == 29);
  for (const auto& f : files) {
    INFO(f);
    const json written = read_json_file(f);
    const RunRecord run = read_run_record(f);
    CHECK(to_json(run) == written);  // the executor's own output, as it wrote it
    CHECK(run_record_from_json(to_json(run), f) == run);
    CHECK(to_json(run_record_from_json(to_json(run), f)).dump(1) == to_json(run).dump(1));
  }
  const RunRecord run = read_run_record(kData + "/compare/run.json");
  CHECK(run.layout.tp == 2);
  CHECK(run.stage_of_rank == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  CHECK(run.step_time.median_s == 0.0148);
  CHECK(run.memory_bytes.at(0).at("weights") == 166272);
  CHECK_FALSE(run.steps[0].grad_norm);  // written before grad_norm was recorded
}

TEST_CASE("run.json: a rank with no memory figures is written back and reads again", "[formats]") {
  json j = read_json_file(kData + "/compare/run.json");
  j["memory"]["1"] = json::object();  // found by fuzz/run.sh: the empty rank was dropped on writing
  const RunRecord run = run_record_from_json(j, "run.json");
  CHECK(run.memory_bytes.at(1).empty());
  CHECK(to_json(run).at("memory").at("1") == json::object());
  CHECK(run_record_from_json(to_json(run), "run.json") == run);
}

TEST_CASE("run.json: the checkpoints block reads strictly and round-trips and older files read without it", "[formats]") {
  json j = read_json_file(kData + "/compare/run.json");
  CHECK_FALSE(run_record_from_json(j, "run.json").checkpoints);  // written before checkpoints existed
  // As a run with --checkpoint-dir and --resume writes it (8 ranks: compare/run.json's layout).
  j["checkpoints"] = json::parse(R"({"async": true, "dir": "ck", "resumed_from": {"folder": "ck/step-00000003", "step": 3},
    "stopped_by_signal": 15, "saves": [{"step": 6, "blocking_s": 0.0019, "wait_s": 0.0001, "write_s": 0.027,
    "file_bytes_by_rank": [1, 2, 3, 4, 5, 6, 7, 8], "state_bytes_by_rank": [1, 1, 1, 1, 1, 1, 1, 1],
    "file_bytes": 36, "state_bytes": 8}]})");
  const RunRecord run = run_record_from_json(j, "run.json");
  REQUIRE(run.checkpoints);
  CHECK(run.checkpoints->resumed_from_step == 3);
  CHECK(run.checkpoints->stopped_by_signal == 15);
  CHECK(run.checkpoints->saves.at(0).file_bytes_by_rank.at(7) == 8);
  CHECK(to_json(run) == j);
  CHECK(run_record_from_json(to_json(run), "run.json") == run);
  json bad = j;
  bad["checkpoints"]["saves"][0]["file_bytes"] = 35;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }),
             Catch::StartsWith("run.json: /checkpoints/saves/0/file_bytes: expected the sum of file_bytes_by_rank (36)"));
  bad = j;
  bad["checkpoints"]["saves"][0]["state_bytes_by_rank"] = {1, 2};
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }),
             Catch::StartsWith("run.json: /checkpoints/saves/0/state_bytes_by_rank: expected a list of 8 byte counts"));
  bad = j;
  bad["checkpoints"]["extra"] = 1;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /checkpoints"));
}

TEST_CASE("run.json: the start-up block reads strictly and round-trips and older files read without it", "[formats]") {
  json j = read_json_file(kData + "/compare/run.json");
  CHECK(run_record_from_json(j, "run.json").startup_s.empty());  // written before start-up was timed
  j["startup_s"] = json::parse(R"({"launch_to_main": 0.41, "setup": 0.002, "rendezvous": 0.001, "groups": 0.01,
    "model": 0.003, "optimizer": 0.0005, "before_first_step": 0.0, "total": 0.4265})");
  const RunRecord run = run_record_from_json(j, "run.json");
  CHECK(run.startup_s.at("launch_to_main") == 0.41);
  CHECK(run.startup_s.size() == 8);
  CHECK(to_json(run) == j);
  CHECK(run_record_from_json(to_json(run), "run.json") == run);
  json bad = j;
  bad["startup_s"]["model"] = -1;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /startup_s/model: "));
  bad = j;
  bad["startup_s"]["groups"] = "fast";
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /startup_s/groups: "));
  bad = j;
  bad["startup_s"].erase("total");
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /startup_s/total: "));
  bad = j;
  bad["startup_s"] = 3;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /startup_s: "));
}

TEST_CASE("run.json: the FLOP counts read strictly, every rank and part, round-trip, and older files read without them",
          "[formats]") {
  json j = read_json_file(kData + "/compare/run.json");
  CHECK(run_record_from_json(j, "run.json").flops_by_rank.empty());  // written before the executor counted them
  json parts = json::object();
  for (int i = 0; i < kNumFlopParts; ++i) parts[to_string(static_cast<FlopPart>(i))] = 1e6 * (i + 1);
  for (int rank = 0; rank < 8; ++rank) j["flops"][std::to_string(rank)] = {{"forward", parts}, {"recompute", parts}};
  const RunRecord run = run_record_from_json(j, "run.json");
  REQUIRE(run.flops_by_rank.size() == 8);
  CHECK(run.flops_by_rank.at(7).forward[static_cast<int>(FlopPart::head)] == 7e6);
  CHECK(to_json(run) == j);
  CHECK(run_record_from_json(to_json(run), "run.json") == run);
  json bad = j;
  bad["flops"].erase("5");
  CHECK(error_of([&] { run_record_from_json(bad, "run.json"); }) == "run.json: /flops: missing key \"5\" (rank 5)");
  bad = j;
  bad["flops"]["2"]["forward"].erase("router");
  CHECK(error_of([&] { run_record_from_json(bad, "run.json"); }) == "run.json: /flops/2/forward: missing key \"router\"");
  bad = j;
  bad["flops"]["2"]["recompute"]["qkv"] = -1;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /flops/2/recompute/qkv: "));
  bad = j;
  bad["flops"]["2"]["forward"]["mlp_up"] = 1;
  CHECK_THAT(error_of([&] { run_record_from_json(bad, "run.json"); }), Catch::StartsWith("run.json: /flops/2/forward"));
}

TEST_CASE("run.json: a newer format, a missing key and a wrong type are one line naming file and pointer", "[formats]") {
  const json good = read_json_file(kData + "/compare/run.json");
  json j = good;
  j["format_version"] = 3;
  CHECK(error_of([&] { run_record_from_json(j, "run.json"); }) ==
        "run.json: /format_version: format 3 is newer than this dplan reads (format 2); use a newer dplan, or write the file again with this one");
  j = good;
  j["step_time_s"].erase("median");
  CHECK_THAT(error_of([&] { run_record_from_json(j, "run.json"); }),
             Catch::StartsWith("run.json: /step_time_s: missing key \"median\""));
  j = good;
  j["layout"]["schedule"] = 1;
  CHECK(error_of([&] { run_record_from_json(j, "run.json"); }) ==
        "run.json: /layout/schedule: expected one of gpipe, 1f1b, interleaved or dualpipe, got 1");
  j = good;
  j["memory"]["3"]["peak"] = "big";
  CHECK(error_of([&] { run_record_from_json(j, "run.json"); }) == "run.json: /memory/3/peak: expected an integer from 0 to 9007199254740992, got \"big\"");
  j = good;
  j["steps"][2]["loss"] = nullptr;
  CHECK(error_of([&] { run_record_from_json(j, "run.json"); }) == "run.json: /steps/2/loss: expected a number, got null");
}

TEST_CASE("profiles: the figures probe and calibrate write go through the one writer and read back", "[formats]") {
  const auto& store = dplan::testing::store();
  for (const char* name : {"local-cpu", "dgx-h100", "dgx-a100-80g"}) {
    INFO(name);
    const std::string path = store.cluster_path(name);
    const ClusterSpec spec = store.load_cluster(name);
    // Write every figure a fit changes back into the file, from the spec read from it; read that,
    // write again. Units convert in floating point (3.4 us -> 3.4e-6 s -> 3.3999999999999995 us),
    // so a figure may move in its last bits each time through; everything else stays as written.
    const std::vector<std::string> figures = {"intra_node.efficiency", "intra_node.latency_us",
                                              "intra_node.half_bandwidth_mib", "inter_node.efficiency",
                                              "inter_node.latency_us", "inter_node.half_bandwidth_mib"};
    auto load_gpu = [&](const std::string& gpu) { return store.load_gpu(gpu); };
    auto write = [&](const ClusterSpec& c) {
      json file = read_json_file(path);
      put_figures(file.at("cluster"), pick_figures(to_json(c), figures));
      return file;
    };
    const json first = write(spec);
    const json second = write(cluster_from_json(first, path, load_gpu));
    json original = read_json_file(path);
    const json picked = pick_figures(original.at("cluster"), figures);
    const json written = pick_figures(second.at("cluster"), figures);
    for (const auto& [figure, value] : written.items()) {
      INFO(figure);
      CHECK(value.get<double>() == Approx(picked.at(figure).get<double>()).epsilon(1e-12));
    }
    put_figures(original.at("cluster"), pick_figures(second.at("cluster"), figures));
    CHECK(original == second);  // nothing but the figures changed

    json gpu_file = read_json_file(store.gpu_path(read_json_file(path)["cluster"]["gpu"].get<std::string>()));
    const std::vector<std::string> gpu_figures = {"matmul.max_efficiency", "matmul.sm_count",
                                                  "matmul.kernel_overhead_us", "memory_efficiency",
                                                  "sustained_fraction"};
    put_figures(gpu_file.at("gpu"), pick_figures(to_json(spec.gpu), gpu_figures));
    CHECK(gpu_from_json(gpu_file, "gpu.json") == spec.gpu);
  }
  CHECK(pick_figures(json{{"a", {{"b", 1}}}}, {"a.b"}) == json{{"a.b", 1}});
}

TEST_CASE("profiles: a newer format, a missing key and a wrong type are one line naming file and pointer", "[formats]") {
  const auto& store = dplan::testing::store();
  const std::string path = store.gpu_path("h100-sxm5-80gb");
  const json good = read_json_file(path);
  json j = good;
  j["format_version"] = 2;
  CHECK(error_of([&] { gpu_from_json(j, "gpu.json"); }) == "gpu.json: /format_version: expected 1, got 2");
  j = good;
  j["gpu"].erase("hbm_gb");
  CHECK(error_of([&] { gpu_from_json(j, "gpu.json"); }) == "gpu.json: /gpu: missing key \"hbm_gb\"");
  j = good;
  j["gpu"]["matmul"]["sm_count"] = "many";
  CHECK(error_of([&] { gpu_from_json(j, "gpu.json"); }) ==
        "gpu.json: /gpu/matmul/sm_count: expected an integer from 1 to 100000, got \"many\"");
}
