// Context parallel end to end (issue 20, items 1, 5 and 9), through the real binaries:
//  - parity: cp 2 alone, with tp 2 (with and without sequence parallel), with pp 2 and ZeRO-3, on
//    gpt-tiny (learned positions, tied embeddings) and llama-tiny (rotary, grouped-query
//    attention), and cp 4 once: every step's loss within 1e-4 relative of the single-process run,
//    and every rank of a (tp, pp) coordinate, cp ranks included, ending with identical weights;
//  - memory: measured weights, gradients and optimizer states within 1 % of the plan, activations
//    within 15 %, for two cp layouts;
//  - a cp whose 2*cp chunks do not divide the sequence is refused by `dplan estimate` and by
//    `dplan run` (a plan edited by hand) with one line naming the rule.
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "process.h"

namespace {
using Catch::Matchers::Contains;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;
using namespace dplan::testing::executor;

using Case = PlanCase;

// The lines of `text` that are not empty.
int lines(const std::string& text) {
  int n = 0;
  bool open = false;
  for (char c : text) {
    if (c == '\n') {
      n += open;
      open = false;
    } else {
      open = true;
    }
  }
  return n + open;
}

}  // namespace

TEST_CASE("parity: context parallel alone, with tp (and sp), with pp and ZeRO-3, on both models, and cp 4",
          "[executor][parity]") {
  const std::vector<Case> cases = {
      {"gpt-tiny", with_cp({1, 1, 1}, 2), {}},
      {"gpt-tiny", with_cp({2, 1, 1}, 2), {}},
      {"gpt-tiny", with_cp({2, 1, 1, "1f1b", true}, 2), {}},
      {"gpt-tiny", with_cp({1, 2, 1}, 2), {"--zero", "3"}},
      {"gpt-tiny", with_cp({1, 1, 1}, 4), {}},
      {kLlamaTiny, with_cp({1, 1, 1}, 2), {}},
      {kLlamaTiny, with_cp({2, 1, 1}, 2), {}},
      {kLlamaTiny, with_cp({2, 1, 1, "1f1b", true}, 2), {}},
      {kLlamaTiny, with_cp({1, 2, 1}, 2), {"--zero", "3"}},
  };
  TempDir dir;
  for (const Case& c : cases) {
    const std::vector<double>& ref = reference(c.model, 8, kFeatureSteps);
    CHECK(ref.back() < ref.front());  // the loss moves, or parity would prove little
    check_parity_case(dir, c, ref);
  }
}

TEST_CASE("context parallel with attention dropout trains as cp 1 does, up to its masks", "[executor][cp]") {
  // gpt-tiny with dropout 0.1 on the attention probabilities (and residuals, embeddings): the ring
  // draws other masks than one process's flash attention, so the losses agree only as well as two
  // draws of the masks do; a ring that dropped without rescaling, or forgot the masks in backward,
  // would drift far further.
  const std::string model = std::string(DPLAN_VALIDATION_DIR) + "/executor/gpt-tiny-dropout/config.json";
  TempDir dir;
  const std::vector<double> one = losses(run_plan(write_plan(dir, model, {1, 1, 1}, 8), {}, kFeatureSteps));
  const std::vector<double> ring = losses(run_plan(write_plan(dir, model, with_cp({1, 1, 1}, 2), 8), {}, kFeatureSteps));
  REQUIRE(ring.size() == one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("step " << i + 1 << ": cp 2 " << ring[i] << ", cp 1 " << one[i]);
    CHECK(std::abs(ring[i] - one[i]) <= 0.02 * one[i]);
  }
  CHECK(ring.back() < ring.front());
}

TEST_CASE("memory: context parallel's weights, gradients and optimizer within 1 % of the plan, activations within 15 %",
          "[executor][memory]") {
  const std::vector<Case> cases = {
      {"gpt-tiny", with_cp({1, 1, 2}, 2), {"--zero", "1"}},
      {kLlamaTiny, with_cp({2, 2, 1, "1f1b", true}, 2), {"--zero", "2"}},
      {"gpt-tiny", with_cp({1, 1, 1}, 2), {"--attention", "standard"}},  // the ring whatever --attention
  };
  check_memory_cases(cases);
}

TEST_CASE("a cp whose 2*cp chunks do not divide the sequence is refused by estimate and by run, in one line",
          "[executor][errors]") {
  TempDir dir;
  // estimate: gpt-tiny's 128 tokens in 2*3 chunks.
  Result est = run_program(DPLAN_BINARY, {"estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "3",
                                          "--cp", "3", "--precision", "fp32", "-o", (dir.path() / "cp3.json").string()});
  INFO(est.err);
  CHECK(est.status != 0);
  CHECK_THAT(est.err, Contains("not divisible by 2*cp = 6"));
  CHECK(lines(est.err) == 1);
  // run: a cp 4 plan whose sequence was edited to 60 tokens (not a multiple of 2*4).
  std::string plan = write_plan(dir, "gpt-tiny", with_cp({1, 1, 1}, 4), 8);
  json j = json::parse(read_file(plan));
  j["training"]["seq_len"] = 60;
  std::ofstream(plan) << j.dump(2);
  Result run = run_program(DPLAN_BINARY, {"run", plan, "--steps", "1", "--quiet", "-o", (dir.path() / "r.json").string()});
  INFO(run.err);
  CHECK(run.status != 0);
  CHECK_THAT(run.err, Contains("sequence length 60 is not divisible by 2*cp = 8"));
  CHECK(lines(run.err) == 1);
}
