// The search with a toy cost model whose answers can be read off, and laws with the real one.
#include <algorithm>
#include <bit>
#include <iterator>
#include <set>
#include <tuple>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/planner/engine_rules.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"
#include "dplan/planner/search.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using namespace dplan::planner;

TEST_CASE("the search ranks by step time, drops what does not fit and counts why", "[search]") {
  // Toy costs: time = 100/tp + 10*pp seconds; layouts with pp = 1 "do not fit".
  std::vector<ParallelConfig> layouts = {{.tp = 1, .pp = 1}, {.tp = 1, .pp = 2}, {.tp = 2, .pp = 2},
                                         {.tp = 4, .pp = 1}, {.tp = 4, .pp = 4}};
  CostFunction toy = [](const ParallelConfig& p) {
    Evaluation e;
    e.fits = p.pp > 1;
    e.reject_reason = "pp 1 is too big";
    e.step_time_s = 100.0 / p.tp + 10 * p.pp;  // (1,2): 120, (2,2): 70, (4,4): 65
    e.peak_bytes = 1000.0 / (p.tp * p.pp);     // (1,2): 500, (2,2): 250, (4,4): 62.5
    return e;
  };
  SearchResult r = search(layouts, toy, 2);
  CHECK(r.evaluated == 5);
  CHECK(r.feasible == 3);
  CHECK(r.rejected.at("pp 1 is too big") == 2);
  REQUIRE(r.ranked.size() == 2);
  CHECK(r.ranked[0].parallel.tp == 4);  // 65 s
  CHECK(r.ranked[1].parallel.tp == 2);  // 70 s
  // (4,4) is fastest and smallest: it alone is on the frontier.
  REQUIRE(r.pareto.size() == 1);
  CHECK(r.pareto[0].parallel.tp == 4);
}

TEST_CASE("the search keeps the near misses that beat its pick, fastest first, and the report names the closest",
          "[search][memory]") {
  // Toy costs as above; the rejected pp 1 layouts are near misses priced at 40 s (tp 4) and 90 s
  // (tp 1): only the first beats the 65 s pick.
  std::vector<ParallelConfig> layouts = {{.tp = 1, .pp = 1}, {.tp = 1, .pp = 2}, {.tp = 2, .pp = 2},
                                         {.tp = 4, .pp = 1}, {.tp = 4, .pp = 4}};
  CostFunction toy = [](const ParallelConfig& p) {
    Evaluation e;
    e.fits = p.pp > 1;
    e.step_time_s = p.pp > 1 ? 100.0 / p.tp + 10 * p.pp : (p.tp == 4 ? 40.0 : 90.0);
    if (!e.fits) e.reject_reason = "over", e.miss_bytes = 1, e.peak_bytes = 11, e.usable_bytes = 10, e.capacity_bytes = 12;
    return e;
  };
  const SearchResult r = search(layouts, toy, 3);
  REQUIRE(r.ranked[0].parallel.tp == 4);
  REQUIRE(r.near_misses.size() == 1);
  CHECK(r.near_misses[0].parallel.tp == 4);
  CHECK(r.near_misses[0].parallel.pp == 1);
  // dplan's own cost function prices a near miss (within kNearMissFraction of the usable bytes) and
  // says by how much and why it missed; the CLI prints it ("closest call") when it beats the pick.
  const ModelSpec m = store().load_model("llama-3-70b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const Network net(c, 16);
  const TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  const CostFunction cost = dplan_cost_function(m, net, t, OverlapOptions{}, 0.05);
  // Llama 3 70B on 16 H100: tp 4 pp 2 cp 2, vpp 2, optimizer offloaded, misses by about 2.5 GiB.
  ParallelConfig tight{.tp = 4, .pp = 2, .dp = 1, .cp = 2, .vpp = 2, .distributed_optimizer = true,
                       .sequence_parallel = true, .offload_optimizer = true, .schedule = Schedule::interleaved};
  Evaluation e = cost(tight);
  const MemoryEstimate mem = estimate_memory(m, c, t, tight, 0.05);
  REQUIRE_FALSE(e.fits);
  CHECK(e.miss_bytes == Approx(mem.peak_bytes - mem.usable_bytes()));
  CHECK(e.miss_bytes <= kNearMissFraction * mem.usable_bytes());
  CHECK(e.step_time_s > 0);
  CHECK(e.step_time_s == Approx(estimate_time(m, net, t, tight, mem, OverlapOptions{}).step_time_s));
  CHECK(std::string(e.largest_part) == largest_part(mem.stages[mem.worst_stage]).name);
  // A layout far beyond the HBM is not priced.
  const ParallelConfig huge{.tp = 1, .pp = 1, .dp = 16};
  e = cost(huge);
  REQUIRE_FALSE(e.fits);
  CHECK(e.miss_bytes > kNearMissFraction * e.usable_bytes);
  CHECK(e.step_time_s == 0);
}

TEST_CASE("exact ties go to the simpler layout", "[search]") {
  std::vector<ParallelConfig> layouts = {{.tp = 2, .pp = 2, .sequence_parallel = true}, {.tp = 1, .pp = 1},
                                         {.tp = 2, .pp = 1}};
  CostFunction flat = [](const ParallelConfig&) { return Evaluation{true, "", 1.0, 1.0}; };
  SearchResult r = search(layouts, flat, 3);
  CHECK(r.ranked[0].parallel.tp == 1);
  CHECK(r.ranked[1].parallel.tp == 2);
  CHECK(r.ranked[1].parallel.pp == 1);
  CHECK(layout_complexity(ParallelConfig{}) == 0);
}

TEST_CASE("a search priced for an engine keeps only the layouts that engine's rules accept", "[search][engine]") {
  // Llama 3 8B on 16 H100 at a batch the pipeline likes: Megatron's best layouts include tensor and
  // pipeline parallel, which Accelerate (no pipeline) and DeepSpeed refuse; the ranking each keeps
  // is the rest in the same order, every one passing its rules, and the count refused shows.
  const ModelSpec m = store().load_model("llama-3-8b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  Network net(c, 16);
  for (const Engine engine : {Engine::accelerate, Engine::deepspeed, Engine::megatron}) {
    TrainingSpec t{.seq_len = 8192, .global_batch = 64};
    t.engine = engine_mechanics(engine);
    const std::vector<ParallelConfig> layouts = enumerate_layouts(m, t, SearchSpace{.gpus = 16});
    SearchResult all = search(layouts, dplan_cost_function(m, net, t, OverlapOptions{}), static_cast<int>(layouts.size()));
    const std::vector<Candidate> before = all.ranked;
    const long feasible = all.feasible;
    keep_engine_runnable(all, m, c, t, OverlapOptions{}, engine, 5);
    CAPTURE(to_string(engine));
    REQUIRE(all.ranked.size() == 5);
    size_t from = 0;
    long refused = 0;
    for (const Candidate& k : all.ranked) {
      const Plan plan = make_plan(m, c, t, k.parallel, OverlapOptions{}, MemoryEstimate{}, TimeBreakdown{});
      CHECK(check_engine_rules(plan, engine).ok());
      // Kept in the search's order; whatever was skipped before it was refused by the rules.
      while (!(before[from].parallel == k.parallel)) {
        const Plan skipped = make_plan(m, c, t, before[from].parallel, OverlapOptions{}, MemoryEstimate{}, TimeBreakdown{});
        CHECK_FALSE(check_engine_rules(skipped, engine).ok());
        ++refused, ++from;
      }
      ++from;
    }
    const std::string key = std::string(to_string(engine)) + "'s rules refuse it";
    CHECK(all.feasible == feasible - refused);
    if (engine == Engine::accelerate) {
      CHECK(refused > 0);  // Megatron's fastest layouts use a pipeline
      for (const Candidate& k : all.ranked) CHECK(k.parallel.pp == 1);
    }
    CHECK((refused > 0 ? all.rejected.at(key) : 0) == refused);
  }
}

TEST_CASE("every enumerated layout is valid, and the chosen one is never slower than any evaluated", "[search][law]") {
  ModelSpec m = store().load_model("llama-3-8b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  Network net(c, 16);
  std::vector<ParallelConfig> layouts = enumerate_layouts(m, t, SearchSpace{.gpus = 16});
  REQUIRE(layouts.size() > 100);
  for (const auto& p : layouts) CHECK_NOTHROW(validate(m, c, t, p, 16));
  CostFunction cost = dplan_cost_function(m, net, t, OverlapOptions{});
  SearchResult r = search(layouts, cost, 5);
  REQUIRE_FALSE(r.ranked.empty());
  for (const auto& p : layouts) {
    Evaluation e = cost(p);
    if (e.fits) CHECK(r.ranked[0].evaluation.step_time_s <= e.step_time_s);
  }
  long rejected = 0;
  for (const auto& [why, n] : r.rejected) rejected += n;
  CHECK(rejected + r.feasible == r.evaluated);
  // The winner carries the cost model's whole answer, as the report prints it.
  const ParallelConfig& best = r.ranked[0].parallel;
  const MemoryEstimate mem = estimate_memory(m, c, t, best);
  CHECK(r.ranked[0].evaluation.memory.peak_bytes == mem.peak_bytes);
  CHECK(r.ranked[0].evaluation.memory.stages.size() == mem.stages.size());
  CHECK(r.ranked[0].evaluation.time.phases() == estimate_time(m, net, t, best, mem).phases());
  CHECK(r.ranked[0].evaluation.time.step_time_s == r.ranked[0].evaluation.step_time_s);
}

// The search's shortcuts (docs/cost-model.md, "Search speed") change no answer: the device priced
// once prices each layout as estimate_time prices it alone, and ranking every candidate (sorted
// where it lies) gives the order and the Pareto frontier of ranking a few (copied out).
TEST_CASE("the search's shortcuts change no answer", "[search][law]") {
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  // The device and the layer times made once price each layout (a dense model and a mixture of
  // experts, every recompute, sharding and offload choice) as estimate_time prices it alone.
  for (const char* name : {"llama-3-8b", "mixtral-8x7b"}) {
    ModelSpec m = store().load_model(name);
    Network net(c, 16);
    CostFunction cost = dplan_cost_function(m, net, t, OverlapOptions{});
    long timed = 0;
    for (const auto& p : enumerate_layouts(m, t, SearchSpace{.gpus = 16})) {
      const Evaluation e = cost(p);
      if (e.step_time_s == 0) continue;
      ++timed;
      const TimeBreakdown alone = estimate_time(m, net, t, p, estimate_memory(m, c, t, p));
      CHECK(e.time.phases() == alone.phases());
      CHECK(e.step_time_s == alone.step_time_s);
      CHECK(e.time.gemm_s == alone.gemm_s);
    }
    INFO(name);
    CHECK(timed > 100);
  }
  ModelSpec m = store().load_model("llama-3-8b");
  Network net(c, 16);
  std::vector<ParallelConfig> layouts = enumerate_layouts(m, t, SearchSpace{.gpus = 16});
  CostFunction cost = dplan_cost_function(m, net, t, OverlapOptions{});
  const SearchResult all = search(layouts, cost, static_cast<int>(layouts.size()));
  const SearchResult few = search(layouts, cost, 7);
  REQUIRE(static_cast<long>(all.ranked.size()) == all.feasible);
  REQUIRE(few.ranked.size() == 7);
  std::set<std::string> seen;
  for (size_t i = 0; i < all.ranked.size(); ++i) {
    CHECK(seen.insert(to_json(all.ranked[i].parallel).dump()).second);
    if (i == 0) continue;
    const Candidate &a = all.ranked[i - 1], &b = all.ranked[i];
    CHECK(a.evaluation.step_time_s <= b.evaluation.step_time_s);
    if (a.evaluation.step_time_s == b.evaluation.step_time_s) CHECK(a.complexity <= b.complexity);
  }
  for (size_t i = 0; i < few.ranked.size(); ++i) {
    CHECK(all.ranked[i].evaluation.step_time_s == few.ranked[i].evaluation.step_time_s);
    CHECK(all.ranked[i].complexity == few.ranked[i].complexity);
  }
  CHECK(all.ranked[0].parallel == few.ranked[0].parallel);
  CHECK(all.ranked[0].evaluation.memory.stages.size() == few.ranked[0].evaluation.memory.stages.size());
  REQUIRE(all.pareto.size() == few.pareto.size());
  for (size_t i = 0; i < all.pareto.size(); ++i) CHECK(all.pareto[i].parallel == few.pareto[i].parallel);
}

namespace {
// Every layout in a box around the search space, with megatron_split's split, kept when the layout rules (training.h) pass and
// the search's own choices allow it (sharding only over more than one data-parallel rank, offload
// only with sharding), in no particular order.
std::set<std::string> layouts_by_the_rules(const ModelSpec& m, const TrainingSpec& t, int n) {
  std::set<std::string> out;
  for (int tp = 1; tp <= n; ++tp)
    for (int cp : {1, 2, 4, 8, 16})
      for (int pp = 1; pp <= n; ++pp) {
        if (n % (tp * cp * pp)) continue;
        const int dp = n / (tp * cp * pp);
        for (int ep = 1; ep <= std::max(1, m.num_experts); ++ep)
         for (int etp : m.is_moe() ? std::vector<int>{tp, 1} : std::vector<int>{0})  // the search's etp choices
          for (int mbs : {1, 2, 4, 8})
            for (int vpp = 1; vpp <= 8; ++vpp)
              for (int zero = 0; zero <= 4; ++zero)
                for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                  for (bool sp : {false, true})
                    for (bool offload : {false, true}) {
                      ParallelConfig p{.tp = tp, .pp = pp, .dp = dp, .cp = cp, .ep = ep, .etp = etp, .vpp = vpp,
                                       .micro_batch = mbs, .zero_stage = zero == 4 ? 0 : zero,
                                       .distributed_optimizer = zero == 4, .sequence_parallel = sp,
                                       .offload_optimizer = offload, .recompute = rc,
                                       .schedule = vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b};
                      // With the split the search gives a pp x vpp that does not divide the layers.
                      const std::optional<ParallelConfig> split = megatron_split(m.num_layers, p);
                      if (!split) continue;
                      p = *split;
                      if (check_layout(m, t, p, n) != LayoutRule::ok) continue;
                      if ((dp * cp == 1 && zero > 0) || (offload && zero == 0)) continue;
                      out.insert(to_json(p).dump());
                    }
      }
  return out;
}
}  // namespace

TEST_CASE("the enumeration yields exactly the layouts the layout rules accept, each once", "[search][law]") {
  auto [model, gpus, seq] = GENERATE(std::make_tuple("llama-3-8b", 16, 8192), std::make_tuple("mixtral-8x7b", 16, 4096),
                                     std::make_tuple("gpt-small", 12, 256));
  ModelSpec m = store().load_model(model);
  TrainingSpec t{.seq_len = seq, .global_batch = 48};
  INFO(model << " on " << gpus);
  std::vector<ParallelConfig> layouts = enumerate_layouts(m, t, SearchSpace{.gpus = gpus});
  std::set<std::string> enumerated;
  for (const auto& p : layouts) enumerated.insert(to_json(p).dump());
  CHECK(enumerated.size() == layouts.size());
  const std::set<std::string> valid = layouts_by_the_rules(m, t, gpus);
  std::vector<std::string> missing, extra;
  std::set_difference(valid.begin(), valid.end(), enumerated.begin(), enumerated.end(), std::back_inserter(missing));
  std::set_difference(enumerated.begin(), enumerated.end(), valid.begin(), valid.end(), std::back_inserter(extra));
  CHECK(missing == std::vector<std::string>{});
  CHECK(extra == std::vector<std::string>{});
  CHECK(enumerated.size() > 50);
}

TEST_CASE("constraints keep exactly the layouts that take the fixed values, cp and micro-batches beyond the defaults "
          "included", "[search][law]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 48};
  const std::vector<ParallelConfig> all = enumerate_layouts(m, t, SearchSpace{.gpus = 16});
  auto constrained = [&](LayoutConstraints c) {
    SearchSpace s{.gpus = 16};
    s.constraints = std::move(c);
    return enumerate_layouts(m, t, s);
  };
  auto same = [](const std::vector<ParallelConfig>& a, const std::vector<ParallelConfig>& b) {
    std::set<std::string> x, y;
    for (const auto& p : a) x.insert(to_json(p).dump());
    for (const auto& p : b) y.insert(to_json(p).dump());
    return x == y && x.size() == a.size();
  };
  // Within the default space: the unconstrained layouts the constraints admit, no more, no less.
  for (const LayoutConstraints& c : {LayoutConstraints{.tp = {2, 4}}, LayoutConstraints{.pp = {2}, .vpp = {1}},
                                     LayoutConstraints{.dp = {8}, .ep = {8}}, LayoutConstraints{.zero = {1}},
                                     LayoutConstraints{.recompute = {Recompute::full}},
                                     LayoutConstraints{.tp = {2}, .cp = {2}, .vpp = {2}, .zero = {0, 3}, .mbs = {2}}}) {
    INFO(c.describe());
    std::vector<ParallelConfig> filtered;
    std::copy_if(all.begin(), all.end(), std::back_inserter(filtered), [&](const ParallelConfig& p) { return c.admits(p); });
    const std::vector<ParallelConfig> got = constrained(c);
    CHECK(!got.empty());
    CHECK(got.size() < all.size());
    CHECK(same(got, filtered));
  }
  // The distributed optimizer counts as ZeRO-1; vpp 1 is a schedule without model chunks.
  for (const ParallelConfig& p : constrained({.zero = {1}})) CHECK((p.zero_stage == 1 || p.distributed_optimizer));
  for (const ParallelConfig& p : constrained({.vpp = {1}})) CHECK(p.schedule != Schedule::interleaved);
  // Sizes the default space does not try: cp 3 (not a power of 2, 48 divides by 3 on 12 GPUs) and mbs 3.
  SearchSpace twelve{.gpus = 12};
  twelve.constraints = {.cp = {3}, .mbs = {3}};
  const ModelSpec llama = store().load_model("llama-3-8b");
  const std::vector<ParallelConfig> odd = enumerate_layouts(llama, {.seq_len = 8190, .global_batch = 48}, twelve);
  REQUIRE(!odd.empty());
  for (const ParallelConfig& p : odd) CHECK((p.cp == 3 && p.micro_batch == 3));
  // What it says: the values fixed, and the values a space takes of them.
  const LayoutConstraints c{.tp = {8, 4}, .zero = {1}, .recompute = {Recompute::selective, Recompute::none}};
  CHECK(c.describe() == "tp 4,8 · zero 1 · recompute none,selective");
  CHECK(LayoutConstraints{}.empty());
  CHECK(LayoutConstraints{.tp = {3}}.values_taken(all) == "tp takes 1, 2, 4, 8");  // 8 kv heads
}

TEST_CASE("an empty search space is an input error", "[search]") {
  CHECK_THROWS_AS(search({}, [](const ParallelConfig&) { return Evaluation{}; }, 3), InputError);
}

TEST_CASE("the executor's search space holds only layouts dplan run executes, and all of those", "[search]") {
  // The one definition is costmodel::executor_refusal; the space is derived from it. For a dense
  // model, one with dropout (context parallel's ring has dropout too) and one the executor does not
  // run at all (DeepSeek's latent attention), the runnable space is exactly the full space filtered
  // by the rule, and a model the rule refuses outright is refused with the rule's reason, the reason
  // the plan reader gives (executor/src/plan_file.cpp). For the dense models and a Mixtral-style
  // one it is the whole space: every layout the search may pick, dplan run executes.
  ModelSpec dense = store().load_model("llama-3-8b");
  ModelSpec dropout = dense;
  dropout.hidden_dropout = 0.1;
  dropout.attention_dropout = 0.1;
  TrainingSpec t;
  t.seq_len = 4096;
  t.global_batch = 64;
  TrainingSpec standard = t;
  standard.attention = Attention::standard;
  for (auto [m, training] : {std::pair{dense, t}, std::pair{dropout, standard}}) {
    INFO(m.name << " dropout " << m.hidden_dropout);
    std::vector<ParallelConfig> all = enumerate_layouts(m, training, SearchSpace{.gpus = 16});
    std::vector<ParallelConfig> runnable =
        enumerate_layouts(m, training, SearchSpace::runnable_by_executor(16, m, training));
    REQUIRE(!runnable.empty());
    for (const auto& p : runnable) {
      INFO(to_json(p).dump());
      CHECK_FALSE(executor_refusal(m, training, p));
    }
    // The bindings by init-capture: clang before 16 cannot capture a structured binding.
    long expected = std::count_if(all.begin(), all.end(), [&m = m, &training = training](const ParallelConfig& p) {
      return !executor_refusal(m, training, p);
    });
    CHECK(long(runnable.size()) == expected);
    CHECK(expected == long(all.size()));
  }
  // Without a model: a dense one without dropout, the same space as the dense model's.
  CHECK(enumerate_layouts(dense, t, SearchSpace::runnable_by_executor(16)).size() ==
        enumerate_layouts(dense, t, SearchSpace::runnable_by_executor(16, dense, t)).size());
  // Attention dropout runs in the blockwise kernel and in context parallel's ring.
  CHECK_FALSE(executor_refusal(dropout, t, ParallelConfig{}));
  CHECK_FALSE(executor_refusal(dropout, t, ParallelConfig{.dp = 8, .cp = 2}));
  // DeepSeek-V3 runs, its multi-token prediction module, latent attention and routing included;
  // MTP modules beside learned positions are refused. A Mixtral-style mixture of experts runs,
  // expert parallel included, and so do gpt-oss and Nemotron.
  ModelSpec moe = store().load_model("deepseek-v3");
  REQUIRE(moe.mtp_layers > 0);
  CHECK_FALSE(executor_refusal(moe, t, ParallelConfig{.dp = 8, .ep = 8}));
  ModelSpec learned = store().load_model("gpt-tiny");
  learned.mtp_layers = 1;
  REQUIRE(executor_refusal(learned, t, ParallelConfig{}));
  CHECK_THROWS_WITH(SearchSpace::runnable_by_executor(16, learned, t), *executor_refusal(learned, t, ParallelConfig{}));
  CHECK_THAT(*executor_refusal(learned, t, ParallelConfig{}), Catch::Contains("multi-token prediction with learned positions"));
  CHECK_FALSE(executor_refusal(store().load_model("gpt-oss-120b"), t, ParallelConfig{.dp = 8, .ep = 8}));
  CHECK_FALSE(executor_refusal(store().load_model("nemotron-4-340b"), t, ParallelConfig{}));
  ModelSpec mixtral = store().load_model("mixtral-8x7b");
  CHECK_FALSE(executor_refusal(mixtral, t, ParallelConfig{.dp = 2, .ep = 2}));
  CHECK(enumerate_layouts(mixtral, t, SearchSpace::runnable_by_executor(16, mixtral, t)).size() ==
        enumerate_layouts(mixtral, t, SearchSpace{.gpus = 16}).size());
}

namespace {
// The predicted step of `batch` sequences on `layout` (the quantity default_global_batch bounds).
double step_s(const ModelSpec& model, const ClusterSpec& cluster, TrainingSpec t, const ParallelConfig& layout, int batch) {
  t.global_batch = batch;
  validate(model, cluster, t, layout, layout.world_size());
  const Network net(cluster, layout.world_size());
  return estimate_time(model, net, t, layout, estimate_memory(model, cluster, t, layout)).step_time_s;
}
}  // namespace

TEST_CASE("the default global batch: about 4M tokens on GPU clusters, a step of about a second on local-cpu",
          "[search][defaults]") {
  const ModelSpec tiny = store().load_model("gpt-tiny");
  TrainingSpec t{.seq_len = 128};
  // GPU clusters keep the 4M-token default, whatever the model or the layout it is sized on.
  for (const char* name : {"dgx-h100", "dgx-a100-80g", "mi300x-8"}) {
    INFO(name);
    const ClusterSpec gpu = store().load_cluster(name);
    CHECK(default_global_batch(tiny, gpu, t, data_parallel_layout(8)) == 32768);
    CHECK(default_global_batch(store().load_model("llama-3-70b"), gpu, TrainingSpec{.seq_len = 8192},
                               data_parallel_layout(64)) == 512);
  }
  // local-cpu: the largest micro_batch * dp * 2^k within kCpuStepTarget_s.
  const ClusterSpec cpu = store().load_cluster("local-cpu");
  for (int gpus : {1, 2, 4, 8}) {
    INFO(gpus << " ranks");
    const ParallelConfig layout = data_parallel_layout(gpus);
    const int batch = default_global_batch(tiny, cpu, t, layout);
    CHECK(batch % gpus == 0);
    CHECK(std::has_single_bit(static_cast<unsigned>(batch / gpus)));
    CHECK(batch <= 1024);  // not 32768 sequences of 128 tokens (a 2-minute predicted step)
    CHECK(step_s(tiny, cpu, t, layout, batch) <= kCpuStepTarget_s);
    CHECK(step_s(tiny, cpu, t, layout, 2 * batch) > kCpuStepTarget_s);
  }
  // Sized on the layout it is given: micro-batch 2 and dp 2 (pp 2) take multiples of 4.
  ParallelConfig pp2 = data_parallel_layout(2);
  pp2.pp = 2;
  pp2.micro_batch = 2;
  const int pp_batch = default_global_batch(tiny, cpu, t, pp2);
  CHECK(pp_batch % 4 == 0);
  CHECK(step_s(tiny, cpu, t, pp2, pp_batch) <= kCpuStepTarget_s);
  // A model whose smallest batch already takes longer gets that smallest batch, one sequence per rank.
  const ModelSpec big = store().load_model("gpt-1.7b");
  const TrainingSpec long_seq{.seq_len = 1024};
  REQUIRE(step_s(big, cpu, long_seq, data_parallel_layout(2), 2) > kCpuStepTarget_s);
  CHECK(default_global_batch(big, cpu, long_seq, data_parallel_layout(2)) == 2);
}
