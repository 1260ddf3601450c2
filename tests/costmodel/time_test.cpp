// Compute FLOPs, GEMM speed and the step-time laws.
#include "dplan/costmodel/time.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
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
  // H100 Megatron runs reach 41-49 % MFU (HARDWARE.md 4.2); a sane model lands near there.
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
  ClusterSpec c = store().load_cluster("local-cpu");
  c.gpus_per_node = 4;
  c.cores_per_node = 2;
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
  ClusterSpec c = store().load_cluster("local-cpu");
  c.gpus_per_node = 4;
  c.cores_per_node = 2;
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
  const double bytes = double(padded_vocab(m, t, p.tp)) / p.tp * m.hidden_size * bytes_per_param(t).grads;
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
