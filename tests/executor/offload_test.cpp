// Optimizer offload (issue 20, item 4): the fp32 weights, AdamW moments and a gradient copy live
// in host memory and the step runs there. On CPU the same path runs as on CUDA (host tensors apart
// from the device's parameters and gradients), so the losses must match the single-process run,
// the device must hold no optimizer state, and the host bytes must be what the plan predicts.
#include "harness.h"

namespace dplan::testing::executor {
namespace {

struct OffloadCase {
  Layout layout;
  std::string zero;
};

const std::vector<OffloadCase> kCases = {
    {{1, 1, 2}, "1"}, {{1, 1, 2}, "3"}, {{2, 1, 2}, "1"}, {{1, 2, 2}, "3"}, {{2, 1, 2, "1f1b", true}, "2"}};

std::vector<std::string> offload_flags(const std::string& zero) { return {"--zero", zero, "--offload"}; }

}  // namespace

TEST_CASE("optimizer offload matches the single-process losses with ZeRO-1, 2 and 3", "[executor][parity]") {
  const std::vector<double>& ref = reference("gpt-tiny", 8, kFeatureSteps);
  CHECK(ref.back() < ref.front());
  TempDir dir;
  for (const OffloadCase& c : kCases) {
    json run = run_plan(write_plan(dir, "gpt-tiny", c.layout, 8, offload_flags(c.zero)), {}, kFeatureSteps);
    require_parity(run, ref, c.layout.describe() + " ZeRO-" + c.zero + " offload");
    for (const auto& [rank, memory] : run["memory"].items()) {
      INFO("rank " << rank);
      CHECK(memory["optimizer"].get<long long>() == 0);  // nothing of the optimizer on the device
      CHECK(memory["host_optimizer"].get<long long>() > 0);
      CHECK(memory["host_master"].get<long long>() > 0);
      CHECK(memory["host_gradients"].get<long long>() == memory["host_master"].get<long long>());
      // The step's temporaries come on top of what stays resident.
      CHECK(memory["host_peak"].get<long long>() >= memory["host_optimizer"].get<long long>() +
                                                        memory["host_master"].get<long long>() +
                                                        memory["host_gradients"].get<long long>());
    }
  }
}

TEST_CASE("optimizer offload: device and host memory as the plan predicts", "[executor][memory]") {
  TempDir dir;
  for (const OffloadCase& c : kCases) {
    INFO(c.layout.describe() << " ZeRO-" << c.zero << " offload");
    const std::string plan = write_plan(dir, "gpt-tiny", c.layout, 8, offload_flags(c.zero));
    run_plan(plan, {}, 3);
    check_memory(plan, c.layout.pp);
    Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
    REQUIRE(r.status == 0);
    for (const auto& stage : json::parse(r.out)["memory"]) {
      INFO("stage " << stage["stage"]);
      REQUIRE(stage.contains("host"));
      const double predicted = stage["host"]["predicted"].get<double>(), measured = stage["host"]["measured"].get<double>();
      INFO("host predicted " << predicted << " measured " << measured);
      CHECK(predicted > 0);
      CHECK(std::abs(measured - predicted) <= 0.01 * predicted);
      CHECK(stage["optimizer"]["predicted"].get<double>() == 0);
    }
    // The text report puts the host prediction beside the measurement.
    Result text = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string()});
    REQUIRE(text.status == 0);
    CHECK(text.out.find("host (offloaded optimizer)") != std::string::npos);
  }
}

TEST_CASE("optimizer offload with bf16 parameters: fp32 weights, moments and gradients on the host",
          "[executor][precision]") {
  const std::vector<double>& ref = reference("gpt-tiny", 8, kFeatureSteps);
  TempDir dir;
  for (const OffloadCase& c : {OffloadCase{{1, 1, 2}, "1"}, OffloadCase{{1, 2, 2}, "3"}}) {
    INFO(c.layout.describe() << " ZeRO-" << c.zero << " offload bf16");
    std::vector<std::string> flags = offload_flags(c.zero);
    flags.insert(flags.end(), {"--precision", "bf16", "--fp32-grads"});
    const std::string plan = write_plan(dir, "gpt-tiny", c.layout, 8, flags);
    json run = run_plan(plan, {"--precision", "bf16"}, kFeatureSteps);
    CHECK(run["config"]["precision"] == "bf16");
    // As the mixed-precision test (executor_test.cpp): bf16 rounding moves the loss a little off
    // the fp32 trajectory, not more; the host's fp32 step is the device's.
    std::vector<double> got = losses(run);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - ref[i]) <= 1e-3 * ref[i]);
    CHECK(run["replicas"]["identical"].get<bool>());
    Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
    REQUIRE(r.status == 0);
    for (const auto& stage : json::parse(r.out)["memory"]) {
      INFO("stage " << stage["stage"]);
      for (const char* part : {"weights", "gradients", "host"}) {
        INFO(part);
        CHECK(std::abs(stage[part]["measured"].get<double>() - stage[part]["predicted"].get<double>()) <=
              0.01 * stage[part]["predicted"].get<double>());
      }
      CHECK(stage["optimizer"]["measured"].get<double>() == 0);
    }
  }
}

}  // namespace dplan::testing::executor
