// Compute FLOPs, GEMM speed and the step-time laws.
#include "dplan/costmodel/time.h"

#include "dplan/costmodel/pipeline.h"
#include "dplan/costmodel/time_phases.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "dplan/planner/profiles.h"
#include "dplan/costmodel/units.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;

namespace {
// local-cpu with four ranks on two cores: every rank gets half a core when all run.
ClusterSpec four_ranks_on_two_cores() {
  ClusterSpec c = store().load_cluster("local-cpu");
  c.gpus_per_node = 4;
  c.cores_per_node = 2;
  return c;
}
}  // namespace
using Catch::Matchers::WithinRel;

TEST_CASE("layer FLOPs reduce to Megatron's 24Th^2 + 4Tsh for a 4h GELU GPT", "[compute]") {
  ModelSpec m = store().load_model("gpt-7.5b");  // h = 4096, f = 4h, a = 32
  const double T = 2048 * 4, s = 2048, h = 4096;
  CHECK_THAT(layer_forward_flops(m, T, s).total(), WithinRel(24 * T * h * h + 4 * T * s * h, 1e-12));
}

TEST_CASE("model FLOPs plus one recompute forward equal Eq. 3 of Narayanan et al. 2021", "[compute]") {
  // Eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh) = 4 x layer forward + 3 x head forward.
  ModelSpec m = store().load_model("gpt-145.6b");
  TrainingSpec t{.seq_len = 2048, .global_batch = 2304};
  const double B = 2304, s = 2048, l = m.num_layers, h = m.hidden_size, V = m.vocab_size;
  double eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  double recompute = l * layer_forward_flops(m, B * s, s).total();
  CHECK_THAT(model_flops_per_step(m, t) + recompute, WithinRel(eq3, 1e-12));
  // ... and the value published.json derives for this run.
  CHECK_THAT(eq3, WithinRel(5.641682123048877e+18, 1e-9));
}

TEST_CASE("GEMM efficiency falls for small shards", "[compute]") {
  GpuSpec gpu = store().load_gpu("h100-sxm5-80gb");
  const double tokens = 8192, h = 8192, f = 28672;
  double whole = gemm_time_s(gpu, Precision::bf16, tokens, f, h);
  double peak_fraction = 2 * tokens * f * h / whole / peak_flops_per_s(gpu, Precision::bf16);
  CHECK(peak_fraction <= gpu.matmul_max_efficiency);
  CHECK(peak_fraction > 0.9 * gpu.matmul_max_efficiency * gpu.sustained_fraction);
  // Split over tp = 64: each shard is 1/64 of the work but takes more than 1/64 of the time.
  double shard = gemm_time_s(gpu, Precision::bf16, tokens, f / 64, h);
  CHECK(shard * 64 > 1.05 * whole);
  // A tiny GEMM is dominated by overhead and memory traffic.
  double tiny = gemm_time_s(gpu, Precision::bf16, 64, 64, 64);
  CHECK(2 * 64.0 * 64 * 64 / tiny < 0.01 * peak_flops_per_s(gpu, Precision::bf16));
}

TEST_CASE(
    "measured GEMMs replace the curve: exact where measured, "
    "interpolated between, by op",
    "[compute]") {
  GpuSpec gpu = store().load_gpu("cpu-core");
  gpu.sustained_fraction = 1;
  const double curve = gemm_time_s(gpu, Precision::fp32, 256, 512, 128);
  // A CPU-like table: the rate falls with size, and the weight gradient runs at
  // half the forward's rate.
  auto time_at = [](double m, double n, double k, double flops_per_s) { return 2 * m * n * k / flops_per_s; };
  for (double x : {128.0, 256.0, 512.0, 1024.0}) {
    const double rate = 8e9 * std::pow(x / 128, -0.25);
    gpu.matmul_measured.push_back({Precision::fp32, GemmOp::forward, x, x, x, 1, time_at(x, x, x, rate)});
    gpu.matmul_measured.push_back({Precision::fp32, GemmOp::wgrad, x, x, x, 1, time_at(x, x, x, rate / 2)});
  }
  // Exactly the measurement where one was taken.
  CHECK_THAT(gemm_time_s(gpu, Precision::fp32, 256, 256, 256),
             WithinRel(time_at(256, 256, 256, 8e9 * std::pow(2, -0.25)), 1e-12));
  CHECK_THAT(gemm_time_s(gpu, Precision::fp32, 256, 256, 256, 1, GemmOp::wgrad),
             WithinRel(time_at(256, 256, 256, 4e9 * std::pow(2, -0.25)), 1e-12));
  // Between measured shapes the rate lies between theirs, and no longer follows
  // the curve.
  const double mid = 2 * 256.0 * 512 * 128 / gemm_time_s(gpu, Precision::fp32, 256, 512, 128);
  CHECK(mid < 8e9);
  CHECK(mid > 8e9 * std::pow(8.0, -0.25));
  CHECK(std::abs(gemm_time_s(gpu, Precision::fp32, 256, 512, 128) / curve - 1) > 0.1);
  // An op the table covers is read from its own measurements: wgrad is about
  // half as fast.
  const double wgrad = gemm_time_s(gpu, Precision::fp32, 300, 300, 300, 1, GemmOp::wgrad);
  const double forward = gemm_time_s(gpu, Precision::fp32, 300, 300, 300, 1, GemmOp::forward);
  CHECK(wgrad / forward > 1.6);
  CHECK(wgrad / forward < 2.1);
  // The sustained fraction still scales it; a precision the table lacks uses
  // the curve.
  GpuSpec slower = gpu;
  slower.sustained_fraction = 0.5;
  CHECK_THAT(gemm_time_s(slower, Precision::fp32, 300, 300, 300), WithinRel(2 * forward, 1e-12));
  GpuSpec curve_only = gpu;
  curve_only.matmul_measured.clear();
  CHECK(gemm_time_s(gpu, Precision::bf16, 300, 300, 300) == gemm_time_s(curve_only, Precision::bf16, 300, 300, 300));
  // The table survives the profile's JSON.
  const GpuSpec reloaded = gpu_from_json({{"format_version", 1}, {"gpu", to_json(gpu)}}, "g.json");
  REQUIRE(reloaded.matmul_measured.size() == gpu.matmul_measured.size());
  for (size_t i = 0; i < gpu.matmul_measured.size(); ++i) {
    const MeasuredGemm& a = reloaded.matmul_measured[i], &b = gpu.matmul_measured[i];
    CHECK((a.precision == b.precision && a.op == b.op && a.m == b.m && a.n == b.n && a.k == b.k && a.batch == b.batch));
    CHECK_THAT(a.time_s, WithinRel(b.time_s, 1e-12));
  }
}

TEST_CASE("the phases add up to the step time and MFU follows from it", "[time]") {
  ModelSpec m = store().load_model("llama-3-70b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  Network net(c, 64);
  TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  ParallelConfig p{.tp = 8, .pp = 4, .dp = 2, .sequence_parallel = true, .recompute = Recompute::selective};
  TimeBreakdown r = estimate_time(m, net, t, p);
  double sum = 0;
  for (const auto& [name, seconds] : r.phases()) sum += seconds;
  CHECK_THAT(sum, WithinRel(r.step_time_s, 1e-12));
  CHECK_THAT(r.mfu, WithinRel(model_flops_per_step(m, t) / (r.step_time_s * 64 * 989e12), 1e-12));
  CHECK(r.hfu > r.mfu);
  CHECK(r.tokens_per_s == 512.0 * 8192 / r.step_time_s);
  // H100 Megatron runs reach 41-49 % MFU (profiles/gpus/SOURCES.md section 4); a sane model lands near there.
  CHECK(r.mfu > 0.30);
  CHECK(r.mfu < 0.65);
}

TEST_CASE("faster links never slow a plan", "[time][law]") {
  ModelSpec m = store().load_model("llama-3-70b");
  ClusterSpec slow = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  auto layout = GENERATE(ParallelConfig{.tp = 8, .pp = 4, .dp = 4, .sequence_parallel = true},
                         ParallelConfig{.tp = 4, .pp = 8, .dp = 4, .recompute = Recompute::full},
                         ParallelConfig{.tp = 2, .pp = 2, .dp = 32, .zero_stage = 3, .recompute = Recompute::full},
                         ParallelConfig{.tp = 16, .pp = 2, .dp = 4, .sequence_parallel = true});
  for (double factor : {1.5, 2.0, 4.0}) {
    ClusterSpec fast = slow;
    fast.intra_node.bandwidth_bytes_per_s *= factor;
    fast.nic_bandwidth_bytes_per_s *= factor;
    double before = estimate_time(m, Network(slow, 128), t, layout).step_time_s;
    double after = estimate_time(m, Network(fast, 128), t, layout).step_time_s;
    INFO("tp " << layout.tp << " pp " << layout.pp << " factor " << factor);
    CHECK(after <= before);
  }
}

TEST_CASE("more micro-batches never grow the 1F1B bubble fraction", "[time][law]") {
  ModelSpec m = store().load_model("gpt3-175b");
  ClusterSpec c = store().load_cluster("dgx-a100-80g");
  Network net(c, 512);
  double previous = 1.0;
  for (int batch : {8, 16, 32, 64, 128, 256, 512, 1024}) {
    TrainingSpec t{.seq_len = 2048, .global_batch = batch};
    ParallelConfig p{.tp = 8, .pp = 8, .dp = 8, .recompute = Recompute::full};
    double fraction = estimate_time(m, net, t, p).bubble_fraction;
    INFO("global batch " << batch);
    CHECK(fraction <= previous);
    previous = fraction;
  }
}

TEST_CASE("ranks that share cores fill each other's pipeline waits", "[time]") {
  ModelSpec m = store().load_model("gpt-small");
  ClusterSpec c = four_ranks_on_two_cores();
  c.lone_rank_speedup = 1.5;
  TrainingSpec t{.seq_len = 256, .global_batch = 8, .precision = Precision::fp32};
  auto pipeline_s = [](const TimeBreakdown& r) { return r.forward_s + r.backward_s + r.pp_bubble_s; };
  // The whole model's forward + backward of one micro-batch on one rank with a core to itself.
  ClusterSpec dedicated = c;
  dedicated.cores_per_node = 0;
  TimeBreakdown whole = estimate_time(m, Network(dedicated, 1), t, ParallelConfig{.tp = 1, .pp = 1, .dp = 1});
  const double model_s = (whole.forward_s + whole.backward_s) / 8;

  // pp 2 x dp 2 on 2 cores: while one stage waits, the other's two ranks have both cores, so no core
  // idles while work waits and the step's pipeline part is the 4 ranks' work over the 2 cores:
  // 4 micro-batches x 2 replicas x the whole model / 2 cores (the stages differ by the embedding and
  // the head, so the fill leaves a little idle).
  ParallelConfig four{.tp = 1, .pp = 2, .dp = 2};
  TimeBreakdown r = estimate_time(m, Network(c, 4), t, four);
  CHECK_THAT(pipeline_s(r), WithinRel(4 * model_s, 0.02));
  CHECK(pipeline_s(r) >= 4 * model_s * (1 - 1e-9));
  // The closed form on the same cores would add a whole slot of the steady state's pace.
  TimeBreakdown closed = estimate_time(m, Network(dedicated, 4), t, four);
  CHECK(pipeline_s(r) < 2 * pipeline_s(closed) - 0.5 * (closed.forward_s + closed.backward_s) / 4);

  // The same with the interleaved schedule (2 chunks per stage): played out the same way.
  ParallelConfig interleaved = four;
  interleaved.vpp = 2;
  interleaved.schedule = Schedule::interleaved;
  r = estimate_time(m, Network(c, 4), t, interleaved);
  TimeBreakdown closed_interleaved = estimate_time(m, Network(dedicated, 4), t, interleaved);
  CHECK(pipeline_s(r) >= 4 * model_s * (1 - 1e-9));
  CHECK(pipeline_s(r) < 2 * pipeline_s(closed_interleaved));

  // pp 2 on 2 cores: each rank has a core, and one alone runs lone_rank_speedup faster, so the waits
  // are partly filled: between perfectly packed and the closed form's (m + p - 1) slots.
  ParallelConfig two{.tp = 1, .pp = 2, .dp = 1};
  r = estimate_time(m, Network(c, 2), t, two);
  TimeBreakdown closed_two = estimate_time(m, Network(dedicated, 2), t, two);
  CHECK(pipeline_s(r) < pipeline_s(closed_two));
  CHECK(pipeline_s(r) > 8 * model_s / 2);
  CHECK(r.pp_bubble_s > 0);

  // A node whose cores are not shared (cores_per_node 0, every GPU cluster): the closed form, p - 1
  // whole slots.
  CHECK_THAT(closed.pp_bubble_s, WithinRel((closed.forward_s + closed.backward_s) / 4, 1e-9));
}

TEST_CASE("tensor-parallel groups beyond the cores fill each other's waits", "[time]") {
  ModelSpec m = store().load_model("gpt-small");
  ClusterSpec c = four_ranks_on_two_cores();
  TrainingSpec t{.seq_len = 256, .global_batch = 8, .precision = Precision::fp32};
  // tp 2 on 2 cores: a core per rank, nothing to fill; its 8 micro-batches' compute and tp waits.
  TimeBreakdown two = estimate_time(m, Network(c, 2), t, ParallelConfig{.tp = 2, .pp = 1, .dp = 1});
  const double compute_s = two.forward_s + two.backward_s, waits_s = two.tp_comm_s;
  REQUIRE(waits_s > 0);
  // tp 2 x dp 2 on 2 cores: two groups of 4 micro-batches each. A group alone has a core per rank,
  // so its compute is C = half of tp 2's; its waits W are tp 2's (half as many, stretched twice by
  // the time-sharing). It computes for Tc, during which the other group computes too (halving its
  // pace) with the probability q = Tc / (Tc + W) that it is not waiting:
  //   C = Tc (1 - q / 2)  =>  Tc^2 + 2 (W - C) Tc - 2 C W = 0  =>  Tc = C - W + sqrt((W - C)^2 + 2 C W),
  // between C (the group alone) and the even share's 2 C.
  TimeBreakdown four = estimate_time(m, Network(c, 4), t, ParallelConfig{.tp = 2, .pp = 1, .dp = 2});
  const double C = compute_s / 2, W = waits_s;
  const double tc_s = C - W + std::sqrt((W - C) * (W - C) + 2 * C * W);
  CHECK_THAT(four.forward_s + four.backward_s, WithinRel(tc_s, 1e-6));
  CHECK_THAT(four.tp_comm_s, WithinRel(waits_s, 1e-9));
  CHECK(four.forward_s + four.backward_s > C);       // the other group does take some of the cores
  CHECK(four.forward_s + four.backward_s < 2 * C);   // but less than always (the even share)
  // Where the cores are not shared, the groups do not meet: compute and waits as they are.
  ClusterSpec dedicated = c;
  dedicated.cores_per_node = 0;
  TimeBreakdown gpu = estimate_time(m, Network(dedicated, 4), t, ParallelConfig{.tp = 2, .pp = 1, .dp = 2});
  CHECK_THAT(gpu.tp_comm_s, WithinRel(waits_s / 2, 1e-9));
  CHECK_THAT(gpu.forward_s + gpu.backward_s, WithinRel(compute_s / 2, 1e-9));
}

TEST_CASE("a tied embedding on separate first and last stages costs one all-reduce between them per step",
          "[time]") {
  ModelSpec m = store().load_model("gpt3-175b");  // tied: the LM head is the token embedding
  REQUIRE(m.tied_embeddings);
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 2048, .global_batch = 1536};
  ParallelConfig p{.tp = 8, .pp = 8, .dp = 12, .distributed_optimizer = true};
  Network net(c, p.world_size());
  auto dp_comm_s = [&](const ModelSpec& model, const ParallelConfig& q) {
    return estimate_time(model, net, t, q).dp_comm_s;
  };
  ModelSpec untied = m;
  untied.tied_embeddings = false;
  // The embedding's tp shard of gradients, between stage 0 and stage 7 (different nodes), priced as
  // two ranks half the pipeline apart (stage 0 and stage 4: different nodes too).
  // (In the bytes the time model moves gradients in: 16-bit, gradient_reduce_bytes.)
  const double bytes = double(padded_vocab(m, t, p.tp)) / p.tp * m.hidden_size * gradient_reduce_bytes(t);
  REQUIRE(embedding_group_shape(p) == GroupShape{2, p.tp * p.dp * p.pp / 2});
  const double all_reduce_s = net.cost(Collective::all_reduce, bytes, embedding_group_shape(p)).time_s;
  CHECK(all_reduce_s > 0);
  CHECK_THAT(dp_comm_s(m, p) - dp_comm_s(untied, p), WithinRel(all_reduce_s, 1e-9));
  // Without data parallelism it is the step's only gradient communication; one stage holding both
  // ends has none.
  Network node(c, 16);
  ParallelConfig two_stages{.tp = 8, .pp = 2, .dp = 1};
  CHECK_THAT(estimate_time(m, node, t, two_stages).dp_comm_s,
             WithinRel(node.cost(Collective::all_reduce, bytes, GroupShape{2, 8}).time_s, 1e-9));
  ParallelConfig one_stage{.tp = 8, .pp = 1, .dp = 1};
  CHECK(estimate_time(m, Network(c, 8), t, one_stage).dp_comm_s == 0);
  // ZeRO-2 sums only its shard of the gradient.
  ParallelConfig zero2 = p;
  zero2.distributed_optimizer = false;
  zero2.zero_stage = 2;
  const double shard_s =
      net.cost(Collective::all_reduce, bytes / p.dp, embedding_group_shape(p)).time_s;
  CHECK_THAT(dp_comm_s(m, zero2) - dp_comm_s(untied, zero2), WithinRel(shard_s, 1e-9));
}

TEST_CASE("a tensor-parallel group that leaves the NVLink domain visibly slows down", "[time]") {
  ModelSpec m = store().load_model("llama-3.1-405b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  Network net(c, 256);
  TrainingSpec t{.seq_len = 8192, .global_batch = 256};
  ParallelConfig inside{.tp = 8, .pp = 8, .dp = 4, .sequence_parallel = true};
  ParallelConfig across{.tp = 16, .pp = 8, .dp = 2, .sequence_parallel = true};
  TimeBreakdown a = estimate_time(m, net, t, inside), b = estimate_time(m, net, t, across);
  // Per micro-batch and GPU, tp 16 moves the same bytes per collective as tp 8, but two of every
  // ring's 16 hops cross the NICs: 8 rails x 47 GB/s (ring) instead of NVLS inside the NVSwitch
  // (~480 GB/s busbw): about 1.3x slower per collective at these 256 MiB messages.
  double per_mb_inside = a.tp_comm_s / (256 / 4), per_mb_across = b.tp_comm_s / (256 / 2);
  CHECK(per_mb_across > 1.2 * per_mb_inside);
  CHECK(b.tp_comm_s / b.step_time_s > 1.5 * a.tp_comm_s / a.step_time_s);
  // With a quarter of the NICs (a PCIe-era node), leaving the node costs far more.
  ClusterSpec few = c;
  few.nics_per_node = 2;
  TimeBreakdown d = estimate_time(m, Network(few, 256), t, across);
  CHECK(d.tp_comm_s / (256 / 2) > 3 * per_mb_inside);
}

TEST_CASE(
    "comm_overlap scales how much gradient reduction hides under "
    "backward; ZeRO-2 reduces every micro-batch",
    "[time]") {
  ModelSpec m = store().load_model("llama-2-7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 64, .micro_batch = 1, .zero_stage = 1};
  const Network net(c, 64);
  const TimeBreakdown full = estimate_time(m, net, t, p);
  ClusterSpec none = c;
  none.comm_overlap_fraction = 0;
  const TimeBreakdown serial = estimate_time(m, Network(none, 64), t, p);
  // Nothing hides: the whole reduce-scatter shows.
  CHECK(serial.dp_comm_s > full.dp_comm_s);
  CHECK_THAT(serial.dp_comm_s + serial.param_gather_s,
             WithinRel(full.dp_comm_s + full.param_gather_s + full.hidden_comm_s, 1e-9));
  CHECK(serial.hidden_comm_s == 0);
  // ZeRO-2 reduce-scatters each of the 4 micro-batches' gradients (nothing
  // hidden: 4x the traffic).
  ParallelConfig z2 = p;
  z2.zero_stage = 2;
  const TimeBreakdown zero2 = estimate_time(m, Network(none, 64), t, z2);
  CHECK_THAT(zero2.dp_comm_s, WithinRel(4 * serial.dp_comm_s, 1e-9));
}

// ---- The phases one by one (time_phases.h), each against its formula worked out here. ----

namespace {
struct Setup {
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  ParallelConfig parallel;
};
Setup llama70b(ParallelConfig p) {
  return {store().load_model("llama-3-70b"), store().load_cluster("dgx-h100"),
          TrainingSpec{.seq_len = 8192, .global_batch = 512}, p};
}
}  // namespace

TEST_CASE("tensor-parallel phase: two collectives forward, two backward, one per edge", "[time][phases]") {
  Setup s = llama70b({.tp = 8, .pp = 4, .dp = 2, .sequence_parallel = true});
  Network net(s.cluster, 64);
  // T h B bytes per collective: one micro-batch of 8192 tokens x 8192 hidden x 2 bytes (bf16).
  const double bytes = 8192.0 * 8192 * 2;
  const GroupShape group{8, 1};
  const double one = 0.5 * (net.cost(Collective::all_gather, bytes, group).time_s +
                            net.cost(Collective::reduce_scatter, bytes, group).time_s);
  TensorParallelComm c = tensor_parallel_comm(s.model, net, s.training, s.parallel);
  CHECK(c.layer_forward_s == 2 * one);
  CHECK(c.edge_s == one);
  CHECK(c.layer_s == 4 * one);
  // Full recompute replays the forward pair; without sequence parallel each one is an all-reduce.
  s.parallel.recompute = Recompute::full;
  CHECK(tensor_parallel_comm(s.model, net, s.training, s.parallel).layer_s == 6 * one);
  s.parallel.sequence_parallel = false;
  CHECK(tensor_parallel_comm(s.model, net, s.training, s.parallel).edge_s ==
        net.cost(Collective::all_reduce, bytes, group).time_s);
  // tp 1: nothing.
  TensorParallelComm none = tensor_parallel_comm(s.model, Network(s.cluster, 8), s.training, {.tp = 1, .pp = 4, .dp = 2});
  CHECK((none.layer_s == 0 && none.layer_forward_s == 0 && none.edge_s == 0));
}

TEST_CASE("context-parallel phase: cp - 1 ring steps forward; backward cp - 1 of K,V and cp of dK,dV, hidden under attention",
          "[time][phases]") {
  Setup s = llama70b({.tp = 8, .pp = 1, .dp = 4, .cp = 2});
  Network net(s.cluster, 64);
  // Each step passes K and V of T = 8192 / 2 tokens, kv_dim / tp wide (8 kv heads x 128 over tp 8).
  const double chunk = 2 * 4096.0 * 1024 / 8 * 2;
  const double step = net.cost(Collective::send_recv, chunk, Mesh(s.parallel).shape(Dim::cp)).time_s;
  REQUIRE(step > 0);
  // No attention core to hide under: forward step, backward 3 (K,V once, dK,dV twice: the second
  // brings them home), all exposed.
  ContextParallelComm bare = context_parallel_comm(s.model, net, s.training, s.parallel, LayerTimes{}, 1.0);
  CHECK(bare.layer_forward_s == step);
  CHECK_THAT(bare.layer_s, WithinRel(4 * step, 1e-12));
  CHECK(bare.hidden_layer_s == 0);
  // An attention core of one step's length hiding at half efficiency: forward exposes 1 - 0.5 = 0.5
  // steps, backward 3 - 0.5 x 2.5 = 1.75, so 2.25 steps show and 1.75 hide.
  LayerTimes lt{.attention_core_s = step};
  ContextParallelComm half = context_parallel_comm(s.model, net, s.training, s.parallel, lt, 0.5);
  CHECK_THAT(half.layer_forward_s, WithinRel(0.5 * step, 1e-12));
  CHECK_THAT(half.layer_s, WithinRel(2.25 * step, 1e-12));
  CHECK_THAT(half.hidden_layer_s, WithinRel(1.75 * step, 1e-12));
  // Full recompute replays the exposed forward.
  s.parallel.recompute = Recompute::full;
  CHECK_THAT(context_parallel_comm(s.model, net, s.training, s.parallel, lt, 0.5).layer_s,
             WithinRel(2.75 * step, 1e-12));
}

TEST_CASE("expert-parallel phase: four all-to-alls of the routed tokens per layer", "[time][phases]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 8, .ep = 8};
  Network net(c, 8);
  // T x experts_per_token x h x B: 4096 tokens, top-2, hidden 4096, bf16.
  REQUIRE(m.experts_per_token == 2);
  const double bytes = 4096.0 * 2 * 4096 * 2;
  CHECK(expert_parallel_comm_s(m, net, t, p) ==
        4 * net.cost(Collective::all_to_all, bytes, Mesh(p).shape(Dim::ep)).time_s);
  p.ep = 1;
  CHECK(expert_parallel_comm_s(m, net, t, p) == 0);
}

TEST_CASE("ZeRO-3 phase: a layer's gather forward, gather + reduce-scatter backward, the first never hidden",
          "[time][phases]") {
  ModelSpec m = store().load_model("llama-2-7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 64, .zero_stage = 3};
  Network net(c, 64);
  const MemoryEstimate mem = estimate_memory(m, c, t, p);
  const double layer_params = mem.stages[0].num_params / m.num_layers;
  const GroupShape dp{64, 1};
  const double gather = net.cost(Collective::all_gather, layer_params * 2, dp).time_s;    // bf16 weights
  const double scatter = net.cost(Collective::reduce_scatter, layer_params * 2, dp).time_s;  // bf16 grads
  // No compute to hide under: everything shows.
  Zero3Comm bare = zero3_comm(m, net, c.gpu, t, p, mem, LayerTimes{}, 1.0);
  CHECK(bare.layer_forward_s == gather);
  CHECK(bare.layer_s == gather + (gather + scatter));
  CHECK(bare.first_s == gather);
  CHECK(bare.hidden_layer_s == 0);
  // Compute longer than the traffic hides it all, but the first layer's gather.
  Zero3Comm hidden = zero3_comm(m, net, c.gpu, t, p, mem, LayerTimes{.forward_s = 1, .backward_s = 2}, 1.0);
  CHECK(hidden.layer_s == 0);
  CHECK(hidden.first_s == gather);
  CHECK_THAT(hidden.hidden_layer_s, WithinRel(2 * gather + scatter, 1e-12));
  p.zero_stage = 2;
  CHECK(zero3_comm(m, net, c.gpu, t, p, mem, LayerTimes{}, 1.0).layer_s == 0);
}

TEST_CASE("ZeRO-3 as each engine runs it: per-parameter collectives, per-rank copies, no prefetch, the recompute's "
          "gather",
          "[time][phases][engine]") {
  ModelSpec m = store().load_model("gpt-529.6b");
  ClusterSpec c = store().load_cluster("dgx-a100-80g");
  TrainingSpec t{.seq_len = 2048, .global_batch = 2240, .precision = Precision::fp16};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 2240, .micro_batch = 1, .zero_stage = 3, .recompute = Recompute::full};
  Network net(c, 2240);
  const MemoryEstimate mem = estimate_memory(m, c, t, p);
  const LayerTimes compute{.forward_s = 0.1, .backward_s = 0.2, .recompute_s = 0.1};
  // Megatron-FSDP: one gather a layer, prefetched: compute hides most of it.
  t.engine = engine_mechanics(Engine::megatron);
  const Zero3Comm layer = zero3_comm(m, net, c.gpu, t, p, mem, compute, 1.0);
  // DeepSpeed's first ZeRO-3: a collective per parameter tensor (12 for a GPT layer with biases and
  // LayerNorms), a copy kernel per rank for each, a synchronize before each gather (nothing hides),
  // and the recompute's gather.
  REQUIRE(layer_params(m).tensors == 12);
  t.engine = engine_mechanics(Engine::deepspeed, "v0.3");
  const Zero3Comm legacy = zero3_comm(m, net, c.gpu, t, p, mem, compute, 1.0);
  CHECK(legacy.hidden_layer_s == 0);
  CHECK(legacy.layer_s > 3 * legacy.first_s);  // two gathers, the recompute's, a reduce-scatter
  CHECK(legacy.first_s > 12 * 2240 * t.engine.sharded.per_rank_s);
  CHECK(t.engine.sharded.per_rank_s > 0);
  CHECK(legacy.layer_s > 5 * layer.layer_s);
  // Without recompute there is no third gather.
  ParallelConfig none = p;
  none.recompute = Recompute::none;
  const Zero3Comm no_recompute = zero3_comm(m, net, c.gpu, t, none, mem, compute, 1.0);
  CHECK_THAT(legacy.layer_s - no_recompute.layer_s, WithinRel(legacy.first_s, 1e-12));
  // The per-rank copies grow with the group: half the ranks, less per collective.
  ParallelConfig half = p;
  half.dp = 1120;
  Network half_net(c, 1120);
  CHECK(zero3_comm(m, half_net, c.gpu, t, half, estimate_memory(m, c, t, half), compute, 1.0).first_s <
        legacy.first_s);
}

TEST_CASE("compute phase: a stage's layers, its edge, and the communication inside a micro-batch",
          "[time][phases]") {
  Setup s = llama70b({.tp = 8, .pp = 4, .dp = 2});
  const GpuSpec gpu = s.cluster.gpu;
  const LayerTimes lt{.forward_s = 1, .backward_s = 2, .recompute_s = 0.5};
  const LayerComm comm{.tp = {.layer_forward_s = 0.01, .layer_s = 0.02, .edge_s = 0.005},
                       .cp = {.layer_s = 0.003, .layer_forward_s = 0.001, .hidden_layer_s = 0.004},
                       .ep_s = 0.006,
                       .zero3 = {.layer_s = 0.007, .layer_forward_s = 0.002, .first_s = 0.1, .hidden_layer_s = 0.008}};
  const std::vector<StageTime> st = stage_times(s.model, gpu, s.training, s.parallel, lt, comm, OverlapOptions{});
  const EdgeTimes et = edge_times(s.model, gpu, s.training, s.parallel);
  REQUIRE(st.size() == 4);  // 80 layers: 20 per stage
  const double n = 20;
  CHECK(st[0].forward_s == n * 1 + et.embedding_forward_s);
  CHECK(st[1].forward_s == n * 1);
  CHECK(st[3].backward_s == n * 2 + et.head_backward_s);
  CHECK(st[2].recompute_s == n * 0.5);
  CHECK(st[1].tp_s == n * 0.02);
  CHECK(st[0].tp_s == n * 0.02 + 0.005);
  CHECK(st[3].tp_s == n * 0.02 + 2 * 0.005);
  CHECK(st[1].cp_s == n * 0.003);
  CHECK(st[1].ep_s == n * 0.006);
  CHECK(st[1].zero3_s == n * 0.007 + 0.1);
  CHECK_THAT(st[1].forward_comm_s, WithinRel(n * 0.01 + n * (0.001 + 0.003 + 0.002) + 0.1, 1e-12));
  CHECK_THAT(st[1].hidden_s, WithinRel(n * (0.004 + 0.008), 1e-12));
  // The last stage carries the LM head: it is the critical one.
  CHECK(critical_stage(st) == 3);
  // Overlapped tensor-parallel collectives (sequence parallel) hide.
  s.parallel.sequence_parallel = true;
  const std::vector<StageTime> overlapped =
      stage_times(s.model, gpu, s.training, s.parallel, lt, comm, OverlapOptions{.tp_comm = true});
  CHECK(overlapped[1].tp_s == 0);
  CHECK_THAT(overlapped[1].hidden_s, WithinRel(n * 0.02 + n * (0.004 + 0.008), 1e-12));
}

TEST_CASE("pipeline phase: (p - 1) / v slots of bubble, two hops per micro-batch and chunk", "[time][phases]") {
  Setup s = llama70b({.tp = 8, .pp = 4, .dp = 2});
  Network net(s.cluster, 64);
  const std::vector<StageTime> st(4, StageTime{.forward_s = 1, .backward_s = 2});
  const CoreSharing dedicated(s.cluster, s.parallel);
  // 512 / 2 = 256 micro-batches; a hop carries T h B / tp = 8192 x 8192 x 2 / 8 bytes.
  const double hop = net.cost(Collective::send_recv, 8192.0 * 8192 * 2 / 8, Mesh(s.parallel).shape(Dim::pp)).time_s;
  PipelineTime r = pipeline_time(s.model, net, s.training, s.parallel, st, 0, dedicated);
  CHECK(r.bubble_s == 3 * 3.0);
  CHECK(r.p2p_s == 2 * hop * (256 + 3));
  CHECK(r.pace == 1);
  s.parallel.schedule = Schedule::interleaved;
  s.parallel.vpp = 5;
  r = pipeline_time(s.model, net, s.training, s.parallel, st, 0, dedicated);
  CHECK(r.bubble_s == 3 * 3.0 / 5);
  // Interleaved: each hop overlaps the next chunk's forward (1 s / 5, far longer than a hop), so
  // only the fill's and drain's 3 hops each way show; the rest is hidden.
  REQUIRE(hop < 0.2);
  CHECK_THAT(r.p2p_s, WithinRel(2 * hop * 3, 1e-12));
  CHECK_THAT(r.p2p_hidden_s, WithinRel(2 * hop * 5 * 256, 1e-12));
  // A chunk too short to cover its hop leaves the difference exposed.
  const std::vector<StageTime> short_chunks(4, StageTime{.forward_s = 5 * hop / 2, .backward_s = 5 * hop});
  r = pipeline_time(s.model, net, s.training, s.parallel, short_chunks, 0, dedicated);
  CHECK_THAT(r.p2p_s, WithinRel(2 * (hop / 2 * 5 * 256 + hop * 3), 1e-9));
  // pp 1: no pipeline.
  r = pipeline_time(s.model, Network(s.cluster, 16), s.training, {.tp = 8, .pp = 1, .dp = 2}, {StageTime{}}, 0,
                    dedicated);
  CHECK((r.bubble_s == 0 && r.p2p_s == 0 && r.pace == 1));
}

TEST_CASE("pipeline phase where ranks share cores: the played-out schedule's waits and pace", "[time][phases]") {
  ModelSpec m = store().load_model("gpt-small");
  ClusterSpec c = four_ranks_on_two_cores();
  TrainingSpec t{.seq_len = 256, .global_batch = 8, .precision = Precision::fp32};
  ParallelConfig p{.tp = 1, .pp = 2, .dp = 2};
  Network net(c, 4);
  const CoreSharing sharing(c, p);
  REQUIRE(sharing.fills_waits());
  // Two equal stages of 1 s forward and 2 s backward per micro-batch, 4 micro-batches (8 / dp 2).
  // A stage running alone has its ranks' 2 cores to itself: twice the pace of both running.
  const std::vector<StageTime> st(2, StageTime{.forward_s = 1, .backward_s = 2});
  const PipelineTimeline run = play_pipeline({{1, 2}, {1, 2}}, 4, Schedule::one_f_one_b, 1,
                                             [](int running) { return running == 1 ? 2.0 : 1.0; });
  PipelineTime r = pipeline_time(m, net, t, p, st, 0, sharing);
  CHECK(r.bubble_s == run.makespan_s - run.busy_s[0]);
  CHECK(r.pace == run.busy_s[0] / (4 * 3.0));
  CHECK(r.pace < 1);  // the fill and drain ran at twice the pace
}

TEST_CASE("data-parallel phase: gradient reduction, parameter gather and the tied embedding", "[time][phases]") {
  ModelSpec m = store().load_model("llama-2-7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  c.comm_overlap_fraction = 1;
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 64, .zero_stage = 1};
  Network net(c, 64);
  const MemoryEstimate mem = estimate_memory(m, c, t, p);
  const double params = mem.stages[0].num_params;
  const GroupShape dp{64, 1};
  // One collective per 25 MiB bucket, each paying its latency.
  const double buckets = std::ceil(params * 2 / (25.0 * kMiB));
  const double scatter = buckets * net.cost(Collective::reduce_scatter, params * 2 / buckets, dp).time_s;
  const double gather = buckets * net.cost(Collective::all_gather, params * 2 / buckets, dp).time_s;
  CHECK(scatter > net.cost(Collective::reduce_scatter, params * 2, dp).time_s);
  // Without overlap everything shows.
  DataParallelComm serial = data_parallel_comm(m, net, t, p, mem, StageTime{}, OverlapOptions{false, false, false});
  CHECK(serial.grad_reduce_s == scatter);
  CHECK(serial.grad_reduce_hidden_s == 0);
  CHECK(serial.param_gather_s == gather);
  CHECK(serial.tied_embedding_s == 0);
  // Overlapped under a long backward and forward: only the last bucket's share of the reduction
  // shows, and none of the gather.
  const StageTime long_stage{.forward_s = 100, .backward_s = 100};
  DataParallelComm overlapped = data_parallel_comm(m, net, t, p, mem, long_stage, OverlapOptions{});
  CHECK(overlapped.grad_reduce_s == scatter / buckets);
  CHECK(overlapped.grad_reduce_hidden_s == scatter - scatter / buckets);
  CHECK(overlapped.param_gather_s == 0);
  CHECK(overlapped.param_gather_hidden_s == gather);
  // ZeRO-2 reduce-scatters in every one of the 4 micro-batches; ZeRO 0 all-reduces and gathers
  // nothing.
  p.zero_stage = 2;
  CHECK(data_parallel_comm(m, net, t, p, mem, StageTime{}, OverlapOptions{false, false, false}).grad_reduce_s ==
        4 * scatter);
  p.zero_stage = 0;
  DataParallelComm ddp = data_parallel_comm(m, net, t, p, mem, StageTime{}, OverlapOptions{false, false, false});
  CHECK_THAT(ddp.grad_reduce_s,
             WithinRel(buckets * net.cost(Collective::all_reduce, params * 2 / buckets, dp).time_s, 1e-12));
  CHECK(ddp.param_gather_s == 0);
  // Megatron's distributed optimizer buckets max(40 M, 1 M x dp) = 64 M parameters at dp 64.
  p.distributed_optimizer = true;
  CHECK(gradient_bucket_bytes(t, p) == 64e6 * 2);
  const double megatron_buckets = std::ceil(params * 2 / (64e6 * 2));
  CHECK_THAT(data_parallel_comm(m, net, t, p, mem, StageTime{}, OverlapOptions{false, false, false}).grad_reduce_s,
             WithinRel(megatron_buckets * net.cost(Collective::reduce_scatter, params * 2 / megatron_buckets, dp).time_s,
                       1e-12));
  p.distributed_optimizer = false;
  // A tied embedding across pp 2 (gpt3-175b, tp 8 on one node): its tp shard of gradients,
  // all-reduced between the two stages.
  ModelSpec tied = store().load_model("gpt3-175b");
  TrainingSpec t2{.seq_len = 2048, .global_batch = 16};
  ParallelConfig two_stages{.tp = 8, .pp = 2, .dp = 1};
  Network node(c, 16);
  const double bytes = double(padded_vocab(tied, t2, 8)) / 8 * tied.hidden_size * 2;
  CHECK(data_parallel_comm(tied, node, t2, two_stages, estimate_memory(tied, c, t2, two_stages), StageTime{},
                           OverlapOptions{})
            .tied_embedding_s == node.cost(Collective::all_reduce, bytes, GroupShape{2, 8}).time_s);
}

TEST_CASE("optimizer phase: AdamW over the local shard, or the host's step and PCIe traffic", "[time][phases]") {
  ModelSpec m = store().load_model("llama-2-7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 256};
  ParallelConfig p{.tp = 1, .pp = 1, .dp = 8, .zero_stage = 1};
  const MemoryEstimate mem = estimate_memory(m, c, t, p);
  const double local = mem.stages[0].num_params / 8;
  OptimizerTime on_gpu = optimizer_time(c.gpu, c, t, p, mem);
  CHECK(on_gpu.optimizer_s == optimizer_step_s(c.gpu, t, local));
  CHECK(on_gpu.offload_s == 0);
  // Offloaded: the gradients (Megatron's fp32 buffer: 4 bytes) and the 16-bit weights (2) a
  // parameter over 25 GB/s of PCIe, and 28 bytes a parameter of the node's 8 GPUs through 100 GB/s
  // of host memory.
  p.offload_optimizer = true;
  OptimizerTime offloaded = optimizer_time(c.gpu, c, t, p, mem);
  CHECK(offloaded.optimizer_s == 0);
  CHECK_THAT(offloaded.offload_s, WithinRel(local * 6 / 25e9 + local * 28 * 8 / 100e9, 1e-12));
}

TEST_CASE("without gradient-accumulation fusion each micro-batch adds its gradients in a pass of its own",
          "[time][phases]") {
  // Megatron-LM CI's 7B speed test layout (public3-NOTES.md section 16), with a smaller model: the
  // pass reads the 16-bit gradient and reads and writes Megatron's fp32 buffer (bf16 training's
  // gradients are fp32 there), 10 bytes a local parameter, once per micro-batch, on the critical
  // stage's backward; nothing else moves.
  const ModelSpec m = store().load_model("llama-2-7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const Network net(c, 8);
  for (const ParallelConfig& p : {ParallelConfig{.tp = 4, .dp = 2, .micro_batch = 2, .distributed_optimizer = true},
                                  ParallelConfig{.pp = 4, .dp = 2, .vpp = 4, .distributed_optimizer = true,
                                                 .schedule = Schedule::interleaved}}) {
    TrainingSpec t{.seq_len = 4096, .global_batch = 16};
    const MemoryEstimate mem = estimate_memory(m, c, t, p);
    const TimeBreakdown fused = estimate_time(m, net, t, p);
    t.gradient_accumulation_fusion = false;
    const TimeBreakdown unfused = estimate_time(m, net, t, p);
    double most_params = 0;
    for (const StageMemory& s : mem.stages) most_params = std::max(most_params, s.num_params);
    const double pass_s = most_params * 10 / (c.gpu.hbm_bandwidth_bytes_per_s * c.gpu.memory_efficiency);
    CAPTURE(p.tp, p.pp);
    CHECK(unfused_accumulation_s(c.gpu, t, p, most_params) == Approx(pass_s).epsilon(1e-12));
    CHECK(fused.backward_s < unfused.backward_s);
    // The critical stage's pass each micro-batch (the pipeline may pick another critical stage,
    // and its bubble slots grow with its chunks, so the step grows by at least the pass).
    CHECK(unfused.step_time_s - fused.step_time_s >= num_microbatches(t, p) * pass_s * 0.5);
    CHECK(unfused.step_time_s - fused.step_time_s <= num_microbatches(t, p) * pass_s * 1.5);
    // (The SMs hidden communication takes are shared out over forward and backward by their times.)
    CHECK_THAT(unfused.forward_s, WithinRel(fused.forward_s, 1e-3));
    CHECK(unfused.optimizer_s == fused.optimizer_s);
  }
}

TEST_CASE("Megatron-FSDP runs without gradient-accumulation fusion: priced so, as its export passes it",
          "[time][phases]") {
  const ModelSpec m = store().load_model("llama-2-7b");
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const Network net(c, 8);
  const TrainingSpec fused{.seq_len = 4096, .global_batch = 32};  // gradient_accumulation_fusion on
  TrainingSpec unfused = fused;
  unfused.gradient_accumulation_fusion = false;
  const ParallelConfig fsdp{.dp = 8, .zero_stage = 3}, dist_opt{.dp = 8, .distributed_optimizer = true};
  CHECK_FALSE(gradient_accumulation_fused(fused, fsdp));
  CHECK(gradient_accumulation_fused(fused, dist_opt));
  // Megatron-FSDP: the plan's flag changes nothing, the pass is priced either way.
  CHECK(estimate_time(m, net, fused, fsdp).step_time_s == estimate_time(m, net, unfused, fsdp).step_time_s);
  CHECK(estimate_time(m, net, fused, dist_opt).step_time_s < estimate_time(m, net, unfused, dist_opt).step_time_s);
}

TEST_CASE("summary: the step is the phases' sum, MFU and HFU follow from it", "[time][phases]") {
  Setup s = llama70b({.tp = 8, .pp = 4, .dp = 2, .recompute = Recompute::full});
  TimeBreakdown r;
  r.forward_s = 1, r.backward_s = 2, r.recompute_s = 1, r.tp_comm_s = 0.5, r.pp_bubble_s = 0.25, r.optimizer_s = 0.25;
  r.hidden_comm_s = 7;  // not on the critical path
  summarize(r, s.model, s.cluster, s.training, s.parallel);
  CHECK(r.step_time_s == 5);
  CHECK(r.tokens_per_s == 512.0 * 8192 / 5);
  CHECK(r.bubble_fraction == 0.25 / 5);
  const double flops = model_flops_per_step(s.model, s.training);
  CHECK_THAT(r.mfu, WithinRel(flops / (5 * 64 * 989e12), 1e-12));
  const double replay = s.model.num_layers * layer_forward_flops(s.model, 512.0 * 8192, 8192).total();
  CHECK_THAT(r.hfu, WithinRel((flops + replay) / (5 * 64 * 989e12), 1e-12));
}

TEST_CASE("core sharing: the identity on dedicated devices, the cores' share on a shared machine", "[time][phases]") {
  ClusterSpec gpus = store().load_cluster("dgx-h100");
  const CoreSharing dedicated(gpus, ParallelConfig{.tp = 2, .pp = 2, .dp = 16});
  CHECK_FALSE(dedicated.fills_waits());
  CHECK(dedicated.device(gpus.gpu) == gpus.gpu);
  CHECK(dedicated.tensor_parallel_pace(1.0, 0.5) == 1);

  ClusterSpec c = four_ranks_on_two_cores();
  // 4 ranks on 2 cores: each at half the pace.
  const CoreSharing shared(c, ParallelConfig{.tp = 1, .pp = 2, .dp = 2});
  REQUIRE(shared.fills_waits());
  const GpuSpec slow = shared.device(c.gpu);
  for (const auto& [precision, flops] : c.gpu.peak_flops_per_s) CHECK(slow.peak_flops_per_s.at(precision) == flops / 2);
  CHECK(slow.hbm_bandwidth_bytes_per_s == c.gpu.hbm_bandwidth_bytes_per_s / 2);
  CHECK(slow.kernel_overhead_s == c.gpu.kernel_overhead_s * 2);
  // One of two stages running: its 2 ranks have the 2 cores, twice the all-stages pace.
  CHECK(shared.pipeline_speed(1) == 2);
  CHECK(shared.pipeline_speed(2) == 1);
  // tp 2 x dp 2: a group's compute C = 1 s x share(4) / share(2) = 0.5 s at its alone pace and its
  // waits W = 0.5 s give Tc = C - W + sqrt((W - C)^2 + 2 C W) = sqrt(0.5) s (the closed form of
  // two groups; see the tensor-parallel test above).
  const CoreSharing groups(c, ParallelConfig{.tp = 2, .pp = 1, .dp = 2});
  CHECK_THAT(groups.tensor_parallel_pace(1.0, 0.5), WithinRel(std::sqrt(0.5), 1e-6));
  CHECK(groups.tensor_parallel_pace(1.0, 0) == 1);  // no waits: nothing to fill
}

TEST_CASE("FP8 never speeds a plan up 2x or more over BF16, and never slows it", "[time][law]") {
  // FP8 doubles only the linear layers' GEMM peak (at a lower MAMF fraction) and adds casts; the
  // attention core, element-wise work, communication and the optimizer stay as they were.
  ClusterSpec c = store().load_cluster("dgx-h100");
  struct Case {
    const char* model;
    int gpus, seq;
    ParallelConfig layout;
  };
  const Case cases[] = {
      {"llama-3-8b", 8, 8192, {.tp = 1, .pp = 1, .dp = 8}},
      {"llama-3-70b", 64, 4096, {.tp = 8, .pp = 4, .dp = 2, .distributed_optimizer = true, .sequence_parallel = true}},
      {"gpt3-175b", 128, 2048, {.tp = 8, .pp = 8, .dp = 2, .sequence_parallel = true}},
      {"gpt-7.5b", 16, 2048, {.tp = 2, .pp = 1, .dp = 8, .recompute = Recompute::full}},
  };
  for (const Case& k : cases) {
    CAPTURE(k.model);
    ModelSpec m = store().load_model(k.model);
    Network net(c, k.gpus);
    TrainingSpec bf16{.seq_len = k.seq, .global_batch = 256, .precision = Precision::bf16};
    TrainingSpec fp8 = bf16;
    fp8.precision = Precision::fp8;
    const double bf16_s = estimate_time(m, net, bf16, k.layout).step_time_s;
    const double fp8_s = estimate_time(m, net, fp8, k.layout).step_time_s;
    CHECK(fp8_s < bf16_s);
    CHECK(bf16_s / fp8_s < 2.0);
    // The GEMMs themselves gain less than 2x: FP8 MAMF is 0.709 of a peak twice as high.
    CHECK(bf16_s / fp8_s < 2 * 0.709 / 0.803);
  }
}

TEST_CASE("flash attention runs at the fused kernel's efficiency, lower on short context-parallel blocks",
          "[compute]") {
  GpuSpec gpu = store().load_gpu("h100-sxm5-80gb");
  REQUIRE(gpu.attention_forward_efficiency > 0);
  ModelSpec m = store().load_model("llama-3-8b");
  TrainingSpec t{.seq_len = 32768, .global_batch = 64};
  // Under FP8 the core still runs in 16 bits: the same time as BF16.
  TrainingSpec t8 = t;
  t8.precision = Precision::fp8;
  ParallelConfig one{.tp = 1, .pp = 1, .dp = 1};
  CHECK(layer_times(m, gpu, t, one).attention_core_s == layer_times(m, gpu, t8, one).attention_core_s);
  // cp 8 splits the queries 8 ways, but each of its ring steps sees 4K keys instead of 32K, so the
  // core takes more than 1/8 of the time.
  ParallelConfig cp8{.tp = 1, .pp = 1, .dp = 1, .cp = 8};
  const double whole = layer_times(m, gpu, t, one).attention_core_s;
  const double split = layer_times(m, gpu, t, cp8).attention_core_s;
  CHECK(split * 8 > 1.03 * whole);
  CHECK(split * 8 < 1.2 * whole);
}

namespace {
// rank_step_flops summed over every rank of the layout: each stage's tp x cp x dp ranks, the
// layers split evenly over pp, the head on the last stage.
RankStepFlops all_ranks_flops(const ModelSpec& m, const TrainingSpec& t, const ParallelConfig& p) {
  RankStepFlops sum;
  const int per_stage = m.num_layers / p.pp;
  for (int stage = 0; stage < p.pp; ++stage) {
    std::vector<int> layers;
    for (int i = 0; i < per_stage; ++i) layers.push_back(stage * per_stage + i);
    const RankStepFlops r = rank_step_flops(m, t, p, layers, stage == p.pp - 1);
    for (int i = 0; i < kNumFlopParts; ++i) {
      sum.forward[i] += double(p.tp) * p.cp * p.dp * r.forward[i];
      sum.recompute[i] += double(p.tp) * p.cp * p.dp * r.recompute[i];
    }
  }
  return sum;
}
double part_of(const FlopsByPart& f, FlopPart part) { return f[static_cast<int>(part)]; }
double all_parts(const FlopsByPart& f) {
  double sum = 0;
  for (double x : f) sum += x;
  return sum;
}
}  // namespace

TEST_CASE("rank FLOPs: over every rank, the model's FLOPs at the layout's splits; each part named once", "[compute]") {
  for (int i = 0; i < kNumFlopParts; ++i)
    CHECK(flop_part_from_string(to_string(static_cast<FlopPart>(i))) == static_cast<FlopPart>(i));
  CHECK_FALSE(flop_part_from_string("mlp_up"));

  SECTION("dense, flash: the causal half of the attention core, the rest as model_flops_per_step; full recompute "
          "replays every layer's forward") {
    const ModelSpec m = store().load_model("llama-3-8b");
    const TrainingSpec t{.seq_len = 8192, .global_batch = 16, .vocab_pad_multiple = 1};
    const ParallelConfig p{.tp = 2, .pp = 2, .dp = 2, .cp = 2, .micro_batch = 1, .recompute = Recompute::full};
    const RankStepFlops f = all_ranks_flops(m, t, p);
    const double tokens = double(t.global_batch) * t.seq_len;
    const LayerFlops layer = layer_forward_flops(m, tokens, t.seq_len);
    CHECK_THAT(part_of(f.forward, FlopPart::attention), WithinRel(0.5 * m.num_layers * layer.attention, 1e-12));
    CHECK_THAT(all_parts(f.forward) + 0.5 * m.num_layers * layer.attention,
               WithinRel(model_flops_per_step(m, t) / 3, 1e-12));
    CHECK_THAT(part_of(f.forward, FlopPart::head), WithinRel(head_forward_flops(m, tokens, m.vocab_size), 1e-12));
    CHECK_THAT(all_parts(f.recompute), WithinRel(all_parts(f.forward) - part_of(f.forward, FlopPart::head), 1e-12));
  }

  SECTION("eager attention computes every score, windowed or not; Megatron's selective replays the core") {
    ModelSpec m = store().load_model("mistral-7b");
    m.sliding_window = 1024;
    m.sliding_layers.clear();
    for (int l = 0; l < m.num_layers; ++l) m.sliding_layers.push_back(l);
    const ParallelConfig p{.tp = 2, .micro_batch = 1, .recompute = Recompute::selective};
    const double tokens = 4.0 * 4096;
    TrainingSpec t{.seq_len = 4096, .global_batch = 4, .attention = Attention::standard, .vocab_pad_multiple = 1};
    const RankStepFlops eager = all_ranks_flops(m, t, p);
    const double full_scores = m.num_layers * 2 * tokens * t.seq_len * (m.q_dim() + m.attn_out_dim());
    CHECK_THAT(part_of(eager.forward, FlopPart::attention), WithinRel(full_scores, 1e-12));
    CHECK_THAT(all_parts(eager.recompute), WithinRel(part_of(eager.forward, FlopPart::attention), 1e-12));
    t.attention = Attention::flash;
    const RankStepFlops flash = all_ranks_flops(m, t, p);
    // The window's keys, causal: s*w - w^2/2 a head, 2 (d + dv) FLOPs each.
    const double w = m.sliding_window, s = t.seq_len;
    CHECK_THAT(part_of(flash.forward, FlopPart::attention),
               WithinRel(m.num_layers * 4.0 * (s * w - w * w / 2) * m.num_heads * 2 * 2 * m.head_dim, 1e-12));
    CHECK_THAT(all_parts(flash.recompute), WithinRel(part_of(flash.forward, FlopPart::attention), 1e-12));
  }

  SECTION("MoE: every routed copy through its expert once, etp or not; the router once per token") {
    const ModelSpec m = store().load_model("mixtral-8x7b");
    const TrainingSpec t{.seq_len = 4096, .global_batch = 8, .vocab_pad_multiple = 1};
    const double tokens = 8.0 * 4096, h = m.hidden_size;
    for (const ParallelConfig& p : {ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1, .sequence_parallel = true},
                                    ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2}}) {
      const RankStepFlops f = all_ranks_flops(m, t, p);
      CHECK_THAT(part_of(f.forward, FlopPart::experts),
                 WithinRel(m.num_layers * tokens * m.experts_per_token * 6 * h * m.ffn_hidden_size, 1e-12));
      CHECK_THAT(part_of(f.forward, FlopPart::router), WithinRel(m.num_layers * 2 * tokens * h * m.num_experts, 1e-12));
      CHECK(part_of(f.forward, FlopPart::mlp) == 0);  // no shared expert, no dense layer
    }
  }

  SECTION("MLA: the down projections run on every tp rank, on all its tokens without sequence parallel") {
    const ModelSpec m = store().load_model("deepseek-v3");
    const TrainingSpec t{.seq_len = 4096, .global_batch = 4, .vocab_pad_multiple = 1};
    const double tokens = 4.0 * 4096, h = m.hidden_size;
    const double down = 2 * tokens * h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim);
    const double model_qkv = m.num_layers * layer_forward_flops(m, tokens, t.seq_len).qkv;
    ParallelConfig p{.tp = 4, .pp = 1, .dp = 1, .ep = 4, .etp = 1};
    CHECK_THAT(part_of(all_ranks_flops(m, t, p).forward, FlopPart::qkv),
               WithinRel(model_qkv + 3 * m.num_layers * down, 1e-12));
    p.sequence_parallel = true;
    CHECK_THAT(part_of(all_ranks_flops(m, t, p).forward, FlopPart::qkv), WithinRel(model_qkv, 1e-12));
  }
}
