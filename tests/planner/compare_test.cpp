// dplan compare: the plan's prediction mapped onto the executor's buckets (docs/run-json.md),
// relative errors, the per-stage max over ranks, and bad input through the binary.
// Fixtures in tests/data/compare/: plan.json is the output of
//   dplan estimate --model gpt-tiny --cluster local-cpu --gpus 8 --tp 2 --pp 2 --dp 2 --mbs 1
//                  --global-batch 8 --precision fp32 -o plan.json
// and run.json a hand-written measurement of that layout (ranks 0-3 run stage 0, ranks 4-7 stage 1);
// run-format1.json the same measurement as format 1 wrote it (docs/run-json.md, "Format 1").
// plan-offload.json and run-offload.json: `dplan estimate --model gpt-tiny --cluster local-cpu
// --gpus 2 --dp 2 --zero 1 --offload --mbs 1 --global-batch 8 --precision fp32` and its
// `dplan run --steps 10` (optimizer offload: run.json's host_* components).
#include <algorithm>
#include <string>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/planner/compare.h"
#include "process.h"

using namespace dplan;
using namespace dplan::planner;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Catch::Matchers::WithinRel;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using dplan::testing::require_one_error_line;

namespace {

const std::string kPlanPath = std::string(DPLAN_VALIDATION_DIR) + "/compare/plan.json";
const std::string kRunPath = std::string(DPLAN_VALIDATION_DIR) + "/compare/run.json";
const std::string kRunFormat1Path = std::string(DPLAN_VALIDATION_DIR) + "/compare/run-format1.json";

json plan_fixture() { return read_json_file(kPlanPath); }
json run_fixture() { return read_json_file(kRunPath); }
json run_format1_fixture() { return read_json_file(kRunFormat1Path); }

Comparison compare(const json& plan, const json& run) { return compare_plan_and_run(plan, "plan.json", run, "run.json"); }

const ComparedValue& phase(const Comparison& c, const std::string& name) {
  for (const auto& p : c.phases)
    if (p.name == name) return p.value;
  FAIL("no phase " << name);
  throw;
}

const ComparedValue& memory(const Comparison& c, int stage, const std::string& name) {
  for (const auto& m : c.memory.at(stage).components)
    if (m.name == name) return m.value;
  FAIL("no memory component " << name);
  throw;
}

std::string error_of(const json& plan, const json& run) {
  try {
    compare(plan, run);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError");
  return "";
}


}  // namespace

TEST_CASE("the relative error is (predicted - measured) / measured, and none when nothing was measured", "[compare]") {
  CHECK_THAT(*relative_error(12, 10), WithinRel(0.2));   // 2 / 10
  CHECK_THAT(*relative_error(8, 10), WithinRel(-0.2));   // -2 / 10
  CHECK(*relative_error(10, 10) == 0);
  CHECK_FALSE(relative_error(5, 0).has_value());
  CHECK_FALSE(relative_error(0, 0).has_value());
}

// Powers of two as predicted times, so each row's sum names exactly the phases in it.
json powers_of_two_plan() {
  json plan = plan_fixture();
  plan["prediction"]["time"] = {{"forward", 1},   {"backward", 2},   {"recompute", 4},     {"tp_comm", 8},
                                {"cp_comm", 16},  {"ep_comm", 32},   {"pp_p2p", 64},       {"pp_bubble", 128},
                                {"dp_comm", 256}, {"param_gather", 512}, {"optimizer", 1024}, {"offload", 2048},
                                {"overhead", 4096}};
  return plan;
}

TEST_CASE("each measured phase is compared with the same phase of the prediction, in one vocabulary", "[compare]") {
  Comparison c = compare(powers_of_two_plan(), run_fixture());
  std::vector<std::string> names;
  for (const auto& p : c.phases) {
    names.push_back(p.name);
    CHECK(p.includes.empty());
    CHECK(p.measured);
  }
  CHECK(names == std::vector<std::string>{"forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p",
                                          "pp_bubble", "dp_comm", "param_gather", "optimizer", "offload", "overhead"});
  double power = 1;
  for (const auto& p : c.phases) {
    INFO(p.name);
    CHECK(p.value.predicted == power);  // its own prediction and no other
    power *= 2;
  }
  // Measured: run.json phases_s as written.
  CHECK(phase(c, "forward").measured == 0.0034);
  CHECK(phase(c, "pp_p2p").measured == 0.0004);
  CHECK(phase(c, "pp_bubble").measured == 0.002);
  CHECK(phase(c, "overhead").measured == 0.0007);
}

TEST_CASE("a format-1 run.json still compares: its phases hold several predicted ones", "[compare]") {
  Comparison c = compare(powers_of_two_plan(), run_format1_fixture());
  std::vector<std::string> names;
  for (const auto& p : c.phases) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"forward", "backward", "tp_comm", "pp_bubble", "dp_comm", "optimizer", "overhead"});
  CHECK(phase(c, "forward").predicted == 1);
  CHECK(phase(c, "backward").predicted == 2 + 4);           // backward + recompute
  CHECK(phase(c, "tp_comm").predicted == 8 + 16 + 32);      // tp + cp + ep (no ep_comm of its own)
  CHECK(phase(c, "pp_bubble").predicted == 64 + 128);       // pp_wait: transfer + bubble
  CHECK(phase(c, "dp_comm").predicted == 256 + 512);        // gradient reduce + param gather
  CHECK(phase(c, "optimizer").predicted == 1024 + 2048);    // step + offload
  CHECK(phase(c, "overhead").predicted == 4096);            // "other"
  CHECK(c.phases[3].includes == std::vector<std::string>{"pp_p2p"});
  CHECK(phase(c, "pp_bubble").measured == 0.0024);
  CHECK(phase(c, "overhead").measured == 0.0007);
  SECTION("with an ep_comm of its own, tp_comm holds cp alone") {
    json run = run_format1_fixture();
    run["phases_s"]["ep_comm"] = 0.0001;
    Comparison e = compare(powers_of_two_plan(), run);
    CHECK(phase(e, "tp_comm").predicted == 8 + 16);
    CHECK(phase(e, "ep_comm").predicted == 32);
    CHECK(phase(e, "ep_comm").measured == 0.0001);
  }
}

TEST_CASE("step time, tokens/s and phases of the fixtures, with their errors", "[compare]") {
  Comparison c = compare(plan_fixture(), run_fixture());
  CHECK(c.tp == 2);
  CHECK(c.pp == 2);
  CHECK(c.dp == 2);
  CHECK(c.cp == 1);
  CHECK((c.ep == 1 && c.vpp == 1));
  CHECK(c.measured_steps == 18);
  // Step: predicted 12.5737568 ms, measured median 14.8 ms: -2.2262432 / 14.8 = -15.04 %.
  CHECK_THAT(c.step_time_s.predicted, WithinRel(0.0125737568, 1e-9));
  CHECK(c.step_time_s.measured == 0.0148);
  CHECK_THAT(*c.step_time_s.rel_error(), WithinRel(-0.0022262432 / 0.0148, 1e-9));
  // Tokens/s: 8 sequences x 128 tokens per step; 1024 / 0.0148 = 69189.2 measured.
  CHECK_THAT(c.tokens_per_s.measured, WithinRel(69189.2, 1e-9));
  CHECK_THAT(*c.tokens_per_s.rel_error(), WithinRel((81439.46286602267 - 69189.2) / 69189.2, 1e-9));
  // pp_bubble: 2.4077888 ms predicted against 2.0 ms: +20.39 %; pp_p2p 0.316768 ms against 0.4 ms.
  CHECK_THAT(phase(c, "pp_bubble").predicted, WithinRel(0.0024077888, 1e-9));
  CHECK_THAT(*phase(c, "pp_bubble").rel_error(), WithinRel(0.0004077888 / 0.002, 1e-9));
  CHECK_THAT(phase(c, "pp_p2p").predicted, WithinRel(0.000316768, 1e-9));
  // overhead: nothing predicted against 0.7 ms measured is -100 %.
  CHECK_THAT(*phase(c, "overhead").rel_error(), WithinRel(-1.0));
}

TEST_CASE("memory per stage is the largest of the stage's ranks, component by component", "[compare]") {
  json run = run_fixture();
  SECTION("ranks 0-3 run stage 0 and ranks 4-7 stage 1, as in the fixture") {
    Comparison c = compare(plan_fixture(), run);
    REQUIRE(c.memory.size() == 2);
    CHECK(c.memory[0].ranks == std::vector<int>{0, 1, 2, 3});
    CHECK(c.memory[1].ranks == std::vector<int>{4, 5, 6, 7});
    // Stage 0: the largest activations are rank 3's, the largest buffers and peak rank 1's.
    CHECK(memory(c, 0, "activations").measured == 729088);
    CHECK(memory(c, 0, "buffers").measured == 26279936);
    CHECK(memory(c, 0, "peak").measured == 27792896);
    // Stage 1: activations from rank 5, buffers and peak from rank 7.
    CHECK(memory(c, 1, "activations").measured == 495616);
    CHECK(memory(c, 1, "buffers").measured == 26279936);
    CHECK(memory(c, 1, "peak").measured == 27438592);
    // Predicted: weights are exact (41568 params x 4 bytes = 166272), activations add logits
    // (stage 1: 396288 + 65536), peak leaves out the 256 MiB reserve (322256384 - 268435456).
    CHECK(memory(c, 0, "weights").predicted == 166272);
    CHECK(*memory(c, 0, "weights").rel_error() == 0);
    CHECK(memory(c, 1, "activations").predicted == 396288 + 65536);
    CHECK(memory(c, 0, "peak").predicted == 322256384.0 - 268435456.0);
    CHECK(c.memory[0].predicted_reserve_bytes == 268435456);
    // Stage 0 activations: (661504 - 729088) / 729088 = -9.27 %.
    CHECK_THAT(*memory(c, 0, "activations").rel_error(), WithinRel(-67584.0 / 729088.0, 1e-12));
  }
  SECTION("the stages follow stage_of_rank, not rank order") {
    run["stage_of_rank"] = {1, 1, 1, 1, 0, 0, 0, 0};
    Comparison c = compare(plan_fixture(), run);
    CHECK(c.memory[0].ranks == std::vector<int>{4, 5, 6, 7});
    CHECK(memory(c, 0, "activations").measured == 495616);  // rank 5
    CHECK(memory(c, 1, "activations").measured == 729088);  // rank 3
  }
}

TEST_CASE("offload: the host's measured bytes beside the plan's host prediction, only where there is one", "[compare]") {
  SECTION("no offload in either file: no host row") {
    Comparison c = compare(plan_fixture(), run_fixture());
    for (const auto& s : c.memory)
      for (const auto& m : s.components) CHECK(m.name != "host");
  }
  SECTION("host = host_optimizer + host_master + host_gradients, the largest of the stage's ranks") {
    json plan = plan_fixture(), run = run_fixture();
    plan["prediction"]["memory"]["stages"][0]["host_bytes"] = 4096.0;
    for (int rank = 0; rank < 8; ++rank) {
      json& m = run["memory"][std::to_string(rank)];
      m["host_optimizer"] = 2048 + rank;  // rank 3 holds the most on stage 0, rank 7 on stage 1
      m["host_master"] = 1024;
      m["host_gradients"] = 1024;
      m["host_peak"] = 1 << 20;  // not part of it: the step's temporaries
    }
    Comparison c = compare(plan, run);
    CHECK(memory(c, 0, "host").predicted == 4096);
    CHECK(memory(c, 0, "host").measured == 4096 + 3);
    CHECK(memory(c, 1, "host").predicted == 0);
    CHECK(memory(c, 1, "host").measured == 4096 + 7);
  }
  SECTION("a real offloaded run: 16 bytes per parameter of the rank's half, as planned") {
    const std::string dir = std::string(DPLAN_VALIDATION_DIR) + "/compare/";
    Comparison c = compare(read_json_file(dir + "plan-offload.json"), read_json_file(dir + "run-offload.json"));
    CHECK(memory(c, 0, "host").predicted == 997376);  // 124672 parameters / 2 ranks x 16 bytes
    CHECK(memory(c, 0, "host").measured == 997376);
    CHECK(memory(c, 0, "optimizer").predicted == 0);
    CHECK(memory(c, 0, "optimizer").measured == 0);
  }
}

TEST_CASE("a measured zero has no relative error: n/a in the table, null in JSON", "[compare]") {
  json run = run_fixture();
  run["phases_s"]["dp_comm"] = 0;
  for (auto& [rank, components] : run["memory"].items()) components["buffers"] = 0;
  Comparison c = compare(plan_fixture(), run);
  CHECK_FALSE(phase(c, "dp_comm").rel_error().has_value());
  CHECK_FALSE(memory(c, 1, "buffers").rel_error().has_value());
  json j = to_json(c);
  CHECK(j["phases"]["dp_comm"]["rel_error"].is_null());
  CHECK(j["memory"][1]["buffers"]["rel_error"].is_null());
  CHECK(j["phases"]["forward"]["rel_error"].is_number());
}

TEST_CASE("a run of another layout is rejected, naming both layouts", "[compare]") {
  json run = run_fixture();
  run["layout"]["tp"] = 4;  // the same 8 ranks and stage_of_rank, another layout
  run["layout"]["dp"] = 1;
  std::string msg = error_of(plan_fixture(), run);
  CHECK_THAT(msg, Contains("plan.json and run.json do not belong together"));
  CHECK_THAT(msg, Contains("plans tp 2 pp 2 dp 2 cp 1"));
  CHECK_THAT(msg, Contains("ran tp 4 pp 2 dp 1 cp 1"));
}

TEST_CASE("a missing or malformed key in run.json is named with the file", "[compare]") {
  json run = run_fixture();
  SECTION("a phase") {
    run["phases_s"].erase("pp_bubble");
    CHECK_THAT(error_of(plan_fixture(), run), StartsWith("run.json: /phases_s: missing key \"pp_bubble\""));
  }
  SECTION("a name that is not a phase, in phases_s or a rank's row") {
    run["phases_s"]["pp_wait"] = 0.001;
    CHECK(error_of(plan_fixture(), run) ==
          "run.json: /phases_s: \"pp_wait\" is not a phase; valid: forward, backward, recompute, tp_comm, cp_comm, "
          "ep_comm, pp_p2p, pp_bubble, dp_comm, param_gather, optimizer, offload, overhead");
    run = run_fixture();
    run["phases_by_rank_s"][3]["other"] = 0.001;
    CHECK_THAT(error_of(plan_fixture(), run), StartsWith("run.json: /phases_by_rank_s/3: \"other\" is not a phase; valid: forward,"));
  }
  SECTION("a phase of a format-1 file") {
    json old = run_format1_fixture();
    old["phases_s"].erase("pp_wait");
    CHECK(error_of(plan_fixture(), old) == "run.json: /phases_s: missing key \"pp_wait\"");
  }
  SECTION("the median step time") {
    run["step_time_s"].erase("median");
    CHECK_THAT(error_of(plan_fixture(), run), StartsWith("run.json: /step_time_s: missing key \"median\""));
  }
  SECTION("a rank's memory") {
    run["memory"].erase("5");
    CHECK(error_of(plan_fixture(), run) == "run.json: /memory: missing key \"5\" (rank 5, which runs stage 1)");
  }
  SECTION("a memory component") {
    run["memory"]["6"].erase("peak");
    CHECK(error_of(plan_fixture(), run) == "run.json: /memory/6: missing key \"peak\"");
  }
  SECTION("stage_of_rank of the wrong length") {
    run["stage_of_rank"] = {0, 0, 1, 1};
    CHECK_THAT(error_of(plan_fixture(), run),
               Contains("run.json: /stage_of_rank: expected 8 entries (tp*cp*dp*pp), got 4"));
  }
  SECTION("a stage no rank runs") {
    run["stage_of_rank"] = {0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_THAT(error_of(plan_fixture(), run), Contains("no rank runs stage 1"));
  }
  SECTION("a key of the plan") {
    json plan = plan_fixture();
    plan["prediction"]["time"].erase("pp_bubble");
    CHECK(error_of(plan, run) == "plan.json: /prediction/time: missing key \"pp_bubble\"");
  }
}

TEST_CASE("dplan compare prints the phase table, a memory table per stage and a summary", "[compare][cli]") {
  Result r = run_program(DPLAN_BINARY, {"compare", kPlanPath, kRunPath});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("step time by phase"));
  CHECK_THAT(r.out, Contains("pp bubble "));
  CHECK_THAT(r.out, Contains("pp p2p "));
  CHECK_THAT(r.out, !Contains("cp comm"));  // neither predicted nor measured: left out of the table
  CHECK_THAT(r.out, Contains("memory per GPU, stage 0 (ranks 0-3"));
  CHECK_THAT(r.out, Contains("memory per GPU, stage 1 (ranks 4-7"));
  CHECK_THAT(r.out, Contains("the reserve is framework overhead the executor's allocator does not see"));
  CHECK_THAT(r.out, Contains("summary: step time -15.0 %"));
  SECTION("a format-1 run.json: the rows that hold several phases say so") {
    Result old = run_program(DPLAN_BINARY, {"compare", kPlanPath, kRunFormat1Path});
    INFO("stderr: " << old.err);
    REQUIRE(old.status == 0);
    CHECK_THAT(old.out, Contains("pp bubble (+ pp p2p)"));
    CHECK_THAT(old.out, Contains("tp comm (+ cp comm, ep comm)"));
    CHECK_THAT(old.out, Contains("summary: step time -15.0 %"));
  }
}

TEST_CASE("dplan compare --json prints predicted, measured and rel_error for every entry", "[compare][cli]") {
  Result r = run_program(DPLAN_BINARY, {"compare", kPlanPath, kRunPath, "--json"});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  json j = json::parse(r.out);
  auto keys_of = [](const json& object) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : object.items()) keys.push_back(k);
    return keys;  // nlohmann objects iterate in sorted order
  };
  const std::vector<std::string> value_keys = {"measured", "predicted", "rel_error"};
  CHECK(keys_of(j) ==
        std::vector<std::string>{"format", "measured_by", "memory", "phases", "step_time_s", "tokens_per_s"});
  CHECK(j["format"] == "run");
  CHECK(keys_of(j["step_time_s"]) == value_keys);
  CHECK(keys_of(j["tokens_per_s"]) == value_keys);
  CHECK(keys_of(j["phases"]) ==
        std::vector<std::string>{"backward", "cp_comm", "dp_comm", "ep_comm", "forward", "offload", "optimizer",
                                 "overhead", "param_gather", "pp_bubble", "pp_p2p", "recompute", "tp_comm"});
  for (const auto& [name, value] : j["phases"].items()) CHECK(keys_of(value) == value_keys);
  REQUIRE(j["memory"].size() == 2);
  for (int stage = 0; stage < 2; ++stage) {
    const json& s = j["memory"][stage];
    CHECK(s["stage"] == stage);
    CHECK(keys_of(s) == std::vector<std::string>{"activations", "buffers", "gradients", "optimizer", "peak", "stage",
                                                 "weights"});
  }
  CHECK(j["step_time_s"]["measured"] == 0.0148);
  CHECK(j["memory"][0]["peak"]["measured"] == 27792896);
}

TEST_CASE("dplan compare: bad files give one error line and exit status 2", "[compare][cli]") {
  TempDir dir;
  SECTION("a missing file") {
    std::string absent = (dir.path() / "absent.json").string();
    CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlanPath, absent})),
               Contains(absent + ": no such file"));
  }
  SECTION("malformed JSON") {
    std::string bad = dir.write("run.json", "{\"format_version\": 1,\n");
    CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlanPath, bad})),
               Contains(bad + ": malformed JSON: parse error at line 2"));
  }
  SECTION("a missing key") {
    json run = run_fixture();
    run.erase("phases_s");
    std::string path = dir.write("run.json", run.dump());
    CHECK(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlanPath, path})) ==
          "dplan: error: " + path + ": /: missing key \"phases_s\"");
  }
  SECTION("another layout") {
    json run = run_fixture();
    run["layout"]["tp"] = 1;  // the same 8 ranks and stage_of_rank, another layout
    run["layout"]["dp"] = 4;
    std::string path = dir.write("run.json", run.dump());
    CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlanPath, path})),
               Contains("plans tp 2 pp 2 dp 2 cp 1, " + path + " ran tp 1 pp 2 dp 4 cp 1"));
  }
  SECTION("a run file that is not a run") {
    std::string path = dir.write("run.json", "[1, 2]");
    CHECK_THAT(require_one_error_line(run_program(DPLAN_BINARY, {"compare", kPlanPath, path})),
               Contains(path + ": /: expected an object, got a list"));
  }
}
