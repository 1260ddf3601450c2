// Laws of the memory model, and the single-GPU case worked out by hand.
#include <algorithm>

#include <catch2/catch.hpp>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/time.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::WithinRel;

namespace {
double model_states(const StageMemory& s) { return s.weights_bytes + s.grads_bytes + s.optimizer_bytes; }
}  // namespace

TEST_CASE("tp = pp = dp = 1 equals the single-GPU formula", "[memory]") {
  // A GPT with dropout off, standard attention, fp16, no vocabulary padding.
  ModelSpec m = store().load_model("gpt-small");  // h=128, L=4, a=4, f=512, V=256, 256 positions
  m.attention_dropout = m.hidden_dropout = 0;
  ClusterSpec c = store().load_cluster("dgx-a100-80g");
  TrainingSpec t{.seq_len = 256, .global_batch = 8, .precision = Precision::fp16, .attention = Attention::standard,
                 .vocab_pad_multiple = 1};
  ParallelConfig p{.micro_batch = 2};
  MemoryEstimate e = estimate_memory(m, c, t, p);
  REQUIRE(e.stages.size() == 1);
  const StageMemory& s = e.stages[0];

  const double P = num_params(m);  // every parameter on the one GPU
  CHECK(s.weights_bytes == 2 * P);
  CHECK(s.grads_bytes == 2 * P);
  CHECK(s.optimizer_bytes == 12 * P);
  // Per layer, 16-bit, no dropout: norm inputs 2*2sbh, QKV input 2sbh, Q K V 6sbh, softmax 2as^2b,
  // out-proj input 2sbh, fc1 input 2sbh, GELU input and output 2*2sbf; LayerNorm mean+rstd 8sb each.
  const double sb = 256.0 * 2, h = 128, a = 4, sq = 256, f = 512;
  double per_layer = 2 * 2 * sb * h + 2 * sb * h + 6 * sb * h + 2 * a * sq * sq * 2 + 2 * sb * h + 2 * sb * h +
                     2 * 2 * sb * f + 2 * 8 * sb;
  double head = 2 * 2 * sb * h;                       // final norm input + LM head input
  // Backward's first GEMM (the LM head) holds dX [sb, h], dW [V, h] and its 16-bit dY [sb, V]
  // cast from the fp32 logits' gradient; fc2's pair, less the freed fp32 logits, is smaller here.
  double head_working = 2 * (sb * h + 256 * h) + 2 * sb * 256;
  double working = std::max(head_working, 2 * (sb * f + h * f) - 4 * sb * 256);
  CHECK(working == head_working);
  CHECK_THAT(s.activations_bytes, WithinRel(4 * per_layer + head + working, 1e-12));
  // The fp32 logits; the transient 16-bit ones (2 sb V) come before the head's backward, whose
  // working set (it holds the 16-bit dY) is the larger.
  CHECK_THAT(s.logits_bytes, WithinRel(4 * sb * 256, 1e-12));
  CHECK(s.buffers_bytes == 0);                        // nothing to reduce, no pipeline
  CHECK(s.reserve_bytes == c.gpu.framework_reserve_bytes);  // one rank: no communicator
  CHECK(e.peak_bytes == s.total_bytes());
}

TEST_CASE("memory per GPU never grows with tp (pp and dp fixed)", "[memory][law]") {
  ClusterSpec c = store().load_cluster("dgx-h100");
  for (const char* name : {"llama-3-70b", "gpt3-175b", "mixtral-8x7b"}) {
    ModelSpec m = store().load_model(name);
    for (bool sp : {false, true}) {
      double previous = 1e300;
      for (int tp : {1, 2, 4, 8}) {
        if (sp && tp == 1) continue;
        TrainingSpec t{.seq_len = 4096, .global_batch = 64};
        ParallelConfig p{.tp = tp, .pp = 2, .dp = 4, .sequence_parallel = sp};
        double peak = estimate_memory(m, c, t, p).peak_bytes;
        INFO(name << " tp " << tp << " sp " << sp);
        CHECK(peak <= previous);
        previous = peak;
      }
    }
  }
}

TEST_CASE("model states never grow with the ZeRO stage", "[memory][law]") {
  ModelSpec m = store().load_model("llama-3-8b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  for (int dp : {1, 2, 8, 64}) {
    double previous = 1e300;
    for (int zero : {0, 1, 2, 3}) {
      ParallelConfig p{.dp = dp, .zero_stage = zero};
      double states = model_states(estimate_memory(m, c, t, p).stages[0]);
      INFO("dp " << dp << " zero " << zero);
      CHECK(states <= previous);
      previous = states;
    }
  }
  SECTION("and the whole footprint shrinks with it when data parallel is wide") {
    double previous = 1e300;
    for (int zero : {0, 1, 2, 3}) {
      ParallelConfig p{.dp = 64, .zero_stage = zero};
      double peak = estimate_memory(m, c, t, p).peak_bytes;
      CHECK(peak < previous);
      previous = peak;
    }
  }
  SECTION("the distributed optimizer shards like ZeRO-1") {
    ParallelConfig zero1{.dp = 8, .zero_stage = 1}, dist{.dp = 8, .distributed_optimizer = true};
    CHECK(model_states(estimate_memory(m, c, t, zero1).stages[0]) ==
          model_states(estimate_memory(m, c, t, dist).stages[0]));
  }
}

TEST_CASE("the first 1F1B stage holds the most in-flight activations", "[memory][law]") {
  ModelSpec m = store().load_model("llama-3-70b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  for (Schedule schedule : {Schedule::one_f_one_b, Schedule::interleaved}) {
    ParallelConfig p{.tp = 8, .pp = 8, .dp = 1, .vpp = schedule == Schedule::interleaved ? 2 : 1,
                     .sequence_parallel = true, .schedule = schedule};
    MemoryEstimate e = estimate_memory(m, c, t, p);
    for (const auto& s : e.stages) {
      CHECK(s.activations_bytes <= e.stages[0].activations_bytes);
      CHECK(s.microbatches_in_flight <= e.stages[0].microbatches_in_flight);
    }
  }
  SECTION("GPipe holds every micro-batch on every stage, more than 1F1B") {
    ParallelConfig gpipe{.tp = 8, .pp = 8, .dp = 1, .schedule = Schedule::gpipe};
    ParallelConfig one{.tp = 8, .pp = 8, .dp = 1, .schedule = Schedule::one_f_one_b};
    TrainingSpec small{.seq_len = 8192, .global_batch = 32};
    // Llama has no embedding dropout, so stage 0 holds only layer activations: 32 vs 8 micro-batches.
    // Plus, once, the working set of backward's first GEMM.
    const double working = backward_working_set_bytes(m, small, one, false);
    CHECK_THAT(estimate_memory(m, c, small, gpipe).stages[0].activations_bytes - working,
               WithinRel(4 * (estimate_memory(m, c, small, one).stages[0].activations_bytes - working), 1e-12));
    CHECK(estimate_memory(m, c, small, gpipe).stages[0].microbatches_in_flight == 32);
  }
}

TEST_CASE("recompute, flash attention and sequence parallel only ever save activation memory", "[memory][law]") {
  ModelSpec m = store().load_model("gpt3-175b");
  ClusterSpec c = store().load_cluster("dgx-a100-80g");
  TrainingSpec standard{.seq_len = 2048, .global_batch = 64, .attention = Attention::standard};
  TrainingSpec flash = standard;
  flash.attention = Attention::flash;
  auto act = [&](const TrainingSpec& t, Recompute r, bool sp) {
    ParallelConfig p{.tp = 8, .pp = 8, .dp = 1, .sequence_parallel = sp, .recompute = r};
    return estimate_memory(m, c, t, p).stages[0].activations_bytes;
  };
  CHECK(act(standard, Recompute::selective, false) < act(standard, Recompute::none, false));
  CHECK(act(standard, Recompute::full, false) < act(standard, Recompute::selective, false));
  CHECK(act(flash, Recompute::none, false) < act(standard, Recompute::none, false));
  CHECK(act(standard, Recompute::none, true) < act(standard, Recompute::none, false));
}

TEST_CASE("optimizer offload moves optimizer bytes to host memory", "[memory]") {
  ModelSpec m = store().load_model("llama-3-8b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  MemoryEstimate on = estimate_memory(m, c, t, ParallelConfig{.dp = 8, .zero_stage = 2, .offload_optimizer = true});
  MemoryEstimate off = estimate_memory(m, c, t, ParallelConfig{.dp = 8, .zero_stage = 2});
  CHECK(on.stages[0].optimizer_bytes == 0);
  // bf16: the 12 bytes of master weights and moments, plus the 4-byte fp32 gradient copy.
  CHECK(on.stages[0].host_bytes == Approx(off.stages[0].optimizer_bytes * 16 / 12));
  CHECK(on.host_bytes_per_node == Approx(8 * on.stages[0].host_bytes));
  CHECK(on.fits);
}

TEST_CASE("a layout that does not fit says which stage and what dominates", "[memory]") {
  ModelSpec m = store().load_model("llama-3-70b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 8192, .global_batch = 64};
  MemoryEstimate e = estimate_memory(m, c, t, ParallelConfig{.dp = 1});
  CHECK_FALSE(e.fits);
  const std::vector<std::string> reasons = memory_problems(e);
  REQUIRE(reasons.size() == 1);
  CHECK_THAT(reasons[0], Catch::Matchers::Contains("stage 0 needs"));
  CHECK_THAT(reasons[0], Catch::Matchers::Contains("largest: optimizer"));
}

TEST_CASE("expert parallel shards the experts and only them", "[memory]") {
  ModelSpec m = store().load_model("mixtral-8x7b");
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  double ep1 = estimate_memory(m, c, t, ParallelConfig{.tp = 1, .pp = 1, .dp = 8, .ep = 1}).stages[0].num_params;
  double ep8 = estimate_memory(m, c, t, ParallelConfig{.tp = 1, .pp = 1, .dp = 8, .ep = 8}).stages[0].num_params;
  LayerParams layer = layer_params(m);
  CHECK_THAT(ep1 - ep8, WithinRel(m.num_layers * layer.experts * 7.0 / 8.0, 1e-12));
}

TEST_CASE("one GPU holds every parameter of today's models exactly once", "[memory]") {
  // MLA's latents, shared experts, router biases, q/k norms, sinks and the dense layers of MoE
  // models: the per-GPU count (memory.cpp) and the model's count (model.cpp) must agree.
  ClusterSpec c = store().load_cluster("dgx-h100");
  TrainingSpec t{.seq_len = 4096, .global_batch = 8};
  for (const char* name : {"nemotron-4-340b", "qwen3-8b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"}) {
    INFO(name);
    ModelSpec m = store().load_model(name);
    MemoryEstimate e = estimate_memory(m, c, t, ParallelConfig{.tp = 1, .pp = 1, .dp = 1, .ep = 1});
    CHECK_THAT(e.stages[0].num_params, WithinRel(num_params(m) + mtp_params(m), 1e-12));
  }
  // MLA's down projections and latent norms stay whole on every tensor-parallel rank.
  ModelSpec ds = store().load_model("deepseek-v3");
  const double tp1 = estimate_memory(ds, c, t, ParallelConfig{.tp = 1, .pp = 1, .dp = 1}).stages[0].num_params;
  const double tp8 = estimate_memory(ds, c, t, ParallelConfig{.tp = 8, .pp = 1, .dp = 1}).stages[0].num_params;
  const double down = 7168.0 * 1536 + 1536 + 7168.0 * (512 + 64) + 512;
  CHECK(tp8 * 8 - tp1 > 7 * ds.num_layers * down);
}

TEST_CASE("what a rank holds outside the allocator: the profile's reserve and NCCL's buffers per communicator",
          "[memory]") {
  ClusterSpec c = store().load_cluster("dgx-h100");
  REQUIRE(c.gpu.nccl_buffers_per_communicator_bytes > 0);
  CHECK(nccl_communicators(ParallelConfig{}) == 0);
  CHECK(nccl_communicators(ParallelConfig{.dp = 8}) == 1);
  // tp, cp, the gradients' dp x cp group and the pipeline's send and receive.
  CHECK(nccl_communicators(ParallelConfig{.tp = 4, .pp = 4, .dp = 2, .cp = 2}) == 4);
  // cp alone still reduces gradients over its dp x cp group, a communicator of its own.
  CHECK(nccl_communicators(ParallelConfig{.cp = 2}) == 2);
  // Experts over ep 8 of dp 8: the data-parallel and the expert group; expert dp is 1.
  CHECK(nccl_communicators(ParallelConfig{.dp = 8, .ep = 8}) == 2);
  CHECK(nccl_communicators(ParallelConfig{.dp = 16, .ep = 8}) == 3);
  const ParallelConfig p{.tp = 8, .dp = 8};
  CHECK(outside_allocator_bytes(c.gpu, p) == c.gpu.framework_reserve_bytes + 2 * c.gpu.nccl_buffers_per_communicator_bytes);
  ModelSpec m = store().load_model("llama-3-8b");
  TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  for (const StageMemory& s : estimate_memory(m, c, t, p).stages) CHECK(s.reserve_bytes == outside_allocator_bytes(c.gpu, p));
  // The CPU profile's gloo keeps nothing on a device.
  ClusterSpec cpu = store().load_cluster("local-cpu");
  CHECK(outside_allocator_bytes(cpu.gpu, p) == cpu.gpu.framework_reserve_bytes);
}

TEST_CASE("each engine's memory: gradients' dtype, FSDP2's fp32 shards, DeepSpeed's live parameters, op-level selective",
          "[memory][engine]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ModelSpec m = store().load_model("llama-3-8b");
  TrainingSpec megatron{.seq_len = 4096, .global_batch = 64};
  TrainingSpec titan = megatron, ds = megatron;
  titan.engine = engine_mechanics(Engine::torchtitan);
  ds.engine = engine_mechanics(Engine::deepspeed);

  SECTION("gradients are fp32 where the engine keeps them so, unless told --grad-reduce-in-bf16") {
    CHECK(gradients_in_fp32(megatron));
    CHECK(bytes_per_param(megatron).grads == 4);
    TrainingSpec bf16 = megatron;
    bf16.grad_reduce_in_bf16 = true;
    CHECK_FALSE(gradients_in_fp32(bf16));
    CHECK(bytes_per_param(bf16).grads == 2);
    CHECK_FALSE(gradients_in_fp32(ds));
    CHECK(gradients_in_fp32(titan));  // FSDP2's reduce_dtype float32
    TrainingSpec fp16 = megatron;
    fp16.precision = Precision::fp16;
    CHECK_FALSE(gradients_in_fp32(fp16));  // Megatron's fp32 rule is bf16's
    CHECK(gradient_reduce_bytes(megatron) == 2);  // the time model's reduce stays 16-bit (memory.h)
    TrainingSpec both = bf16;
    both.fp32_grads = true;
    CHECK_THROWS_WITH(validate(m, c, both, ParallelConfig{.dp = 8}, 8), Catch::Contains("--grad-reduce-in-bf16"));
  }

  SECTION("bf16 Adam moments: TE's master remainder and two bf16 moments, 2 + 2 + 2 bytes, and in the checkpoint") {
    TrainingSpec bf16_moments = megatron;
    bf16_moments.bf16_adam_moments = true;
    CHECK(bytes_per_param(bf16_moments).optimizer == 6);
    CHECK(bytes_per_param(megatron).optimizer == 12);
    TrainingSpec fp32 = bf16_moments;
    fp32.precision = Precision::fp32;
    CHECK(bytes_per_param(fp32).optimizer == 4);
    bf16_moments.engine = titan.engine;  // FSDP2's fp32 shard is the master: 4 + 4 + 4
    CHECK(model_state_bytes(8e9, 8, bf16_moments, ParallelConfig{.dp = 8, .zero_stage = 3}).optimizer_bytes == 4e9);
    CHECK(checkpoint_bytes_per_param(bf16_moments).moments == 4);
    CHECK(checkpoint_bytes_per_param(megatron).moments == 8);
  }

  SECTION("FSDP2 keeps fp32 shards, the master copy: the same 16 bytes per parameter, split 4 + 4 + 8") {
    const ParallelConfig p{.dp = 8, .zero_stage = 3};
    const ModelStateBytes fsdp2 = model_state_bytes(1e9, 8, titan, p);
    CHECK(fsdp2.weights_bytes == 4e9 / 8);
    CHECK(fsdp2.grads_bytes == 4e9 / 8);
    CHECK(fsdp2.optimizer_bytes == 8e9 / 8);
    TrainingSpec bf16_grads = megatron;
    bf16_grads.grad_reduce_in_bf16 = true;
    const ModelStateBytes zero3 = model_state_bytes(1e9, 8, bf16_grads, p);
    CHECK(zero3.total_gpu_bytes() == fsdp2.total_gpu_bytes());
    // Its buffers: two gathered 16-bit blocks, and one block's 16-bit gradients with their fp32 cast.
    const MemoryEstimate e = estimate_memory(m, c, titan, p);
    const double layer = layer_params(m).total();
    CHECK_THAT(e.stages[0].buffers_bytes, WithinRel(2 * layer * 2 + layer * (2 + 4), 1e-12));
  }

  SECTION("DeepSpeed ZeRO-3 keeps at most stage3_max_live_parameters gathered, plus the tensor in use") {
    const ModelSpec big = store().load_model("llama-3-70b");
    const ParallelConfig p{.dp = 64, .zero_stage = 3};
    const double live = ds.engine.sharded.max_live_params;
    REQUIRE(live == 1e9);
    const double fc1 = 2.0 * big.hidden_size * big.ffn_hidden_size;  // gate and up, fused
    const double grads_bucket = ds.bucket_bytes / 2 + fc1;
    const MemoryEstimate e = estimate_memory(big, c, ds, p);
    const double slice = layer_params(big).total() * 2 / 64;
    CHECK_THAT(e.stages[0].buffers_bytes, WithinRel((live + fc1) * 2 + grads_bucket * 2 + slice, 1e-12));
    // Megatron-FSDP gathers whole layers: two of them, more than DeepSpeed's limit here.
    const MemoryEstimate whole = estimate_memory(big, c, megatron, p);
    CHECK(whole.stages[0].buffers_bytes > e.stages[0].buffers_bytes);
  }

  SECTION("torchtitan's selective recompute keeps the input, q, v, the attention's output, up and down") {
    ParallelConfig p{.dp = 8, .recompute = Recompute::selective};
    const double tokens = 4096, h = m.hidden_size, q = m.q_dim(), kv = m.kv_dim(), f = m.ffn_hidden_size;
    const double expected = 2 * tokens * (h + q + kv + q + f + h) + 4.0 * m.num_heads * tokens;
    CHECK(stored_activation_bytes_per_layer(m, titan, p) == Approx(expected));
    // Megatron's selective (core_attn) drops only the s^2 tensors, none with flash attention, and
    // flash attention's fp32 log-sum-exp.
    ParallelConfig none = p;
    none.recompute = Recompute::none;
    CHECK(stored_activation_bytes_per_layer(m, megatron, p) ==
          Approx(stored_activation_bytes_per_layer(m, megatron, none) - 4.0 * m.num_heads * tokens));
    CHECK(stored_activation_bytes_per_layer(m, titan, p) < 0.6 * stored_activation_bytes_per_layer(m, titan, none));
    // With tensor parallel the two reduce-scatters' outputs are kept too, sequence-sharded.
    ParallelConfig tp{.tp = 2, .dp = 4, .sequence_parallel = true, .recompute = Recompute::selective};
    const double tp_expected = 2 * tokens * (h / 2 + q / 2 + kv / 2 + q / 2 + f / 2 + h) + 4.0 * m.num_heads / 2 * tokens +
                               2 * 2 * tokens * h / 2;
    CHECK(stored_activation_bytes_per_layer(m, titan, tp) == Approx(tp_expected));
    // The recompute reruns k, the output projection, w3 and the element-wise work, not the attention.
    const OpPolicyShares share = op_policy_recompute_shares(m);
    CHECK(share.qkv == Approx(kv / (q + 2 * kv)));
    CHECK(share.mlp == Approx(1.0 / 3));
    const LayerTimes op = layer_times(m, c.gpu, titan, p);
    const LayerTimes core = layer_times(m, c.gpu, megatron, p);
    CHECK(op.recompute_s > core.recompute_s);
    CHECK(op.recompute_s < op.forward_s - op.attention_core_s + 1e-12);
  }
}

TEST_CASE("MoE: the dispatcher's buffers at the balanced count, and dropless routing's worst case stated apart",
          "[memory][moe]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ModelSpec mixtral = store().load_model("mixtral-8x7b");
  const ModelSpec dense = store().load_model("llama-3-8b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig p{.tp = 2, .dp = 4, .ep = 8, .etp = 1, .sequence_parallel = true};
  CHECK(moe_dispatch_bytes(dense, t, p) == 0);
  CHECK(moe_worst_case_imbalance(dense, p) == 1);
  // k 2 copies of the rank's 4096 / 2 tokens (etp 1 of tp 2), permuted and received.
  CHECK(moe_dispatch_bytes(mixtral, t, p) == Approx(2 * 2 * 2.0 * 4096 * 4096 / 2));
  // One expert a rank (8 over ep 8): a token sends it at most 1 of its 2 copies, from all 8 ranks.
  CHECK(moe_worst_case_imbalance(mixtral, p) == 4);
  CHECK(moe_worst_case_imbalance(store().load_model("deepseek-v3"), ParallelConfig{.dp = 64, .ep = 64}) == 32);
  CHECK(moe_worst_case_imbalance(mixtral, ParallelConfig{.dp = 8}) == 1);  // every expert on every rank
  const MemoryEstimate e = estimate_memory(mixtral, c, t, p);
  const LayerActivations a = activations_per_layer(mixtral, t, p);
  REQUIRE(a.routed_expert_bytes > 0);
  CHECK(a.routed_expert_bytes < a.mlp_bytes);
  CHECK(e.stages[0].moe_worst_case_extra_bytes == Approx(3 * a.routed_expert_bytes * mixtral.num_layers));
  CHECK(e.stages[0].moe_worst_case_extra_bytes > 0);
  CHECK(e.stages[0].total_bytes() < e.stages[0].total_bytes() + e.stages[0].moe_worst_case_extra_bytes);
  // Full recompute keeps only the layer's input: nothing of the experts to grow.
  ParallelConfig full = p;
  full.recompute = Recompute::full;
  CHECK(estimate_memory(mixtral, c, t, full).stages[0].moe_worst_case_extra_bytes == 0);
}

TEST_CASE("Megatron's --recompute-modules: what each module drops from a layer's stored set and replays", "[memory]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 1024};
  const ParallelConfig none{.tp = 2, .dp = 32, .ep = 8, .etp = 1, .sequence_parallel = true};
  ParallelConfig p = none;
  p.recompute = Recompute::selective;
  auto with = [&](const char* modules) {
    TrainingSpec x = t;
    x.recompute_modules = recompute_modules_from_string(modules);
    return x;
  };

  SECTION("names read and written in Megatron's order; unknown ones are refused with the choices") {
    CHECK(to_string(with("mlp,layernorm moe_act").recompute_modules, " ") == "moe_act layernorm mlp");
    CHECK(RecomputeModules{}.is_default());
    CHECK(to_string(RecomputeModules{}, ",") == "core_attn");
    CHECK_THROWS_WITH(recompute_modules_from_string("mlp,attn"),
                      Catch::Contains("\"attn\"") && Catch::Contains("core_attn, moe_act, layernorm"));
    CHECK_THROWS_AS(recompute_modules_from_string(" , "), InputError);
  }

  SECTION("a dense model: mlp keeps only the MLP's input; each module only ever saves memory") {
    const ModelSpec m = store().load_model("llama-3-8b");
    const ParallelConfig d{.tp = 2, .dp = 4, .sequence_parallel = true, .recompute = Recompute::selective};
    const double tokens = 4096, h = m.hidden_size;
    const LayerActivations a = activations_per_layer(m, t, d);
    // mlp alone: the attention's whole set and the MLP checkpoint's input, the hidden state (h/sp, 2 bytes).
    CHECK(stored_activation_bytes_per_layer(m, with("mlp"), d) == Approx(a.attention_bytes + 2 * tokens * h / 2));
    ParallelConfig off = d;
    off.recompute = Recompute::none;
    const double all = stored_activation_bytes_per_layer(m, t, off);
    double previous = all;
    for (const char* modules : {"core_attn", "core_attn,mlp"}) {
      const double stored = stored_activation_bytes_per_layer(m, with(modules), d);
      CHECK(stored < previous);
      previous = stored;
    }
    // MoE and MLA modules change nothing in a dense, non-MLA model.
    CHECK(stored_activation_bytes_per_layer(m, with("core_attn,moe,moe_act,shared_experts,mla_up_proj,layernorm"), d) ==
          Approx(stored_activation_bytes_per_layer(m, with("core_attn"), d)));
    // The replay: mlp reruns the MLP's GEMMs and one of the layer's two forward tensor-parallel collectives.
    const LayerTimes core = layer_times(m, c.gpu, with("core_attn"), d);
    const LayerTimes both = layer_times(m, c.gpu, with("core_attn,mlp"), d);
    CHECK(both.recompute_s > core.recompute_s + core.mlp_forward_s - 1e-12);
    CHECK(both.recompute_s < both.forward_s);
    CHECK(recomputed_comm(m, with("core_attn,mlp"), d).tp == 0.5);
    CHECK(recomputed_comm(m, with("core_attn"), d).tp == 0);
    CHECK(recomputed_comm(m, with("core_attn"), d).cp == 1);
    const LayerFlops lf = layer_forward_flops(m, tokens, tokens);
    CHECK(recompute_flops(m, with("core_attn"), d, tokens, tokens) == Approx(m.num_layers * lf.attention));
    CHECK(recompute_flops(m, with("core_attn,mlp"), d, tokens, tokens) ==
          Approx(m.num_layers * (lf.attention + lf.mlp)));
  }

  SECTION("DeepSeek-V3: MLA's up projections, the MoE layer's norm, its experts' activations, the whole MoE layer") {
    const ModelSpec m = store().load_model("deepseek-v3");
    REQUIRE(m.is_mla());
    REQUIRE(m.is_moe());
    const double core = stored_activation_bytes_per_layer(m, with("core_attn"), p);
    // Each module alone saves memory beside core_attn, and the model-zoo set saves more than each.
    const double zoo = stored_activation_bytes_per_layer(m, with("core_attn,layernorm,mla_up_proj,mlp,moe_act"), p);
    for (const char* one : {"layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts", "moe"}) {
      INFO(one);
      const double stored = stored_activation_bytes_per_layer(m, with((std::string("core_attn,") + one).c_str()), p);
      CHECK(stored < core);
      if (std::string(one) != "moe" && std::string(one) != "shared_experts") CHECK(zoo <= stored);
    }
    // The whole MoE layer subsumes its activations and shared experts.
    const double moe = stored_activation_bytes_per_layer(m, with("core_attn,moe"), p);
    CHECK(moe < stored_activation_bytes_per_layer(m, with("core_attn,moe_act,shared_experts"), p));
    CHECK(stored_activation_bytes_per_layer(m, with("core_attn,moe,moe_act,shared_experts"), p) == Approx(moe));
    // moe_act drops the routed experts' down-projection input: k copies of T/tp tokens' f columns, weighted by
    // the MoE layers' share.
    const double tokens = 4096;
    CHECK(core - stored_activation_bytes_per_layer(m, with("core_attn,moe_act"), p) ==
          Approx(m.moe_layer_fraction() * m.experts_per_token * 2 * tokens * m.ffn_hidden_size / 2));
    // Memory: the routed experts' dropless worst case is gone with the whole MoE layer recomputed.
    CHECK(estimate_memory(m, c, with("core_attn,moe"), p).stages[0].moe_worst_case_extra_bytes == 0);
    CHECK(estimate_memory(m, c, with("core_attn,moe_act"), p).stages[0].moe_worst_case_extra_bytes > 0);
    // Time: moe replays the experts' GEMMs and its dispatch and combine.
    CHECK(recomputed_comm(m, with("core_attn,moe"), p).ep == 1);
    CHECK(recomputed_comm(m, with("core_attn,moe_act"), p).ep == 0);
    const LayerTimes base = layer_times(m, c.gpu, with("core_attn"), p);
    const LayerTimes zoo_t = layer_times(m, c.gpu, with("core_attn,layernorm,mla_up_proj,mlp,moe_act"), p);
    const LayerTimes all_moe = layer_times(m, c.gpu, with("core_attn,moe"), p);
    CHECK(zoo_t.recompute_s > base.recompute_s);
    CHECK(all_moe.recompute_s > zoo_t.recompute_s);
    CHECK(all_moe.recompute_s < all_moe.forward_s);
    CHECK(megatron_recompute_shares(m, with("mla_up_proj").recompute_modules).qkv > 0);
    CHECK(megatron_recompute_shares(m, with("mla_up_proj").recompute_modules).qkv < 1);
    // Other engines' selective recompute is their own: the modules change nothing there.
    TrainingSpec titan = with("core_attn,moe");
    titan.engine = engine_mechanics(Engine::torchtitan);
    TrainingSpec titan_default = t;
    titan_default.engine = titan.engine;
    CHECK(stored_activation_bytes_per_layer(m, titan, p) == stored_activation_bytes_per_layer(m, titan_default, p));
  }
}

TEST_CASE("multi-token prediction: its modules, an embedding copy, their activations and logits on the last stage",
          "[memory]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ModelSpec with = store().load_model("deepseek-v3");
  REQUIRE(with.mtp_layers == 1);
  ModelSpec without = with;
  without.mtp_layers = 0;
  const TrainingSpec t{.seq_len = 4096, .global_batch = 1024};
  const ParallelConfig p{.tp = 2, .pp = 8, .dp = 64, .ep = 64, .etp = 1, .micro_batch = 1,
                         .distributed_optimizer = true, .sequence_parallel = true};
  const std::vector<StageParams> a = stage_params(with, p, with.vocab_size), b = stage_params(without, p, with.vocab_size);
  for (int i = 0; i + 1 < p.pp; ++i) CHECK(a[i].dense + a[i].expert == b[i].dense + b[i].expert);
  // The last stage: one MoE layer on this GPU, its norms and eh_proj (over tp 2), and the embedding copy.
  const double h = with.hidden_size, copy = with.vocab_size * h / 2;
  CHECK(a.back().embedding_copy == copy);
  CHECK(b.back().embedding_copy == 0);
  CHECK(a.back().expert - b.back().expert == Approx(256.0 / 64 * 3 * h * 2048));
  CHECK(a.back().dense - b.back().dense > copy + 2 * h * h / 2);
  const MemoryEstimate ea = estimate_memory(with, c, t, p), eb = estimate_memory(without, c, t, p);
  for (int i = 0; i + 1 < p.pp; ++i) CHECK(ea.stages[i].total_bytes() == eb.stages[i].total_bytes());
  const StageMemory &la = ea.stages.back(), &lb = eb.stages.back();
  CHECK(la.logits_bytes == Approx(2 * lb.logits_bytes));
  CHECK(la.activations_bytes > lb.activations_bytes + stored_activation_bytes_per_layer(with, t, p) - 1);
  CHECK(la.weights_bytes > lb.weights_bytes);
  // Its FLOPs (Megatron's count): a layer, the 2h x h projection and a head per module.
  const double tokens = double(t.global_batch) * t.seq_len;
  CHECK(model_flops_per_step(with, t) - model_flops_per_step(without, t) ==
        Approx(3 * (layer_forward_flops(with, tokens, t.seq_len).total() + 4 * tokens * h * h +
                    head_forward_flops(with, tokens, with.vocab_size))));
  // Time: the last stage runs the module's layer and head; the others are as they were.
  const Network net(c, p.world_size());
  const TimeBreakdown ta = estimate_time(with, net, t, p), tb = estimate_time(without, net, t, p);
  CHECK(ta.step_time_s > tb.step_time_s);
}

TEST_CASE("Megatron's fused cross-entropy and deferred embedding weight gradients on the last stage", "[memory]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ModelSpec m = store().load_model("llama-3-8b");
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig p{.tp = 2, .pp = 2, .dp = 2, .micro_batch = 2, .sequence_parallel = true};
  const MemoryEstimate base = estimate_memory(m, c, t, p);
  const double tokens = 2 * 4096, vocab_local = padded_vocab(m, t, 2) / 2.0;
  SECTION("the fused loss: one more fp32 logits tensor at the loss's forward, on the last stage only") {
    TrainingSpec fused = t;
    fused.cross_entropy_fusion = true;
    const MemoryEstimate e = estimate_memory(m, c, fused, p);
    CHECK(e.stages[0].total_bytes() == base.stages[0].total_bytes());
    CHECK(e.stages[1].total_bytes() > base.stages[1].total_bytes());
    CHECK(e.stages[1].total_bytes() - base.stages[1].total_bytes() <= 4 * tokens * vocab_local * 1.000001);
  }
  SECTION("deferral: each deferred micro-batch's 16-bit output gradient and input until the flush") {
    const int microbatches = num_microbatches(t, p);
    REQUIRE(microbatches == 16);
    auto extra = [&](std::optional<int> limit, const ParallelConfig& layout) {
      TrainingSpec d = t;
      d.embedding_wgrad_deferral = limit;
      return estimate_memory(m, c, d, layout).stages.back().logits_bytes -
             estimate_memory(m, c, t, layout).stages.back().logits_bytes;
    };
    const double one = 2 * tokens * (vocab_local + m.hidden_size);
    CHECK(extra(2, p) == Approx(2 * one));
    CHECK(extra(0, p) == Approx(16 * one));   // 0: every micro-batch
    CHECK(extra(64, p) == Approx(16 * one));  // no more than the step has
    ParallelConfig flat = p;
    flat.pp = 1;
    flat.dp = 4;
    CHECK(extra(2, flat) == 0);  // nothing to defer to without a pipeline flush
  }
}

TEST_CASE("torchtitan's float8 keeps 16-bit GEMM inputs and no FP8 weight copy; Transformer Engine's are FP8", "[memory]") {
  const ClusterSpec c = store().load_cluster("dgx-h100");
  const ModelSpec m = store().load_model("llama-3-8b");
  TrainingSpec bf16{.seq_len = 4096, .global_batch = 64};
  bf16.engine = engine_mechanics(Engine::torchtitan);
  TrainingSpec fp8 = bf16;
  fp8.precision = Precision::fp8;
  TrainingSpec te = fp8;
  te.engine = engine_mechanics(Engine::megatron);
  const ParallelConfig p{.tp = 2, .dp = 4, .sequence_parallel = true};
  CHECK(stored_activation_bytes_per_layer(m, fp8, p) == stored_activation_bytes_per_layer(m, bf16, p));
  CHECK(stored_activation_bytes_per_layer(m, te, p) < stored_activation_bytes_per_layer(m, fp8, p));
  CHECK(bytes_per_param(fp8).weights == 2);
  CHECK(bytes_per_param(te).weights == 3);
  // Under FSDP2 the fp32 shards are the weights whatever the precision.
  const ParallelConfig fsdp{.dp = 8, .zero_stage = 3};
  CHECK(estimate_memory(m, c, fp8, fsdp).stages[0].weights_bytes == estimate_memory(m, c, bf16, fsdp).stages[0].weights_bytes);
}
