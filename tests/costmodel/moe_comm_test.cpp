// MoE communication as users run it in Megatron-Core: the DeepEP dispatcher (its kernels' bytes
// and links, the SMs they take) and the EP overlap (one micro-batch's dispatch/combine behind
// another's compute), each priced by mechanism, read and written in plan.json, refused in one
// line where Megatron-Core refuses it, and searched where asked.
#include <catch2/catch.hpp>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
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

namespace {

TimeBreakdown step(const ModelSpec& m, const ClusterSpec& c, const TrainingSpec& t, const ParallelConfig& p) {
  validate(m, c, t, p, p.world_size());
  return estimate_time(m, Network(c, p.world_size()), t, p, OverlapOptions{});
}

ParallelConfig with(ParallelConfig p, MoeDispatcher d, bool overlap) {
  p.moe_dispatcher = d;
  p.overlap_ep_comm = overlap;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DeepEP's dispatch and combine

TEST_CASE("DeepEP inside a node: each token once per rank holding its experts, over NVLink at DeepEP's measured rate",
          "[moe][deepep][time]") {
  const ModelSpec m = many_experts();  // E = 64, k = 2, h = 4096
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig p = with({.dp = 8, .ep = 8, .etp = 1}, MoeDispatcher::deepep, false);
  const Network net(c, 8);
  // A rank holds 8 of the 64 experts; a token's 2 experts both miss a given rank with probability
  // (56/64)(55/63), so it reaches 8 (1 - that) ranks. Rows of h bf16 elements, T = 4096 tokens.
  const double rank_copies = 8 * (1 - (56.0 / 64) * (55.0 / 63));
  const double row_bytes = 4096.0 * 4096 * 2;
  const double expected = row_bytes * rank_copies / (450e9 * 153 / 200) + 3.4e-6;  // NVLink 450 GB/s, one hop
  CHECK_THAT(deepep_transfer_s(m, net, t, p), WithinRel(expected, 1e-9));
  const DispatchCombine dc = moe_dispatch_combine(m, net, t, p);
  CHECK(dc.dispatch_s == dc.combine_s);
  CHECK_THAT(expert_parallel_comm_s(m, net, t, p), WithinRel(4 * expected, 1e-9));  // two each way
}

TEST_CASE("DeepEP across nodes: a token crosses the network once per node, the slower link sets the time",
          "[moe][deepep][time]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig p = with({.dp = 16, .ep = 16, .etp = 1}, MoeDispatcher::deepep, false);
  const Network net(c, 16);
  const double row_bytes = 4096.0 * 4096 * 2;
  // 16 ranks, 4 experts each: a token reaches 16 (1 - (60/64)(59/63)) ranks. 2 nodes, 32 experts
  // each: 2 (1 - (32/64)(31/63)) node copies over the GPU's 50 GB/s NIC at DeepEP's EP16 rate,
  // 43 of 50 GB/s; NVLink forwarding at 0.765 of 450 GB/s; then one network hop (14 us).
  const double nvlink_s = row_bytes * 16 * (1 - (60.0 / 64) * (59.0 / 63)) / (450e9 * 0.765) + 3.4e-6;
  const double rdma_s = row_bytes * 2 * (1 - (32.0 / 64) * (31.0 / 63)) / (50e9 * 43 / 50) + 3.4e-6;
  REQUIRE(rdma_s > nvlink_s);
  CHECK_THAT(deepep_transfer_s(m, net, t, p), WithinRel(rdma_s + 14e-6, 1e-9));
}

TEST_CASE("DeepEP beats the alltoall dispatcher across nodes where a token's experts share nodes", "[moe][deepep][time]") {
  // DeepSeek-V3's routing shape (top-8 of 256 experts) on Mixtral's layers: a token's 8 experts
  // land on few nodes, and DeepEP sends it once per node where the alltoall dispatcher sends 8 copies.
  ModelSpec m = many_experts();
  m.num_experts = 256;
  m.experts_per_token = 8;
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  for (int ep : {16, 32, 64}) {
    const ParallelConfig p{.dp = 64, .ep = ep, .etp = 1};
    const Network net(c, 64);
    REQUIRE(net.crosses_nodes(Mesh(p).shape(Dim::ep)));
    const double nccl = expert_parallel_comm_s(m, net, t, p);
    const double deepep = expert_parallel_comm_s(m, net, t, with(p, MoeDispatcher::deepep, false));
    CAPTURE(ep, nccl, deepep);
    CHECK(deepep < nccl);
    // and the whole step follows (nothing of DeepEP's is hidden without the overlap: no SMs charged)
    const TimeBreakdown a = step(m, c, t, p), b = step(m, c, t, with(p, MoeDispatcher::deepep, false));
    CHECK(b.step_time_s < a.step_time_s);
    CHECK(b.comm_contention_s == a.comm_contention_s);
  }
  // With Mixtral's top-2 on 2 nodes the saving is small (1.5 node copies against 2 expert copies,
  // one of them remote), and DeepEP's measured EP16 rate (43 GB/s, every node copy counted, the
  // own node's too) is below NCCL's ring rate on the NIC: the alltoall dispatcher stays ahead there,
  // and DeepEP overtakes it from 4 nodes (its EP32 rate, and more nodes to skip).
  const ModelSpec top2 = many_experts();
  const Network net(c, 64);
  const ParallelConfig ep16{.dp = 64, .ep = 16, .etp = 1}, ep32{.dp = 64, .ep = 32, .etp = 1};
  CHECK(expert_parallel_comm_s(top2, net, t, with(ep16, MoeDispatcher::deepep, false)) >
        expert_parallel_comm_s(top2, net, t, ep16));
  CHECK(expert_parallel_comm_s(top2, net, t, with(ep32, MoeDispatcher::deepep, false)) <
        expert_parallel_comm_s(top2, net, t, ep32));
}

TEST_CASE("DeepEP over the etp x ep group: with etp 2 a token goes to both halves of each expert", "[moe][deepep][time]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const Network net(c, 8);
  // tp 2, etp 2, ep 4: 8 ranks, a token's T/tp rows reach 2 x 4 (1 - (48/64)(47/63)) ranks.
  const ParallelConfig p = with({.tp = 2, .dp = 4, .ep = 4, .etp = 2, .sequence_parallel = true},
                                MoeDispatcher::deepep, false);
  const double expected = 4096.0 / 2 * 4096 * 2 * 2 * 4 * (1 - (48.0 / 64) * (47.0 / 63)) / (450e9 * 0.765) + 3.4e-6;
  CHECK_THAT(deepep_transfer_s(m, net, t, p), WithinRel(expected, 1e-9));
  CHECK(deepep_transfer_s(m, net, t, with({.dp = 8, .ep = 1, .etp = 1}, MoeDispatcher::deepep, false)) == 0);
}

// ---------------------------------------------------------------------------------------------
// The EP overlap

TEST_CASE("EP overlap: the steps that pair a forward with a backward are all but Megatron's warm-up",
          "[moe][overlap][time]") {
  const TrainingSpec t{.seq_len = 4096, .global_batch = 8};
  // pp 1, 4 micro-batches: the first forward and the last backward run alone.
  CHECK(ep_overlap_paired_fraction(t, {.dp = 2, .ep = 2, .micro_batch = 1, .overlap_ep_comm = true}, 0) == 0.75);
  CHECK(ep_overlap_paired_fraction(t, {.dp = 2, .ep = 2, .micro_batch = 1}, 0) == 0);  // off
  CHECK(ep_overlap_paired_fraction(t, {.dp = 8, .ep = 2, .micro_batch = 1, .overlap_ep_comm = true}, 0) == 0);  // m 1
  // pp 4, vpp 2, 8 micro-batches: 16 forwards a stage; warm-up 2(4 - s - 1) + (2 - 1) 4 + 1:
  // stage 0: 11 (5 paired), stage 3: 5 (11 paired).
  const ParallelConfig p{.pp = 4, .dp = 1, .ep = 1, .vpp = 2, .micro_batch = 1, .schedule = Schedule::interleaved,
                         .overlap_ep_comm = true};
  CHECK(ep_overlap_paired_fraction(t, p, 0) == 5.0 / 16);
  CHECK(ep_overlap_paired_fraction(t, p, 3) == 11.0 / 16);
}

TEST_CASE("EP overlap: a pair hides at most its four transfers, each at most the compute beside it",
          "[moe][overlap][time]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig p{.dp = 8, .ep = 8, .etp = 1};
  const Network net(c, 8);
  const LayerTimes lt = layer_times(m, c.gpu, t, p);
  const DispatchCombine dc = moe_dispatch_combine(m, net, t, p);
  // Windows larger than every transfer: all four hide.
  REQUIRE(dc.dispatch_s < lt.mlp_forward_s);
  REQUIRE(dc.dispatch_s < lt.forward_s - lt.mlp_forward_s);
  CHECK_THAT(ep_overlap_pair_hidden_s(m, dc, lt, 1.0), WithinRel(2 * (dc.dispatch_s + dc.combine_s), 1e-12));
  // Transfers 3x the MLP's forward: each hides only as much as its window; none hides more than itself.
  LayerTimes small = lt;
  const DispatchCombine big{3 * lt.mlp_forward_s, 3 * lt.mlp_forward_s};
  const double attention_forward_s = lt.forward_s - lt.mlp_forward_s;
  const double attention_backward_s = lt.backward_s - lt.mlp_backward_s + lt.recompute_s;
  const double expected = std::min(big.dispatch_s, attention_forward_s) + std::min(big.dispatch_s, lt.mlp_backward_s) +
                          std::min(big.combine_s, lt.mlp_forward_s) + std::min(big.combine_s, attention_backward_s);
  CHECK_THAT(ep_overlap_pair_hidden_s(m, big, small, 1.0), WithinRel(expected, 1e-12));
  CHECK(ep_overlap_pair_hidden_s(m, big, small, 1.0) < 2 * (big.dispatch_s + big.combine_s));
  // Collectives that cannot run beside compute (overlap fraction 0) hide nothing.
  CHECK(ep_overlap_pair_hidden_s(m, dc, lt, 0.0) == 0);
}

TEST_CASE("EP overlap: the step hides (m-1)/m of the EP transfers without a pipeline, and pays the SMs beside them",
          "[moe][overlap][time]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 32};  // 4 micro-batches of 1 on dp 8
  const ParallelConfig p{.dp = 8, .ep = 8, .etp = 1};
  const TimeBreakdown off = step(m, c, t, p), on = step(m, c, t, with(p, MoeDispatcher::alltoall, true));
  REQUIRE(off.ep_comm_s > 0);
  // Every window is larger than its transfer here (the test above), so the paired 3 of 4 steps hide all.
  CHECK_THAT(off.ep_comm_s - on.ep_comm_s, WithinRel(0.75 * off.ep_comm_s, 1e-9));
  const double hidden = on.hidden_comm_s - off.hidden_comm_s;
  CHECK_THAT(hidden, WithinRel(0.75 * off.ep_comm_s, 1e-9));
  // NCCL's all-to-all beside the compute takes the comm-contention rule's 8 SMs of 132.
  CHECK_THAT(on.comm_contention_s - off.comm_contention_s, WithinRel(hidden * 8 / 132, 1e-9));
  // DeepEP hidden the same way takes its 20 SMs (Megatron's --moe-deepep-num-sms).
  const TimeBreakdown d_off = step(m, c, t, with(p, MoeDispatcher::deepep, false)),
                      d_on = step(m, c, t, with(p, MoeDispatcher::deepep, true));
  const double d_hidden = d_on.hidden_comm_s - d_off.hidden_comm_s;
  REQUIRE(d_hidden > 0);
  CHECK_THAT(d_on.comm_contention_s - d_off.comm_contention_s, WithinRel(d_hidden * kDeepepSms / 132, 1e-9));
}

TEST_CASE("EP overlap never slows a step beyond the SMs it takes, and hides at most the paired steps' transfers",
          "[moe][overlap][time][law]") {
  const ModelSpec m = many_experts();
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const auto [p, batch] = GENERATE(
      std::pair{ParallelConfig{.dp = 16, .ep = 16, .etp = 1}, 64},
      std::pair{ParallelConfig{.tp = 2, .dp = 8, .ep = 8, .etp = 2, .sequence_parallel = true}, 64},
      std::pair{ParallelConfig{.tp = 2, .dp = 8, .ep = 16, .etp = 1, .sequence_parallel = true,
                               .recompute = Recompute::selective}, 128},
      std::pair{ParallelConfig{.pp = 2, .dp = 16, .ep = 16, .etp = 1, .vpp = 2, .schedule = Schedule::interleaved}, 64},
      std::pair{ParallelConfig{.pp = 4, .dp = 8, .ep = 8, .etp = 1, .vpp = 4, .schedule = Schedule::interleaved}, 32},
      std::pair{ParallelConfig{.dp = 32, .ep = 32, .etp = 1}, 32});
  const TrainingSpec t{.seq_len = 4096, .global_batch = batch};
  for (MoeDispatcher d : {MoeDispatcher::alltoall, MoeDispatcher::deepep}) {
    const TimeBreakdown off = step(m, c, t, with(p, d, false)), on = step(m, c, t, with(p, d, true));
    CAPTURE(p.tp, p.pp, p.ep, p.vpp, to_string(d), off.step_time_s, on.step_time_s);
    CHECK(on.step_time_s - on.comm_contention_s <= (off.step_time_s - off.comm_contention_s) * (1 + 1e-12));
    CHECK(on.ep_comm_s <= off.ep_comm_s);
    // At most the share of steps the schedule pairs (the stage with the most, the last), and never
    // more than the time those transfers take.
    const double paired = ep_overlap_paired_fraction(t, with(p, d, true), p.pp - 1);
    CHECK(off.ep_comm_s - on.ep_comm_s <= paired * off.ep_comm_s * (1 + 1e-9));
  }
}

TEST_CASE("EP overlap keeps one more layer's activations without a pipeline, one more chunk with one",
          "[moe][overlap][memory]") {
  ParallelConfig p{.dp = 8, .ep = 8};
  CHECK(microbatches_in_flight(p, 0, 4) == 1);
  p.overlap_ep_comm = true;
  // Without a pipeline the paired backward frees a layer for each one the next forward stores
  // (Megatron-Core's model_chunk_schedule_plan.py run): one micro-batch, and one layer at a time.
  CHECK(microbatches_in_flight(p, 0, 4) == 1);
  CHECK(microbatches_in_flight(p, 0, 1) == 1);
  const ModelSpec mixtral = store().load_model("mixtral-8x7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 32};
  ParallelConfig off = p;
  off.overlap_ep_comm = false;
  const MemoryEstimate a = estimate_memory(mixtral, c, t, p), b = estimate_memory(mixtral, c, t, off);
  // The paired layer joins the backward's working set (on the only stage the loss's own moments may
  // be larger): more than without the overlap, at most one layer's stored set more.
  const double more = a.stages[0].activations_bytes - b.stages[0].activations_bytes;
  CHECK(more > 0);
  CHECK(more <= stored_activation_bytes_per_layer(mixtral, t, p) * (1 + 1e-12));
  // Interleaved pp 4, vpp 2, 8 micro-batches: stage 0's warm-up 2*3 + 4 + 1 = 11 chunk forwards,
  // one more with the overlap: 12 of 1/2 stage each.
  ParallelConfig q{.pp = 4, .dp = 2, .ep = 2, .vpp = 2, .schedule = Schedule::interleaved};
  CHECK(microbatches_in_flight(q, 0, 8) == 5.5);
  q.overlap_ep_comm = true;
  CHECK(microbatches_in_flight(q, 0, 8) == 6.0);
}

// ---------------------------------------------------------------------------------------------
// Refusals, plan.json, the executor, the search

TEST_CASE("the MoE communication options are refused in one line where Megatron-Core refuses them",
          "[moe][deepep][overlap][training]") {
  const ModelSpec moe = store().load_model("mixtral-8x7b"), dense = store().load_model("llama-2-7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig ok{.dp = 8, .ep = 8, .etp = 1};
  CHECK(validate_error(moe, c, t, with(ok, MoeDispatcher::deepep, true)).empty());
  auto line = [&](const ModelSpec& m, const ClusterSpec& cl, const TrainingSpec& tr, const ParallelConfig& p) {
    const std::string e = validate_error(m, cl, tr, p);
    CHECK(e.find('\n') == std::string::npos);
    return e;
  };
  CHECK_THAT(line(dense, c, t, with({.dp = 8}, MoeDispatcher::deepep, false)),
             Contains("--moe-dispatcher deepep needs a mixture-of-experts model; llama-2-7b is dense"));
  CHECK_THAT(line(dense, c, t, with({.dp = 8}, MoeDispatcher::alltoall, true)),
             Contains("--overlap-ep-comm needs a mixture-of-experts model"));
  CHECK_THAT(line(moe, c, t, with({.dp = 8, .ep = 1, .etp = 1}, MoeDispatcher::deepep, false)),
             Contains("needs ep*etp > 1 (Megatron-Core's flex dispatcher runs over the etp x ep group"));
  CHECK_THAT(line(moe, c, t, with({.dp = 8, .ep = 1, .etp = 1}, MoeDispatcher::alltoall, true)),
             Contains("--overlap-ep-comm needs ep > 1 (Megatron-Core asserts expert_model_parallel_size > 1); "
                      "choose --ep among 2, 4 or 8, or drop --overlap-ep-comm"));
  CHECK_THAT(line(moe, c, t, with({.pp = 2, .dp = 4, .ep = 4, .etp = 1}, MoeDispatcher::alltoall, true)),
             Contains("--overlap-ep-comm with pp 2 needs --schedule interleaved with --vpp >= 2"));
  CHECK_THAT(line(moe, c, t, with({.dp = 8, .ep = 8, .etp = 1, .recompute = Recompute::full}, MoeDispatcher::alltoall, true)),
             Contains("does not run with full recompute (Megatron-Core asserts recompute_granularity != full); use --recompute none or selective"));
  TrainingSpec fp32 = t;
  fp32.precision = Precision::fp32;
  CHECK_THAT(line(moe, c, fp32, with(ok, MoeDispatcher::alltoall, true)), Contains("use --precision bf16"));
  TrainingSpec deepspeed = t;
  deepspeed.engine = engine_mechanics(Engine::deepspeed);
  CHECK_THAT(line(moe, c, deepspeed, with(ok, MoeDispatcher::deepep, false)),
             Contains("is Megatron-Core's (its combined 1F1B schedule, its flex dispatcher); the plan's engine is "
                      "deepspeed: use --engine megatron"));
  CHECK_THAT(line(moe, store().load_cluster("pcie-h100"), t, with(ok, MoeDispatcher::deepep, false)),
             Contains("needs NVLink between every pair of a node's GPUs (an NVSwitch node); cluster pcie-h100 has "
                      "none: use --moe-dispatcher alltoall"));
  CHECK_THROWS_WITH(moe_dispatcher_from_string("nccl"), Contains("choose alltoall or deepep"));
}

TEST_CASE("plan.json carries the dispatcher and the EP overlap only when set, and reads them back",
          "[moe][deepep][overlap][plan]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig plain{.dp = 8, .ep = 8, .etp = 1};
  const json plain_json = to_json(plain);
  CHECK_FALSE(plain_json.contains("moe_dispatcher"));
  CHECK_FALSE(plain_json.contains("overlap_ep_comm"));
  const ParallelConfig both = with(plain, MoeDispatcher::deepep, true);
  const json j = to_json(both);
  CHECK(j.at("moe_dispatcher") == "deepep");
  CHECK(j.at("overlap_ep_comm") == true);
  CHECK(parallel_from_json(j, "plan.json", "/parallel") == both);
  CHECK(parallel_from_json(plain_json, "plan.json", "/parallel") == plain);
  // A whole plan, through its text.
  const Network net(c, 8);
  const MemoryEstimate mem = estimate_memory(m, c, t, both);
  const Plan plan = make_plan(m, c, t, both, OverlapOptions{}, mem, estimate_time(m, net, t, both, mem));
  const Plan back = plan_from_json(json::parse(to_json(plan).dump()), "plan.json");
  CHECK(back.parallel == both);
  // An unknown dispatcher names the choices; a layout Megatron refuses is refused on reading.
  json bad = to_json(plan);
  bad["parallel"]["moe_dispatcher"] = "nccl";
  CHECK_THROWS_WITH(plan_from_json(bad, "plan.json"), Contains("alltoall") && Contains("deepep"));
  json full = to_json(plan);
  full["parallel"]["recompute"] = "full";
  CHECK_THROWS_WITH(plan_from_json(full, "plan.json"), Contains("--overlap-ep-comm does not run with full recompute"));
}

TEST_CASE("the executor refuses DeepEP and the EP overlap in one line", "[moe][deepep][overlap][executor]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  CHECK_FALSE(executor_refusal(m, t, ParallelConfig{.dp = 8, .ep = 8}));
  for (const ParallelConfig& p : {with({.dp = 8, .ep = 8}, MoeDispatcher::deepep, false),
                                  with({.dp = 8, .ep = 8}, MoeDispatcher::alltoall, true)}) {
    const std::optional<std::string> why = executor_refusal(m, t, p);
    REQUIRE(why);
    CHECK_THAT(*why, Contains("drop --overlap-ep-comm and use --moe-dispatcher alltoall"));
    CHECK(why->find('\n') == std::string::npos);
  }
}

TEST_CASE("the search applies the asked MoE communication to the layouts Megatron-Core accepts it on, and no other",
          "[moe][deepep][overlap][search]") {
  const ModelSpec m = store().load_model("mixtral-8x7b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  planner::SearchSpace space;
  space.gpus = 16;
  for (const ParallelConfig& p : planner::enumerate_layouts(m, t, space)) {
    CHECK(p.moe_dispatcher == MoeDispatcher::alltoall);
    CHECK_FALSE(p.overlap_ep_comm);
  }
  space.moe_dispatcher = MoeDispatcher::deepep;
  space.overlap_ep_comm = true;
  long overlapped = 0, deepep = 0, total = 0;
  for (const ParallelConfig& p : planner::enumerate_layouts(m, t, space)) {
    ++total;
    CHECK(check_layout(m, t, p, 16) == LayoutRule::ok);
    const bool takes_overlap = p.ep > 1 && (p.pp == 1 || p.schedule == Schedule::interleaved) &&
                               p.recompute != Recompute::full;
    CHECK(p.overlap_ep_comm == takes_overlap);
    CHECK((p.moe_dispatcher == MoeDispatcher::deepep) == (p.ep * p.expert_tp() > 1));
    overlapped += p.overlap_ep_comm;
    deepep += p.moe_dispatcher == MoeDispatcher::deepep;
  }
  CHECK(overlapped > 0);
  CHECK(overlapped < total);
  CHECK(deepep > 0);
}
