// The model being trained: a decoder-only transformer described by its shape. Read from a
// Hugging Face config.json or from dplan's own JSON form (inside plan.json); parameter counts
// follow the layer structure exactly. Families (Hugging Face model_type):
//   llama, mistral, qwen2   dense, gated MLP, RMSNorm, rotary, grouped-query attention
//   qwen3                   + per-head RMSNorm on q and k, explicit head_dim, attention_bias
//   nemotron                non-gated squared-ReLU MLP, LayerNorm1p, grouped-query attention
//   gpt_neox, gpt2          non-gated MLP, LayerNorm, biases (gpt2: learned positions)
//   mixtral                 MoE, top-k of E experts in every layer
//   qwen2_moe, qwen3_moe    MoE with moe_intermediate_size experts, dense layers
//                           (mlp_only_layers, decoder_sparse_step), qwen2_moe's gated shared expert
//   deepseek_v2/_v3         multi-head latent attention, shared experts, first_k_dense_replace
//                           dense layers (num_nextn_predict_layers, the MTP head, is not counted)
//   gpt_oss                 MoE with biased SwiGLU experts and router, attention sinks, a
//                           sliding window on the layers layer_types marks "sliding_attention"
// Models that mix dense and MoE layers (or windowed and full attention) are priced by their mean
// layer (layer_params, layer_forward_flops, layer_times); num_params sums the layers exactly.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

// Gated (gate, up, down matrices: SwiGLU, GeGLU) or plain (up, down: GELU, squared ReLU), whatever
// the activation; gelu and swiglu are the old names of the two kinds.
enum class MlpKind { plain, gated, gelu = plain, swiglu = gated };
enum class NormKind { layernorm, rmsnorm };
enum class PositionKind { learned, rotary };

struct ModelSpec {
  std::string name;
  std::string family;                 // Hugging Face model_type
  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;               // == num_heads without grouped-query attention
  int head_dim = 0;                   // usually hidden_size / num_heads
  int ffn_hidden_size = 0;            // per expert for MoE models
  int vocab_size = 0;
  int max_seq_len = 0;                // max_position_embeddings
  MlpKind mlp = MlpKind::swiglu;
  NormKind norm = NormKind::rmsnorm;
  PositionKind position = PositionKind::rotary;
  bool tied_embeddings = false;       // LM head shares the token embedding
  bool qkv_bias = false;              // biases on the q, k, v projections
  bool out_bias = false;              // bias on the attention output projection
  bool mlp_bias = false;              // biases on the MLP matrices
  int num_experts = 0;                // 0: dense MLP
  int experts_per_token = 0;          // top-k routing
  double attention_dropout = 0.0;     // probability
  double hidden_dropout = 0.0;        // residual / embedding dropout probability
  std::string activation = "silu";    // Hugging Face hidden_act (element-wise; no cost of its own)
  // MoE structure. Dense layers of an MoE model (DeepSeek's first_k_dense_replace and
  // moe_layer_freq, Qwen's mlp_only_layers and decoder_sparse_step), listed ascending, have a dense
  // MLP of dense_ffn_hidden_size; every MoE layer also runs the shared experts, one dense MLP of
  // shared_expert_ffn_size (n_shared_experts x their width).
  std::vector<int> dense_layers;
  int dense_ffn_hidden_size = 0;      // 0 when there are no dense layers
  int shared_expert_ffn_size = 0;     // 0: no shared expert
  bool shared_expert_gate = false;    // qwen2_moe: sigmoid gate h x 1 on the shared expert
  // E router biases: gpt_oss's, added to the logits and trained; DeepSeek-V3's
  // e_score_correction_bias (a sigmoid router's: moe_router_score below), added to the scores for
  // choosing the experts only and not trained by gradient (transformers keeps it as a buffer;
  // Megatron moves it by --moe-router-bias-update-rate outside the gradient).
  bool router_bias = false;
  // The load-balancing loss's coefficient: router_aux_loss_coef where the config trains with it
  // (output_router_logits: transformers adds it to the loss only then), else 0; DeepSeek's
  // aux_loss_alpha. Plans written before this key ran with Switch Transformer's 0.01.
  double moe_aux_loss_coef = 0.01;
  // The top-k routing weights renormalised to sum 1 (Mixtral always; Qwen-MoE's norm_topk_prob,
  // false by default in transformers), else the softmax probabilities as they are.
  bool moe_norm_topk_prob = true;
  // DeepSeek's routing (transformers 5.23 DeepseekV2TopkRouter, DeepseekV3TopkRouter; DeepSeek-V3,
  // arXiv 2412.19437, Sec. 2.1.2): the scores are a softmax over the experts (every other family,
  // DeepSeek-V2) or each expert's sigmoid (V3). With moe_groups > 0 the experts form that many
  // equal groups and a token picks its k experts from its moe_group_topk best groups only, a group
  // scored by its best expert under softmax (V2's group_limited_greedy) or by the sum of its two
  // best under sigmoid (V3's noaux_tc, correction bias included). The chosen experts' weights
  // (renormalised where moe_norm_topk_prob) are multiplied by moe_routed_scaling.
  enum class RouterScore { softmax, sigmoid };
  RouterScore moe_router_score = RouterScore::softmax;
  int moe_groups = 0;                 // 0: no group limit
  int moe_group_topk = 0;
  double moe_routed_scaling = 1.0;
  // DeepSeek's rotary pairs (x0, x1), (x2, x3), ... of each head's rotated dims (transformers'
  // rope_interleave, V3's default; V2 always), where every other family pairs dim i with i + d/2.
  // The two give the same attention once the rotated rows of the projections are permuted (evens
  // first, then odds): the executor rotates halves and its checkpoint loader permutes those rows.
  bool rope_interleave = false;
  // gpt-oss's clamped SwiGLU in its experts (transformers GptOssExperts._apply_gate):
  // (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit), when
  // swiglu_limit > 0 (its swiglu_limit, 7, and swiglu_alpha, 1.702); 0: the plain SwiGLU.
  double swiglu_limit = 0.0;
  double swiglu_alpha = 1.0;
  // Multi-head latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0: head_dim is the query and
  // key head width (qk_nope_head_dim + qk_rope_head_dim), num_kv_heads == num_heads.
  int q_lora_rank = 0;                // 0: plain q projection
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;           // the decoupled rotary key, shared by all heads
  int v_head_dim = 0;                 // 0: head_dim
  bool qk_norm = false;               // qwen3: RMSNorm over head_dim on each q and k head
  bool attention_sinks = false;       // gpt_oss: one learned logit per head
  // Sliding-window attention: on the layers listed (ascending), query i sees keys i - w + 1 .. i,
  // w = sliding_window, its own included (transformers masking_utils.py sliding_window_overlay).
  // Which layers: layer_types' "sliding_attention" (gpt_oss: the even ones by default; Qwen2 and
  // Qwen3: from max_window_layers on with use_sliding_window), every layer for Mistral, Mixtral and
  // Qwen3-MoE where the config has a window.
  int sliding_window = 0;             // 0: none
  std::vector<int> sliding_layers;
  // Rotary on the first rotary_dim of each query and key head's dims, the rest passed through
  // (Nemotron's partial_rotary_factor, GPT-NeoX's rotary_pct: int(head_dim x fraction)); 0: all.
  int rotary_dim = 0;
  // GPT-NeoX's use_parallel_residual: x + attn(norm1(x)) + mlp(norm2(x)), both from the same x.
  bool parallel_residual = false;
  // Multi-token prediction (DeepSeek-V3, arXiv 2412.19437, Sec. 2.2; its config's
  // num_nextn_predict_layers; Megatron-LM's --mtp-num-layers): D sequential modules on the last
  // pipeline stage, each one transformer layer (of the last layer's kind), two norms, a 2h x h
  // projection and a final norm, sharing the embedding and the LM head. Not in num_params (the model
  // cards count the main model); mtp_params counts them.
  int mtp_layers = 0;
  // The MTP losses' weight in the objective, lambda / D times the sum of the modules' mean token
  // losses (DeepSeek-V3, arXiv 2412.19437, eq. 25: lambda 0.3, then 0.1); Megatron-LM's
  // --mtp-loss-scaling-factor, default 0.1.
  double mtp_loss_scale = 0.1;
  // Numerics that change the function, not the cost: the norms' epsilon (rms_norm_eps,
  // layer_norm_eps, layer_norm_epsilon, norm_eps) and the rotary base (rope_theta, or
  // rope_parameters' in transformers 5); rope_scaling names a scaled rotary (linear, llama3, yarn,
  // ...), empty for the plain one, and rope_scaling_params holds its parameters as the config gives
  // them (factor, original_max_position_embeddings, ...: rotary.h reads them). Plans written before
  // these keys get the executor's old constants.
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  std::string rope_scaling;
  json rope_scaling_params = json::object();

  bool is_moe() const { return num_experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Width of the attention output over all heads (the output projection's input): heads x value dim.
  int attn_out_dim() const { return num_heads * (v_head_dim > 0 ? v_head_dim : head_dim); }
  int num_dense_layers() const { return static_cast<int>(dense_layers.size()); }
  bool is_dense_layer(int layer) const;  // a layer with a dense MLP in an MoE model
  int num_moe_layers() const { return is_moe() ? num_layers - num_dense_layers() : 0; }
  int num_sliding_layers() const { return static_cast<int>(sliding_layers.size()); }
  // Whether a window cuts anything off at this sequence length (a window as long as the sequence is
  // full causal attention).
  bool window_binds(double seq_len) const { return num_sliding_layers() > 0 && sliding_window < seq_len; }
  // The keys a query of `layer` sees back to its own (sliding_window on a windowed layer), 0: all.
  int attention_window(int layer) const;
  // The rotated dims of each query and key head: MLA's decoupled rotary part, else rotary_dim or all.
  int rotary_width() const { return is_mla() ? qk_rope_head_dim : rotary_dim > 0 ? rotary_dim : head_dim; }
  // Share of the layers that are MoE layers (the rest have a dense MLP).
  double moe_layer_fraction() const { return double(num_moe_layers()) / num_layers; }
  bool operator==(const ModelSpec&) const = default;
};

// Parameters of one transformer layer, split by where they live (counts, not bytes).
struct LayerParams {
  double attention = 0;   // q, k, v, o projections, their biases, MLA's latent norms, q/k norms, sinks
  double mlp = 0;         // dense MLP, or the shared part of an MoE layer (router, shared experts)
  double experts = 0;     // all experts of an MoE layer (0 for dense)
  double norms = 0;       // the two norms
  double attention_replicated = 0;  // the part of `attention` tensor parallel does not split
  // Parameter tensors (weights, biases, norm scales) as Megatron's modules hold them: fused QKV, the
  // MLP's fc1 with gate and up fused, one fc1 and fc2 per expert. What an engine that gathers
  // parameter by parameter (engine.h, ShardUnit::parameter) runs one collective for.
  double tensors = 0;
  double total() const { return attention + mlp + experts + norms; }
};

enum class LayerKind { dense, moe };
// One layer of that kind (a dense layer of an MoE model has its dense_ffn_hidden_size MLP).
LayerParams layer_params(const ModelSpec& model, LayerKind kind);
// The mean layer: dense and MoE layers weighted by their counts (exact for uniform models).
LayerParams layer_params(const ModelSpec& model);

// Parameters of the whole model, exact (Llama-3-8B = 8,030,261,248): embedding, learned position
// embedding, layers, final norm and LM head (counted once when tied). `vocab_size` overrides the
// model's vocabulary (for padded vocabularies); 0 means the model's own.
double num_params(const ModelSpec& model, int vocab_size = 0);

// The kind of an MTP module's transformer layer: the model's last layer's (Megatron's
// num_floating_point_operations, last_layer_is_moe): MoE for an MoE model, whose dense layers come first.
LayerKind mtp_layer_kind(const ModelSpec& model);
// Parameters of the model's MTP modules (ModelSpec::mtp_layers): per module its layer, the
// embedding and hidden norms, the 2h x h projection and its final norm (Megatron-LM core_v0.15.0
// multi_token_prediction.py: enorm, hnorm, eh_proj, transformer_layer, final_layernorm). 0 without.
double mtp_params(const ModelSpec& model);
// One MTP module's own parameters beside its transformer layer: enorm, hnorm, final norm, eh_proj.
double mtp_module_extra_params(const ModelSpec& model);

// Parameters a token activates: like num_params, but only experts_per_token experts per layer
// (the input embedding counted, as for Mixtral's 12.9 B; gpt-oss's model card leaves it out).
double num_active_params(const ModelSpec& model);

// Reads a Hugging Face config.json. `file` names the source in error messages. Throws
// InputError for an unsupported model_type (naming the supported ones), a missing required key,
// an out-of-range value, or a key that is neither understood nor known to be irrelevant.
ModelSpec model_from_hf_config(const json& config, const std::string& file, const std::string& name);

// dplan's own JSON form (used inside plan.json). model_from_json is strict like every reader.
json to_json(const ModelSpec& model);
ModelSpec model_from_json(const json& j, const std::string& file, const std::string& pointer);

// Throws InputError if the shape is inconsistent (e.g. heads not divisible by kv heads).
void validate(const ModelSpec& model, const std::string& where);

const char* to_string(MlpKind kind);
const char* to_string(NormKind kind);

}  // namespace dplan::costmodel
