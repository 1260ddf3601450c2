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

TEST_CASE("every layout rule is reported by its own condition with its own message", "[training]") {
  // One layout per rule, each breaking that rule and none checked before it (llama-3-70b: 64 heads,
  // 8 kv heads, FFN 28672, 80 layers; gpt3-175b: 2048 learned positions; mixtral-8x7b: 8 experts).
  struct Case {
    LayoutRule rule;
    const char* model;
    void (*change)(ModelSpec&, TrainingSpec&, ParallelConfig&, int& gpus);
    const char* message;
  };
  using M = ModelSpec;
  using T = TrainingSpec;
  using P = ParallelConfig;
  const Case cases[] = {
      {LayoutRule::gpus_positive, "llama-3-70b", [](M&, T&, P&, int& g) { g = 0; },
       "--gpus must be a positive integer, got 0"},
      {LayoutRule::tp_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.tp = 0; }, "--tp must be a positive integer"},
      {LayoutRule::pp_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.pp = -1; },
       "--pp must be a positive integer, got -1"},
      {LayoutRule::dp_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.dp = 0; }, "--dp must be"},
      {LayoutRule::cp_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.cp = 0; }, "--cp must be"},
      {LayoutRule::ep_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.ep = 0; }, "--ep must be"},
      {LayoutRule::vpp_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.vpp = 0; }, "--vpp must be"},
      {LayoutRule::micro_batch_positive, "llama-3-70b", [](M&, T&, P& p, int&) { p.micro_batch = 0; },
       "--mbs (micro-batch size) must be"},
      {LayoutRule::global_batch_positive, "llama-3-70b", [](M&, T& t, P&, int&) { t.global_batch = 0; },
       "--global-batch must be"},
      {LayoutRule::seq_positive, "llama-3-70b", [](M&, T& t, P&, int&) { t.seq_len = 0; }, "--seq must be"},
      {LayoutRule::size_limit, "llama-3-70b", [](M&, T&, P& p, int&) { p.vpp = kMaxVirtualStages + 1; },
       "sizes must be at most"},
      {LayoutRule::world_size, "llama-3-70b", [](M&, T&, P&, int& g) { g = 48; },
       "= 64 but --gpus is 48; tp*pp*cp = 32 must divide"},
      {LayoutRule::tp_divides_heads, "llama-3-70b", [](M&, T&, P& p, int&) { p.tp = 16, p.dp = 1; },
       "valid tp: 1, 2, 4 or 8"},
      {LayoutRule::tp_divides_ffn, "llama-3-70b", [](M& m, T&, P&, int&) { m.ffn_hidden_size = 28676; },
       "tp 8 does not divide the FFN size 28676"},
      {LayoutRule::pp_within_layers, "llama-3-70b", [](M&, T&, P& p, int& g) { p.tp = 1, p.pp = 81, p.dp = 1, g = 81; },
       "pp 81 exceeds the 80 layers"},
      {LayoutRule::split_one_way, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.first_stage_layers = 20, p.account_for_loss = true; }, "choose one way to split"},
      {LayoutRule::first_last_need_pp, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.pp = 1, p.dp = 8, p.last_stage_layers = 2; }, "need pp >= 2, got pp 1"},
      {LayoutRule::stages_listed, "llama-3-70b",
       [](M&, T&, P& p, int&) {
         p.layers_per_stage = {40, 40};
       },
       "lists 2 stages but pp is 4"},
      {LayoutRule::split_adds_up, "llama-3-70b", [](M&, T&, P& p, int&) { p.first_stage_layers = 21; },
       "leaves 59 of the 80 layers"},
      {LayoutRule::batch_divisible, "llama-3-70b", [](M&, T& t, P&, int&) { t.global_batch = 511; }, "a multiple of 2"},
      {LayoutRule::interleaved_needs_pp, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.pp = 1, p.dp = 8, p.schedule = Schedule::interleaved; }, "needs pp >= 2"},
      {LayoutRule::interleaved_needs_vpp, "llama-3-70b", [](M&, T&, P& p, int&) { p.schedule = Schedule::interleaved; },
       "needs --vpp >= 2"},
      {LayoutRule::vpp_divides_stage_layers, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.vpp = 3, p.schedule = Schedule::interleaved; },
       "vpp 3 does not divide the 20 layers"},
      {LayoutRule::chunks_hold_a_layer, "llama-3-70b",
       [](M&, T&, P& p, int&) {
         p.layers_per_stage = {0, 26, 26, 28};
       },
       "pp 4 x vpp 1 leaves one empty"},
      {LayoutRule::interleaved_needs_microbatches, "llama-3-70b",
       [](M&, T& t, P& p, int&) { t.global_batch = 12, p.vpp = 2, p.schedule = Schedule::interleaved; }, "got 6"},
      {LayoutRule::vpp_needs_interleaved, "llama-3-70b", [](M&, T&, P& p, int&) { p.vpp = 2; },
       "--vpp 2 needs --schedule interleaved"},
      {LayoutRule::dualpipe_needs_even_pp, "llama-3-70b",
       [](M&, T&, P& p, int& g) { p.pp = 5, g = 80, p.schedule = Schedule::dualpipe; }, "even pp >= 2"},
      {LayoutRule::dualpipe_needs_microbatches, "llama-3-70b",
       [](M&, T& t, P& p, int&) { t.global_batch = 12, p.schedule = Schedule::dualpipe; }, "at least 2 x pp = 8"},
      {LayoutRule::cp_divides_seq, "llama-3-70b", [](M&, T& t, P& p, int&) { t.seq_len = 8190, p.cp = 2, p.dp = 1; },
       "not divisible by 2*cp = 4"},
      {LayoutRule::seq_within_positions, "gpt3-175b", [](M&, T&, P& p, int& g) { p.pp = 8, g = 128; },
       "exceeds the 2048 learned positions"},
      {LayoutRule::etp_positive, "mixtral-8x7b", [](M&, T&, P& p, int&) { p.etp = -1; },
       "--etp must be a positive integer (or 0"},
      {LayoutRule::ep_needs_moe, "llama-3-70b", [](M&, T&, P& p, int&) { p.etp = 2; },
       "--etp 2 needs a mixture-of-experts model"},
      {LayoutRule::ep_divides_experts, "mixtral-8x7b", [](M&, T&, P& p, int&) { p.ep = 3; }, "valid ep: 1, 2, 4 or 8"},
      {LayoutRule::etp_divides_expert_ffn, "mixtral-8x7b", [](M&, T&, P& p, int&) { p.etp = 3; },
       "etp 3 does not divide the expert FFN size 14336"},
      {LayoutRule::ep_etp_divides_tp_cp_dp, "mixtral-8x7b", [](M&, T&, P& p, int&) { p.ep = 4; },
       "ep*etp = 4*8 must divide tp*cp*dp = 16"},
      {LayoutRule::zero_stage_exists, "llama-3-70b", [](M&, T&, P& p, int&) { p.zero_stage = 4; },
       "ZeRO stage 4 does not exist"},
      {LayoutRule::dist_opt_needs_zero_0_or_1, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.zero_stage = 3, p.distributed_optimizer = true; }, "not 3"},
      {LayoutRule::sp_needs_tp, "llama-3-70b",
       [](M&, T&, P& p, int&) { p.tp = 1, p.dp = 16, p.sequence_parallel = true; }, "needs tp >= 2"},
      {LayoutRule::vocab_pad_positive, "llama-3-70b", [](M&, T& t, P&, int&) { t.vocab_pad_multiple = 0; },
       "vocab padding multiple must be positive"},
  };
  // Every rule but ok, once: a rule added to the enum needs a case here.
  CHECK(std::size(cases) == std::size_t(LayoutRule::vocab_pad_positive));
  const ClusterSpec c = store().load_cluster("dgx-h100");
  for (const Case& k : cases) {
    ModelSpec m = store().load_model(k.model);
    TrainingSpec t{.seq_len = 8192, .global_batch = 512};
    ParallelConfig p{.tp = 8, .pp = 4, .dp = 2};
    int gpus = 64;
    k.change(m, t, p, gpus);
    INFO("case " << int(k.rule) << ": " << k.message);
    CHECK(check_layout(m, t, p, gpus) == k.rule);
    const std::string message = error_of(m, c, t, p, gpus);
    CHECK(message != "(no error)");
    CHECK_THAT(message, Contains(k.message));
  }
}
