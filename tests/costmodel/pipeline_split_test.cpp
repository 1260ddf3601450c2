// Pipelines as Megatron-LM builds them: the layer assignment per (stage, model chunk) with the
// first/last stage counts and the embedding and loss accounted as layers (assign_chunks), the rules
// and their messages, memory in flight per chunk, the plan file, the search's split, and the law
// that an uneven split never beats the balanced one it came from.
#include <numeric>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/pipeline.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/time.h"
#include "dplan/costmodel/time_phases.h"
#include "dplan/costmodel/training.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::Contains;

namespace {
std::string error_of(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p, int gpus) {
  try {
    validate(m, store().load_cluster("dgx-h100"), t, p, gpus);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

ParallelConfig llama405b_pp8_vpp8() {
  return ParallelConfig{.tp = 8, .pp = 8, .dp = 16, .vpp = 8, .schedule = Schedule::interleaved,
                        .account_for_embedding = true, .account_for_loss = true};
}
}  // namespace

TEST_CASE("126 layers on pp 8 x vpp 8 with embedding and loss accounted: 2 a chunk, 1 in the first and last",
          "[pipeline-split]") {
  const auto chunks = assign_chunks(126, llama405b_pp8_vpp8());
  REQUIRE(chunks.size() == 8);
  int next = 0;
  for (int j = 0; j < 8; ++j)  // through the model: virtual stage j of ranks 0..7, then j + 1
    for (int i = 0; i < 8; ++i) {
      INFO("stage " << i << " chunk " << j);
      const ModelChunk& c = chunks[i][j];
      const bool first = i == 0 && j == 0, last = i == 7 && j == 7;
      CHECK(c.num_layers == (first || last ? 1 : 2));
      CHECK(c.first_layer == next);
      CHECK(c.embedding == first);
      CHECK(c.loss == last);
      next += c.num_layers;
    }
  CHECK(next == 126);
  CHECK(assign_layers(126, llama405b_pp8_vpp8()) == std::vector<int>{15, 16, 16, 16, 16, 16, 16, 15});
  // Without the accounting 126 layers do not split over 8 x 8: the rule names the choices.
  ParallelConfig plain = llama405b_pp8_vpp8();
  plain.account_for_embedding = plain.account_for_loss = false;
  const ModelSpec m = store().load_model("llama-3.1-405b");
  const TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  CHECK(check_schedule(m, t, plain) == LayoutRule::vpp_divides_stage_layers);
  CHECK_THAT(error_of(m, t, plain, 1024), Contains("vpp 8 does not divide the 15 layers"));
  CHECK(error_of(m, t, llama405b_pp8_vpp8(), 1024) == "(no error)");
}

TEST_CASE("Megatron's first and last stage counts: the other stages share the rest evenly", "[pipeline-split]") {
  const ModelSpec m = store().load_model("llama-3-70b");  // 80 layers
  const TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  ParallelConfig p{.tp = 8, .pp = 4, .dp = 2, .first_stage_layers = 18, .last_stage_layers = 18};
  CHECK(assign_layers(80, p) == std::vector<int>{18, 22, 22, 18});
  CHECK(check_layout(m, t, p, 64) == LayoutRule::ok);
  p.last_stage_layers = 0;  // only the first given: the other three share 62 - not evenly
  CHECK(check_pipeline_parallel(m, p) == LayoutRule::split_adds_up);
  CHECK_THAT(error_of(m, t, p, 64), Contains("--first-stage-layers 18 leaves 62 of the 80 layers of"));
  p.first_stage_layers = 17;  // 63 = 3 x 21
  CHECK(assign_layers(80, p) == std::vector<int>{17, 21, 21, 21});
  // Interleaved: every stage's count divides by vpp, chunks equal within a stage.
  ParallelConfig v2{.tp = 8, .pp = 4, .dp = 2, .vpp = 2, .schedule = Schedule::interleaved,
                    .first_stage_layers = 18, .last_stage_layers = 18};
  const auto chunks = assign_chunks(80, v2);
  CHECK(chunks[0][0].num_layers == 9);
  CHECK(chunks[1][0].first_layer == 9);
  CHECK(chunks[0][1].first_layer == 9 + 11 + 11 + 9);
  v2.first_stage_layers = v2.last_stage_layers = 19;  // 42 = 2 x 21, but 19 and 21 are odd
  CHECK(check_schedule(m, t, v2) == LayoutRule::vpp_divides_stage_layers);
  // One way to split at a time (Megatron refuses first/last counts with the accounting flags).
  ParallelConfig both{.tp = 8, .pp = 4, .dp = 2, .first_stage_layers = 18, .account_for_loss = true};
  CHECK(check_pipeline_parallel(m, both) == LayoutRule::split_one_way);
  CHECK_THAT(error_of(m, t, both, 64), Contains("choose one way to split"));
  CHECK(check_pipeline_parallel(m, ParallelConfig{.first_stage_layers = 80}) == LayoutRule::first_last_need_pp);
}

TEST_CASE("the accounted embedding or loss takes a layer's place on its stage", "[pipeline-split]") {
  const ModelSpec m = store().load_model("llama-3-70b");  // 80 layers
  CHECK(assign_layers(80, ParallelConfig{.pp = 3, .account_for_loss = true}) == std::vector<int>{27, 27, 26});
  CHECK(assign_layers(80, ParallelConfig{.pp = 3, .account_for_embedding = true}) == std::vector<int>{26, 27, 27});
  CHECK(check_pipeline_parallel(m, ParallelConfig{.pp = 6, .account_for_loss = true}) == LayoutRule::split_adds_up);
  // pp may reach the layers plus what is accounted: one stage then holds only the embedding.
  ParallelConfig tiny{.pp = 3, .account_for_embedding = true};
  const auto chunks = assign_chunks(2, tiny);
  CHECK(chunks[0][0].num_layers == 0);
  CHECK(chunks[0][0].embedding);
  CHECK(assign_layers(2, tiny) == std::vector<int>{0, 1, 1});
}

TEST_CASE("activations in flight count the layers of the chunks the warm-up ran through", "[pipeline-split]") {
  const ParallelConfig p = llama405b_pp8_vpp8();
  const auto chunks = assign_chunks(126, p);
  // Stage 0 at its peak: 2 (pp - 1) + (v - 1) pp + 1 = 71 chunk-micro-batches (m = 64): a group of
  // 8 micro-batches through chunk 0 (1 layer, the embedding's slot), then through chunks 1..7 (2
  // layers each), then 7 of the next group through chunk 0: 15 x 1 + 56 x 2.
  CHECK(layer_microbatches_in_flight(p, chunks[0], 0, 64) == 15 * 1 + 56 * 2);
  // Equal chunks: the stage's layers times microbatches_in_flight.
  CHECK(layer_microbatches_in_flight(p, chunks[3], 3, 64) == 16 * microbatches_in_flight(p, 3, 64));
  // The estimate per stage: stage 0 holds 15 layers and the embedding, stage 1 16 layers.
  const ModelSpec m = store().load_model("llama-3.1-405b");
  const TrainingSpec t{.seq_len = 8192, .global_batch = 1024};
  const MemoryEstimate mem = estimate_memory(m, store().load_cluster("dgx-h100"), t, p);
  CHECK(mem.stages[0].num_layers == 15);
  CHECK(mem.stages[1].num_layers == 16);
  CHECK(mem.stages[7].num_layers == 15);
  // Stage 0 stores 127 layer-micro-batches where 15 layers in equal chunks would store
  // 15 x 71 / 8 = 133.1: the rest of its activations (embedding, working set) is below 6 of them.
  const double per_layer = stored_activation_bytes_per_layer(m, t, p);
  CHECK(mem.stages[0].activations_bytes >= per_layer * 127);
  CHECK(mem.stages[0].activations_bytes < per_layer * 133);
}

TEST_CASE("plan.json: an uneven split writes its chunks and flags and reads back", "[pipeline-split][formats]") {
  const ModelSpec m = store().load_model("llama-3.1-405b");
  const TrainingSpec t{.seq_len = 8192, .global_batch = 1024};
  const ParallelConfig p = llama405b_pp8_vpp8();
  CHECK(parallel_from_json(to_json(p), "plan.json", "/parallel") == p);
  const Plan plan = make_plan(m, store().load_cluster("dgx-h100"), t, p, {}, MemoryEstimate{}, TimeBreakdown{});
  CHECK(plan.stages[0].num_layers == 15);
  CHECK(plan.stages[0].chunks[0] == PlanChunk{0, 1});
  CHECK(plan.stages[0].chunks[1] == PlanChunk{15, 2});
  CHECK(plan.stages[7].chunks[7] == PlanChunk{125, 1});
  CHECK(plan_from_json(to_json(plan), "plan.json") == plan);
  // Even splits write no new keys (files written before read and write back unchanged).
  CHECK_FALSE(to_json(ParallelConfig{}).contains("account_for_loss"));
  json split = to_json(plan);
  split["parallel"]["account_for_embedding"] = false;  // 127 slots do not split over 8 x 8
  CHECK_THROWS_WITH(plan_from_json(split, "plan.json"), Contains("plan.json: /parallel: pp 8 does not divide"));
  json bad = to_json(p);
  bad["first_stage_layers"] = -1;
  CHECK_THROWS_WITH(parallel_from_json(bad, "plan.json", "/parallel"), Contains("/parallel/first_stage_layers"));
}

TEST_CASE("the search's split for a pp x vpp that does not divide the layers", "[pipeline-split]") {
  const ParallelConfig v8 = megatron_split(126, ParallelConfig{.pp = 8, .vpp = 8, .schedule = Schedule::interleaved})
                                .value_or(ParallelConfig{});
  CHECK(v8.account_for_embedding);
  CHECK(v8.account_for_loss);
  const ParallelConfig pp3 = megatron_split(80, ParallelConfig{.pp = 3}).value_or(ParallelConfig{});
  CHECK((pp3.account_for_loss && !pp3.account_for_embedding));
  // 80 on 6: neither 81 nor 82 divides; the four middles hold 14, first and last 12 each.
  const ParallelConfig pp6 = megatron_split(80, ParallelConfig{.pp = 6}).value_or(ParallelConfig{});
  CHECK(assign_layers(80, pp6) == std::vector<int>{12, 14, 14, 14, 14, 12});
  CHECK(megatron_split(80, ParallelConfig{.pp = 4}) == ParallelConfig{.pp = 4});  // divides: as it is
  CHECK_FALSE(megatron_split(81, ParallelConfig{.pp = 4, .vpp = 2, .schedule = Schedule::interleaved}));
}

TEST_CASE("law: moving work between chunks never shortens a pipeline played out on dedicated devices",
          "[pipeline-split][law]") {
  const auto dedicated = [](int) { return 1.0; };
  for (Schedule schedule : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved})
    for (int p : {2, 4, 8})
      for (int v : {1, 2, 4}) {
        if ((schedule == Schedule::interleaved) != (v > 1)) continue;
        for (int m : {p, 2 * p, 4 * p + 3}) {
          if (schedule == Schedule::interleaved && m % p) continue;
          std::vector<PipelineStage> even(p, PipelineStage{1.0 * v, 2.0 * v, std::vector<double>(v, 1.0),
                                                           std::vector<double>(v, 2.0)});
          const double balanced = play_pipeline(even, m, schedule, v, dedicated).makespan_s;
          // Move 1/2 chunk of work from one chunk to another, for several pairs.
          for (int from = 0; from < p * v; from += 3)
            for (int to = 0; to < p * v; to += 5) {
              if (from == to) continue;
              std::vector<PipelineStage> uneven = even;
              for (auto [chunk, sign] : {std::pair{from, -1}, {to, +1}}) {
                PipelineStage& s = uneven[chunk % p];
                s.chunk_forward_s[chunk / p] += sign * 0.5;
                s.chunk_backward_s[chunk / p] += sign * 1.0;
                s.forward_s += sign * 0.5;
                s.backward_s += sign * 1.0;
              }
              INFO("p " << p << " v " << v << " m " << m << " from " << from << " to " << to);
              CHECK(play_pipeline(uneven, m, schedule, v, dedicated).makespan_s >= balanced * (1 - 1e-12));
            }
        }
      }
}

TEST_CASE("law: an uneven split never beats the balanced one it came from", "[pipeline-split][law]") {
  // Balanced: pp x vpp divides the layers. Uneven: layers moved onto the stages that hold the
  // embedding and the loss (Megatron's first/last counts), or between middle stages (a listed
  // assignment). (Moving layers off the stage with the LM head can be faster: what the flags are for.)
  struct Case {
    const char* model;
    int gpus, tp, pp, vpp;
  };
  for (const Case& c : {Case{"gpt3-175b", 64, 8, 8, 1}, Case{"gpt3-175b", 64, 8, 4, 3},
                        Case{"llama-3-70b", 32, 8, 4, 1}, Case{"llama-3-70b", 32, 8, 4, 2},
                        Case{"llama-2-7b", 16, 2, 8, 1}, Case{"llama-2-7b", 16, 2, 4, 2}}) {
    const ModelSpec m = store().load_model(c.model);
    const ClusterSpec cluster = store().load_cluster("dgx-h100");
    const TrainingSpec t{.seq_len = 2048, .global_batch = 64};
    const Network net(cluster, c.gpus);
    ParallelConfig balanced{.tp = c.tp, .pp = c.pp, .dp = c.gpus / (c.tp * c.pp), .vpp = c.vpp,
                            .schedule = c.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b};
    REQUIRE(m.num_layers % (c.pp * c.vpp) == 0);
    validate(m, cluster, t, balanced, c.gpus);
    const double base = estimate_time(m, net, t, balanced).step_time_s;
    const int n = m.num_layers / c.pp, v = c.vpp;
    std::vector<ParallelConfig> uneven;
    for (int k = 1; k <= 2; ++k) {
      ParallelConfig first = balanced, last = balanced, both = balanced, listed = balanced;
      first.first_stage_layers = n + k * v * (c.pp - 1);  // the others give up k*v each
      last.last_stage_layers = n + k * v * (c.pp - 1);
      if (c.pp > 2 && (k * (c.pp - 2)) % 2 == 0) {  // the middles give up k*v each
        both.first_stage_layers = both.last_stage_layers = n + k * v * (c.pp - 2) / 2;
        uneven.push_back(both);
      }
      listed.layers_per_stage.assign(c.pp, n);
      listed.layers_per_stage[1] += k * v;
      listed.layers_per_stage[c.pp - 2] -= k * v;
      uneven.push_back(first);
      uneven.push_back(last);
      if (c.pp >= 4) uneven.push_back(listed);
    }
    for (const ParallelConfig& p : uneven) {
      INFO(c.model << " pp " << c.pp << " vpp " << c.vpp << ": " << to_json(p).dump());
      if (check_layout(m, t, p, c.gpus) != LayoutRule::ok) continue;
      CHECK(estimate_time(m, net, t, p).step_time_s >= base);
    }
  }
}

TEST_CASE("uneven chunks: the closed form's p - 1 slots of the longest chunk stay just above the play-out",
          "[pipeline-split]") {
  // Stages built from the assignment: 1 s forward and 2 s backward a layer, the embedding 0.05 s
  // forward and 0.1 s backward on chunk 0 of stage 0, the LM head 0.4 s and 0.8 s on the last chunk.
  struct Case {
    int layers;
    ParallelConfig p;
    int microbatches;
  };
  const Case cases[] = {
      {126, llama405b_pp8_vpp8(), 64},
      {126, ParallelConfig{.pp = 8, .account_for_embedding = true, .account_for_loss = true}, 64},
      {80, ParallelConfig{.pp = 4, .first_stage_layers = 18, .last_stage_layers = 18}, 32},
      {80, ParallelConfig{.pp = 4, .vpp = 2, .schedule = Schedule::interleaved, .first_stage_layers = 18,
                          .last_stage_layers = 18}, 32},
      {80, ParallelConfig{.pp = 4, .layers_per_stage = {20, 21, 19, 20}}, 128},
      {80, ParallelConfig{.pp = 6, .first_stage_layers = 12, .last_stage_layers = 12}, 24}};
  for (const Case& c : cases) {
    INFO(to_json(c.p).dump());
    std::vector<StageTime> st;
    std::vector<PipelineStage> played;
    for (const auto& stage : assign_chunks(c.layers, c.p)) {
      StageTime s;
      std::vector<double> played_forward_s, played_backward_s;
      for (const ModelChunk& chunk : stage) {
        const double f = chunk.num_layers + (chunk.embedding ? 0.05 : 0) + (chunk.loss ? 0.4 : 0);
        const double b = 2.0 * chunk.num_layers + (chunk.embedding ? 0.1 : 0) + (chunk.loss ? 0.8 : 0);
        s.forward_s += f, s.backward_s += b;
        s.chunks.push_back({.forward_s = f, .backward_s = b, .edge_s = f + b - 3.0 * chunk.num_layers,
                            .layers = chunk.num_layers});
        played_forward_s.push_back(f), played_backward_s.push_back(b);
      }
      st.push_back(s);
      played.push_back({s.forward_s, s.backward_s, played_forward_s, played_backward_s});
    }
    const std::optional<double> slot = uneven_chunk_slot_s(st);
    REQUIRE(slot);
    const double closed = c.microbatches * st[critical_stage(st)].total_s() + (c.p.pp - 1) * *slot;
    const double makespan =
        play_pipeline(played, c.microbatches, c.p.schedule, c.p.vpp, [](int) { return 1.0; }).makespan_s;
    CHECK(closed >= makespan * (1 - 1e-9));
    CHECK(closed <= makespan * 1.05);
  }
  // Equal layer counts: the closed form's own slot.
  std::vector<StageTime> even(4);
  for (StageTime& s : even) s.chunks = {ChunkTime{.layers = 5}, ChunkTime{.layers = 5}};
  CHECK_FALSE(uneven_chunk_slot_s(even));
}

// The search's shortcuts (docs/cost-model.md, "Search speed") give the values of what they stand
// for: the kept assignment is assign_chunks', and the one-walk count of layer-micro-batches in
// flight is each chunk's count weighted by its layers, over every split the search makes.
TEST_CASE("shared_chunks and layer_microbatches_in_flight equal what they shortcut", "[pipeline-split]") {
  std::vector<std::pair<int, ParallelConfig>> splits;
  for (int layers : {1, 2, 7, 32, 61, 80, 94, 126})
    for (int pp = 1; pp <= 16; ++pp)
      for (Schedule schedule : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::dualpipe})
        for (int vpp = 1; vpp <= (schedule == Schedule::interleaved ? 8 : 1); ++vpp) {
          if ((schedule == Schedule::interleaved && (vpp < 2 || pp < 2)) || (schedule == Schedule::dualpipe && pp % 2))
            continue;
          ParallelConfig p{.pp = pp, .vpp = vpp, .schedule = schedule};
          if (auto split = megatron_split(layers, p)) splits.push_back({layers, *split});
        }
  // Explicit splits too: a listed one and first/last counts.
  splits.push_back({80, ParallelConfig{.pp = 4, .layers_per_stage = {20, 21, 19, 20}}});
  splits.push_back({80, ParallelConfig{.pp = 4, .first_stage_layers = 18, .last_stage_layers = 18}});
  splits.push_back({80, ParallelConfig{.pp = 4, .layers_per_stage = {21, 20, 19, 20}}});
  REQUIRE(splits.size() > 4 * kSharedAssignments);
  // Twice through, so the kept ones are found again, and evicted, in a search's order and out of it.
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < splits.size(); ++i) {
      const auto& [layers, p] = splits[round == 0 ? i : splits.size() - 1 - i];
      INFO(layers << " layers, " << to_json(p).dump());
      const std::vector<std::vector<ModelChunk>> chunks = assign_chunks(layers, p);
      REQUIRE(*shared_chunks(layers, p) == chunks);
      REQUIRE(*shared_chunks(layers, p) == chunks);
      for (int stage = 0; stage < p.pp; ++stage)
        for (int m : {1, p.pp, 2 * p.pp + 1, 64, 256}) {
          if (p.schedule == Schedule::interleaved && m % p.pp) continue;
          double by_chunk = 0;
          for (size_t c = 0; c < chunks[stage].size(); ++c)
            by_chunk += chunks[stage][c].num_layers *
                        chunk_microbatches_in_flight(p, int(chunks[stage].size()), int(c), stage, m);
          CHECK(layer_microbatches_in_flight(p, chunks[stage], stage, m) == by_chunk);
        }
    }
}
