#include "dplan/costmodel/executor_support.h"

namespace dplan::costmodel {

std::string executor_does_not_run(const std::string& what) {
  return "the executor does not run " + what +
         " yet; it runs tp, pp (gpipe, 1f1b, interleaved), dp, context parallel, sequence parallel, ZeRO 0-3, the distributed optimizer, optimizer offload, recompute, "
         "Mixtral- and Qwen3-MoE-style mixture of experts with ep and etp "
         "(dplan --runnable searches only those)";
}

std::optional<std::string> gelu_approximation(const std::string& activation) {
  if (activation == "gelu" || activation == "gelu_python") return "none";
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast") return "tanh";
  return std::nullopt;
}

std::optional<std::string> executor_refusal(const ModelSpec& model, const TrainingSpec& training,
                                            const ParallelConfig& p) {
  // MoE: Mixtral-style layers (executor/src/moe.h): every layer routed, no shared expert, no router bias.
  if (model.num_dense_layers > 0 || model.shared_expert_ffn_size > 0 || model.router_bias)
    return executor_does_not_run("dense layers, shared experts or router biases in a mixture-of-experts model");
  // Its layers are GELU or SiLU-gated MLPs after plain multi-head / grouped-query attention, with
  // Qwen3's q/k norms where the model has them, and full rotary at the model's base.
  if (model.is_mla() || model.attention_sinks || model.num_sliding_layers > 0)
    return executor_does_not_run("latent attention, attention sinks or sliding windows");
  if (model.mlp == MlpKind::plain ? !gelu_approximation(model.activation) : model.activation != "silu")
    return executor_does_not_run("the " + model.activation + " activation in a " + to_string(model.mlp) + " MLP");
  if (!model.rope_scaling.empty())
    return executor_does_not_run("the " + model.rope_scaling + " rotary scaling (rope_scaling)");
  // GPT-NeoX rotates a part of each head (rotary_pct) and adds attention and MLP in parallel;
  // Nemotron's LayerNorm1P and partial rotary: neither is the executor's block.
  if (model.family == "gpt_neox" || model.family == "nemotron")
    return executor_does_not_run(model.family == "gpt_neox" ? "GPT-NeoX's partial rotary and parallel residual"
                                                             : "Nemotron's LayerNorm1P and partial rotary");
  // Its MoE layers send tokens with one all-to-all over ep and run one micro-batch at a time
  // (executor/src/moe.h, trainer.cpp): neither DeepEP's kernels nor Megatron-Core's combined 1F1B.
  if (p.moe_dispatcher != MoeDispatcher::alltoall || p.overlap_ep_comm)
    return std::string(p.overlap_ep_comm ? "the EP overlap (--overlap-ep-comm)" : "the DeepEP dispatcher") +
           " is not run (the executor's MoE layers send tokens with one all-to-all, one micro-batch at a time); "
           "drop --overlap-ep-comm and use --moe-dispatcher alltoall";
  // Its AdamW keeps fp32 moments (executor/src/rank_setup.cpp build_optimizer: torch::optim::AdamW).
  if (training.bf16_adam_moments)
    return "bf16 Adam moments are not run (the executor's AdamW keeps them in fp32); drop --bf16-adam-moments";
  // Its loss and LM head are its own (executor/src/gpt.cpp): neither Megatron's fused cross-entropy
  // nor its deferred embedding weight gradients, whose memory the plan would count.
  if (training.cross_entropy_fusion || training.embedding_wgrad_deferral)
    return executor_does_not_run("Megatron's fused cross-entropy or deferred embedding weight gradients "
                                 "(drop --cross-entropy-fusion and --defer-embedding-wgrad)");
  // Its GPT (executor/src/gpt.h) has no multi-token prediction modules.
  if (model.mtp_layers > 0) return executor_does_not_run("multi-token prediction (--mtp-layers 0 drops it)");
  // Its selective recompute reruns the attention core (Megatron's default module, core_attn).
  if (p.recompute == Recompute::selective && !training.recompute_modules.is_default())
    return "Megatron's recompute modules are not run (the executor's selective recompute reruns the attention core); "
           "drop --recompute-modules";
  // Its pipeline plays pipeline_order (pipeline.h), which has no bidirectional schedule.
  if (p.schedule == Schedule::dualpipe)
    return executor_does_not_run("the dualpipe schedule (--schedule dualpipe)");
  // Context parallel runs the blockwise ring whatever --attention says (ring_attention.h).
  if (p.cp > 1 && model.attention_dropout > 0)
    return "context parallel with attention dropout " + std::to_string(model.attention_dropout) +
           " is not run (the executor's ring attention has no dropout); use cp 1 or a model with attention dropout 0";
  return std::nullopt;
}

}  // namespace dplan::costmodel
