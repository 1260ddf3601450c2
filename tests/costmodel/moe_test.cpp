// MoE as Megatron-Core runs it: expert parallel folded over tp*cp*dp with expert tensor parallel
// (Liu et al. 2025, arXiv 2504.14960), the token all-to-all on the links the ep group spans, the
// expert weights sharded by ep, etp and expert dp, and the plan files carrying etp.
#include <catch2/catch.hpp>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/time_phases.h"
#include "dplan/planner/search.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::many_experts;
using dplan::testing::store;
using dplan::testing::validate_error;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

TEST_CASE("MoE folding: ep may exceed dp*cp when ep*etp divides tp*cp*dp", "[moe][training]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  // tp 4 x dp 2 = 8 ranks per stage: ep 8 with etp 1 folds over all of them, ep > dp.
  CHECK(validate_error(m, c, t, ParallelConfig{.tp = 4, .pp = 2, .dp = 2, .ep = 8, .etp = 1}) == "");
  CHECK(validate_error(m, c, t, ParallelConfig{.tp = 4, .pp = 2, .dp = 2, .ep = 2}) == "");  // etp as tp: 2*4 = 8
  const std::string line = validate_error(m, c, t, ParallelConfig{.tp = 4, .pp = 2, .dp = 2, .ep = 4, .etp = 4});
  CHECK_THAT(line, Contains("ep*etp = 4*4 must divide tp*cp*dp = 8"));
  CHECK_THAT(line, Contains("valid ep*etp: 1, 2, 4 or 8"));
  CHECK(line.find('\n') == std::string::npos);
  CHECK_THAT(validate_error(m, c, t, ParallelConfig{.tp = 1, .dp = 8, .ep = 1, .etp = 3}),
             Contains("etp 3 does not divide the expert FFN size 14336"));
  CHECK(check_expert_parallel(m, ParallelConfig{.dp = 8, .etp = -1}) == LayoutRule::etp_positive);
  // A dense model has no expert groups: etp other than tp is refused, etp = tp (the default) is not.
  ModelSpec dense = store().load_model("llama-2-7b");
  CHECK_THAT(validate_error(dense, c, t, ParallelConfig{.tp = 1, .dp = 8, .etp = 2}),
             Contains("--etp 2 needs a mixture-of-experts model"));
  CHECK(validate_error(dense, c, t, ParallelConfig{.tp = 2, .dp = 4, .etp = 2}) == "");
}

TEST_CASE("MoE folding: the expert groups tile each stage's tp*cp*dp ranks, etp fastest", "[moe][network]") {
  ParallelConfig p{.tp = 2, .pp = 2, .dp = 4, .cp = 1, .ep = 4, .etp = 1};
  CHECK(Mesh(p).shape(Dim::etp) == GroupShape{1, 1});
  CHECK(Mesh(p).shape(Dim::ep) == GroupShape{4, 1});
  CHECK(Mesh(p).shape(Dim::edp) == GroupShape{2, 4});
  CHECK(p.expert_dp() == 2);
  p.etp = 0;  // as tp: 2 x 4 ranks, one expert-dp rank
  CHECK(Mesh(p).shape(Dim::etp) == GroupShape{2, 1});
  CHECK(Mesh(p).shape(Dim::ep) == GroupShape{4, 2});
  CHECK(Mesh(p).shape(Dim::edp) == GroupShape{1, 8});
  // Rank 13 = stage 1, local rank 5: etp 1 (5 % 2), ep 2 (5 / 2), edp 0.
  RankCoordinates r = Mesh(p, 8).coordinates(13);
  CHECK(r.etp == 1);
  CHECK(r.ep == 2);
  CHECK(r.edp == 0);
  CHECK(r.pp == 1);
}

TEST_CASE("the token all-to-all costs more when the ep group leaves the node", "[moe][time]") {
  ModelSpec m = many_experts();
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  Network net(c, 64);
  ParallelConfig ep8{.tp = 1, .dp = 64, .ep = 8}, ep16{.tp = 1, .dp = 64, .ep = 16};
  CHECK_FALSE(net.crosses_nodes(Mesh(ep8).shape(Dim::ep)));
  CHECK(net.crosses_nodes(Mesh(ep16).shape(Dim::ep)));
  const double within = expert_parallel_comm_s(m, net, t, ep8), across = expert_parallel_comm_s(m, net, t, ep16);
  CHECK(within > 0);
  CHECK(across > 1.5 * within);
  // Per rank (T/tp)*k*h elements each way, four all-to-alls (dispatch and combine, forward and
  // backward); with tp 2 a rank brings half the tokens.
  const double bytes = 4096.0 * 2 * 4096 * 2;
  CHECK_THAT(within, WithinRel(4 * net.cost(Collective::all_to_all, bytes, {8, 1}).time_s, 1e-12));
  ParallelConfig tp2{.tp = 2, .dp = 32, .ep = 8, .etp = 1};
  CHECK_THAT(expert_parallel_comm_s(m, net, t, tp2),
             WithinRel(4 * net.cost(Collective::all_to_all, bytes / 2, {8, 1}).time_s, 1e-12));
  // etp 2 adds an all-gather and a reduce-scatter of the received tokens over the etp pair.
  tp2.etp = 2;
  const double etp_s = net.cost(Collective::all_gather, bytes, {2, 1}).time_s +
                       net.cost(Collective::reduce_scatter, bytes, {2, 1}).time_s;
  CHECK_THAT(expert_parallel_comm_s(m, net, t, tp2),
             WithinRel(2 * (2 * net.cost(Collective::all_to_all, bytes / 2, {8, 2}).time_s + etp_s), 1e-12));
}

TEST_CASE("a layout with ep > dp*cp estimates, with its all-to-all in the step", "[moe][time]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  ParallelConfig p{.tp = 8, .pp = 1, .dp = 1, .ep = 8, .etp = 1, .sequence_parallel = true,
                   .recompute = Recompute::full};
  validate(m, c, t, p, 8);
  Network net(c, 8);
  MemoryEstimate mem = estimate_memory(m, c, t, p);
  TimeBreakdown time = estimate_time(m, net, t, p, mem);
  CHECK(time.ep_comm_s > 0);
  CHECK(std::isfinite(time.step_time_s));
  CHECK(time.step_time_s > 0);
  // The experts' gradients reduce over expert dp (1 rank here), so nothing is reduced for them,
  // while attention's dp*cp = 1 needs nothing either.
  CHECK(time.dp_comm_s == 0);
}

TEST_CASE("expert weights shard by ep and etp, their optimizer states by expert dp", "[moe][memory]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  auto stage0 = [&](ParallelConfig p) { return estimate_memory(m, c, t, p).stages[0]; };
  const double all_experts = m.num_layers * layer_params(m).experts;
  // 16 ranks of tp 2 x dp 8: ep 8 x etp 1 and ep 4 x etp 2 both hold 1/8 of the experts.
  StageMemory a = stage0({.tp = 2, .dp = 8, .ep = 8, .etp = 1, .distributed_optimizer = true});
  StageMemory b = stage0({.tp = 2, .dp = 8, .ep = 4, .etp = 2, .distributed_optimizer = true});
  StageMemory d = stage0({.tp = 2, .dp = 8, .ep = 2, .etp = 1, .distributed_optimizer = true});
  CHECK_THAT(a.expert_params, WithinRel(all_experts / 8, 1e-12));
  CHECK_THAT(b.expert_params, WithinRel(all_experts / 8, 1e-12));
  CHECK_THAT(d.expert_params, WithinRel(all_experts / 2, 1e-12));
  // Distributed optimizer: dense states over dp*cp = 8, expert states over expert dp = 16/(etp*ep).
  const double dense = a.num_params - a.expert_params;
  CHECK_THAT(a.optimizer_bytes, WithinRel(12 * (dense / 8 + a.expert_params / 2), 1e-12));
  CHECK_THAT(d.optimizer_bytes, WithinRel(12 * (dense / 8 + d.expert_params / 8), 1e-12));
  // Without sharding every rank keeps its experts' whole states.
  StageMemory plain = stage0({.tp = 2, .dp = 8, .ep = 8, .etp = 1});
  CHECK_THAT(plain.optimizer_bytes, WithinRel(12 * plain.num_params, 1e-12));
}

TEST_CASE("etp round-trips through the parallel config and the plan file", "[moe][json]") {
  for (int etp : {0, 1, 2}) {
    ParallelConfig p{.tp = 2, .pp = 1, .dp = 4, .ep = 4, .etp = etp};
    INFO("etp " << etp);
    CHECK(parallel_from_json(to_json(p), "plan.json", "/parallel") == p);
    CHECK(to_json(p).contains("etp") == (etp > 0));
  }
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  ParallelConfig p{.tp = 2, .pp = 1, .dp = 4, .ep = 8, .etp = 1, .sequence_parallel = true};
  Network net(c, 8);
  MemoryEstimate mem = estimate_memory(m, c, t, p);
  Plan plan = make_plan(m, c, t, p, OverlapOptions{}, mem, estimate_time(m, net, t, p, mem));
  CHECK(plan.ranks[5].ep == 5);
  CHECK(plan_from_json(to_json(plan), "plan.json") == plan);
  json bad = to_json(plan);
  bad["parallel"]["etp"] = 0;
  CHECK_THROWS_AS(plan_from_json(bad, "plan.json"), InputError);
}

TEST_CASE("the search plans Mixtral 8x7B on 8 and 64 GPUs with folded expert layouts", "[moe][search]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 1024};
  for (int gpus : {8, 64}) {
    INFO(gpus << " GPUs");
    std::vector<ParallelConfig> layouts = planner::enumerate_layouts(m, t, planner::SearchSpace{.gpus = gpus});
    bool ep_beyond_dp = false;
    for (const ParallelConfig& p : layouts) {
      REQUIRE(check_layout(m, t, p, gpus) == LayoutRule::ok);
      ep_beyond_dp |= p.ep > p.dp * p.cp;
    }
    CHECK(ep_beyond_dp);
    Network net(c, gpus);
    planner::SearchResult r = planner::search(layouts, planner::dplan_cost_function(m, net, t, OverlapOptions{}), 3);
    REQUIRE_FALSE(r.ranked.empty());
    CHECK(r.ranked[0].evaluation.fits);
    CHECK(r.ranked[0].parallel.ep > 1);
  }
}

TEST_CASE("the experts run as one grouped GEMM beside the router GEMM", "[moe][compute]") {
  // Mixtral's MoE layer against the same layer with one dense MLP of the expert's size: the GEMM
  // time differs only in the MLP. tp 2, etp 1, ep 4: a rank brings 4096/2 tokens, its 2 local
  // experts see 2048*2*1*4/8 = 2048 tokens each at the full expert FFN width.
  ModelSpec moe = store().load_model("mixtral-8x7b");
  ModelSpec dense = moe;
  dense.num_experts = 0;
  dense.experts_per_token = 0;
  const GpuSpec gpu = store().load_cluster("dgx-h100").gpu;
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  ParallelConfig p{.tp = 2, .pp = 1, .dp = 4, .ep = 4, .etp = 1, .sequence_parallel = true};
  const double h = moe.hidden_size, f = moe.ffn_hidden_size, T = 4096;
  const Precision bf16 = Precision::bf16;
  const double experts = 2, tokens = 2048;
  const double grouped = gemm_time_s(gpu, bf16, tokens, 2 * f, h, experts, GemmOp::forward) +
                         gemm_time_s(gpu, bf16, tokens, h, f, experts, GemmOp::forward);
  const double router = gemm_time_s(gpu, bf16, T / 2, moe.num_experts, h, 1, GemmOp::forward);
  const double dense_mlp = linear_times(gpu, bf16, T, 2 * f / 2, h).forward_s + linear_times(gpu, bf16, T, h, f / 2).forward_s;
  const double difference = layer_times(moe, gpu, t, p).gemm_forward_s - layer_times(dense, gpu, t, p).gemm_forward_s;
  CHECK_THAT(difference, WithinRel(grouped + router - dense_mlp, 1e-9));
  // One grouped launch is never slower than the experts one after the other.
  const double one_by_one = experts * (gemm_time_s(gpu, bf16, tokens, 2 * f, h, 1, GemmOp::forward) +
                                       gemm_time_s(gpu, bf16, tokens, h, f, 1, GemmOp::forward));
  CHECK(grouped <= one_by_one);
}
