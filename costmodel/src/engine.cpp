// The engines' ids, names and mechanics (engine.h). Each row cites the code it follows; the
// compute scales are fitted (docs/cost-model.md, "What was fitted, and on what").
#include "dplan/costmodel/engine.h"

#include <iterator>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {
namespace {

constexpr const char* kNames[] = {"megatron", "torchtitan", "deepspeed", "accelerate", "torchrun", "slurm"};

// The fitted scales (planner/validation.h fit_parameters on every run of the validation files,
// docs/cost-model.md "What was fitted, and on what"): DeepSpeed's from Narayanan et al. 2021's
// ZeRO-3 runs, BLOOM and MT-NLG (Megatron-DeepSpeed, 2021-2022), one figure for both rows;
// Accelerate's (PyTorch FSDP) from llm-foundry's FSDP runs.
constexpr double kDeepSpeedGemmScale = 0.796;
constexpr double kFsdpGemmScale = 0.997;
constexpr double kFsdpElementwiseScale = 1.0;
// DeepSpeed v0.3's per-rank copies: PyTorch's list all-gather copies each of the group's outputs
// with its own copy_ (ProcessGroupNCCL::allgather, PyTorch 1.8), dispatched from the host.
constexpr double kDeepSpeedV03PerRankS = 1.28e-6;
// The part of PyTorch FSDP's (FULL_SHARD) gathers and reduce-scatters its compute hides.
constexpr double kFsdpPrefetchOverlap = 0.069;
// DeepSpeed ZeRO-3's default stage3_max_live_parameters, 1e9 since ZeRO-3's first release
// (deepspeed/runtime/zero/constants.py ZERO_OPTIMIZATION_MAX_LIVE_PARAMETERS_DEFAULT in v0.3.x;
// deepspeed/runtime/zero/config.py max_live_parameters at 38327e07f6).
constexpr double kDeepSpeedMaxLiveParams = 1e9;

// One collective per layer, the next layer's prefetched under the current one's compute, the
// recompute inside the backward's gather: Megatron-FSDP, FSDP2 and dplan's executor.
constexpr ShardedDataParallel kLayerPrefetched{
    .unit = ShardUnit::layer, .per_rank_s = 0, .prefetch_overlap = 1, .regather_for_recompute = false};

constexpr EngineMechanics kMechanics[] = {
    // Megatron-LM / Megatron-Core (NeMo runs it too). The GPU profiles' fitted figures were fitted on
    // its runs, so its kernels are the reference. Sharded data parallel is Megatron-FSDP
    // (megatron/core/distributed/fsdp: one bucket per layer, prefetched; the recompute runs inside
    // the layer's backward, whose gather already holds the parameters).
    // With bf16 it accumulates and reduces gradients in fp32 unless told otherwise
    // (megatron/training/arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be
    // done in fp32", accumulate_allreduce_grads_in_fp32; NVIDIA/Megatron-LM@d98e8a64dd lines 1204-1217).
    {.engine = Engine::megatron,
     .version = "core_v0.15.0",
     .source = "megatron/core/distributed/fsdp/src/megatron_fsdp (core_v0.15.0); megatron/training/arguments.py",
     .sharded = kLayerPrefetched,
     .gemm_scale = 1.0,
     .elementwise_scale = 1.0,
     .bf16_grads_in_fp32 = true},
    // torchtitan: FSDP2 fully_shard per transformer block (torchtitan/models/llama3/infra/parallelize.py
    // apply_fsdp), all_gather_into_tensor into one buffer per block, the next block's gather
    // prefetched (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py); activation checkpointing
    // wraps the block inside its FSDP unit, so the recompute runs on the backward's gather. No
    // published torchtitan run is in the validation files: compute scale 1 is an assumption.
    // Memory: fully_shard's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) keeps
    // fp32 shards (the optimizer steps them) and reduce-scatters fp32 gradients
    // (training.mixed_precision_param / mixed_precision_reduce, the latter only "float32" in
    // torchtitan/config/job_config.py); --recompute selective is its op-level policy
    // (selective_ac_option "op": save every op output of _save_list, mm, the SDPA kernels,
    // reduce_scatter, max, but every second mm; apply_ac). Its float8 converter's Float8Linear
    // saves the high-precision input and weight (pytorch/ao torchao/float8/float8_linear.py,
    // matmul_with_hp_or_float8_args: ctx.save_for_backward(input_hp, weight_hp_t)).
    {.engine = Engine::torchtitan,
     .version = "v0.2.2",
     .source = "torchtitan/models/llama3/infra/parallelize.py apply_fsdp, apply_ac; torchtitan/config/job_config.py (v0.2.2)",
     .sharded = kLayerPrefetched,
     .gemm_scale = 1.0,
     .elementwise_scale = 1.0,
     .bf16_grads_in_fp32 = true,
     .selective = SelectiveRecompute::op_policy,
     .fp32_sharded_params = true,
     .fp8_keeps_16bit_operands = true},
    // DeepSpeed ZeRO-3 as first released (March 2021; Narayanan et al. 2021, Table 2, ran it):
    // deepspeed/runtime/zero/partition_parameters.py _allgather_param gathers each parameter on its
    // own, torch.distributed.all_gather into a list of world-size partitions (PyTorch's
    // ProcessGroupNCCL::allgather gathers into one flat buffer and copies each output out), after a
    // torch.cuda.synchronize(); a checkpointed layer's recompute fetches its parameters again
    // (stage3.py's pre-forward hook fetches whatever is not AVAILABLE, and the forward released them).
    {.engine = Engine::deepspeed,
     .version = "v0.3",
     .source = "deepspeed/runtime/zero/partition_parameters.py _allgather_param, stage3.py (v0.3.x, 2021)",
     .sharded = {.unit = ShardUnit::parameter, .per_rank_s = kDeepSpeedV03PerRankS, .prefetch_overlap = 0,
                 .regather_for_recompute = true, .max_live_params = kDeepSpeedMaxLiveParams},
     .gemm_scale = kDeepSpeedGemmScale,
     .elementwise_scale = 1.0},
    // DeepSpeed ZeRO-3 today: still one fetch per sub-module's parameters, coalesced
    // (partition_parameters.py _all_gather_dtype: all_gather_into_tensor, one flat buffer) and
    // prefetched up to stage3_prefetch_bucket_size ahead (partitioned_param_coordinator.py
    // fetch_sub_module); a checkpointed layer's recompute fetches again (parameters are released after
    // use beyond stage3_max_reuse_distance).
    {.engine = Engine::deepspeed,
     .version = "38327e07f6",
     .source = "deepspeed/runtime/zero/partition_parameters.py, partitioned_param_coordinator.py (38327e07f6)",
     .sharded = {.unit = ShardUnit::parameter, .per_rank_s = 0, .prefetch_overlap = 1,
                 .regather_for_recompute = true, .max_live_params = kDeepSpeedMaxLiveParams},
     .gemm_scale = kDeepSpeedGemmScale,
     .elementwise_scale = 1.0},
    // Accelerate's FSDP plugin runs PyTorch FSDP (FullyShardedDataParallel, FULL_SHARD) with the
    // transformer block as the auto-wrap unit (accelerate/utils/dataclasses.py
    // FullyShardedDataParallelPlugin; torch/distributed/fsdp/_runtime_utils.py: flat parameter per unit,
    // _all_gather_base, BACKWARD_PRE prefetch); checkpointing wraps inside the unit.
    {.engine = Engine::accelerate,
     .version = "16cb6eb80d",
     .source = "accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin (16cb6eb80d); "
               "torch/distributed/fsdp/_runtime_utils.py",
     .sharded = {.unit = ShardUnit::layer, .per_rank_s = 0, .prefetch_overlap = kFsdpPrefetchOverlap,
                 .regather_for_recompute = false},
     .gemm_scale = kFsdpGemmScale,
     .elementwise_scale = kFsdpElementwiseScale},
    // dplan's own executor under torchrun or Slurm: ZeRO-3 gathers each layer's parameters before its
    // forward and backward (executor/src/grad_sync.cpp), the recompute inside the backward's gather.
    {.engine = Engine::torchrun,
     .version = "dplan",
     .source = "executor/src/grad_sync.cpp",
     .sharded = kLayerPrefetched,
     .gemm_scale = 1.0,
     .elementwise_scale = 1.0},
    {.engine = Engine::slurm,
     .version = "dplan",
     .source = "executor/src/grad_sync.cpp",
     .sharded = kLayerPrefetched,
     .gemm_scale = 1.0,
     .elementwise_scale = 1.0},
};

constexpr bool engines_in_order() {
  for (size_t i = 1; i < std::size(kMechanics); ++i)
    if (kMechanics[i].engine < kMechanics[i - 1].engine) return false;
  for (size_t e = 0; e < std::size(kNames); ++e) {
    bool found = false;
    for (const EngineMechanics& m : kMechanics) found = found || static_cast<size_t>(m.engine) == e;
    if (!found) return false;
  }
  return true;
}
static_assert(engines_in_order(), "kMechanics lists every engine, in the order of enum Engine");

bool newest_of_its_engine(const EngineMechanics& m) {
  const EngineMechanics* newest = nullptr;
  for (const EngineMechanics& row : kMechanics)
    if (row.engine == m.engine) newest = &row;
  return newest && std::string_view(newest->version) == m.version;
}

}  // namespace

const char* to_string(Engine engine) {
  const size_t i = static_cast<size_t>(engine);
  DPLAN_CHECK(i < std::size(kNames));
  return kNames[i];
}

std::vector<std::string> engine_names() { return {std::begin(kNames), std::end(kNames)}; }

std::optional<Engine> engine_from_string(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (name == kNames[i]) return static_cast<Engine>(i);
  return std::nullopt;
}

std::span<const EngineMechanics> engine_mechanics_table() { return kMechanics; }

const EngineMechanics& engine_mechanics(Engine engine, std::string_view version) {
  const EngineMechanics* found = nullptr;
  std::string versions;
  for (const EngineMechanics& m : kMechanics) {
    if (m.engine != engine) continue;
    versions += (versions.empty() ? "" : ", ") + std::string(m.version);
    if (version.empty() || version == m.version) found = &m;  // empty: the last (newest) row
    if (!version.empty() && found) break;
  }
  if (!found)
    throw InputError("engine " + std::string(to_string(engine)) + " has no version \"" + std::string(version) +
                     "\" dplan prices; valid: " + versions);
  return *found;
}

std::string engine_label(const EngineMechanics& m) {
  std::string label = to_string(m.engine);
  if (!newest_of_its_engine(m)) label += std::string("@") + m.version;
  return label;
}

const EngineMechanics& engine_mechanics_from_label(std::string_view label) {
  const size_t at = label.find('@');
  const std::string_view name = label.substr(0, at);
  const std::optional<Engine> engine = engine_from_string(name);
  if (!engine) {
    std::string valid;
    std::vector<std::string> names;
    for (const char* n : kNames) {
      valid += (valid.empty() ? "" : ", ") + std::string(n);
      names.emplace_back(n);
    }
    throw InputError("unknown engine \"" + std::string(name) + "\"" + did_you_mean(std::string(name), names) + "; valid: " + valid +
                     " (NAME@VERSION for an older version's mechanics)");
  }
  return engine_mechanics(*engine, at == std::string_view::npos ? std::string_view{} : label.substr(at + 1));
}

}  // namespace dplan::costmodel
