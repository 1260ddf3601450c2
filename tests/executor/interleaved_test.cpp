// The interleaved 1F1B schedule (vpp model chunks per pipeline rank, Megatron-LM's order) and
// uneven layer splits, end to end: every step's loss matches the single-process run within 1e-4
// relative, and the measured weights, gradients and optimizer states match the plan's prediction.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness.h"

namespace {
using namespace dplan::testing::executor;
using dplan::testing::TempDir;

const std::string kLlamaDeep = std::string(DPLAN_VALIDATION_DIR) + "/executor/llama-tiny-8l/config.json";

}  // namespace

TEST_CASE("parity: interleaved 1F1B, vpp 2 on pp 2 and pp 4, with tp, dp, ZeRO and recompute", "[executor][parity]") {
  TempDir dir;
  // llama-tiny's 4 layers: one per chunk on pp 2 x vpp 2; 8 micro-batches, so the warm-up, the
  // steady state and the cool-down all run.
  const std::vector<double>& ref4 = reference(kLlamaTiny, 8, kFeatureSteps);
  Layout pp2{1, 2, 1, "interleaved"};
  require_parity(run_plan(write_plan(dir, kLlamaTiny, pp2, 8, {"--vpp", "2"}), {}, kFeatureSteps), ref4,
                 pp2.describe() + " vpp 2");
  Layout tp_pp_dp{2, 2, 2, "interleaved", true};
  require_parity(run_plan(write_plan(dir, kLlamaTiny, tp_pp_dp, 8, {"--vpp", "2", "--zero", "1"}), {}, kFeatureSteps),
                 ref4,
                 tp_pp_dp.describe() + " vpp 2 ZeRO-1");
  // 6 micro-batches on pp 2: three groups of pp through both chunks.
  const std::vector<double>& ref6 = reference(kLlamaTiny, 6, kFeatureSteps);
  require_parity(run_plan(write_plan(dir, kLlamaTiny, pp2, 6, {"--vpp", "2"}), {}, kFeatureSteps), ref6,
                 "pp 2 vpp 2, 6 micro-batches");

  // The 8-layer model on pp 4 x vpp 2 (one layer per chunk), alone and with ZeRO-3 and full recompute.
  const std::vector<double>& ref8 = reference(kLlamaDeep, 8, kFeatureSteps);
  Layout pp4{1, 4, 1, "interleaved"};
  require_parity(run_plan(write_plan(dir, kLlamaDeep, pp4, 8, {"--vpp", "2"}), {}, kFeatureSteps), ref8,
                 pp4.describe() + " vpp 2");
  Layout pp4_dp{1, 4, 2, "interleaved", false, 1, "full"};
  require_parity(run_plan(write_plan(dir, kLlamaDeep, pp4_dp, 8, {"--vpp", "2", "--zero", "3"}), {}, kFeatureSteps),
                 ref8,
                 pp4_dp.describe() + " vpp 2 ZeRO-3");
}

TEST_CASE("parity: uneven pipelines as Megatron splits them (first/last stage layers, accounted embedding and loss)",
          "[executor][parity]") {
  TempDir dir;
  const std::vector<double>& ref8 = reference(kLlamaDeep, 8, kFeatureSteps);
  // 8 layers on pp 3: 2 on the first stage, 3, 3.
  Layout pp3{1, 3, 1};
  require_parity(run_plan(write_plan(dir, kLlamaDeep, pp3, 8, {"--first-stage-layers", "2"}), {}, kFeatureSteps),
                 ref8,
                 "pp 3 with 2 layers on the first stage");
  // 8 layers + the loss accounted as a layer: 9 slots on pp 3, 3 layers, 3, 2 + the loss.
  require_parity(run_plan(write_plan(dir, kLlamaDeep, pp3, 8, {"--account-for-loss"}), {}, kFeatureSteps), ref8,
                 "pp 3 with the loss accounted as a layer");
}

TEST_CASE("memory: interleaved chunks hold what the plan predicts", "[executor][memory]") {
  check_memory_cases({{kLlamaTiny, {1, 2, 1, "interleaved"}, {"--vpp", "2"}},
                      {kLlamaDeep, {1, 4, 2, "interleaved"}, {"--vpp", "2", "--zero", "1"}}});
}

TEST_CASE("dplan compare names an interleaved plan's model chunks in its layout line", "[executor][interleaved]") {
  TempDir dir;
  const std::string plan = write_plan(dir, kLlamaTiny, {1, 2, 1, "interleaved"}, 8, {"--vpp", "2"});
  run_plan(plan, {}, 3);
  dplan::testing::Result r = dplan::testing::run_program(
      DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string()});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.substr(0, r.out.find('\n')).find("tp 1 · pp 2 · dp 1 · cp 1 · vpp 2") != std::string::npos);
}
