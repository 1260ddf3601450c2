// Checkpoint sizes and times (costmodel/checkpoint_cost.h) worked out by hand for a few layouts of
// gpt-tiny, the laws every layout keeps (the total is P (w + m + 8) whatever the layout, the ranks'
// shards add up to it), and the laws of the checkpoint interval (Young 1974, Daly 2006).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::WithinRel;

namespace {

std::vector<double> rank_bytes(const CheckpointCost& c) {
  std::vector<double> out;
  for (const RankCheckpoint& r : c.ranks) out.push_back(r.total_bytes());
  return out;
}

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// gpt-tiny (gpt2, tied embeddings): h = 64, L = 2, 4 heads, f = 256, V = 256, 128 positions.
//   embedding V h = 16,384; positions 128 h = 8,192; final LayerNorm 2h = 128;
//   per layer: LayerNorms 2 x 2h = 256, qkv 3h^2 + 3h = 12,480, out proj h^2 + h = 4,160,
//   fc1 h f + f = 16,640, fc2 f h + h = 16,448: 49,984; two layers 99,968.
//   P = 16,384 + 8,192 + 99,968 + 128 = 124,672.
constexpr double kTinyParams = 124672;
// Split over tp = 2, one GPU holds: embedding 8,192 (vocabulary-parallel), positions 8,192
// (replicated), per layer 25,184 (qkv 6,144 + 96, out 2,048 + its bias 64 replicated, fc1 8,192 +
// 128, fc2 8,192 + its bias 64 replicated, LayerNorms 256 replicated), final LayerNorm 128
// (replicated): 66,880, of which 8,192 + 2 x 384 + 128 = 9,088 every tp rank holds whole. Written
// once: tp rank 0 writes its 66,880, tp rank 1 the 57,792 it alone holds; 66,880 + 57,792 = P.
constexpr double kTinyTp0 = 66880, kTinyTp1 = 57792;

TrainingSpec tiny_training(Precision precision) {
  return TrainingSpec{.seq_len = 128, .global_batch = 8, .precision = precision};
}

CheckpointCost tiny(ParallelConfig p, Precision precision = Precision::fp32) {
  const ModelSpec m = store().load_model("gpt-tiny");
  const ClusterSpec c = store().load_cluster("local-cpu");
  const TrainingSpec t = tiny_training(precision);
  validate(m, c, t, p, p.world_size());
  return checkpoint_cost(m, c, t, p);
}

}  // namespace

TEST_CASE("the checkpoint's bytes per parameter follow the training precision", "[checkpoint]") {
  const CheckpointBytesPerParam fp32 = checkpoint_bytes_per_param(tiny_training(Precision::fp32));
  const CheckpointBytesPerParam bf16 = checkpoint_bytes_per_param(tiny_training(Precision::bf16));
  const CheckpointBytesPerParam fp8 = checkpoint_bytes_per_param(tiny_training(Precision::fp8));
  CHECK(std::make_tuple(fp32.weights, fp32.master, fp32.moments) == std::make_tuple(4.0, 0.0, 8.0));
  CHECK(std::make_tuple(bf16.weights, bf16.master, bf16.moments) == std::make_tuple(2.0, 4.0, 8.0));
  CHECK(std::make_tuple(fp8.weights, fp8.master, fp8.moments) == std::make_tuple(2.0, 4.0, 8.0));
}

TEST_CASE("gpt-tiny fp32 on 4 ranks: shard sizes worked out by hand", "[checkpoint]") {
  const double per_param = 12;  // fp32 weights 4 + AdamW moments 8, no master
  SECTION("data parallel ZeRO-0: rank 0 writes everything") {
    const CheckpointCost c = tiny(ParallelConfig{.dp = 4});
    CHECK(rank_bytes(c) == std::vector<double>{kTinyParams * per_param, 0, 0, 0});
  }
  SECTION("ZeRO-3: every rank writes a quarter of everything") {
    const CheckpointCost c = tiny(ParallelConfig{.dp = 4, .zero_stage = 3});
    const double quarter = kTinyParams * per_param / 4;
    CHECK(rank_bytes(c) == std::vector<double>{quarter, quarter, quarter, quarter});
  }
  SECTION("tp 2 x dp 2 ZeRO-1: each optimizer shard's owner writes its weights and moments, tp-replicated by tp 0") {
    // Ranks in Megatron's order, tp fastest: (tp 0, dp 0), (tp 1, dp 0), (tp 0, dp 1), (tp 1, dp 1).
    // The executor writes a sharded optimizer's weights with its shard (GradSync::state_pieces).
    const CheckpointCost c = tiny(ParallelConfig{.tp = 2, .dp = 2, .zero_stage = 1});
    const std::vector<double> expected = {kTinyTp0 * 12 / 2, kTinyTp1 * 12 / 2, kTinyTp0 * 12 / 2,
                                          kTinyTp1 * 12 / 2};  // 401,280, 346,752, 401,280, 346,752
    CHECK(rank_bytes(c) == expected);
  }
  SECTION("pp 2 x dp 2: the tied head on the last stage is written by the first stage only") {
    // Stage 0: embedding, positions and layer 0 = 16,384 + 8,192 + 49,984 = 74,560; stage 1:
    // layer 1 and the final LayerNorm = 50,112 (its copy of the embedding not written).
    const CheckpointCost c = tiny(ParallelConfig{.pp = 2, .dp = 2});
    CHECK(rank_bytes(c) == std::vector<double>{74560 * per_param, 0, 50112 * per_param, 0});
    // The memory model holds the copy on the last stage: 16,384 more there.
    const ModelSpec m = store().load_model("gpt-tiny");
    const std::vector<StageParams> held = stage_params(m, ParallelConfig{.pp = 2, .dp = 2}, m.vocab_size);
    CHECK(held[1].dense == 50112 + 16384);
    CHECK(held[1].embedding_copy == 16384);
  }
}

TEST_CASE("16-bit training writes 16-bit weights and the fp32 master with the moments, by shard", "[checkpoint]") {
  // bf16, dp 2, ZeRO-1: each rank writes its half of the weights, master and moments (14P / 2);
  // ZeRO-0: rank 0 writes all of it.
  const CheckpointCost c = tiny(ParallelConfig{.dp = 2, .zero_stage = 1}, Precision::bf16);
  CHECK(rank_bytes(c) == std::vector<double>{kTinyParams * 7, kTinyParams * 7});
  CHECK(rank_bytes(tiny(ParallelConfig{.dp = 2}, Precision::bf16)) == std::vector<double>{kTinyParams * 14, 0});
  CHECK(c.weights_bytes == 2 * kTinyParams);
  CHECK(c.master_bytes == 4 * kTinyParams);
  CHECK(c.moments_bytes == 8 * kTinyParams);
}

TEST_CASE("ZeRO-3 spreads the shards: the largest is a dp-th of ZeRO-0's", "[checkpoint]") {
  const CheckpointCost zero0 = tiny(ParallelConfig{.dp = 4});
  const CheckpointCost zero3 = tiny(ParallelConfig{.dp = 4, .zero_stage = 3});
  CHECK(zero3.total_bytes() == zero0.total_bytes());
  CHECK_THAT(zero3.max_rank_bytes, WithinRel(zero0.max_rank_bytes / 4, 1e-12));
}

TEST_CASE("experts are written once by the ranks of expert data parallel coordinate 0", "[checkpoint]") {
  // Mixtral 8x7B on 4 GPUs as dp 4, ep 2, etp 1: the experts fold over the four ranks as
  // (ep 0, edp 0), (ep 1, edp 0), (ep 0, edp 1), (ep 1, edp 1). ZeRO-0: rank 0 writes the dense
  // parameters and its four experts, rank 1 the other four, ranks 2 and 3 nothing.
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const ClusterSpec cluster = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 8, .precision = Precision::bf16};
  const ParallelConfig p{.dp = 4, .ep = 2, .etp = 1};
  validate(m, cluster, t, p, 4);
  const CheckpointCost c = checkpoint_cost(m, cluster, t, p);
  const LayerParams moe = layer_params(m, LayerKind::moe);
  const double experts = m.num_layers * moe.experts, dense = num_params(m) - experts;
  const std::vector<double> bytes = rank_bytes(c);
  REQUIRE(bytes.size() == 4);
  CHECK_THAT(bytes[0], WithinRel((dense + experts / 2) * 14, 1e-12));
  CHECK_THAT(bytes[1], WithinRel(experts / 2 * 14, 1e-12));
  CHECK(bytes[2] == 0);
  CHECK(bytes[3] == 0);
}

TEST_CASE("a checkpoint holds P x (w + m + 8) bytes whatever the layout and its shards add up to it", "[checkpoint]") {
  struct Case {
    const char* model;
    ParallelConfig parallel;
  };
  const Case c = GENERATE(values<Case>({
      {"gpt-tiny", {.tp = 4, .dp = 2, .zero_stage = 2}},
      {"gpt-tiny", {.pp = 2, .dp = 2, .cp = 2, .distributed_optimizer = true}},
      {"llama-3-8b", {.tp = 2, .pp = 4, .dp = 2, .zero_stage = 1}},
      {"llama-3-8b", {.tp = 8, .pp = 2, .dp = 4, .cp = 2, .zero_stage = 3}},
      {"llama-3-8b", {.tp = 4, .dp = 4, .zero_stage = 1, .offload_optimizer = true}},
      {"llama-3-70b", {.tp = 8, .pp = 8, .dp = 16, .distributed_optimizer = true}},
      {"mixtral-8x7b", {.tp = 2, .pp = 4, .dp = 4, .ep = 8, .etp = 1, .distributed_optimizer = true}},
      {"mixtral-8x7b", {.tp = 4, .pp = 2, .dp = 2, .ep = 2, .zero_stage = 3}},
      {"deepseek-v3", {.tp = 8, .dp = 8, .ep = 64, .etp = 1, .distributed_optimizer = true}},
  }));
  const Precision precision = GENERATE(Precision::fp32, Precision::bf16);
  const ModelSpec m = store().load_model(c.model);
  const ClusterSpec cluster = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = std::min(1024, m.max_seq_len), .global_batch = 256, .precision = precision};
  validate(m, cluster, t, c.parallel, c.parallel.world_size());
  const CheckpointCost cost = checkpoint_cost(m, cluster, t, c.parallel);
  const double per_param = checkpoint_bytes_per_param(t).total();
  INFO(c.model << " tp " << c.parallel.tp << " pp " << c.parallel.pp << " dp " << c.parallel.dp << " "
               << to_string(precision));
  CHECK_THAT(cost.total_bytes(), WithinRel((num_params(m) + mtp_params(m)) * per_param, 1e-9));
  CHECK_THAT(sum(rank_bytes(cost)), WithinRel(cost.total_bytes(), 1e-12));
  CHECK(cost.ranks.size() == size_t(c.parallel.world_size()));
}

TEST_CASE("save and load times worked out by hand", "[checkpoint]") {
  // gpt-tiny fp32, ZeRO-3 over dp 4, two ranks per node: each rank writes and holds a quarter of
  // 1,496,064 bytes (374,016), each node 748,032. Storage: per node 1 GB/s write, 2 GB/s read;
  // aggregate 1.5 GB/s write, 3 GB/s read. GPUs copy to host at kHostLinkBytesPerS.
  ClusterSpec cluster = store().load_cluster("dgx-h100");
  cluster.gpus_per_node = 2;
  cluster.storage = StorageSpec{.node_read_bytes_per_s = 2e9,
                                .node_write_bytes_per_s = 1e9,
                                .aggregate_read_bytes_per_s = 3e9,
                                .aggregate_write_bytes_per_s = 1.5e9};
  const ModelSpec m = store().load_model("gpt-tiny");
  const TrainingSpec t = tiny_training(Precision::fp32);
  const ParallelConfig p{.dp = 4, .zero_stage = 3};
  validate(m, cluster, t, p, 4);
  const CheckpointCost c = checkpoint_cost(m, cluster, t, p);
  REQUIRE(c.times);
  const double shard = kTinyParams * 12 / 4, node = 2 * shard, total = 4 * shard;
  CHECK(c.max_node_bytes == node);
  // The stall: one shard over the host link.
  CHECK_THAT(c.times->async_blocking_s, WithinRel(shard / kHostLinkBytesPerS, 1e-12));
  // The write: max(node 748,032 / 1e9 = 0.75 ms, aggregate 1,496,064 / 1.5e9 = 1.0 ms): the aggregate.
  CHECK_THAT(c.times->write_s, WithinRel(total / 1.5e9, 1e-12));
  CHECK_THAT(c.times->sync_blocking_s, WithinRel(shard / kHostLinkBytesPerS + total / 1.5e9, 1e-12));
  // The load: max(node 748,032 / 2e9, aggregate 1,496,064 / 3e9) = the aggregate, then to the device.
  CHECK_THAT(c.times->load_s, WithinRel(total / 3e9 + shard / kHostLinkBytesPerS, 1e-12));

  SECTION("a slow node path makes the node the bound") {
    cluster.storage.node_write_bytes_per_s = 0.25e9;  // 748,032 / 0.25e9 = 3.0 ms > 1.0 ms
    const CheckpointCost slow = checkpoint_cost(m, cluster, t, p);
    CHECK_THAT(slow.times->write_s, WithinRel(node / 0.25e9, 1e-12));
  }
  SECTION("without a storage block there are sizes but no times") {
    cluster.storage = StorageSpec{};
    const CheckpointCost none = checkpoint_cost(m, cluster, t, p);
    CHECK(!none.times);
    CHECK(none.total_bytes() == total);
    CHECK_THROWS_AS(goodput(none, FailureModel{}, 4, 1.0, 1e9, 1e6), InputError);
  }
}

TEST_CASE("the default failure rate is the Llama 3 paper's", "[checkpoint]") {
  // 419 unexpected interruptions in 54 days on 16,384 GPUs.
  CHECK_THAT(kLlama3FailuresPerGpuHour, WithinRel(1.9733e-5, 1e-4));
  // One job interruption every 3.09 hours at that size.
  CHECK_THAT(1 / (kLlama3FailuresPerGpuHour * 16384), WithinRel(54.0 * 24 / 419, 1e-12));
}

TEST_CASE("Daly's interval minimises the expected time lost over a grid of intervals", "[checkpoint]") {
  const double checkpoint_s = GENERATE(0.1, 1.0, 10.0, 60.0, 600.0);
  const double mtbf_s = GENERATE(3600.0, 11130.0, 360000.0);
  const double restart_s = 300;
  const double daly = daly_interval_s(checkpoint_s, mtbf_s);
  const double at_daly = lost_fraction(daly, checkpoint_s, mtbf_s, restart_s);
  double best = 1, best_interval = 0;
  for (int k = -400; k <= 400; ++k) {  // 0.135x to 7.4x Daly's interval
    const double interval = daly * std::exp(k / 200.0);
    const double lost = lost_fraction(interval, checkpoint_s, mtbf_s, restart_s);
    if (lost < best) best = lost, best_interval = interval;
  }
  INFO("checkpoint " << checkpoint_s << " s, MTBF " << mtbf_s << " s: Daly " << daly << " s, grid best "
                     << best_interval << " s");
  CHECK(at_daly <= best * (1 + 1e-6));
  CHECK_THAT(best_interval, WithinRel(daly, 0.01));
  // Young's first-order interval is as good where checkpoints are cheap against failures.
  if (checkpoint_s / mtbf_s < 1e-3)
    CHECK(lost_fraction(young_interval_s(checkpoint_s, mtbf_s), checkpoint_s, mtbf_s, restart_s) <= best * 1.01);
}

TEST_CASE("more failures never lengthen the interval and a bigger checkpoint never shortens it", "[checkpoint]") {
  for (double mtbf_s : {600.0, 3600.0, 36000.0, 360000.0}) {
    double previous = 0;
    for (double checkpoint_s = 0.01; checkpoint_s < 3 * mtbf_s; checkpoint_s *= 1.1) {
      const double interval = daly_interval_s(checkpoint_s, mtbf_s);
      CHECK(interval >= previous);
      previous = interval;
    }
  }
  // Daly's estimate is piecewise: M where δ >= 2M, and at δ = 2M its series gives 0.89 M, a step
  // down as M grows past δ / 2 (a checkpoint costing twice the time between failures: no training
  // happens there). The law holds on either side of that point.
  for (double checkpoint_s : {0.1, 1.0, 60.0, 600.0}) {
    double previous = 0;
    for (double mtbf_s = checkpoint_s / 2 * 1.001; mtbf_s < 1e7; mtbf_s *= 1.1) {  // fewer failures as it grows
      const double interval = daly_interval_s(checkpoint_s, mtbf_s);
      CHECK(interval >= previous);
      previous = interval;
    }
  }
}

TEST_CASE("goodput of a plan: interval in steps and fractions that add up and time with failures", "[checkpoint]") {
  ClusterSpec cluster = store().load_cluster("dgx-h100");
  const ModelSpec m = store().load_model("llama-3-70b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 1024, .precision = Precision::bf16};
  const ParallelConfig p{.tp = 8, .pp = 8, .dp = 16, .distributed_optimizer = true};
  validate(m, cluster, t, p, 1024);
  const CheckpointCost c = checkpoint_cost(m, cluster, t, p);
  const double step_s = 5, tokens_per_s = 1024.0 * 4096 / step_s, tokens = 1e12;
  const Goodput g = goodput(c, FailureModel{}, 1024, step_s, tokens, tokens_per_s);
  CHECK_THAT(g.mtbf_s, WithinRel(3600 / (kLlama3FailuresPerGpuHour * 1024), 1e-12));
  CHECK(g.checkpoint_s == c.times->async_blocking_s);
  CHECK_THAT(g.restart_s, WithinRel(kDefaultRestartOverheadS + c.times->load_s + c.times->write_s, 1e-12));
  CHECK(g.interval_steps == std::max(1L, std::lround(g.daly_interval_s / step_s)));
  CHECK(g.interval_s == g.interval_steps * step_s);
  CHECK_THAT(g.checkpoint_fraction + g.rework_fraction + g.restart_fraction, WithinRel(g.lost_fraction, 1e-9));
  CHECK_THAT(g.time_to_train_with_failures_s, WithinRel(tokens / tokens_per_s / (1 - g.lost_fraction), 1e-12));
  CHECK(g.time_to_train_with_failures_s > g.time_to_train_s);

  SECTION("more failures never lengthen the interval nor shorten the time to train") {
    Goodput previous = g;
    for (double rate : {3e-5, 1e-4, 1e-3}) {
      const Goodput more = goodput(c, FailureModel{.failures_per_gpu_hour = rate}, 1024, step_s, tokens, tokens_per_s);
      CHECK(more.interval_steps <= previous.interval_steps);
      CHECK(more.time_to_train_with_failures_s >= previous.time_to_train_with_failures_s);
      previous = more;
    }
  }
  SECTION("a save never starts while the previous one is writing") {
    cluster.storage.aggregate_write_bytes_per_s = cluster.storage.node_write_bytes_per_s = 1e8;  // ~1000 s writes
    const CheckpointCost slow = checkpoint_cost(m, cluster, t, p);
    const Goodput s = goodput(slow, FailureModel{}, 1024, step_s, tokens, tokens_per_s);
    CHECK(s.daly_interval_s + s.checkpoint_s < slow.times->write_s);  // Daly's alone would overlap them
    CHECK(s.interval_s + s.checkpoint_s >= slow.times->write_s);
  }
  SECTION("bad failure models are refused") {
    CHECK_THROWS_AS(goodput(c, FailureModel{.failures_per_gpu_hour = 0}, 1024, step_s, tokens, tokens_per_s), InputError);
    CHECK_THROWS_AS(goodput(c, FailureModel{.restart_overhead_s = -1}, 1024, step_s, tokens, tokens_per_s), InputError);
  }
}
