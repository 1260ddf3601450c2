#include "dplan/costmodel/executor_support.h"

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/rotary.h"

namespace dplan::costmodel {

std::string executor_does_not_run(const std::string& what) {
  return "the executor does not run " + what +
         " yet; it runs tp, pp (gpipe, 1f1b, interleaved), dp, context parallel, sequence parallel, ZeRO 0-3, "
         "the distributed optimizer, optimizer offload, recompute, Mixtral-, Qwen-MoE-, gpt-oss- and DeepSeek-style "
         "mixture of experts (dense layers, shared experts) with ep and etp, multi-head latent attention, attention "
         "sinks, sliding windows, partial and scaled rotary (linear, llama3, yarn) (dplan --runnable searches only "
         "those)";
}

std::optional<std::string> gelu_approximation(const std::string& activation) {
  if (activation == "gelu" || activation == "gelu_python") return "none";
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast") return "tanh";
  return std::nullopt;
}

bool runs_plain_activation(const std::string& activation) {
  return gelu_approximation(activation) || activation == "relu" || activation == "relu2";
}

std::optional<std::string> executor_refusal(const ModelSpec& model, const TrainingSpec& training,
                                            const ParallelConfig& p) {
  // MoE (executor/src/moe.h): softmax top-k routing over experts with or without biases (gpt-oss),
  // DeepSeek's sigmoid or softmax routing over expert groups with its correction bias, dense layers
  // and shared experts (gated: Qwen2-MoE) beside them: every router the planner reads.
  // Its layers (executor/src/gpt.h) are GELU, ReLU or squared-ReLU MLPs, or SiLU-gated ones, after
  // multi-head, grouped-query or DeepSeek's multi-head latent attention with Qwen3's q/k norms,
  // sliding windows and gpt-oss's sinks where the model has them, rotary over all or part of each head at the model's base and scaling
  // (costmodel/rotary.h), and the serial or GPT-NeoX's parallel residual.
  if (model.mlp == MlpKind::plain ? !runs_plain_activation(model.activation) : model.activation != "silu")
    return executor_does_not_run("the " + model.activation + " activation in a " + to_string(model.mlp) + " MLP");
  if (model.position == PositionKind::rotary) {
    try {
      rotary_frequencies(model);
    } catch (const InputError& e) {
      return std::string(e.what()) + " (the executor's rotary embedding)";
    }
  }
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
  // Its multi-token prediction modules (executor/src/gpt.h) embed their tokens on the last stage,
  // which holds no learned positions.
  if (model.mtp_layers > 0 && model.position == PositionKind::learned)
    return executor_does_not_run("multi-token prediction with learned positions (--mtp-layers 0 drops it)");
  // Its selective recompute reruns the attention core (Megatron's default module, core_attn).
  if (p.recompute == Recompute::selective && !training.recompute_modules.is_default())
    return "Megatron's recompute modules are not run (the executor's selective recompute reruns the attention core); "
           "drop --recompute-modules";
  // Its pipeline plays pipeline_order (pipeline.h), which has no bidirectional schedule.
  if (p.schedule == Schedule::dualpipe)
    return executor_does_not_run("the dualpipe schedule (--schedule dualpipe)");
  return std::nullopt;
}

}  // namespace dplan::costmodel
