// The engine a plan runs on, as far as its cost goes: each engine implements the same layout its
// own way (how sharded data parallel gathers parameters, what overlaps with what, how fast its
// kernels are), so a prediction names the engine it prices. The engines are those dplan hands plans
// to (planner/engines.h describes their files, rules and logs); this header owns their ids, their
// names and how each implements a layout, one row per engine version whose code was read.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dplan::costmodel {

// An engine's id (the planner's engine table is in this order).
enum class Engine { megatron, torchtitan, deepspeed, accelerate, torchrun, slurm };

// "megatron", "torchtitan", "deepspeed", "accelerate", "torchrun", "slurm"
const char* to_string(Engine engine);
std::vector<std::string> engine_names();
std::optional<Engine> engine_from_string(std::string_view name);

// What one all-gather or reduce-scatter of sharded data parallel (ZeRO-3, FSDP) covers.
enum class ShardUnit {
  layer,      // one collective per transformer layer (FSDP's wrapped block, a flat bucket)
  parameter,  // one collective per parameter tensor (DeepSpeed ZeRO-3's partitioned parameters)
};

// How an engine runs ZeRO-3 / FSDP: the parameters of each unit are all-gathered before its
// forward and its backward, and its gradients reduce-scattered after its backward.
struct ShardedDataParallel {
  ShardUnit unit = ShardUnit::layer;
  // Seconds per rank of the group that each collective costs besides its transfer: where the
  // collective's output is a list of one tensor per rank, the process group gathers into one buffer
  // and copies it out rank by rank (and in, for a reduce-scatter), one copy_ each, launched from
  // the host. 0: one flat buffer, no per-rank work. Fitted where an engine has it (engine.cpp).
  double per_rank_s = 0;
  // The part of a layer's gathers and reduce-scatters its compute can hide (times the cluster's
  // comm_overlap_fraction): 1 where the next gather is prefetched under the current layer's compute;
  // 0 where the engine synchronizes the device before each gather. Fitted where an engine's
  // published runs show less (engine.cpp).
  double prefetch_overlap = 1;
  // Full recompute runs a layer's forward again inside its backward; true: the engine gathers the
  // layer's parameters again for it (it released them after the first forward).
  bool regather_for_recompute = false;
  // Memory: how many gathered parameters an engine that gathers parameter by parameter keeps live
  // (DeepSpeed's stage3_max_live_parameters): past it, parameters not in use are released. 0: the
  // engine holds whole units (a layer in use and the next one prefetched).
  double max_live_params = 0;
  bool operator==(const ShardedDataParallel&) const = default;
};

// What --recompute selective recomputes, as the engine implements it.
enum class SelectiveRecompute {
  // Megatron-LM's --recompute-granularity selective (core_attn): the attention core's s^2 tensors
  // (Korthikanti et al. 2022, Sec. 4.2); with flash attention there are none to drop.
  attention_core,
  // torchtitan's op-level selective activation checkpointing (selective_ac_option "op"): a layer's
  // forward keeps the outputs of its matrix multiplies but every second one, and the attention's,
  // and reruns the rest (op_policy_recompute_shares, compute.h).
  op_policy,
};

// One engine at one version: how it implements a layout, with the code it was read from.
struct EngineMechanics {
  Engine engine = Engine::megatron;
  const char* version = "";  // the version this row follows: what --engine NAME@VERSION names
  const char* source = "";   // the engine's code or docs at that version
  ShardedDataParallel sharded;
  // The pace of the engine's kernels against the GPU profile's, whose figures were fitted on
  // Megatron-LM runs (docs/cost-model.md): 1 for Megatron. GEMMs and attention (the profile's
  // sustained fraction), and element-wise work (norms, activations, dropout, residuals: its HBM
  // efficiency; unfused kernels move the same tensors more often). Properties of the engine, fitted
  // where published runs of it exist (planner/validation.h, fit_parameters).
  double gemm_scale = 1.0;
  double elementwise_scale = 1.0;
  // bf16 training (FP8's included, whose parameters are bf16) keeps its gradient buffer in fp32,
  // and accumulates and reduces it there, as if --fp32-grads were given (Megatron-LM).
  bool bf16_grads_in_fp32 = false;
  SelectiveRecompute selective = SelectiveRecompute::attention_core;
  // Sharded data parallel keeps the parameters' shards in fp32 and casts each gathered unit to
  // 16 bits (FSDP2's MixedPrecisionPolicy): the shard is the master copy, so ZeRO-3 holds 4 + 4 + 8
  // bytes per parameter over the shards instead of 2 + 2 + 12, and the gathered unit is 16-bit.
  bool fp32_sharded_params = false;
  // FP8 training's linear layers keep their 16-bit input and weight for backward and cast them to
  // FP8 again there (torchao's Float8Linear, which torchtitan's float8 converter swaps in), instead
  // of Transformer Engine's FP8 copies: stored GEMM inputs stay 16-bit and no FP8 weight copy
  // persists beside the 16-bit weights.
  bool fp8_keeps_16bit_operands = false;
  bool operator==(const EngineMechanics&) const = default;
};

// Every row, engines in Engine order and each engine's versions oldest first.
std::span<const EngineMechanics> engine_mechanics_table();

// The row of `engine` at `version`; an empty version is the engine's newest row (the version
// dplan exports). An unknown version throws InputError naming the engine's versions.
const EngineMechanics& engine_mechanics(Engine engine, std::string_view version = {});

// "deepspeed" or "deepspeed@v0.3.16": the engine, and the version when it is not the newest row.
std::string engine_label(const EngineMechanics& mechanics);
// Reads "NAME" or "NAME@VERSION" (engine_label's form); throws InputError naming the choices.
const EngineMechanics& engine_mechanics_from_label(std::string_view label);

}  // namespace dplan::costmodel
