// Megatron-LM: megatron.args (one argument per line) and launch-megatron.sh (torchrun running
// pretrain_gpt.py). Spellings: Megatron-LM core_v0.15.0 megatron/training/arguments.py (each an
// explicit add_argument there), all in the table below.
#include <sstream>
#include <utility>

#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/time_phases.h"
#include "export_engines.h"

namespace dplan::planner::detail {
using namespace costmodel;

namespace {

// The one table of Megatron-LM's flag spellings dplan writes (core_v0.15.0).
namespace flag {
// _add_network_size_args
constexpr const char* num_layers = "--num-layers";
constexpr const char* hidden_size = "--hidden-size";
constexpr const char* ffn_hidden_size = "--ffn-hidden-size";
constexpr const char* num_attention_heads = "--num-attention-heads";
constexpr const char* group_query_attention = "--group-query-attention";
constexpr const char* num_query_groups = "--num-query-groups";
constexpr const char* kv_channels = "--kv-channels";
constexpr const char* max_position_embeddings = "--max-position-embeddings";
constexpr const char* position_embedding_type = "--position-embedding-type";  // learned_absolute | rope
constexpr const char* normalization = "--normalization";                       // LayerNorm | RMSNorm
constexpr const char* apply_layernorm_1p = "--apply-layernorm-1p";
constexpr const char* qk_layernorm = "--qk-layernorm";
constexpr const char* swiglu = "--swiglu";
constexpr const char* squared_relu = "--squared-relu";
constexpr const char* untie_embeddings = "--untie-embeddings-and-output-weights";
constexpr const char* disable_bias_linear = "--disable-bias-linear";
constexpr const char* add_qkv_bias = "--add-qkv-bias";
constexpr const char* vocab_size = "--vocab-size";
constexpr const char* make_vocab_size_divisible_by = "--make-vocab-size-divisible-by";
constexpr const char* mtp_num_layers = "--mtp-num-layers";  // _add_network_size_args (core_v0.15.0)
constexpr const char* mtp_loss_scaling_factor = "--mtp-loss-scaling-factor";  // likewise
constexpr const char* rotary_percent = "--rotary-percent";
// Sliding windows: TransformerConfig.window_size (left, right) through arguments.py's tuple_type,
// and window_attn_skip_freq, a pattern with 1 for a windowed layer
// (megatron/core/transformer/utils.py is_layer_window_attention).
constexpr const char* window_size = "--window-size";
constexpr const char* window_attn_skip_freq = "--window-attn-skip-freq";
// _add_regularization_args
constexpr const char* attention_dropout = "--attention-dropout";
constexpr const char* hidden_dropout = "--hidden-dropout";
// _add_moe_args
constexpr const char* num_experts = "--num-experts";
constexpr const char* moe_router_topk = "--moe-router-topk";
constexpr const char* moe_ffn_hidden_size = "--moe-ffn-hidden-size";
constexpr const char* moe_shared_expert_intermediate_size = "--moe-shared-expert-intermediate-size";
constexpr const char* moe_layer_freq = "--moe-layer-freq";
constexpr const char* moe_token_dispatcher_type = "--moe-token-dispatcher-type";
constexpr const char* moe_grouped_gemm = "--moe-grouped-gemm";
constexpr const char* moe_enable_deepep = "--moe-enable-deepep";        // needs --moe-token-dispatcher-type flex
constexpr const char* moe_deepep_num_sms = "--moe-deepep-num-sms";      // default 20
constexpr const char* overlap_moe_expert_parallel_comm = "--overlap-moe-expert-parallel-comm";
constexpr const char* expert_model_parallel_size = "--expert-model-parallel-size";
constexpr const char* expert_tensor_parallel_size = "--expert-tensor-parallel-size";
// _add_distributed_args
constexpr const char* tensor_model_parallel_size = "--tensor-model-parallel-size";
constexpr const char* pipeline_model_parallel_size = "--pipeline-model-parallel-size";
constexpr const char* num_layers_per_virtual_pipeline_stage = "--num-layers-per-virtual-pipeline-stage";
constexpr const char* num_virtual_stages_per_pipeline_rank = "--num-virtual-stages-per-pipeline-rank";
constexpr const char* decoder_first_pipeline_num_layers = "--decoder-first-pipeline-num-layers";
constexpr const char* decoder_last_pipeline_num_layers = "--decoder-last-pipeline-num-layers";
constexpr const char* account_for_embedding = "--account-for-embedding-in-pipeline-split";
constexpr const char* account_for_loss = "--account-for-loss-in-pipeline-split";
constexpr const char* context_parallel_size = "--context-parallel-size";
constexpr const char* use_distributed_optimizer = "--use-distributed-optimizer";
constexpr const char* overlap_grad_reduce = "--overlap-grad-reduce";
constexpr const char* overlap_param_gather = "--overlap-param-gather";
constexpr const char* tp_comm_overlap = "--tp-comm-overlap";
constexpr const char* use_megatron_fsdp = "--use-megatron-fsdp";
constexpr const char* data_parallel_sharding_strategy = "--data-parallel-sharding-strategy";  // optim_grads[_params]
constexpr const char* ckpt_format = "--ckpt-format";  // Megatron-FSDP asserts fsdp_dtensor (v0.15)
constexpr const char* no_gradient_accumulation_fusion = "--no-gradient-accumulation-fusion";
constexpr const char* cross_entropy_loss_fusion = "--cross-entropy-loss-fusion";
constexpr const char* defer_embedding_wgrad_compute = "--defer-embedding-wgrad-compute";
constexpr const char* wgrad_deferral_limit = "--wgrad-deferral-limit";
// _add_training_args
constexpr const char* sequence_parallel = "--sequence-parallel";
constexpr const char* micro_batch_size = "--micro-batch-size";
constexpr const char* global_batch_size = "--global-batch-size";
constexpr const char* seq_length = "--seq-length";
constexpr const char* recompute_granularity = "--recompute-granularity";  // full | selective
constexpr const char* recompute_method = "--recompute-method";            // uniform | block
constexpr const char* recompute_num_layers = "--recompute-num-layers";
constexpr const char* recompute_modules = "--recompute-modules";  // nargs='*', default core_attn
constexpr const char* optimizer_cpu_offload = "--optimizer-cpu-offload";
// validate_args: "The optimizer cpu offload must be used in conjunction with
// `--use-precision-aware-optimizer`" (the hybrid device optimizer runs its code path).
constexpr const char* use_precision_aware_optimizer = "--use-precision-aware-optimizer";
constexpr const char* exp_avg_dtype = "--exp-avg-dtype";        // fp32 | fp16 | bf16 | fp8
constexpr const char* exp_avg_sq_dtype = "--exp-avg-sq-dtype";  // likewise
// _add_mixed_precision_args
constexpr const char* bf16 = "--bf16";
constexpr const char* fp16 = "--fp16";
constexpr const char* fp8_format = "--fp8-format";  // e4m3 | hybrid
constexpr const char* grad_reduce_in_bf16 = "--grad-reduce-in-bf16";
}  // namespace flag

using Args = std::vector<std::pair<std::string, std::string>>;  // flag, value ("" for a switch)

// One argument: a flag and its value ("" for a switch).
void add(Args& a, const char* flag, const std::string& value = "") { a.emplace_back(flag, value); }
std::string num(long long x) { return std::to_string(x); }

// The model's shape.
void model_arguments(Args& a, const ModelSpec& m, const TrainingSpec& t) {
  add(a, flag::num_layers, num(m.num_layers));
  add(a, flag::hidden_size, num(m.hidden_size));
  // --ffn-hidden-size is the dense MLP's; MoE layers take --moe-ffn-hidden-size (Mixtral example:
  // both the expert width).
  add(a, flag::ffn_hidden_size, num(m.num_dense_layers() > 0 ? m.dense_ffn_hidden_size : m.ffn_hidden_size));
  add(a, flag::num_attention_heads, num(m.num_heads));
  if (m.num_kv_heads != m.num_heads) {
    add(a, flag::group_query_attention);
    add(a, flag::num_query_groups, num(m.num_kv_heads));
  }
  add(a, flag::kv_channels, num(m.head_dim));
  add(a, flag::seq_length, num(t.seq_len));
  add(a, flag::max_position_embeddings, num(std::max(m.max_seq_len, t.seq_len)));  // asserted >= seq_length
  add(a, flag::position_embedding_type, m.position == PositionKind::rotary ? "rope" : "learned_absolute");
  add(a, flag::normalization, m.norm == NormKind::rmsnorm ? "RMSNorm" : "LayerNorm");
  if (m.family == "nemotron") add(a, flag::apply_layernorm_1p);
  if (m.qk_norm) add(a, flag::qk_layernorm);
  if (m.mlp == MlpKind::gated) add(a, flag::swiglu);
  else if (m.activation == "relu2") add(a, flag::squared_relu);
  if (!m.tied_embeddings) add(a, flag::untie_embeddings);
  if (!m.out_bias && !m.mlp_bias) {
    add(a, flag::disable_bias_linear);
    if (m.qkv_bias) add(a, flag::add_qkv_bias);
  }
  add(a, flag::vocab_size, num(m.vocab_size));
  add(a, flag::make_vocab_size_divisible_by, num(t.vocab_pad_multiple));
  if (m.mtp_layers > 0) {
    add(a, flag::mtp_num_layers, num(m.mtp_layers));
    add(a, flag::mtp_loss_scaling_factor, number(m.mtp_loss_scale));
  }
  // Partial rotary (Nemotron, GPT-NeoX): the share of each head's dims that rotates.
  if (m.rotary_dim > 0) add(a, flag::rotary_percent, number(double(m.rotary_dim) / m.head_dim));
  // A window of w keys, the query's own included (transformers' sliding_window), is w - 1 keys to
  // the left in Transformer Engine's (left, right); the layers that have it, where not all do.
  if (m.num_sliding_layers() > 0) {
    add(a, flag::window_size, num(m.sliding_window - 1) + ",0");
    if (m.num_sliding_layers() < m.num_layers) {
      std::string pattern;
      for (int i = 0; i < m.num_layers; ++i) pattern += std::string(i ? "," : "[") + (m.attention_window(i) > 0 ? "1" : "0");
      add(a, flag::window_attn_skip_freq, pattern + "]");
    }
  }
  // Megatron's defaults are 0.1 each: written always.
  add(a, flag::attention_dropout, number(m.attention_dropout));
  add(a, flag::hidden_dropout, number(m.hidden_dropout));
}

void moe_arguments(Args& a, const Plan& plan) {
  const ModelSpec& m = plan.model;
  const ParallelConfig& p = plan.parallel;
  if (!m.is_moe()) return;
  add(a, flag::num_experts, num(m.num_experts));
  add(a, flag::moe_router_topk, num(m.experts_per_token));
  add(a, flag::moe_ffn_hidden_size, num(m.ffn_hidden_size));
  if (m.shared_expert_ffn_size > 0) add(a, flag::moe_shared_expert_intermediate_size, num(m.shared_expert_ffn_size));
  // The dense layers' places (Megatron-LM arguments.py: --moe-layer-freq takes a Python list
  // expression, 1 for an MoE layer): DeepSeek's first k as its own scripts write them, any other
  // pattern (Qwen's mlp_only_layers, decoder_sparse_step) layer by layer.
  if (m.num_dense_layers() > 0) {
    bool first_k = true;
    for (int i = 0; i < m.num_dense_layers(); ++i) first_k = first_k && m.dense_layers[i] == i;
    std::string pattern;
    if (first_k) {
      pattern = "([0]*" + num(m.num_dense_layers()) + "+[1]*" + num(m.num_moe_layers()) + ")";
    } else {
      for (int i = 0; i < m.num_layers; ++i) pattern += std::string(i ? "," : "[") + (m.is_dense_layer(i) ? "0" : "1");
      pattern += "]";
    }
    add(a, flag::moe_layer_freq, pattern);
  }
  // The plan's dispatcher: alltoall, or DeepEP through the flex dispatcher (transformer_config.py:
  // "DeepEP backend is only supported with flex token dispatcher") with the SMs dplan priced
  // (costmodel kDeepepSms, Megatron's default written out).
  if (p.moe_dispatcher == MoeDispatcher::deepep) {
    add(a, flag::moe_token_dispatcher_type, "flex");
    add(a, flag::moe_enable_deepep);
    add(a, flag::moe_deepep_num_sms, num(static_cast<int>(kDeepepSms)));
  } else {
    add(a, flag::moe_token_dispatcher_type, "alltoall");
  }
  add(a, flag::moe_grouped_gemm);
  // The EP overlap (combined 1F1B); the layout rules (check_moe_comm) hold Megatron-Core's asserts.
  if (p.overlap_ep_comm) add(a, flag::overlap_moe_expert_parallel_comm);
}

// The parallel layout.
void parallel_arguments(Args& a, const Plan& plan) {
  const ModelSpec& m = plan.model;
  const ParallelConfig& p = plan.parallel;
  add(a, flag::tensor_model_parallel_size, num(p.tp));
  add(a, flag::pipeline_model_parallel_size, num(p.pp));
  const MegatronSplit split = megatron_split_flags(plan);
  if (split.first_stage_layers > 0) add(a, flag::decoder_first_pipeline_num_layers, num(split.first_stage_layers));
  if (split.last_stage_layers > 0) add(a, flag::decoder_last_pipeline_num_layers, num(split.last_stage_layers));
  if (split.account_for_embedding) add(a, flag::account_for_embedding);
  if (split.account_for_loss) add(a, flag::account_for_loss);
  if (p.vpp > 1) {
    const bool even = split.first_stage_layers == 0 && split.last_stage_layers == 0 && !split.account_for_embedding &&
                      !split.account_for_loss;
    // validate_args: --num-layers-per-virtual-pipeline-stage only with an even split; uneven
    // pipelines give the virtual stages per rank instead.
    if (even)
      add(a, flag::num_layers_per_virtual_pipeline_stage, num(m.num_layers / (p.pp * p.vpp)));
    else
      add(a, flag::num_virtual_stages_per_pipeline_rank, num(p.vpp));
  }
  if (p.cp > 1) add(a, flag::context_parallel_size, num(p.cp));
  if (p.tp > 1 && p.sequence_parallel) add(a, flag::sequence_parallel);
  if (m.is_moe()) {
    add(a, flag::expert_model_parallel_size, num(p.ep));
    add(a, flag::expert_tensor_parallel_size, num(p.expert_tp()));
  }
}

void batch_and_precision_arguments(Args& a, const Plan& plan) {
  const TrainingSpec& t = plan.training;
  const ParallelConfig& p = plan.parallel;
  add(a, flag::micro_batch_size, num(p.micro_batch));
  add(a, flag::global_batch_size, num(t.global_batch));

  // Precision. Megatron keeps bf16 training's gradients in fp32 unless told otherwise.
  switch (t.precision) {
    case Precision::bf16: add(a, flag::bf16); break;
    case Precision::fp16: add(a, flag::fp16); break;
    case Precision::fp8:
      add(a, flag::bf16);
      add(a, flag::fp8_format, "hybrid");
      break;
    case Precision::fp32: break;
  }
  // Megatron keeps bf16 training's gradients in fp32 unless told; the plan's say (gradients_in_fp32,
  // which its memory was priced with).
  if ((t.precision == Precision::bf16 || t.precision == Precision::fp8) && !gradients_in_fp32(t))
    add(a, flag::grad_reduce_in_bf16);
}

void sharding_arguments(Args& a, const Plan& plan) {
  const ParallelConfig& p = plan.parallel;
  // Sharding: ZeRO-1 is the distributed optimizer; ZeRO-2/3 are Megatron-FSDP's optim_grads /
  // optim_grads_params (Megatron-FSDP's ZeRO-like strategies), which v0.15 runs with the distributed optimizer, no
  // gradient-accumulation fusion and the fsdp_dtensor checkpoint format.
  const bool fsdp = p.zero_stage >= 2;
  const bool sharded_optimizer = fsdp || p.zero_stage == 1 || p.distributed_optimizer;
  if (fsdp) {
    add(a, flag::use_megatron_fsdp);
    add(a, flag::data_parallel_sharding_strategy, p.zero_stage == 3 ? "optim_grads_params" : "optim_grads");
    add(a, flag::ckpt_format, "fsdp_dtensor");
  }
  // The cost model's rule (compute.h), Megatron-FSDP's off included.
  if (!gradient_accumulation_fused(plan.training, p)) add(a, flag::no_gradient_accumulation_fusion);
  if (plan.training.cross_entropy_fusion) add(a, flag::cross_entropy_loss_fusion);
  if (plan.training.embedding_wgrad_deferral) {
    add(a, flag::defer_embedding_wgrad_compute);
    add(a, flag::wgrad_deferral_limit, num(*plan.training.embedding_wgrad_deferral));
  }
  if (sharded_optimizer) add(a, flag::use_distributed_optimizer);
  if (p.offload_optimizer) add(a, flag::optimizer_cpu_offload);
  if (p.offload_optimizer || plan.training.bf16_adam_moments) add(a, flag::use_precision_aware_optimizer);
  if (plan.training.bf16_adam_moments) {
    add(a, flag::exp_avg_dtype, "bf16");
    add(a, flag::exp_avg_sq_dtype, "bf16");
  }
  // Overlap: --overlap-param-gather needs a sharded optimizer and --overlap-grad-reduce (validate_args).
  if (plan.overlap.grad_reduce && p.dp * p.cp > 1) add(a, flag::overlap_grad_reduce);
  if (plan.overlap.param_gather && plan.overlap.grad_reduce && sharded_optimizer && p.dp * p.cp > 1)
    add(a, flag::overlap_param_gather);
  if (plan.overlap.tp_comm && p.tp > 1 && p.sequence_parallel) add(a, flag::tp_comm_overlap);
}

// Recompute (validate_args: no --recompute-method with selective).
void recompute_arguments(Args& a, const TrainingSpec& t, const ParallelConfig& p) {
  if (p.recompute == Recompute::selective) {
    add(a, flag::recompute_granularity, "selective");
    if (!t.recompute_modules.is_default()) add(a, flag::recompute_modules, to_string(t.recompute_modules, " "));
  } else if (p.recompute == Recompute::full) {
    add(a, flag::recompute_granularity, "full");
    add(a, flag::recompute_method, "uniform");
    add(a, flag::recompute_num_layers, "1");
  }
}

// Every argument of megatron.args, in the order written.
Args megatron_arguments(const Plan& plan) {
  Args a;
  model_arguments(a, plan.model, plan.training);
  moe_arguments(a, plan);
  parallel_arguments(a, plan);
  batch_and_precision_arguments(a, plan);
  sharding_arguments(a, plan);
  recompute_arguments(a, plan.training, plan.parallel);
  return a;
}

}  // namespace

Exported export_megatron(const ExportInput& in) {
  const Plan& plan = in.plan;
  const LaunchShape s = launch_shape(plan);
  const EngineDescriptor& engine = descriptor(in.engine);
  const std::string launch = engine.launch_file;
  std::ostringstream args;
  args << header(in, "# ");
  args << "# One argument per line; " << launch << " passes them to pretrain_gpt.py. Data, tokenizer and\n"
       << "# training length (--train-iters, --lr, ...) are the user's: give them to " << launch << ".\n";
  if (plan.model.position == PositionKind::rotary)
    args << "# The plan does not record the rotary base: add --rotary-base if the model's is not 10000.\n";
  for (const auto& [f, v] : megatron_arguments(plan)) args << f << (v.empty() ? "" : " " + v) << "\n";

  std::ostringstream sh;
  sh << script_preamble(in);
  sh << ": \"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (" << engine.version << ")}\"\n";
  // validate_args (core_v0.15.0): Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1; without it,
  // tp > 1 or cp > 1 asserts == 1 (before Blackwell).
  if (plan.parallel.zero_stage >= 2)
    sh << "# Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1 (validate_args).\n"
          "unset CUDA_DEVICE_MAX_CONNECTIONS\n";
  else if (plan.parallel.tp > 1 || plan.parallel.cp > 1)
    sh << "# Megatron asserts it with tp > 1 or cp > 1 (validate_args).\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n";
  sh << "args=()\n"
        "while read -r -a words; do\n"
        "  [[ ${#words[@]} -eq 0 || ${words[0]} == \\#* ]] && continue\n"
        "  args+=(\"${words[@]}\")\n"
        "done <\"$here/megatron.args\"\n";
  sh << "exec " << torchrun_command(s) << " \"$MEGATRON_LM/pretrain_gpt.py\" \"${args[@]}\" \"$@\"\n";

  Exported e;
  e.files.push_back({"megatron.args", args.str(), false});
  e.files.push_back({launch, sh.str(), true});
  e.launch_line = std::string(s.nodes > 1 ? "MASTER_ADDR=<first node> " : "") +
                  "MEGATRON_LM=<Megatron-LM checkout> ./" + launch +
                  " --train-iters N --lr X --tokenizer-type ... --data-path ...";
  std::vector<std::string> notes = {
      "data, tokenizer, optimizer hyper-parameters and training length are not in the plan: pass them after the script",
      "the rank order is Megatron's default tp-cp-ep-dp-pp, the plan's own (no --use-tp-pp-dp-mapping)"};
  if (plan.model.position == PositionKind::rotary)
    notes.push_back("the plan does not record the rotary base (--rotary-base, default 10000)");
  e.files.push_back(readme(in, e.files, e.launch_line, notes));
  return e;
}

}  // namespace dplan::planner::detail
