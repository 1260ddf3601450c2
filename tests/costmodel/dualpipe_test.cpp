// DualPipe (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1 and Table 2; deepseek-ai/DualPipe
// dualpipe.py): rank i holds model stages i and pp-1-i, the bubble is (pp/2 - 1)(F&B + B - 3W),
// parameters 2x, activations pp + 1 micro-batches of one stage; dualpipe.py's asserts as layout
// rules; priced, refused in one line by every engine and by the executor.
#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/pipeline.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/time.h"
#include "dplan/planner/engine_rules.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::many_experts;
using dplan::testing::store;
using dplan::testing::validate_error;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

namespace {

ParallelConfig layout(Schedule s, int pp = 4) {
  ParallelConfig p{.tp = 2, .pp = pp, .dp = 8, .ep = 8, .micro_batch = 1};
  p.sequence_parallel = true;
  p.distributed_optimizer = true;
  p.schedule = s;
  return p;
}

const TrainingSpec kTraining{.seq_len = 4096, .global_batch = 256};  // 32 micro-batches per pipeline

}  // namespace

TEST_CASE("dualpipe: dualpipe.py's asserts are layout rules, each refused in one line", "[dualpipe][rules]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  CHECK(check_schedule(m, kTraining, layout(Schedule::dualpipe)) == LayoutRule::ok);
  ParallelConfig odd = layout(Schedule::dualpipe, 2);
  odd.pp = 1, odd.dp = 16;
  CHECK(check_schedule(m, kTraining, odd) == LayoutRule::dualpipe_needs_even_pp);
  CHECK_THAT(validate_error(m, c, kTraining, odd), Contains("even pp >= 2"));
  const TrainingSpec few{.seq_len = 4096, .global_batch = 48};  // 6 micro-batches < 2 x 4
  CHECK(check_schedule(m, few, layout(Schedule::dualpipe)) == LayoutRule::dualpipe_needs_microbatches);
  CHECK_THAT(validate_error(m, c, few, layout(Schedule::dualpipe)), Contains("at least 2 x pp = 8"));
  ParallelConfig with_vpp = layout(Schedule::dualpipe);
  with_vpp.vpp = 2;
  CHECK(check_schedule(m, kTraining, with_vpp) == LayoutRule::vpp_needs_interleaved);
  // The EP overlap runs in DualPipe's forward-backward pairs with a pipeline; not with plain 1F1B.
  ParallelConfig overlapped = layout(Schedule::dualpipe);
  overlapped.overlap_ep_comm = true;
  CHECK(validate_error(m, c, kTraining, overlapped).empty());
  overlapped.schedule = Schedule::one_f_one_b;
  CHECK_THAT(validate_error(m, c, kTraining, overlapped), Contains("or --schedule dualpipe"));
  CHECK(schedule_from_string("dualpipe") == Schedule::dualpipe);
  CHECK_THROWS_WITH(schedule_from_string("zb1p"), Contains("gpipe, 1f1b, interleaved or dualpipe"));
}

TEST_CASE("dualpipe: each rank holds its stage and the mirror stage, parameters 2x, pp + 1 micro-batches of "
          "activations",
          "[dualpipe][memory]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const MemoryEstimate one = estimate_memory(m, c, kTraining, layout(Schedule::one_f_one_b));
  const MemoryEstimate dual = estimate_memory(m, c, kTraining, layout(Schedule::dualpipe));
  const std::vector<std::vector<ModelChunk>> chunks = assign_chunks(m.num_layers, layout(Schedule::dualpipe));
  REQUIRE(chunks.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const StageMemory& d = dual.stages[i];
    const StageMemory &own = one.stages[i], &mirror = one.stages[3 - i];
    CHECK(chunks[i].size() == 2);
    CHECK(d.num_layers == own.num_layers + mirror.num_layers);
    CHECK_THAT(d.num_params, WithinRel(own.num_params + mirror.num_params, 1e-12));
    CHECK_THAT(d.weights_bytes, WithinRel(own.weights_bytes + mirror.weights_bytes, 1e-12));
    CHECK_THAT(d.optimizer_bytes, WithinRel(own.optimizer_bytes + mirror.optimizer_bytes, 1e-12));
    CHECK(d.microbatches_in_flight == 2.5);  // (pp + 1) / 2 of both chunks: pp + 1 of one stage
  }
  // Both end ranks hold the embedding and the loss.
  CHECK((holds_embedding(chunks[0]) && holds_loss(chunks[0]) && holds_embedding(chunks[3]) && holds_loss(chunks[3])));
  CHECK(!(holds_embedding(chunks[1]) || holds_loss(chunks[1])));
  // 1F1B's first stage holds pp = 4 micro-batches of its 8 layers; DualPipe's ranks pp + 1 = 5 of a
  // stage's 8: activations 5/4 of it, less the per-micro-batch extras of the end stages.
  CHECK(dual.stages[1].activations_bytes > 1.2 * one.stages[1].activations_bytes);
}

TEST_CASE("dualpipe: the bubble is (pp/2 - 1)(F + 2B - 3W), the work per rank 1F1B's, the mirrors' gradients summed",
          "[dualpipe][time]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const Network net(c, 64);
  const TimeBreakdown one = estimate_time(m, net, kTraining, layout(Schedule::one_f_one_b), OverlapOptions{});
  const TimeBreakdown dual = estimate_time(m, net, kTraining, layout(Schedule::dualpipe), OverlapOptions{});
  // The same micro-batches through the same layers: the compute per rank within the end stages'
  // embedding and head (which 1F1B's critical stage holds one of, DualPipe's both halves).
  CHECK_THAT(dual.forward_s, WithinRel(one.forward_s, 0.10));
  CHECK_THAT(dual.backward_s, WithinRel(one.backward_s, 0.10));
  // 1F1B: (pp - 1)(F + B) = 3 slots; DualPipe: 1 x (F + 2B - 3W) with W <= B/2, so less than half.
  CHECK(dual.pp_bubble_s > 0);
  CHECK(dual.pp_bubble_s < 0.5 * one.pp_bubble_s);
  // pp 2: (2/2 - 1) = 0 slots.
  ParallelConfig two = layout(Schedule::dualpipe, 2);
  two.dp = 16;
  CHECK(estimate_time(m, net, kTraining, two, OverlapOptions{}).pp_bubble_s == 0);
  // The mirrors' gradients are summed once per step: with the data-parallel reduce not overlapped
  // both show, and DualPipe's is the larger for its twice-as-many parameters.
  OverlapOptions none;
  none.grad_reduce = false;
  const TimeBreakdown one_exposed = estimate_time(m, net, kTraining, layout(Schedule::one_f_one_b), none);
  const TimeBreakdown dual_exposed = estimate_time(m, net, kTraining, layout(Schedule::dualpipe), none);
  CHECK(dual_exposed.dp_comm_s > 1.5 * one_exposed.dp_comm_s);
  // With the EP overlap in its forward-backward pairs, less EP communication shows.
  ParallelConfig overlapped = layout(Schedule::dualpipe);
  overlapped.overlap_ep_comm = true;
  CHECK(estimate_time(m, net, kTraining, overlapped, OverlapOptions{}).ep_comm_s < dual.ep_comm_s);
}

TEST_CASE("dualpipe: priced for comparison, refused in one line by the executor and every engine",
          "[dualpipe][engines]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ParallelConfig p = layout(Schedule::dualpipe);
  CHECK_THROWS_AS(pipeline_order(Schedule::dualpipe, 0, 4, 8, 1), InputError);
  const std::optional<std::string> refusal = executor_refusal(m, kTraining, p);
  REQUIRE(refusal);
  CHECK_THAT(*refusal, Contains("dualpipe"));
  const Network net(c, 64);
  const MemoryEstimate mem = estimate_memory(m, c, kTraining, p);
  const Plan plan = make_plan(m, c, kTraining, p, OverlapOptions{}, mem, estimate_time(m, net, kTraining, p, OverlapOptions{}));
  for (const std::string& name : engine_names()) {
    const planner::RuleReport report = planner::check_engine_rules(plan, *engine_from_string(name));
    REQUIRE_FALSE(report.ok());
    CHECK_THAT(report.failures.front(), Contains("dualpipe"));
  }
  // plan.json keeps the schedule and the mirrored stages.
  const Plan back = plan_from_json(to_json(plan), "plan.json");
  CHECK(back.parallel.schedule == Schedule::dualpipe);
  CHECK(back == plan);
}
