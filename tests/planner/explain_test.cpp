// Why MFU is low: the decomposition adds up, every suggestion's gain is its re-estimate, the
// suggestions a bubble-heavy or over-recomputed plan needs are made; and the headroom law (more
// headroom never picks a plan that needs more memory). Structure and laws only: the time model's
// numbers change under these tests.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/planner/explain.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/search.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using namespace dplan::planner;

namespace {

PlanCase make_case(const std::string& model, TrainingSpec t, ParallelConfig p, OverlapOptions o = {}) {
  PlanCase c;
  c.model = store().load_model(model);
  c.cluster = store().load_cluster("dgx-h100");
  c.training = t;
  c.parallel = p;
  c.overlap = o;
  return c;
}

// A mix of layouts: each loss of the contract is non-zero in at least one of them.
std::vector<PlanCase> sample_cases() {
  return {
      make_case("llama-3-8b", {.seq_len = 8192, .global_batch = 64}, {.dp = 8, .zero_stage = 1}),
      make_case("llama-3-70b", {.seq_len = 4096, .global_batch = 64},
                {.tp = 8, .pp = 4, .dp = 2, .vpp = 2, .micro_batch = 1, .sequence_parallel = true,
                 .recompute = Recompute::full, .schedule = Schedule::interleaved}),
      make_case("llama-3-70b", {.seq_len = 4096, .global_batch = 128}, {.tp = 4, .dp = 16, .zero_stage = 3},
                {.grad_reduce = false, .param_gather = false}),
      make_case("llama-3-8b", {.seq_len = 32768, .global_batch = 16},
                {.tp = 2, .dp = 2, .cp = 4, .distributed_optimizer = true, .recompute = Recompute::selective}),
      make_case("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64},
                {.tp = 2, .pp = 2, .dp = 4, .ep = 4, .zero_stage = 1, .offload_optimizer = true}),
  };
}

}  // namespace

TEST_CASE("the named losses and the ideal add up to the step time", "[explain][law]") {
  std::set<std::string> nonzero;
  for (const PlanCase& c : sample_cases()) {
    CAPTURE(c.model.name, estimate_flags(c));
    const Estimated e = estimate_case(c);
    const MfuBreakdown b = explain_time(e.time);
    CHECK(b.step_time_s == e.time.step_time_s);
    CHECK(b.ideal_s == Approx(e.time.mfu * e.time.step_time_s).epsilon(1e-12));
    CHECK(b.ideal_s > 0);
    CHECK(b.ideal_s + b.losses_s() == Approx(e.time.step_time_s).epsilon(1e-9));
    double shares = b.ideal_s / b.step_time_s;
    for (const Loss& l : b.losses) {
      shares += l.share;
      CHECK(l.share == Approx(l.seconds / b.step_time_s).epsilon(1e-12));
      if (l.seconds != 0) nonzero.insert(l.key);
      // Only GEMM efficiency (measured GEMM tables may beat the dense peak) can be negative.
      if (l.key != "gemm_efficiency") CHECK(l.seconds >= 0);
    }
    CHECK(shares == Approx(1.0).epsilon(1e-9));
    // The JSON holds the same facts.
    const json j = to_json(b);
    CHECK(j.at("losses").size() == b.losses.size());
    CHECK(j.at("mfu").get<double>() == b.mfu);
  }
  // The samples exercise the data-parallel, bubble, recompute, TP and optimizer losses (CP and EP
  // communication may hide entirely).
  for (const char* key : {"non_gemm", "recompute", "tp_comm", "pp_bubble", "optimizer", "dp_comm"}) {
    CAPTURE(key);
    CHECK(nonzero.count(key) == 1);
  }
}

TEST_CASE("every phase of the step lands in exactly one loss", "[explain][law]") {
  // Distinct powers of two: a phase dropped or counted twice changes the sum.
  TimeBreakdown t;
  t.forward_s = 1, t.backward_s = 2, t.recompute_s = 4, t.tp_comm_s = 8, t.cp_comm_s = 16, t.ep_comm_s = 32;
  t.pp_p2p_s = 64, t.pp_bubble_s = 128, t.dp_comm_s = 256, t.param_gather_s = 512, t.optimizer_s = 1024;
  t.offload_s = 2048, t.overhead_s = 4096, t.hidden_comm_s = 8192;  // hidden: not on the critical path
  double step = 0;
  for (const auto& [name, seconds] : t.phases()) step += seconds;
  t.step_time_s = step;
  t.gemm_s = 2.5;          // of forward + backward = 3
  t.comm_contention_s = 0.25;  // of the rest, 0.5
  t.mfu = 1.0 / step;      // ideal = 1 s
  const MfuBreakdown b = explain_time(t);
  CHECK(b.ideal_s == Approx(1.0));
  CHECK(b.ideal_s + b.losses_s() == Approx(step).epsilon(1e-12));
  std::map<std::string, double> by_key;
  for (const Loss& l : b.losses) by_key[l.key] = l.seconds;
  CHECK(by_key.at("gemm_efficiency") == Approx(1.5));
  CHECK(by_key.at("non_gemm") == Approx(0.25));
  CHECK(by_key.at("comm_contention") == Approx(0.25));
  CHECK(by_key.at("recompute") == 4);
  CHECK(by_key.at("dp_comm") == 256 + 512);
  CHECK(by_key.at("optimizer") == 1024 + 2048);
  CHECK(by_key.at("overhead") == 4096);
  CHECK(by_key.at("pp_bubble") == 128);
}

TEST_CASE("every suggestion's stated gain is the re-estimate of its changed plan, which fits", "[explain][law]") {
  for (const PlanCase& c : sample_cases()) {
    CAPTURE(c.model.name, estimate_flags(c));
    const Estimated base = estimate_case(c);
    const std::vector<Suggestion> suggestions = suggest_changes(c, base.time, 4);
    CHECK(std::count_if(suggestions.begin(), suggestions.end(), [](const Suggestion& s) { return s.same_math; }) <= 4);
    for (size_t i = 0; i < suggestions.size(); ++i) {
      const Suggestion& s = suggestions[i];
      CAPTURE(s.what, s.flags);
      CHECK_FALSE(s.flags.empty());
      CHECK(s.changed.headroom_fraction == c.headroom_fraction);
      const Estimated again = estimate_case(s.changed);
      CHECK(again.memory.fits);
      CHECK(again.memory.peak_bytes <= again.memory.usable_bytes());
      CHECK(s.step_time_s == again.time.step_time_s);
      CHECK(s.gain == Approx(again.time.tokens_per_s / base.time.tokens_per_s - 1).epsilon(1e-12));
      CHECK(s.gain > 0);
      // One change of each kind.
      for (size_t k = 0; k < i; ++k) CHECK(suggestions[k].kind != s.kind);
      // Ranked by gain among the like-for-like changes; a change of the training comes last.
      if (i > 0 && s.same_math) CHECK(suggestions[i - 1].gain >= s.gain);
      if (!s.same_math) CHECK(i + 1 == suggestions.size());
    }
  }
}

TEST_CASE("a plan with a big pipeline bubble is told to interleave or use more micro-batches", "[explain]") {
  // 70B on 64 GPUs as tp 8 x pp 8, micro-batch 2 of 32 sequences: 16 micro-batches for 8 stages.
  const PlanCase c = make_case("llama-3-70b", {.seq_len = 4096, .global_batch = 32},
                               {.tp = 8, .pp = 8, .dp = 1, .micro_batch = 2, .sequence_parallel = true});
  const Estimated base = estimate_case(c);
  REQUIRE(base.memory.fits);
  REQUIRE(base.time.bubble_fraction > 0.15);
  const std::vector<Suggestion> suggestions = suggest_changes(c, base.time);
  REQUIRE_FALSE(suggestions.empty());
  const bool pipeline_fix = std::any_of(suggestions.begin(), suggestions.end(), [&](const Suggestion& s) {
    return s.same_math && (s.changed.parallel.vpp != c.parallel.vpp ||
                           s.changed.parallel.micro_batch < c.parallel.micro_batch);
  });
  CHECK(pipeline_fix);
}

TEST_CASE("a plan with full recompute that fits without it is told to recompute less", "[explain]") {
  const PlanCase c = make_case("llama-3-8b", {.seq_len = 4096, .global_batch = 64},
                               {.tp = 2, .dp = 4, .distributed_optimizer = true, .sequence_parallel = true,
                                .recompute = Recompute::full});
  PlanCase none = c;
  none.parallel.recompute = Recompute::none;
  REQUIRE(estimate_case(none).memory.fits);
  const Estimated base = estimate_case(c);
  const std::vector<Suggestion> suggestions = suggest_changes(c, base.time);
  const auto less = std::find_if(suggestions.begin(), suggestions.end(), [](const Suggestion& s) {
    return s.what.rfind("less recompute", 0) == 0;
  });
  REQUIRE(less != suggestions.end());
  CHECK(less->changed.parallel.recompute != Recompute::full);
  CHECK(less->flags.find("--recompute") != std::string::npos);
}

TEST_CASE("an MoE plan whose all-to-all crosses nodes is told of the EP overlap and DeepEP, each with its flag",
          "[explain][moe]") {
  // Mixtral on 4 nodes, tp 4 (etp 4) x ep 8: the ep group spans the 4 nodes, 32 micro-batches.
  const PlanCase c = make_case("mixtral-8x7b", {.seq_len = 4096, .global_batch = 256},
                               {.tp = 4, .dp = 8, .ep = 8, .distributed_optimizer = true, .sequence_parallel = true});
  const Estimated base = estimate_case(c);
  REQUIRE(base.memory.fits);
  REQUIRE(base.time.ep_comm_s > 0.1 * base.time.step_time_s);
  const std::vector<Suggestion> suggestions = suggest_changes(c, base.time, 10);
  auto find = [&](const std::string& flag) {
    return std::find_if(suggestions.begin(), suggestions.end(),
                        [&](const Suggestion& s) { return s.flags.find(flag) != std::string::npos; });
  };
  const auto overlap = find("--overlap-ep-comm"), deepep = find("--moe-dispatcher deepep");
  REQUIRE(overlap != suggestions.end());
  REQUIRE(deepep != suggestions.end());
  CHECK(overlap->changed.parallel.overlap_ep_comm);
  CHECK(deepep->changed.parallel.moe_dispatcher == MoeDispatcher::deepep);
  CHECK(overlap->gain > 0);
  CHECK(deepep->gain > 0);
  // A plan that has them is not told again.
  PlanCase both = c;
  both.parallel.overlap_ep_comm = true;
  both.parallel.moe_dispatcher = MoeDispatcher::deepep;
  for (const Suggestion& s : suggest_changes(both, estimate_case(both).time, 10)) {
    CHECK(s.flags.find("--overlap-ep-comm") == std::string::npos);
    CHECK(s.flags.find("--moe-dispatcher") == std::string::npos);
  }
}

TEST_CASE("the estimate's fit verdict keeps the headroom free", "[explain][headroom]") {
  const PlanCase c = make_case("llama-3-8b", {.seq_len = 4096, .global_batch = 64},
                               {.tp = 2, .dp = 4, .distributed_optimizer = true, .sequence_parallel = true,
                                .recompute = Recompute::full});
  const MemoryEstimate raw = estimate_memory(c.model, c.cluster, c.training, c.parallel, 0.0);
  REQUIRE(raw.fits);
  const double used = raw.peak_bytes / raw.capacity_bytes;
  REQUIRE(used > 0.2);
  const MemoryEstimate loose = estimate_memory(c.model, c.cluster, c.training, c.parallel, 1 - used - 0.01);
  const MemoryEstimate tight = estimate_memory(c.model, c.cluster, c.training, c.parallel, 1 - used + 0.01);
  CHECK(loose.fits);
  CHECK_FALSE(tight.fits);
  const std::vector<std::string> reasons = memory_problems(tight);
  REQUIRE(reasons.size() == 1);
  CHECK_THAT(reasons[0], Catch::Matchers::Contains("headroom"));
  CHECK(tight.peak_bytes == raw.peak_bytes);  // headroom changes the verdict, never the estimate
  // The default is the one owned constant.
  CHECK(estimate_memory(c.model, c.cluster, c.training, c.parallel).headroom_fraction == kDefaultHeadroomFraction);
}

TEST_CASE("more headroom never picks a plan that needs more memory", "[explain][headroom][law]") {
  struct Case {
    const char* model;
    int gpus;
    TrainingSpec training;
  };
  const Case cases[] = {{"llama-3-8b", 8, {.seq_len = 8192, .global_batch = 64}},
                        {"llama-2-13b", 16, {.seq_len = 4096, .global_batch = 128}},
                        {"llama-3-70b", 64, {.seq_len = 4096, .global_batch = 128}}};
  const ClusterSpec cluster = store().load_cluster("dgx-h100");
  for (const Case& k : cases) {
    CAPTURE(k.model, k.gpus);
    const ModelSpec m = store().load_model(k.model);
    Network net(cluster, k.gpus);
    // A smaller space than the CLI's, to keep the test fast; the law holds on any space.
    SearchSpace space{.gpus = k.gpus, .max_cp = 1, .micro_batches = {1, 2}, .max_vpp = 2};
    const std::vector<ParallelConfig> layouts = enumerate_layouts(m, k.training, space);
    double previous_peak = 1e300;
    int picked = 0;
    for (double headroom : {0.0, 0.05, 0.10, 0.20, 0.35}) {
      CAPTURE(headroom);
      SearchResult r = search(layouts, dplan_cost_function(m, net, k.training, OverlapOptions{}, headroom), 3);
      if (r.ranked.empty()) break;  // nothing fits with this much free: more headroom fits nothing either
      ++picked;
      for (const Candidate& cand : r.ranked)
        CHECK(cand.evaluation.peak_bytes <= cluster.gpu.memory_capacity_bytes() * (1 - headroom));
      CHECK(r.ranked[0].evaluation.peak_bytes <= previous_peak);
      previous_peak = r.ranked[0].evaluation.peak_bytes;
    }
    CHECK(picked >= 2);
  }
}

TEST_CASE("the dplan estimate flags of a plan name its expert tensor parallel size and its pipeline split",
          "[explain]") {
  // Without them the command a suggestion prints would estimate another layout (etp = tp, an even split).
  ParallelConfig moe{.tp = 2, .pp = 2, .dp = 4, .ep = 8};
  moe.etp = 1;
  const std::string flags = estimate_flags(make_case("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, moe));
  CHECK_THAT(flags, Catch::Contains("--ep 8 --etp 1"));
  ParallelConfig split{.tp = 8, .pp = 8, .dp = 1};
  split.account_for_embedding = split.account_for_loss = true;
  const std::string split_flags =
      estimate_flags(make_case("llama-3.1-405b", {.seq_len = 4096, .global_batch = 64}, split));
  CHECK_THAT(split_flags, Catch::Contains("--account-for-embedding"));
  CHECK_THAT(split_flags, Catch::Contains("--account-for-loss"));
  split.account_for_embedding = split.account_for_loss = false;
  split.first_stage_layers = 14;
  split.last_stage_layers = 14;
  CHECK_THAT(estimate_flags(make_case("llama-3.1-405b", {.seq_len = 4096, .global_batch = 64}, split)),
             Catch::Contains("--first-stage-layers 14 --last-stage-layers 14"));
}
