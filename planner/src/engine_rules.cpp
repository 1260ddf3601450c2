// Each engine's invariants on a plan. Sources (docs/export.md has the full table):
//   Megatron-LM core_v0.15.0: megatron/training/arguments.py validate_args, megatron/core/
//     parallel_state.py initialize_model_parallel, megatron/core/num_microbatches_calculator.py,
//     megatron/core/transformer/transformer_config.py, model_parallel_config.py
//   torchtitan v0.2.2: torchtitan/distributed/parallel_dims.py ParallelDims._validate and
//     seq_len_divisor, torchtitan/config/job_config.py, torchtitan/models/llama3
//   DeepSpeed (HEAD 38327e07f6): deepspeed/runtime/config.py _batch_assertion,
//     deepspeed/runtime/pipe/engine.py (ZeRO-2/3 are incompatible with pipeline parallelism),
//     docs/_pages/config-json.md (offload_optimizer stages 1-3)
//   Accelerate (HEAD 16cb6eb80d): commands/config YAML (distributed_type, fsdp_config,
//     parallelism_config, deepspeed_config)
//   torchrun / Slurm: dplan-worker, whose rules costmodel/executor_support.h owns.
// The engine table (engines.cpp) names each engine's function below; the messages that name a
// version take it from the engine's descriptor.
#include "dplan/planner/engine_rules.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "dplan/costmodel/executor_support.h"
#include "dplan/planner/report.h"
#include "engine_parts.h"

namespace dplan::planner {
using namespace costmodel;

namespace detail {

Rules::Rules(Engine engine, RuleReport& report) : prefix_(std::string(to_string(engine)) + ": "), report_(report) {}

void Rules::rule(bool holds, const std::function<std::string()>& why) {
  ++report_.rules_checked;
  if (!holds) report_.failures.push_back(prefix_ + why());
}

}  // namespace detail

namespace {
using detail::Rules;

std::string str(long long x) { return std::to_string(x); }

// "96 or 112" for a global batch that must be a multiple of `unit`.
std::string nearest_multiples(int value, int unit) {
  const long long below = value / unit * static_cast<long long>(unit);
  const long long above = below + unit;
  if (below <= 0) return str(above);
  return str(below) + " or " + str(above);
}

// Divisors of n up to `limit`, as "1, 2, 4, 8".
std::string divisors(int n, int limit = 64) {
  std::string out;
  for (int d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + str(d);
  return out;
}

int data_parallel(const ParallelConfig& p) { return p.dp; }

// Rules every engine's launch shares: the launchers (torchrun, deepspeed, accelerate, srun) start
// the same number of processes on every node; and none of the engines runs DualPipe (DeepSeek's
// runs in its own framework; deepseek-ai/DualPipe is a module, not a trainer).
void launch_rules(const Plan& plan, Rules& r) {
  r.rule(plan.parallel.schedule != costmodel::Schedule::dualpipe, [] {
    return std::string("cannot run the dualpipe schedule (no engine dplan exports to has a bidirectional pipeline; "
                       "dplan prices it for comparison); use --schedule 1f1b or interleaved");
  });
  const LaunchShape s = launch_shape(plan);
  r.rule(s.homogeneous, [&] {
    return "the plan's " + str(s.world) + " ranks do not fill whole nodes of " + str(s.per_node) +
           " (launchers start the same number of processes on every node); use a world size of at most " +
           str(s.per_node) + " or a multiple of it";
  });
}

void batch_rule(const Plan& plan, Rules& r, const std::string& how) {
  const ParallelConfig& p = plan.parallel;
  const int unit = p.micro_batch * data_parallel(p);
  r.rule(plan.training.global_batch % unit == 0, [&] {
    return how + ": global batch " + str(plan.training.global_batch) + " is not a multiple of micro-batch " +
           str(p.micro_batch) + " x data parallel " + str(p.dp) + " (= " + str(unit) + "); use --global-batch " +
           nearest_multiples(plan.training.global_batch, unit);
  });
}

void heads_rules(const Plan& plan, Rules& r, const std::string& source, bool kv_rule) {
  const ModelSpec& m = plan.model;
  const int tp = plan.parallel.tp;
  r.rule(m.num_heads % tp == 0, [&] {
    return "attention heads " + str(m.num_heads) + " are not divisible by tp " + str(tp) + " (" + source +
           "); use --tp " + divisors(m.num_heads);
  });
  if (kv_rule && !m.is_mla())
    r.rule(m.num_kv_heads % tp == 0, [&] {
      return "key/value heads " + str(m.num_kv_heads) + " are not divisible by tp " + str(tp) + " (" + source +
             "); use --tp " + divisors(m.num_kv_heads);
    });
}

void context_parallel_rule(const Plan& plan, Rules& r, const std::string& source) {
  const int cp = plan.parallel.cp;
  if (cp <= 1) return;
  r.rule(plan.training.seq_len % (2 * cp) == 0, [&] {
    return "sequence " + str(plan.training.seq_len) + " is not a multiple of 2 x cp " + str(cp) + " (" + source +
           ": each rank takes two load-balanced chunks); use --seq " + nearest_multiples(plan.training.seq_len, 2 * cp);
  });
}

// Pipeline split with first/last stage counts read off an explicit per-stage list.
bool uniform(const std::vector<int>& v, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (v[i] != v[from]) return false;
  return true;
}

std::vector<int> stage_layers(const Plan& plan) {
  std::vector<int> v;
  for (const PlanStage& s : plan.stages) v.push_back(s.num_layers);
  if (v.empty()) v = assign_layers(plan.model.num_layers, plan.parallel);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Model features an engine's flag set cannot say (each a refusal naming the feature).

void megatron_model_rules(const Plan& plan, Rules& r) {
  const ModelSpec& m = plan.model;
  const char* v = "cannot express ";
  const std::string version = descriptor(Engine::megatron).version;
  r.rule(!m.is_mla(), [&] {
    return std::string("dplan export does not write Megatron's multi-head latent attention flags "
                       "(--multi-latent-attention, --q-lora-rank, --kv-lora-rank) yet; the model ") +
           m.name + " uses it";
  });
  r.rule(!m.attention_sinks, [&] {
    return std::string(v) + "attention sinks with the " + version + " flags dplan writes; the model " + m.name +
           " uses them";
  });
  const bool silu = m.activation == "silu" || m.activation == "swish";
  const bool gelu = m.activation.rfind("gelu", 0) == 0;
  const bool relu2 = m.activation == "relu2";
  r.rule((m.mlp == MlpKind::gated && silu) || (m.mlp == MlpKind::plain && (gelu || relu2)), [&] {
    return std::string(v) + "a " + to_string(m.mlp) + " MLP with the " + m.activation +
           " activation (its flags: --swiglu for gated SiLU, the default GELU, --squared-relu)";
  });
  const bool no_bias = !m.qkv_bias && !m.out_bias && !m.mlp_bias;
  const bool qkv_only = m.qkv_bias && !m.out_bias && !m.mlp_bias;
  const bool all_bias = m.qkv_bias && m.out_bias && m.mlp_bias;
  r.rule(no_bias || qkv_only || all_bias, [&] {
    return std::string(v) + "biases on some linear layers only (qkv " + (m.qkv_bias ? "yes" : "no") + ", output " +
           (m.out_bias ? "yes" : "no") + ", MLP " + (m.mlp_bias ? "yes" : "no") +
           "); its flags give all biases, none (--disable-bias-linear) or q/k/v only (--add-qkv-bias)";
  });
  if (m.is_moe()) {
    r.rule(!m.router_bias && !m.shared_expert_gate, [&] {
      return std::string(v) + "a router bias or a gated shared expert with the " + version +
             " flags dplan writes; the model " + m.name + " has one";
    });
  }
}

// torchtitan v0.2.2 ships its models as code (torchtitan/models/<name>/__init__.py flavors); the
// TOML names one. dplan writes the llama3 model: gated SiLU MLP, RMSNorm, rotary positions, no
// biases, untied output, dense (torchtitan/models/llama3/model/model.py).
void torchtitan_model_rules(const Plan& plan, Rules& r) {
  const ModelSpec& m = plan.model;
  std::vector<std::string> differs;
  if (m.mlp != MlpKind::gated || m.activation != "silu") differs.push_back("a " + std::string(to_string(m.mlp)) + " " + m.activation + " MLP");
  if (m.norm != NormKind::rmsnorm) differs.push_back("LayerNorm");
  if (m.position != PositionKind::rotary) differs.push_back("learned positions");
  if (m.qkv_bias || m.out_bias || m.mlp_bias) differs.push_back("linear biases");
  if (m.tied_embeddings) differs.push_back("tied embeddings");
  if (m.qk_norm) differs.push_back("q/k norms");
  if (m.is_moe()) differs.push_back("mixture of experts");
  if (m.is_mla()) differs.push_back("latent attention");
  if (m.window_binds(plan.training.seq_len) || m.attention_sinks) differs.push_back("sliding windows or attention sinks");
  if (m.head_dim * m.num_heads != m.hidden_size) differs.push_back("head_dim x heads != hidden size");
  std::string list;
  for (size_t i = 0; i < differs.size(); ++i) list += (i ? ", " : "") + differs[i];
  r.rule(differs.empty(), [&] {
    return "cannot express the model " + m.name + " with its llama3 model (" + list +
           "); dplan exports torchtitan's llama3 (gated SiLU MLP, RMSNorm, rotary, no biases, untied, dense)";
  });
  r.rule(m.attention_dropout == 0 && m.hidden_dropout == 0, [&] {
    return std::string("cannot express dropout (its llama3 model has none); the model has attention dropout ") +
           std::to_string(m.attention_dropout) + ", hidden dropout " + std::to_string(m.hidden_dropout);
  });
}

// The DeepSpeed config's own rules (also Accelerate's when it writes a DeepSpeed config).
void deepspeed_config_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  // train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp.
  batch_rule(plan, r, "deepspeed/runtime/config.py _batch_assertion");
  r.rule(p.cp == 1, [&] {
    return "cannot express context parallel (cp " + str(p.cp) +
           "): DeepSpeed's sequence_parallel_size is Ulysses all-to-all, not the plan's ring attention; use --cp 1";
  });
  r.rule(plan.training.precision != Precision::fp8, [&] {
    return "cannot express fp8 training in a DeepSpeed config (fp8 lives in the model code); use --precision bf16";
  });
  r.rule(!p.offload_optimizer || p.zero_stage >= 1 || p.distributed_optimizer, [&] {
    return std::string("zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 (config-json.md); use --zero 1");
  });
  r.rule(!p.sequence_parallel, [&] {
    return "cannot express Megatron-style sequence parallel in a DeepSpeed config; drop --sp";
  });
  r.rule(p.ep == 1, [&] {
    return "cannot express expert parallel (ep " + str(p.ep) +
           ") in a DeepSpeed config (DeepSpeed MoE sets ep_size in the model code); use --ep 1";
  });
}

// torchtitan's data-parallel split (see export): FSDP (dp_shard) for ZeRO-2/3, DDP (dp_replicate)
// for ZeRO-0.
int torchtitan_dp_shard(const ParallelConfig& p) { return p.zero_stage >= 2 ? p.dp : 1; }

// torchtitan's mesh (parallel_dims.py) and the data-parallel shardings FSDP2 and DDP can say.
void torchtitan_data_parallel_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  const int dp_shard = torchtitan_dp_shard(p);
  const int dp_replicate = p.zero_stage >= 2 ? 1 : p.dp;
  const int world = plan.ranks.empty() ? p.world_size() : static_cast<int>(plan.ranks.size());
  r.rule(static_cast<long long>(dp_replicate) * dp_shard * p.cp * p.tp * p.pp == world, [&] {
    return "dp_replicate " + str(dp_replicate) + " x dp_shard " + str(dp_shard) + " x cp " + str(p.cp) + " x tp " +
           str(p.tp) + " x pp " + str(p.pp) + " != world size " + str(world) + " (parallel_dims.py)";
  });
  r.rule(p.dp == 1 || (p.zero_stage != 1 && !p.distributed_optimizer), [&] {
    return std::string("cannot express ZeRO-1 / the distributed optimizer (FSDP2 shards parameters and "
                       "gradients too; there is no optimizer-only sharding); use --zero 2 (fsdp_reshard_after_forward "
                       "never) or --zero 3");
  });
  r.rule(!(p.zero_stage == 0 && !p.distributed_optimizer && p.dp > 1 && (p.tp > 1 || p.pp > 1 || p.cp > 1)), [&] {
    return std::string("cannot express plain data parallel (DDP) beside tp, pp or cp (llama3 "
                       "parallelize.py: \"DDP has not supported > 1D parallelism\"); use --zero 2 or --zero 3");
  });
  r.rule(!(p.cp > 1 && p.zero_stage < 2), [&] {
    return "torchtitan shards parameters over the context-parallel ranks (FSDP on dp_shard x cp, "
           "parallel_dims.py fsdp_enabled), which a plan with cp " + str(p.cp) + " and ZeRO-" + str(p.zero_stage) +
           " does not; use --zero 2 or --zero 3";
  });
}

// Offload, sequence parallel, precision, heads and the sequence divisors.
void torchtitan_tensor_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  r.rule(!p.offload_optimizer, [&] {
    return std::string("cannot express optimizer-only offload (training.enable_cpu_offload offloads "
                       "parameters, gradients and optimizer states: FSDP2 CPUOffloadPolicy); drop --offload");
  });
  r.rule(p.tp == 1 || p.sequence_parallel, [&] {
    return "torchtitan's tensor parallel always shards activations along the sequence (sequence parallel, llama3 "
           "parallelize.py); the plan has tp " + str(p.tp) + " without it: use --sp";
  });
  r.rule(plan.training.precision != Precision::fp16, [&] {
    return std::string("cannot express fp16 training (training.mixed_precision_param is bfloat16 or "
                       "float32); use --precision bf16");
  });
  heads_rules(plan, r, "torchtitan: tp divides the heads and the key/value heads", true);
  if (p.tp > 1)
    r.rule(plan.training.seq_len % p.tp == 0, [&] {
      return "sequence " + str(plan.training.seq_len) + " is not a multiple of tp " + str(p.tp) +
             " (parallel_dims.py seq_len_divisor: sequence parallel); use --seq " +
             nearest_multiples(plan.training.seq_len, p.tp);
    });
  if (p.cp > 1)
    r.rule(plan.training.seq_len % (2 * p.cp * p.tp) == 0, [&] {
      return "sequence " + str(plan.training.seq_len) + " is not a multiple of tp x 2 x cp = " + str(2 * p.cp * p.tp) +
             " (parallel_dims.py seq_len_divisor); use --seq " +
             nearest_multiples(plan.training.seq_len, 2 * p.cp * p.tp);
    });
}

// Expert parallel beside etp, tp and cp (parallel_dims.py).
void torchtitan_expert_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  const ModelSpec& m = plan.model;
  const int dp_shard = torchtitan_dp_shard(p);
  if (m.is_moe() && p.ep > 1) {
    const int etp = p.expert_tp();
    r.rule(etp == p.tp || etp == 1, [&] {
      return "etp " + str(etp) + " is neither 1 nor tp " + str(p.tp) +
             " (parallel_dims.py: \"Currently we only support ETP=TP or ETP=1\"); use --etp 1 or --etp " + str(p.tp);
    });
    if (etp == p.tp)
      r.rule(p.ep % p.cp == 0 && (dp_shard * p.cp) % p.ep == 0, [&] {
        return "with etp = tp, ep " + str(p.ep) + " must be a multiple of cp " + str(p.cp) + " and divide dp_shard x cp = " +
               str(dp_shard * p.cp) + " (parallel_dims.py)";
      });
    else if (etp == 1)
      r.rule(p.ep % (p.cp * p.tp) == 0 && (dp_shard * p.cp * p.tp) % p.ep == 0, [&] {
        return "with etp 1, ep " + str(p.ep) + " must be a multiple of cp x tp " + str(p.cp * p.tp) +
               " and divide dp_shard x cp x tp = " + str(dp_shard * p.cp * p.tp) + " (parallel_dims.py)";
      });
  }
}

void torchtitan_pipeline_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  const ModelSpec& m = plan.model;
  // torchtitan splits (layers + first_stage_less_layers + last_stage_less_layers) evenly
  // into ceil(that / pipeline_parallel_layers_per_stage) virtual stages (torchtitan/distributed/
  // pipeline_parallel.py): an even split, or the embedding and loss accounted as one layer each.
  if (p.pp > 1) {
    const std::vector<int> layers = stage_layers(plan);
    const int slots = m.num_layers + p.account_for_embedding + p.account_for_loss;
    const bool expressible = p.first_stage_layers == 0 && p.last_stage_layers == 0 &&
                             (p.layers_per_stage.empty() || uniform(layers, 0, layers.size())) &&
                             slots % (p.pp * p.vpp) == 0;
    r.rule(expressible, [&] {
      return "cannot express this pipeline split (pipeline_parallel_layers_per_stage gives every virtual "
             "stage the same count, the embedding and loss counted by pipeline_parallel_first/last_stage_less_layers); "
             "use a pp x vpp dividing " + str(m.num_layers) + " layers (" + divisors(m.num_layers) +
             ") or --account-for-embedding/--account-for-loss, and no --first-stage-layers/--last-stage-layers";
    });
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Each engine's rules (the engine table, engines.cpp, names them).

namespace detail {

void megatron_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  const ModelSpec& m = plan.model;
  const int world = plan.ranks.empty() ? p.world_size() : static_cast<int>(plan.ranks.size());
  // validate_args: world % (tp*pp*cp) == 0, data parallel = world / (tp*pp*cp) (EP not in it).
  const int tpppcp = p.tp * p.pp * p.cp;
  r.rule(world % tpppcp == 0 && world / tpppcp == p.dp, [&] {
    return "world size " + str(world) + " is not tp " + str(p.tp) + " x pp " + str(p.pp) + " x cp " + str(p.cp) +
           " x dp " + str(p.dp) + " (validate_args: data parallel = world / (tp x pp x cp)); use --gpus " +
           str(static_cast<long long>(tpppcp) * p.dp);
  });
  // Deferred embedding weight gradients (ModelParallelConfig.__post_init__, core_v0.15.0).
  if (plan.training.embedding_wgrad_deferral) {
    r.rule(p.pp > 1, [&] {
      return std::string("cannot defer the embedding weight gradient without pipeline parallel (ModelParallelConfig: "
                         "\"Cannot defer embedding wgrad compute when pipeline model parallel is not used\"); drop "
                         "--defer-embedding-wgrad or use pp > 1");
    });
    r.rule(gradient_accumulation_fused(plan.training, p), [&] {
      return std::string("cannot defer the embedding weight gradient without gradient-accumulation fusion "
                         "(ModelParallelConfig); drop --defer-embedding-wgrad or --no-gradient-accumulation-fusion");
    });
  }
  // Expert data parallel = world / (etp * ep * pp) (parallel_state.py).
  if (m.is_moe()) {
    const int etp_ep_pp = p.expert_tp() * p.ep * p.pp;
    r.rule(world % etp_ep_pp == 0, [&] {
      return "world size " + str(world) + " is not divisible by etp " + str(p.expert_tp()) + " x ep " + str(p.ep) +
             " x pp " + str(p.pp) + " (= " + str(etp_ep_pp) +
             "; parallel_state.py: expert data parallel = world / (etp x ep x pp)); use an --ep dividing " +
             str(world / std::max(1, p.expert_tp() * p.pp));
    });
  }
  // ConstantNumMicroBatchesCalculator.
  batch_rule(plan, r, "num_microbatches_calculator.py");
  // Layers per pipeline stage as the flags can say them.
  const MegatronSplit split = megatron_split_flags(plan);
  r.rule(split.problem.empty(), [&] { return split.problem; });
  // The interleaved schedule.
  if (p.pp > 1)
    r.rule(p.schedule != Schedule::gpipe, [&] {
      return std::string("cannot express the gpipe schedule (its pipeline schedules are 1F1B and interleaved "
                         "1F1B, megatron/core/pipeline_parallel/schedules.py); use --schedule 1f1b");
    });
  if (p.vpp > 1) {
    r.rule(p.pp > 1, [&] { return "the interleaved schedule (vpp " + str(p.vpp) + ") needs pp > 1; use --pp 2 or more or --vpp 1"; });
    const std::vector<int> layers = stage_layers(plan);
    bool divisible = true;
    for (size_t s = 0; s < layers.size(); ++s) {
      const int slots = layers[s] + (s == 0 && split.account_for_embedding) + (s + 1 == layers.size() && split.account_for_loss);
      divisible = divisible && slots % p.vpp == 0;
    }
    r.rule(divisible, [&] {
      return "layers per pipeline stage are not a multiple of vpp " + str(p.vpp) +
             " (validate_args: (num_layers / pp) % layers per virtual stage == 0); use a --vpp dividing " +
             str(layers.empty() ? 0 : layers.front());
    });
    r.rule(plan.num_microbatches % p.pp == 0, [&] {
      return "the interleaved schedule needs the micro-batches per pipeline (" + str(plan.num_microbatches) +
             ") to be a multiple of pp " + str(p.pp) +
             " (megatron/core/pipeline_parallel/schedules.py); use --global-batch " +
             nearest_multiples(plan.training.global_batch, p.micro_batch * p.dp * p.pp);
    });
  }
  // validate_args: seq_length % (2 x cp).
  context_parallel_rule(plan, r, "validate_args");
  // Heads and query groups divisible by tp (core_v0.15.0 transformer_config.py L743-762;
  // HEAD relaxes the second to "multiple or divisor").
  heads_rules(plan, r, std::string("transformer_config.py ") + descriptor(Engine::megatron).version, true);
  // validate_args: experts per ep rank; no expert parallel in fp16.
  if (m.is_moe()) {
    r.rule(m.num_experts % p.ep == 0, [&] {
      return "experts " + str(m.num_experts) + " are not divisible by ep " + str(p.ep) + "; use --ep " + divisors(m.num_experts);
    });
    // megatron/core/model_parallel_config.py: "When using expert parallelism and tensor parallelism
    // for training, sequence parallelism must be used" (a warning at core_v0.15.0).
    r.rule(p.ep == 1 || p.tp == 1 || p.sequence_parallel, [&] {
      return "expert parallel (ep " + str(p.ep) + ") with tp " + str(p.tp) +
             " needs sequence parallel (model_parallel_config.py: \"When using expert parallelism and tensor "
             "parallelism for training, sequence parallelism must be used\"); use --sp";
    });
    r.rule(p.ep == 1 || plan.training.precision != Precision::fp16, [&] {
      return std::string("expert parallel (ep ") + str(p.ep) + ") does not run with fp16 (validate_args); use --precision bf16";
    });
  }
  // Megatron's CPU optimizer offload runs inside the distributed optimizer
  // (megatron/core/optimizer/__init__.py builds HybridDeviceOptimizer only there).
  r.rule(!p.offload_optimizer || p.zero_stage >= 1 || p.distributed_optimizer, [&] {
    return std::string("--optimizer-cpu-offload needs the distributed optimizer; use --dist-opt or --zero 1");
  });
  // "--use-precision-aware-optimizer only supported with distributed optimizer"
  // (megatron/core/optimizer/__init__.py at NVIDIA/Megatron-LM@d98e8a64dd).
  r.rule(!plan.training.bf16_adam_moments || p.zero_stage >= 1 || p.distributed_optimizer, [&] {
    return std::string("bf16 Adam moments (--use-precision-aware-optimizer) need the distributed optimizer; use "
                       "--dist-opt or --zero 1");
  });
  // These hold by construction of the exported flags (docs/export.md):
  // --sequence-parallel only with tp > 1, CUDA_DEVICE_MAX_CONNECTIONS=1 in the launch script,
  // --overlap-param-gather only with a sharded optimizer and --overlap-grad-reduce, no
  // --use-torch-fsdp2, no --recompute-method with selective recompute.
  megatron_model_rules(plan, r);
}

// Megatron-Core's options the other engines' files at the versions dplan writes have no key for:
// its MoE communication (ParallelConfig::moe_dispatcher, overlap_ep_comm) and its precision-aware
// optimizer's bf16 moments (TrainingSpec::bf16_adam_moments).
void megatron_only_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  r.rule(!plan.training.bf16_adam_moments, [&] {
    return std::string("keeps AdamW's moments in fp32 (no key for their dtype); drop --bf16-adam-moments or use "
                       "the megatron export");
  });
  r.rule(!plan.training.cross_entropy_fusion && !plan.training.embedding_wgrad_deferral, [&] {
    return std::string("cannot express Megatron's fused cross-entropy or deferred embedding weight gradients; drop "
                       "--cross-entropy-fusion and --defer-embedding-wgrad or use the megatron export");
  });
  r.rule(plan.model.mtp_layers == 0, [&] {
    return "cannot train multi-token prediction (" + str(plan.model.mtp_layers) +
           " MTP modules); use --mtp-layers 0 or the megatron export";
  });
  r.rule(p.recompute != Recompute::selective || plan.training.recompute_modules.is_default(), [&] {
    return std::string("cannot express Megatron's --recompute-modules (its selective recompute is its own); drop "
                       "--recompute-modules or use the megatron export");
  });
  r.rule(p.moe_dispatcher == MoeDispatcher::alltoall, [&] {
    return std::string("cannot express the DeepEP dispatcher (Megatron-Core's flex dispatcher); use "
                       "--moe-dispatcher alltoall or the megatron export");
  });
  r.rule(!p.overlap_ep_comm, [&] {
    return std::string("cannot express the EP overlap (Megatron-Core's combined 1F1B, "
                       "--overlap-moe-expert-parallel-comm); drop --overlap-ep-comm or use the megatron export");
  });
}

void torchtitan_rules(const Plan& plan, Rules& r) {
  megatron_only_rules(plan, r);
  torchtitan_model_rules(plan, r);
  torchtitan_data_parallel_rules(plan, r);
  torchtitan_tensor_rules(plan, r);
  torchtitan_expert_rules(plan, r);
  torchtitan_pipeline_rules(plan, r);
  // Local batch integral: per-rank batch = global / data parallel, in micro-batches.
  batch_rule(plan, r, "torchtitan training.local_batch_size");
}

void deepspeed_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  megatron_only_rules(plan, r);
  deepspeed_config_rules(plan, r);
  if (p.pp > 1) {
    r.rule(p.zero_stage < 2, [&] {
      return "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only (deepspeed/runtime/pipe/engine.py: \"ZeRO-2 and "
             "ZeRO-3 are incompatible with pipeline parallelism\"); the plan has pp " + str(p.pp) + " with ZeRO-" +
             str(p.zero_stage) + ": use --zero 1";
    });
    r.rule(p.vpp == 1 && p.schedule != Schedule::gpipe, [&] {
      return std::string("cannot express the ") + to_string(p.schedule) +
             " schedule (its pipeline engine runs one 1F1B TrainSchedule); use --schedule 1f1b --vpp 1";
    });
    r.rule(p.tp == 1, [&] {
      return std::string("cannot express tp with pp in its config (PipelineModule takes tensor parallel from "
                         "a Megatron mpu, not from tensor_parallel.autotp_size); use --tp 1 or the megatron export");
    });
    const std::vector<int> layers = stage_layers(plan);
    r.rule(uniform(layers, 0, layers.size()), [&] {
      return std::string("cannot express an uneven pipeline split (PipelineModule partition_method "
                         "\"uniform\" gives every stage the same layer count); use a pp dividing the layers");
    });
  }
  if (p.tp > 1) {
    heads_rules(plan, r, "AutoTP splits attention heads over tp", true);
    // deepspeed/runtime/engine.py _configure_tensor_parallel_states asserts ZeRO stage <= 2.
    r.rule(p.zero_stage <= 2, [&] {
      return std::string("DeepSpeed's AutoTP (tensor_parallel.autotp_size) runs with ZeRO stage 0-2 (engine.py: "
                         "\"the compatibility between 'autotp' and 'zero_stage = 3' has not been validated\"); use "
                         "--zero 2 or --tp 1");
    });
  }
}

void accelerate_rules(const Plan& plan, Rules& r) {
  const ParallelConfig& p = plan.parallel;
  megatron_only_rules(plan, r);
  r.rule(p.pp == 1, [&] {
    return "cannot express pipeline parallel (pp " + str(p.pp) +
           "): its config has no pipeline key; use --pp 1 or the megatron / torchtitan export";
  });
  r.rule(p.ep == 1, [&] {
    return "cannot express expert parallel (ep " + str(p.ep) + "): its config has no expert key; use --ep 1";
  });
  r.rule(!p.sequence_parallel, [&] {
    return std::string("cannot express Megatron-style sequence parallel (its tensor parallel follows the "
                       "model's tp_plan); drop --sp");
  });
  r.rule(plan.training.precision != Precision::fp8, [&] {
    return std::string("dplan does not write an fp8 backend (fp8_config); use --precision bf16");
  });
  const bool deepspeed = p.offload_optimizer || p.zero_stage == 1 || p.distributed_optimizer;
  if (deepspeed) {
    deepspeed_config_rules(plan, r);
    r.rule(p.tp == 1, [&] {
      return "cannot express tp " + str(p.tp) +
             " with DeepSpeed (ZeRO-1 or optimizer offload; parallelism_config is for FSDP2); use --tp 1 or --zero 3";
    });
  } else {
    batch_rule(plan, r, "gradient accumulation steps");
    r.rule(p.cp == 1 || p.zero_stage >= 2, [&] {
      return "accelerate runs context parallel with FSDP2 only (parallelism_config_cp_size); the plan has cp " +
             str(p.cp) + " with ZeRO-" + str(p.zero_stage) + ": use --zero 2 or --zero 3";
    });
    context_parallel_rule(plan, r, "torch context_parallel load balancing");
    if (p.zero_stage >= 2)
      r.rule(p.recompute != Recompute::selective, [&] {
        return std::string("cannot express selective recompute with FSDP2 (fsdp_activation_checkpointing "
                           "checkpoints whole layers); use --recompute full or none");
      });
  }
  if (p.tp > 1) heads_rules(plan, r, "tensor parallel splits the heads", true);
}

void dplan_worker_rules(const Plan& plan, Rules& r) {
  // The executor's own support, one owner: costmodel/executor_support.h.
  const std::optional<std::string> refusal = executor_refusal(plan.model, plan.training, plan.parallel);
  r.rule(!refusal, [&] { return "dplan-worker: " + *refusal; });
}

}  // namespace detail

LaunchShape launch_shape(const Plan& plan) {
  LaunchShape s;
  s.world = plan.parallel.world_size();
  int per_node = plan.cluster.is_object() ? plan.cluster.value("gpus_per_node", s.world) : s.world;
  if (per_node < 1) per_node = s.world;
  s.gpus = !(plan.cluster.is_object() && plan.cluster.contains("cores_per_node"));
  if (s.world <= per_node) {
    s.nodes = 1;
    s.per_node = s.world;
  } else {
    s.per_node = per_node;
    s.nodes = (s.world + per_node - 1) / per_node;
    s.homogeneous = s.world % per_node == 0;
  }
  return s;
}

MegatronSplit megatron_split_flags(const Plan& plan) {
  const ParallelConfig& p = plan.parallel;
  const int L = plan.model.num_layers;
  MegatronSplit s;
  s.first_stage_layers = p.first_stage_layers;
  s.last_stage_layers = p.last_stage_layers;
  s.account_for_embedding = p.account_for_embedding;
  s.account_for_loss = p.account_for_loss;
  if (p.pp == 1) return s;
  if (s.first_stage_layers || s.last_stage_layers || s.account_for_embedding || s.account_for_loss) return s;
  const std::vector<int> v = stage_layers(plan);
  if (uniform(v, 0, v.size())) {
    if (L % p.pp == 0) return s;
  } else if (!p.layers_per_stage.empty() && v.size() >= 2 && uniform(v, 1, v.size() - 1)) {
    // An explicit list whose middle stages are equal: --decoder-first/last-pipeline-num-layers.
    const int mid = v.size() == 2 ? -1 : v[1];
    s.first_stage_layers = v.front() != mid ? v.front() : 0;
    s.last_stage_layers = v.back() != mid ? v.back() : 0;
    return s;
  }
  std::string list;
  for (size_t i = 0; i < v.size(); ++i) list += (i ? "," : "") + str(v[i]);
  s.problem = "cannot express the pipeline split [" + list + "] of " + str(L) + " layers over pp " + str(p.pp) +
              " (an even split needs pp to divide the layers; otherwise --decoder-first/last-pipeline-num-layers "
              "around equal middle stages, or --account-for-embedding/loss-in-pipeline-split); use --pp " +
              divisors(L, 16) + ", or --first-stage-layers/--last-stage-layers or --account-for-embedding/--account-for-loss";
  return s;
}

RuleReport check_engine_rules(const Plan& plan, Engine engine) {
  RuleReport report;
  Rules r(engine, report);
  launch_rules(plan, r);
  descriptor(engine).rules(plan, r);
  return report;
}

void keep_engine_runnable(SearchResult& result, const costmodel::ModelSpec& model,
                          const costmodel::ClusterSpec& cluster, const costmodel::TrainingSpec& training,
                          const costmodel::OverlapOptions& overlap, Engine engine, int top_k) {
  // The plan the rules read, made once: make_plan's model, cluster, training and overlap, and per
  // layout its sizes and micro-batch count. The rank list, the stages and the prediction make_plan
  // adds stay empty: no rule reads the prediction, and without ranks and stages the rules take the
  // world size and assign_layers (stage_layers), which are what make_plan lists. (Made per layout,
  // a plan for 16,384 GPUs listed 16,384 ranks for each layout checked.)
  Plan plan;
  plan.model = model;
  plan.cluster = costmodel::to_json(cluster);
  plan.training = training;
  plan.overlap = overlap;
  std::string first_failure;  // the first refused layout's first reason
  auto runs = [&](const ParallelConfig& p) {
    plan.parallel = p;
    plan.num_microbatches = costmodel::num_microbatches(training, p);
    const RuleReport report = check_engine_rules(plan, engine);
    if (!report.ok() && first_failure.empty()) first_failure = report.failures.front();
    return report.ok();
  };
  std::vector<Candidate> kept;
  long refused = 0;
  for (Candidate& c : result.ranked) {
    if (static_cast<int>(kept.size()) >= top_k) break;
    if (runs(c.parallel))
      kept.push_back(std::move(c));
    else
      ++refused;
  }
  // Beyond the top_k kept the rest are not checked: they are neither ranked nor counted as refused.
  result.ranked = std::move(kept);
  std::erase_if(result.pareto, [&](const Candidate& c) { return !runs(c.parallel); });
  // (search() kept the near misses that beat its winner, so they beat any the filter promotes.)
  std::erase_if(result.near_misses, [&](const Candidate& c) { return !runs(c.parallel); });
  result.feasible -= refused;
  // When the engine takes none of them, its first reason is what the user needs (often the model:
  // a feature its flags cannot say), with the way out.
  if (refused && result.ranked.empty())
    result.rejected[std::string(to_string(engine)) + "'s rules refuse it (the first: " + first_failure +
                    "; --engine torchrun plans for dplan's own executor instead)"] += refused;
  else if (refused)
    result.rejected[std::string(to_string(engine)) + "'s rules refuse it"] += refused;
}

std::string rules_ok_line(const Plan& plan, Engine engine, const RuleReport& report) {
  const ParallelConfig& p = plan.parallel;
  const LaunchShape s = launch_shape(plan);
  std::ostringstream o;
  o << to_string(engine) << ": ok: " << report.rules_checked << " rules pass (tp " << p.tp << " x pp " << p.pp;
  if (p.vpp > 1) o << " (vpp " << p.vpp << ")";
  if (p.cp > 1) o << " x cp " << p.cp;
  o << " x dp " << p.dp;
  if (p.ep > 1) o << ", ep " << p.ep;
  if (p.zero_stage > 0) o << ", ZeRO-" << p.zero_stage;
  o << ", " << s.world << " ranks = " << s.nodes << (s.nodes == 1 ? " node" : " nodes") << " x " << s.per_node << ")";
  return o.str();
}

}  // namespace dplan::planner
