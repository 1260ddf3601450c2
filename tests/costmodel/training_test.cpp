#include <numeric>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/training.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::Contains;

namespace {
std::string error_of(const ModelSpec& m, const ClusterSpec& c, const TrainingSpec& t, const ParallelConfig& p,
                     int gpus) {
  try {
    validate(m, c, t, p, gpus);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("layers are split evenly, remainders to the middle stages", "[training]") {
  ParallelConfig p{.pp = 8};
  std::vector<int> layers = assign_layers(126, p);  // Llama-3.1-405B: 126 = 8*15 + 6
  CHECK(std::accumulate(layers.begin(), layers.end(), 0) == 126);
  CHECK(layers.front() == 15);
  CHECK(layers.back() == 15);
  CHECK(layers[1] == 16);
  CHECK(layers[6] == 16);
  CHECK(assign_layers(80, ParallelConfig{.pp = 4}) == std::vector<int>{20, 20, 20, 20});
}

TEST_CASE("micro-batches in flight follow the schedule", "[training]") {
  SECTION("1F1B: stage i holds min(pp - i, m)") {
    ParallelConfig p{.pp = 4, .schedule = Schedule::one_f_one_b};
    CHECK(microbatches_in_flight(p, 0, 16) == 4);
    CHECK(microbatches_in_flight(p, 3, 16) == 1);
    CHECK(microbatches_in_flight(p, 0, 2) == 2);
  }
  SECTION("GPipe: every stage holds all m") {
    ParallelConfig p{.pp = 4, .schedule = Schedule::gpipe};
    CHECK(microbatches_in_flight(p, 3, 16) == 16);
  }
  SECTION("interleaved: stage 0 holds p(1 + (p-1)/(p v)) stages' worth (Korthikanti Sec. 4.2.3)") {
    ParallelConfig p{.pp = 4, .vpp = 2, .schedule = Schedule::interleaved};
    // 2(p-1) + (v-1)p + 1 = 6 + 4 + 1 = 11 chunk-micro-batches of half a stage = 5.5
    CHECK(microbatches_in_flight(p, 0, 16) == 5.5);
    CHECK(microbatches_in_flight(p, 0, 16) == 4 * (1 + 3.0 / 8));
  }
  SECTION("without pipelining one micro-batch at a time") {
    CHECK(microbatches_in_flight(ParallelConfig{.pp = 1, .schedule = Schedule::gpipe}, 0, 64) == 1);
  }
}

TEST_CASE("impossible layouts are rejected with the valid choices", "[training]") {
  ModelSpec m = store().load_model("llama-3-70b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  ParallelConfig ok{.tp = 8, .pp = 4, .dp = 2};
  CHECK(error_of(m, c, t, ok, 64) == "(no error)");

  ParallelConfig tp3 = ok;
  tp3.tp = 3;
  tp3.dp = 1;
  CHECK_THAT(error_of(m, c, t, tp3, 12), Contains("valid tp: 1, 2, 4 or 8"));
  ParallelConfig wrong_dp = ok;
  wrong_dp.dp = 4;
  CHECK_THAT(error_of(m, c, t, wrong_dp, 64), Contains("= 128 but --gpus is 64; with these tp, pp and cp use --dp 2"));
  TrainingSpec odd_batch = t;
  odd_batch.global_batch = 513;
  CHECK_THAT(error_of(m, c, odd_batch, ok, 64), Contains("not divisible by micro-batch * dp"));
  ParallelConfig vpp = ok;
  vpp.vpp = 2;
  CHECK_THAT(error_of(m, c, t, vpp, 64), Contains("needs --schedule interleaved"));
  ParallelConfig vpp3 = ok;
  vpp3.vpp = 3;
  vpp3.schedule = Schedule::interleaved;
  CHECK_THAT(error_of(m, c, t, vpp3, 64), Contains("choose vpp among 1, 2, 4, 5, 10 or 20"));
  ParallelConfig ep = ok;
  ep.ep = 2;
  CHECK_THAT(error_of(m, c, t, ep, 64), Contains("needs a mixture-of-experts model"));
  ParallelConfig zero = ok;
  zero.zero_stage = 4;
  CHECK_THAT(error_of(m, c, t, zero, 64), Contains("choose 0, 1, 2 or 3"));
  ParallelConfig sp{.tp = 1, .pp = 4, .dp = 16, .sequence_parallel = true};
  CHECK_THAT(error_of(m, c, t, sp, 64), Contains("sequence parallel (--sp) needs tp >= 2"));
  ParallelConfig zero_tp = ok;
  zero_tp.tp = 0;
  CHECK_THAT(error_of(m, c, t, zero_tp, 64), Contains("--tp must be a positive integer, got 0"));
  TrainingSpec fp8 = t;
  fp8.precision = Precision::fp8;
  CHECK_THAT(error_of(m, store().load_cluster("dgx-a100-80g"), fp8, ok, 64), Contains("no fp8 peak"));
}

TEST_CASE("mixture-of-experts layouts check expert parallel against experts and tp*cp*dp", "[training]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig ep8{.tp = 2, .pp = 1, .dp = 8, .ep = 8}, ep3{.tp = 2, .pp = 1, .dp = 8, .ep = 3},
      ep4{.tp = 8, .pp = 1, .dp = 2, .ep = 4};
  CHECK_NOTHROW(validate(m, c, t, ep8, 16));
  CHECK_THAT(error_of(m, c, t, ep3, 16), Contains("valid ep: 1, 2, 4 or 8"));
  CHECK_THAT(error_of(m, c, t, ep4, 16), Contains("ep*etp = 4*8 must divide tp*cp*dp = 16"));
}

TEST_CASE("training and parallel specs round-trip through JSON", "[training]") {
  TrainingSpec t{.seq_len = 4096, .global_batch = 1024, .precision = Precision::fp8, .attention = Attention::standard,
                 .fp32_grads = true};
  CHECK(training_from_json(to_json(t), "plan.json", "/training") == t);
  ParallelConfig p{.tp = 4, .pp = 2, .dp = 8, .cp = 2, .ep = 1, .vpp = 2, .micro_batch = 2, .zero_stage = 1,
                   .sequence_parallel = true, .recompute = Recompute::selective, .schedule = Schedule::interleaved,
                   .layers_per_stage = {10, 14}};
  CHECK(parallel_from_json(to_json(p), "plan.json", "/parallel") == p);
  json extra = to_json(p);
  extra["pipeline"] = 2;
  CHECK_THROWS_WITH(parallel_from_json(extra, "plan.json", "/parallel"), Contains("unknown key \"pipeline\""));
}

TEST_CASE("the layout rules name the first one broken, in validate's order", "[training]") {
  ModelSpec m = store().load_model("llama-3-70b");  // 64 heads, 8 kv heads, 80 layers
  TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  ParallelConfig ok{.tp = 8, .pp = 4, .dp = 2};
  CHECK(check_layout(m, t, ok, 64) == LayoutRule::ok);
  CHECK(check_layout(m, t, ok, 0) == LayoutRule::gpus_positive);
  CHECK(check_layout(m, t, ok, 32) == LayoutRule::world_size);
  // tp 16 breaks the heads rule and (dp 1, global batch 511) the batch rule: heads come first.
  TrainingSpec odd = t;
  odd.global_batch = 511;
  ParallelConfig tp16{.tp = 16, .pp = 4, .dp = 1};
  CHECK(check_layout(m, odd, tp16, 64) == LayoutRule::tp_divides_heads);
  CHECK(check_layout(m, odd, ok, 64) == LayoutRule::batch_divisible);
  // The checks the search applies dimension by dimension.
  CHECK(check_tensor_parallel(m, 8) == LayoutRule::ok);
  CHECK(check_tensor_parallel(m, 16) == LayoutRule::tp_divides_heads);
  CHECK(check_pipeline_parallel(m, ParallelConfig{.pp = 81}) == LayoutRule::pp_within_layers);
  CHECK(check_pipeline_parallel(m, ParallelConfig{.pp = 2, .layers_per_stage = {40, 41}}) ==
        LayoutRule::split_adds_up);
  CHECK(check_context_parallel(t, 3) == LayoutRule::cp_divides_seq);
  CHECK(check_context_parallel(t, 4) == LayoutRule::ok);
  CHECK(check_batch(t, 3, 2) == LayoutRule::batch_divisible);
  ParallelConfig interleaved{.tp = 8, .pp = 4, .dp = 2, .vpp = 3, .schedule = Schedule::interleaved};
  CHECK(check_schedule(m, t, interleaved) == LayoutRule::vpp_divides_stage_layers);  // 20 layers a stage
  interleaved.vpp = 5;
  CHECK(check_schedule(m, t, interleaved) == LayoutRule::ok);
  CHECK(check_schedule(m, TrainingSpec{.seq_len = 8192, .global_batch = 6}, interleaved) ==
        LayoutRule::interleaved_needs_microbatches);
  CHECK(check_expert_parallel(m, ParallelConfig{.dp = 2, .ep = 2}) == LayoutRule::ep_needs_moe);
  CHECK(check_sharding(ParallelConfig{.zero_stage = 2, .distributed_optimizer = true}) ==
        LayoutRule::dist_opt_needs_zero_0_or_1);
  CHECK(check_sequence_parallel(ParallelConfig{.tp = 1, .sequence_parallel = true}) == LayoutRule::sp_needs_tp);
}
