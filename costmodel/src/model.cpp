#include "dplan/costmodel/model.h"

#include <algorithm>
#include <map>
#include <vector>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {
namespace {

// Keys found in real config.json files that do not change memory or time (tokenizer ids, init,
// numerics, RoPE details, routing rules, inference-time weight quantization and the MTP head).
// Accepted and ignored (sliding windows and partial rotary are read for the families that have
// them: read_sliding_window, read_numerics).
const std::initializer_list<const char*> kIgnoredHfKeys = {
    "_name_or_path", "architectures", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "pretraining_tp", "sliding_window", "use_sliding_window",
    "max_window_layers", "layer_types", "router_jitter_noise",
    "classifier_dropout", "rotary_pct", "rotary_emb_dim",
    "partial_rotary_factor", "scoring_func", "seq_aux", "ep_size",
    "quantization_config", "initial_context_length", "auto_map", "qk_head_dim",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "n_ctx",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "task_specific_params", "attn_implementation", "use_mrope", "model_type",
    "is_decoder"};

const std::vector<std::string> kFamilies = {"llama",     "mistral",   "mixtral",     "qwen2",   "qwen3",
                                            "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "nemotron",
                                            "gpt_neox",  "gpt2"};

// Bounds on a config's sizes, far above any model built (hidden 2^20, 2^16 layers, 2^24 vocab
// and positions, 2^16 experts) and low enough that products of them (parameters, FLOPs) stay
// exact in double and every int index in range.
constexpr long long kMaxWidth = 1 << 20;
constexpr long long kMaxLayers = 1 << 16;
constexpr long long kMaxTokens = 1 << 24;  // vocabulary and positions
constexpr long long kMaxExperts = 1 << 16;

}  // namespace

int ModelSpec::attention_window(int layer) const {
  return std::binary_search(sliding_layers.begin(), sliding_layers.end(), layer) ? sliding_window : 0;
}

bool ModelSpec::is_dense_layer(int layer) const {
  return std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

namespace {

int width(ObjectReader& r, const char* key) { return static_cast<int>(r.int_in(key, 1, kMaxWidth)); }
int optional_width(ObjectReader& r, const char* key) { return r.has(key) ? width(r, key) : 0; }
bool optional_bool(ObjectReader& r, const char* key, bool otherwise) { return r.has(key) ? r.boolean(key) : otherwise; }

// Hugging Face's activation names (transformers/activations.py ACT2FN): none changes the cost,
// but a name outside the list is a broken config.
const std::vector<std::string> kActivations = {
    "gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
    "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu", "relu", "relu2", "relu6",
    "sigmoid", "silu", "swish", "tanh", "xielu"};

std::string activation(ObjectReader& r, const char* key, const char* otherwise) {
  return r.has(key) ? r.one_of(key, kActivations) : otherwise;
}

// A list of layer indices (Qwen's mlp_only_layers), each in [0, layers).
std::vector<int> layer_list(ObjectReader& r, const char* key, int layers) {
  std::vector<int> out;
  if (!r.has(key)) return out;
  const json& j = r.raw(key);
  auto bad = [&] {
    throw InputError(r.where(key) + ": expected a list of layer indices from 0 to " + std::to_string(layers - 1));
  };
  if (!j.is_array()) bad();
  for (const json& x : j) {
    if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() >= layers) bad();
    out.push_back(static_cast<int>(x.get<long long>()));
  }
  return out;
}

// The keys every decoder family here shares: sizes, heads, vocabulary, positions.
void read_common(ObjectReader& r, ModelSpec& m) {
  m.hidden_size = width(r, "hidden_size");
  m.num_layers = static_cast<int>(r.int_in("num_hidden_layers", 1, kMaxLayers));
  m.num_heads = width(r, "num_attention_heads");
  m.num_kv_heads = r.has("num_key_value_heads") ? width(r, "num_key_value_heads") : m.num_heads;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("max_position_embeddings", 1, kMaxTokens));
  m.tied_embeddings = optional_bool(r, "tie_word_embeddings", false);
  m.attention_dropout = r.has("attention_dropout") ? r.fraction("attention_dropout") : 0.0;
}

// Qwen2-MoE / Qwen3-MoE (transformers modeling_qwen{2,3}_moe.py Qwen*MoeDecoderLayer): layer i has
// experts unless i is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0; the others have
// a dense MLP of intermediate_size.
void read_qwen_moe(ObjectReader& r, const std::string& family, ModelSpec& m) {
  // num_experts on the hub's configs; transformers 5 saves it as num_local_experts (its attribute_map).
  const bool hub = r.has("num_experts"), v5 = r.has("num_local_experts");
  m.num_experts = static_cast<int>(r.int_in(hub || !v5 ? "num_experts" : "num_local_experts", 1, kMaxExperts));
  if (hub && v5 && r.int_in("num_local_experts", 1, kMaxExperts) != m.num_experts)
    throw InputError(r.where("num_local_experts") + ": differs from num_experts (" + std::to_string(m.num_experts) + ")");
  m.experts_per_token = static_cast<int>(r.int_in("num_experts_per_tok", 1, kMaxExperts));
  m.dense_ffn_hidden_size = m.ffn_hidden_size;
  m.ffn_hidden_size = width(r, "moe_intermediate_size");
  const int step = r.has("decoder_sparse_step") ? static_cast<int>(r.int_in("decoder_sparse_step", 1, kMaxLayers)) : 1;
  const std::vector<int> dense_only = layer_list(r, "mlp_only_layers", m.num_layers);
  for (int i = 0; i < m.num_layers; ++i) {
    bool listed = std::find(dense_only.begin(), dense_only.end(), i) != dense_only.end();
    if (listed || (i + 1) % step != 0) m.dense_layers.push_back(i);
  }
  if (m.dense_layers.empty()) m.dense_ffn_hidden_size = 0;
  // Qwen{2,3}MoeSparseMoeBlock: routing_weights /= sum only with norm_topk_prob (default false).
  m.moe_norm_topk_prob = optional_bool(r, "norm_topk_prob", false);
  if (family == "qwen2_moe" && r.has("shared_expert_intermediate_size")) {
    m.shared_expert_ffn_size = static_cast<int>(r.int_in("shared_expert_intermediate_size", 0, kMaxWidth));
    m.shared_expert_gate = m.shared_expert_ffn_size > 0;  // Qwen2MoeSparseMoeBlock.shared_expert_gate
  }
}

// llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe: gated (SwiGLU) MLP, RMSNorm, rotary.
void read_llama_like(ObjectReader& r, const std::string& family, ModelSpec& m) {
  read_common(r, m);
  m.ffn_hidden_size = width(r, "intermediate_size");
  // Qwen3Config's head_dim defaults to 128 rather than hidden / heads.
  const bool qwen3 = family == "qwen3" || family == "qwen3_moe";
  m.head_dim = r.has("head_dim") ? width(r, "head_dim") : qwen3 ? 128 : 0;
  m.activation = activation(r, "hidden_act", "silu");  // the MLP is gated whatever it is
  m.mlp = MlpKind::gated;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rotary;
  if (family == "llama") {
    bool attention_bias = optional_bool(r, "attention_bias", false);
    m.qkv_bias = m.out_bias = attention_bias;
    m.mlp_bias = optional_bool(r, "mlp_bias", false);
  } else if (family == "qwen2" || family == "qwen2_moe") {
    // Qwen2(Moe)Attention: q/k/v projections with bias, o_proj without (transformers 5's
    // Qwen2MoeConfig names it qkv_bias).
    m.qkv_bias = family == "qwen2_moe" ? optional_bool(r, "qkv_bias", true) : true;
  } else if (qwen3) {
    // Qwen3Attention: q/k/v/o bias = attention_bias; q_norm and k_norm RMSNorm(head_dim).
    m.qkv_bias = m.out_bias = optional_bool(r, "attention_bias", false);
    m.qk_norm = true;
  }
  if (family == "mixtral") {
    m.num_experts = static_cast<int>(r.int_in("num_local_experts", 1, kMaxExperts));
    m.experts_per_token = static_cast<int>(r.int_in("num_experts_per_tok", 1, kMaxExperts));
  } else if (family == "qwen2_moe" || family == "qwen3_moe") {
    read_qwen_moe(r, family, m);
  }
}

// DeepSeek-V2 and -V3 (deepseek-ai/DeepSeek-V3 modeling_deepseek.py): multi-head latent attention
// (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1), routed experts of moe_intermediate_size plus
// n_shared_experts shared ones, and dense layers before first_k_dense_replace and off moe_layer_freq.
void read_deepseek_v3(ObjectReader& r, ModelSpec& m) {
  read_common(r, m);
  m.num_kv_heads = m.num_heads;  // MLA: every head has its own key and value (num_key_value_heads unused)
  m.dense_ffn_hidden_size = width(r, "intermediate_size");
  m.ffn_hidden_size = width(r, "moe_intermediate_size");
  m.num_experts = static_cast<int>(r.int_in("n_routed_experts", 1, kMaxExperts));
  m.experts_per_token = static_cast<int>(r.int_in("num_experts_per_tok", 1, kMaxExperts));
  const long long shared = r.has("n_shared_experts") ? r.int_in("n_shared_experts", 0, kMaxExperts) : 0;
  if (shared * m.ffn_hidden_size > kMaxWidth)
    throw InputError(r.where("n_shared_experts") + ": n_shared_experts x moe_intermediate_size (" +
                     std::to_string(shared * m.ffn_hidden_size) + ") must be at most " + std::to_string(kMaxWidth));
  // DeepseekV3MoE.shared_experts: one MLP of n_shared_experts x moe_intermediate_size.
  m.shared_expert_ffn_size = static_cast<int>(shared * m.ffn_hidden_size);
  const int first_dense = r.has("first_k_dense_replace")
                              ? static_cast<int>(r.int_in("first_k_dense_replace", 0, kMaxLayers)) : 0;
  const int freq = r.has("moe_layer_freq") ? static_cast<int>(r.int_in("moe_layer_freq", 1, kMaxLayers)) : 1;
  for (int i = 0; i < m.num_layers; ++i)
    if (!(i >= first_dense && i % freq == 0)) m.dense_layers.push_back(i);
  if (m.dense_layers.empty()) m.dense_ffn_hidden_size = 0;
  // Routing as transformers 5.23 runs it (ModelSpec::moe_router_score): V3's router is always the
  // sigmoid one with its correction bias (noaux_tc; DeepSeek-V3, arXiv 2412.19437, Sec. 2.1.2) over
  // n_group groups (8, 4 of them chosen, by default), its weights renormalised (norm_topk_prob,
  // default true) and scaled (routed_scaling_factor, 2.5); V2's a softmax, greedy or
  // group_limited_greedy, never renormalised (DeepseekV2TopkRouter does not read norm_topk_prob),
  // scaled by routed_scaling_factor (1).
  const bool v3 = m.family == "deepseek_v3";
  const std::string method = r.has("topk_method") ? r.string("topk_method") : v3 ? "noaux_tc" : "greedy";
  if (!v3 && method != "greedy" && method != "group_limited_greedy")
    throw InputError(r.where("topk_method") + ": '" + method + "' is not DeepSeek-V2's; valid: greedy, group_limited_greedy");
  m.router_bias = v3;
  m.moe_router_score = v3 ? ModelSpec::RouterScore::sigmoid : ModelSpec::RouterScore::softmax;
  if (v3 || method == "group_limited_greedy") {
    m.moe_groups = r.has("n_group") ? static_cast<int>(r.int_in("n_group", 1, m.num_experts)) : v3 ? 8 : 1;
    m.moe_group_topk = r.has("topk_group") ? static_cast<int>(r.int_in("topk_group", 1, m.moe_groups))
                                           : v3 ? std::min(4, m.moe_groups) : 1;
  } else {
    r.ignore({"n_group", "topk_group"});
  }
  m.moe_routed_scaling = r.has("routed_scaling_factor") ? r.number_in("routed_scaling_factor", 1e-6, 1e6) : v3 ? 2.5 : 1.0;
  m.moe_norm_topk_prob = v3 ? optional_bool(r, "norm_topk_prob", true) : false;
  // transformers' DeepseekV3Config: rope_interleave, default true; DeepseekV2's rotary is always
  // interleaved (its complex-number apply_rotary_emb pairs neighbouring dims).
  m.rope_interleave = v3 ? optional_bool(r, "rope_interleave", true) : true;
  m.q_lora_rank = r.has("q_lora_rank") ? width(r, "q_lora_rank") : 0;
  m.kv_lora_rank = width(r, "kv_lora_rank");
  m.qk_rope_head_dim = width(r, "qk_rope_head_dim");
  m.head_dim = width(r, "qk_nope_head_dim") + m.qk_rope_head_dim;
  m.v_head_dim = width(r, "v_head_dim");
  r.ignore("head_dim");  // transformers' DeepseekV3Config sets head_dim = qk_rope_head_dim (derived)
  // The MTP modules DeepSeek-V3 trained with (transformers' own model drops their weights on load).
  if (r.has("num_nextn_predict_layers"))
    m.mtp_layers = static_cast<int>(r.int_in("num_nextn_predict_layers", 0, kMaxLayers));
  r.ignore("num_key_value_heads");
  m.activation = activation(r, "hidden_act", "silu");
  m.qkv_bias = m.out_bias = optional_bool(r, "attention_bias", false);
  // transformers' DeepseekV2Config has mlp_bias (biases on the dense and shared MLPs, not the experts').
  if (optional_bool(r, "mlp_bias", false))
    throw InputError(r.where("mlp_bias") + ": DeepSeek-V2's MLP biases (mlp_bias true) are not read; valid: false");
  m.mlp = MlpKind::gated;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rotary;
}

// gpt-oss (transformers modeling_gpt_oss.py): biased q/k/v/o, one sink logit per head, a biased
// router and biased SwiGLU experts of intermediate_size, and a sliding window on the layers
// layer_types names "sliding_attention" (by default the even ones, GptOssConfig).
void read_gpt_oss(ObjectReader& r, ModelSpec& m) {
  read_common(r, m);
  m.ffn_hidden_size = width(r, "intermediate_size");
  m.head_dim = optional_width(r, "head_dim");
  m.num_experts = static_cast<int>(r.int_in("num_local_experts", 1, kMaxExperts));
  const bool k1 = r.has("num_experts_per_tok"), k2 = r.has("experts_per_token");
  if (!k1 && !k2) throw InputError(r.where("num_experts_per_tok") + ": missing key \"num_experts_per_tok\"");
  m.experts_per_token = static_cast<int>(r.int_in(k1 ? "num_experts_per_tok" : "experts_per_token", 1, kMaxExperts));
  if (k1 && k2 && r.int_in("experts_per_token", 1, kMaxExperts) != m.experts_per_token)
    throw InputError(r.where("experts_per_token") + ": differs from num_experts_per_tok (" +
                     std::to_string(m.experts_per_token) + ")");
  m.activation = activation(r, "hidden_act", "silu");
  m.qkv_bias = m.out_bias = optional_bool(r, "attention_bias", true);
  m.mlp_bias = true;
  m.router_bias = true;
  m.attention_sinks = true;
  m.swiglu_limit = r.has("swiglu_limit") ? r.number_in("swiglu_limit", 1e-6, 1e6) : 7.0;
  m.swiglu_alpha = r.has("swiglu_alpha") ? r.number_in("swiglu_alpha", 1e-6, 1e6) : 1.702;
  m.mlp = MlpKind::gated;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rotary;
}

// Nemotron-4 (transformers modeling_nemotron.py): up and down projections with relu2 between
// (squared ReLU, no gate), LayerNorm1P (weight and bias), q/k/v/o bias = attention_bias, MLP
// bias = mlp_bias, grouped-query attention.
void read_nemotron(ObjectReader& r, ModelSpec& m) {
  read_common(r, m);
  m.ffn_hidden_size = width(r, "intermediate_size");
  m.head_dim = optional_width(r, "head_dim");
  m.activation = activation(r, "hidden_act", "relu2");
  m.qkv_bias = m.out_bias = optional_bool(r, "attention_bias", false);
  m.mlp_bias = optional_bool(r, "mlp_bias", false);
  m.mlp = MlpKind::plain;
  m.norm = NormKind::layernorm;
  m.position = PositionKind::rotary;
}

void read_gpt_neox(ObjectReader& r, ModelSpec& m) {
  m.hidden_size = width(r, "hidden_size");
  m.ffn_hidden_size = width(r, "intermediate_size");
  m.num_layers = static_cast<int>(r.int_in("num_hidden_layers", 1, kMaxLayers));
  m.num_heads = width(r, "num_attention_heads");
  // Hugging Face's GPTNeoXConfig has no grouped-query attention; Megatron's GPT with
  // --group-query-attention is the same network with fewer key/value heads, spelled so here.
  m.num_kv_heads = r.has("num_key_value_heads") ? width(r, "num_key_value_heads") : m.num_heads;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("max_position_embeddings", 1, kMaxTokens));
  m.activation = activation(r, "hidden_act", "gelu");  // relu2 (Nemotron-3) too: same GEMMs
  m.tied_embeddings = r.has("tie_word_embeddings") ? r.boolean("tie_word_embeddings") : false;
  bool bias = r.has("attention_bias") ? r.boolean("attention_bias") : true;
  m.qkv_bias = m.out_bias = bias;
  m.mlp_bias = true;
  m.attention_dropout = r.has("attention_dropout") ? r.fraction("attention_dropout") : 0.0;
  m.hidden_dropout = r.has("hidden_dropout") ? r.fraction("hidden_dropout") : 0.0;
  m.parallel_residual = optional_bool(r, "use_parallel_residual", true);
  m.mlp = MlpKind::plain;
  m.norm = NormKind::layernorm;
  m.position = PositionKind::rotary;
}

// Sliding-window attention (ModelSpec::sliding_layers) with each family's transformers defaults
// (5.23, configuration_<family>.py and the attention modules): gpt_oss's window (128) on the layers
// layer_types calls "sliding_attention", by default the even ones; Qwen2's and Qwen3's only with
// use_sliding_window, on layer_types' or else from max_window_layers (28) on; Qwen2-MoE's on the
// even layers below max_window_layers; Mistral's (4096 unless null), Mixtral's and Qwen3-MoE's (with
// use_sliding_window) on every layer. A null or 0 window is none; the other families have none.
void read_sliding_window(ObjectReader& r, ModelSpec& m) {
  const std::string& f = m.family;
  const bool qwen = f == "qwen2" || f == "qwen3" || f == "qwen2_moe" || f == "qwen3_moe";
  if (!(qwen || f == "gpt_oss" || f == "mistral" || f == "mixtral")) return;
  m.sliding_window = f == "gpt_oss" ? 128 : f == "mixtral" ? 0 : 4096;
  if (r.has("sliding_window")) m.sliding_window = static_cast<int>(r.int_in("sliding_window", 0, kMaxTokens));
  else if (r.has_key("sliding_window")) m.sliding_window = 0;  // null
  if (qwen && !optional_bool(r, "use_sliding_window", false)) m.sliding_window = 0;
  const int max_window = r.has("max_window_layers") ? static_cast<int>(r.int_in("max_window_layers", 0, kMaxLayers)) : 28;
  std::vector<bool> sliding(m.num_layers, false);
  if (r.has("layer_types") && f != "mistral" && f != "mixtral" && f != "qwen3_moe") {
    const json& types = r.raw("layer_types");
    if (!types.is_array() || static_cast<long long>(types.size()) != m.num_layers)
      throw InputError(r.where("layer_types") + ": expected a list of " + std::to_string(m.num_layers) +
                       " entries, each \"sliding_attention\" or \"full_attention\"");
    for (int i = 0; i < m.num_layers; ++i) {
      const json& t = types[i];
      if (t != "sliding_attention" && t != "full_attention")
        throw InputError(r.where("layer_types") + ": unknown layer type " + t.dump() +
                         "; valid: sliding_attention or full_attention");
      sliding[i] = t == "sliding_attention";
    }
  } else {
    for (int i = 0; i < m.num_layers; ++i)
      sliding[i] = f == "gpt_oss" ? i % 2 == 0
                   : f == "qwen2_moe" ? i % 2 == 0 && i < max_window
                   : f == "qwen2" || f == "qwen3" ? i >= max_window
                   : true;
  }
  if (m.sliding_window == 0) return;
  for (int i = 0; i < m.num_layers; ++i)
    if (sliding[i]) m.sliding_layers.push_back(i);
  if (m.sliding_layers.empty()) m.sliding_window = 0;
}

// The norms' epsilon and the rotary base and scaling, under each family's keys, with the defaults
// of its transformers configuration class (5.23: configuration_<family>.py) where the file has none.
// Returns the share of each head's dims that rotate (partial rotary), for set_rotary_dim.
double read_numerics(ObjectReader& r, ModelSpec& m) {
  const std::string& f = m.family;
  const char* eps_key = f == "gpt2" ? "layer_norm_epsilon" : f == "gpt_neox" ? "layer_norm_eps"
                        : f == "nemotron" ? "norm_eps" : "rms_norm_eps";
  const bool eps_1e5 = f == "gpt2" || f == "gpt_neox" || f == "nemotron" || f == "mixtral" || f == "gpt_oss";
  m.norm_eps = r.has(eps_key) ? r.number_in(eps_key, 1e-12, 1.0) : eps_1e5 ? 1e-5 : 1e-6;
  if (f == "gpt2") return 1.0;  // learned positions
  m.rope_theta = f == "mixtral" ? 1e6 : f == "gpt_oss" ? 150000.0 : 10000.0;
  if (f == "gpt_oss") m.rope_scaling = "yarn";
  for (const char* key : {"rotary_emb_base", "rope_theta"})  // gpt_neox's older name first
    if (r.has(key)) m.rope_theta = r.number_in(key, 1.0, 1e12);
  // Partial rotary: Nemotron's partial_rotary_factor (0.5 by default), GPT-NeoX's rotary_pct (0.25),
  // at the top level (transformers 4) or inside rope_parameters (5).
  double rotary_fraction = f == "nemotron" ? 0.5 : f == "gpt_neox" ? 0.25 : 1.0;
  for (const char* key : {"partial_rotary_factor", "rotary_pct"})
    if (r.has(key)) rotary_fraction = r.number_in(key, 1e-6, 1.0);
  // rope_scaling (transformers 4) or rope_parameters (5): {"rope_type" or "type": ..., "rope_theta",
  // "partial_rotary_factor", and the scaling's own parameters}; those are kept for rotary.h.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& j = r.raw(key);
    if (!j.is_object()) throw InputError(r.where(key) + ": expected an object with \"rope_type\"");
    json params = j;
    if (j.contains("rope_theta")) {
      if (!j["rope_theta"].is_number() || !(j["rope_theta"].get<double>() >= 1.0))
        throw InputError(r.where(key) + "/rope_theta: expected a number of at least 1");
      m.rope_theta = j["rope_theta"].get<double>();
    }
    if (j.contains("partial_rotary_factor")) {
      const json& x = j["partial_rotary_factor"];
      if (!x.is_number() || !(x.get<double>() > 0 && x.get<double>() <= 1))
        throw InputError(r.where(key) + "/partial_rotary_factor: expected a number above 0, at most 1");
      rotary_fraction = x.get<double>();
    }
    const char* type_key = j.contains("rope_type") ? "rope_type" : j.contains("type") ? "type" : nullptr;
    for (const char* k : {"rope_theta", "partial_rotary_factor", "rope_type", "type"}) params.erase(k);
    if (type_key == nullptr) continue;
    if (!j[type_key].is_string()) throw InputError(r.where(key) + "/" + type_key + ": expected a string");
    const std::string type = j[type_key].get<std::string>();
    m.rope_scaling = type == "default" ? "" : type;
    m.rope_scaling_params = type == "default" ? json::object() : params;
  }
  if (f == "gpt_oss" && m.rope_scaling == "yarn" && m.rope_scaling_params.empty())
    m.rope_scaling_params = {{"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"truncate", false},
                             {"original_max_position_embeddings", 4096}};  // GptOssConfig's default
  return rotary_fraction;
}

// ModelSpec::rotary_dim from the share of head_dim that rotates, int() of the product as transformers takes it.
void set_rotary_dim(ModelSpec& m, double rotary_fraction, const std::string& file) {
  if (rotary_fraction >= 1.0) return;
  const int rotary = static_cast<int>(m.head_dim * rotary_fraction);
  if (rotary < 2 || rotary % 2 != 0)
    throw InputError(file + ": the partial rotary fraction " + std::to_string(rotary_fraction) + " of head_dim " +
                     std::to_string(m.head_dim) + " leaves " + std::to_string(rotary) +
                     " rotated dims; it must leave an even number, at least 2");
  m.rotary_dim = rotary == m.head_dim ? 0 : rotary;
}

// The MoE load-balancing loss's coefficient (ModelSpec::moe_aux_loss_coef). transformers'
// Mixtral/Qwen-MoE/gpt-oss models add router_aux_loss_coef (default 0.001) times their balance loss
// to the loss only with output_router_logits (default false); DeepSeek's aux_loss_alpha (0.001).
void read_aux_loss(ObjectReader& r, ModelSpec& m) {
  const bool deepseek = m.family == "deepseek_v2" || m.family == "deepseek_v3";
  const char* key = deepseek ? "aux_loss_alpha" : "router_aux_loss_coef";
  const double coef = r.has(key) ? r.number_in(key, 0.0, 1e3) : 0.001;
  const bool trained = deepseek || (r.has("output_router_logits") && r.boolean("output_router_logits"));
  r.ignore({"router_aux_loss_coef", "aux_loss_alpha", "output_router_logits", "norm_topk_prob"});  // other families' names
  if (m.is_moe()) m.moe_aux_loss_coef = trained ? coef : 0.0;  // a dense model keeps the default, unused
}

void read_gpt2(ObjectReader& r, ModelSpec& m) {
  m.hidden_size = width(r, "n_embd");
  m.num_layers = static_cast<int>(r.int_in("n_layer", 1, kMaxLayers));
  m.num_heads = width(r, "n_head");
  m.num_kv_heads = m.num_heads;
  m.ffn_hidden_size = r.has("n_inner") ? width(r, "n_inner") : 4 * m.hidden_size;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("n_positions", 1, kMaxTokens));
  m.activation = activation(r, "activation_function", "gelu_new");
  m.tied_embeddings = r.has("tie_word_embeddings") ? r.boolean("tie_word_embeddings") : true;
  m.attention_dropout = r.has("attn_pdrop") ? r.fraction("attn_pdrop") : 0.1;
  m.hidden_dropout = r.has("resid_pdrop") ? r.fraction("resid_pdrop") : 0.1;
  if (r.has("embd_pdrop")) r.fraction("embd_pdrop");
  m.qkv_bias = m.out_bias = m.mlp_bias = true;
  m.mlp = MlpKind::plain;
  m.norm = NormKind::layernorm;
  m.position = PositionKind::learned;
  // transformers writes it into every GPT-2 config.json it saves, false for the decoder-only model.
  if (r.has("add_cross_attention") && r.boolean("add_cross_attention"))
    throw InputError(r.where("add_cross_attention") +
                     ": cross-attention (GPT-2 as an encoder-decoder's decoder) is not planned; dplan plans decoder-only models");
}

// One MLP of width f: plain fc1 (h->f) + fc2 (f->h); gated: gate and up (h->f each) + down (f->h).
double mlp_params(const ModelSpec& m, double f) {
  const double h = m.hidden_size;
  const bool gated = m.mlp == MlpKind::gated;
  double weights = (gated ? 3.0 : 2.0) * h * f;
  double biases = m.mlp_bias ? (gated ? 2.0 * f : f) + h : 0.0;
  return weights + biases;
}

}  // namespace

const char* to_string(MlpKind kind) { return kind == MlpKind::plain ? "plain" : "gated"; }
const char* to_string(NormKind kind) { return kind == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

LayerParams layer_params(const ModelSpec& m, LayerKind kind) {
  const double h = m.hidden_size, q = m.q_dim(), kv = m.kv_dim(), heads = m.num_heads;
  LayerParams p;
  if (m.is_mla()) {
    // MLA (modeling_deepseek.py DeepseekV3Attention): q_a_proj h x r_q, q_a_layernorm r_q, q_b_proj
    // r_q x heads*(nope+rope) (or one q_proj h x q); kv_a_proj_with_mqa h x (r_kv + rope),
    // kv_a_layernorm r_kv, kv_b_proj r_kv x heads*(nope + v); o_proj heads*v x h. attention_bias
    // puts biases on q_a, kv_a and o. The down projections and latent norms are replicated
    // under tensor parallel (Megatron-Core MLASelfAttention: linear_q_down_proj and
    // linear_kv_down_proj are not tensor-parallel).
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, rope = m.qk_rope_head_dim;
    const double nope = m.head_dim - rope, v = m.attn_out_dim() / heads;
    double down = 0, up = 0;
    if (rq > 0) {
      down += h * rq + rq + (m.qkv_bias ? rq : 0);
      up += rq * q;
    } else {
      up += h * q;
    }
    down += h * (rkv + rope) + rkv + (m.qkv_bias ? rkv + rope : 0);
    up += rkv * heads * (nope + v);
    p.attention = down + up + m.attn_out_dim() * h + (m.out_bias ? h : 0);
    p.attention_replicated = down + (m.out_bias ? h : 0);
    // q_a (or q), q_a_layernorm, q_b, kv_a, kv_a_layernorm, kv_b, o, and their biases.
    p.tensors = (rq > 0 ? 3 : 1) + 3 + 1 + (m.qkv_bias ? (rq > 0 ? 2 : 1) : 0) + (m.out_bias ? 1 : 0);
  } else {
    // q: h x q, k and v: h x kv each, o: q x h.
    p.attention = h * (q + 2 * kv) + q * h + (m.qkv_bias ? q + 2 * kv : 0) + (m.out_bias ? h : 0);
    p.attention_replicated = m.out_bias ? h : 0;  // the row-parallel output's bias
    p.tensors = 2 + (m.qkv_bias ? 1 : 0) + (m.out_bias ? 1 : 0);  // fused QKV, output projection
  }
  if (m.qk_norm) {
    p.attention += 2.0 * m.head_dim;  // Qwen3 q_norm, k_norm: RMSNorm(head_dim), shared by heads
    p.attention_replicated += 2.0 * m.head_dim;
  }
  if (m.qk_norm) p.tensors += 2;
  if (m.attention_sinks) p.attention += heads;  // gpt-oss: self_attn.sinks, one per head
  if (m.attention_sinks) p.tensors += 1;
  const double mlp_tensors = 2 + (m.mlp_bias ? 2 : 0);  // fc1 (gate and up fused) and fc2
  if (kind == LayerKind::moe && m.is_moe()) {
    // Router (gate) h x E, with E biases where the family has them; shared experts are one dense
    // MLP of their summed width, with qwen2_moe's h x 1 sigmoid gate.
    p.mlp = h * m.num_experts + (m.router_bias ? m.num_experts : 0);
    if (m.shared_expert_ffn_size > 0)
      p.mlp += mlp_params(m, m.shared_expert_ffn_size) + (m.shared_expert_gate ? h : 0);
    p.experts = m.num_experts * mlp_params(m, m.ffn_hidden_size);
    p.tensors += 1 + (m.router_bias ? 1 : 0) + m.num_experts * mlp_tensors +
                 (m.shared_expert_ffn_size > 0 ? mlp_tensors + (m.shared_expert_gate ? 1 : 0) : 0);
  } else {
    p.mlp = mlp_params(m, m.is_moe() ? m.dense_ffn_hidden_size : m.ffn_hidden_size);
    p.tensors += mlp_tensors;
  }
  double norm = m.norm == NormKind::layernorm ? 2.0 * h : h;  // LayerNorm: weight + bias
  p.norms = 2 * norm;
  p.tensors += m.norm == NormKind::layernorm ? 4 : 2;
  return p;
}

LayerParams layer_params(const ModelSpec& m) {
  const double moe = m.moe_layer_fraction();
  if (moe == 0) return layer_params(m, LayerKind::dense);
  if (moe == 1) return layer_params(m, LayerKind::moe);
  const LayerParams d = layer_params(m, LayerKind::dense), e = layer_params(m, LayerKind::moe);
  auto mix = [&](double a, double b) { return (1 - moe) * a + moe * b; };
  return {mix(d.attention, e.attention), mix(d.mlp, e.mlp), mix(d.experts, e.experts), mix(d.norms, e.norms),
          mix(d.attention_replicated, e.attention_replicated), mix(d.tensors, e.tensors)};
}

double num_params(const ModelSpec& m, int vocab_size) {
  const double h = m.hidden_size;
  const double v = vocab_size > 0 ? vocab_size : m.vocab_size;
  double embedding = v * h;
  double positions = m.position == PositionKind::learned ? double(m.max_seq_len) * h : 0.0;
  double final_norm = m.norm == NormKind::layernorm ? 2.0 * h : h;
  double head = m.tied_embeddings ? 0.0 : v * h;
  const int moe_layers = m.num_moe_layers();
  double layers = double(m.num_layers - moe_layers) * layer_params(m, LayerKind::dense).total() +
                  (moe_layers > 0 ? double(moe_layers) * layer_params(m, LayerKind::moe).total() : 0.0);
  return embedding + positions + layers + final_norm + head;
}

LayerKind mtp_layer_kind(const ModelSpec& m) { return m.is_moe() ? LayerKind::moe : LayerKind::dense; }

double mtp_module_extra_params(const ModelSpec& m) {
  const double h = m.hidden_size, norm = m.norm == NormKind::layernorm ? 2 * h : h;
  return 3 * norm + 2 * h * h;
}

double mtp_params(const ModelSpec& m) {
  return m.mtp_layers * (layer_params(m, mtp_layer_kind(m)).total() + mtp_module_extra_params(m));
}

double num_active_params(const ModelSpec& m) {
  double total = num_params(m);
  if (!m.is_moe()) return total;
  double per_expert = mlp_params(m, m.ffn_hidden_size);
  return total - double(m.num_moe_layers()) * (m.num_experts - m.experts_per_token) * per_expert;
}

namespace {

// Throws InputError for the model read from `where`.
struct BadModel {
  const std::string& where;
  [[noreturn]] void operator()(const std::string& what) const { throw InputError(where + ": " + what); }
};

// Sizes positive and within bounds; heads a multiple of key/value heads.
void validate_shape(const ModelSpec& m, const BadModel& bad) {
  if (m.num_layers < 1 || m.hidden_size < 1 || m.num_heads < 1 || m.num_kv_heads < 1 ||
      m.ffn_hidden_size < 1 || m.vocab_size < 1 || m.max_seq_len < 1 || m.head_dim < 1)
    bad("layers, hidden size, heads, kv heads, head dim, ffn size, vocab and max positions must be positive");
  if (static_cast<long long>(m.num_heads) * m.head_dim > kMaxWidth)
    bad("num_attention_heads x head_dim (" + std::to_string(static_cast<long long>(m.num_heads) * m.head_dim) +
        ") must be at most " + std::to_string(kMaxWidth));
  if (m.num_heads % m.num_kv_heads != 0)
    bad("num_attention_heads (" + std::to_string(m.num_heads) + ") must be a multiple of num_key_value_heads (" +
        std::to_string(m.num_kv_heads) + ")");
}

// Each token routed to 1 to num_experts experts.
void validate_routing(const ModelSpec& m, const BadModel& bad) {
  if (m.is_moe() && (m.experts_per_token < 1 || m.experts_per_token > m.num_experts))
    bad("num_experts_per_tok (" + std::to_string(m.experts_per_token) + ") must be between 1 and num_local_experts (" +
        std::to_string(m.num_experts) + ")");
}

// Dense layers of an MoE model, and its dense and shared-expert MLP sizes.
void validate_layer_mix(const ModelSpec& m, const BadModel& bad) {
  const std::string layers = std::to_string(m.num_layers);
  for (size_t i = 0; i < m.dense_layers.size(); ++i)
    if (m.dense_layers[i] < 0 || m.dense_layers[i] >= m.num_layers || (i > 0 && m.dense_layers[i] <= m.dense_layers[i - 1]))
      bad("the dense layers must be distinct layer indices from 0 to " + std::to_string(m.num_layers - 1) + ", ascending");
  if (m.num_dense_layers() > 0 && !m.is_moe()) bad("dense layers are counted only in MoE models (no experts given)");
  if (m.is_moe() && m.num_dense_layers() == m.num_layers) bad("every layer is dense: no layer uses the experts");
  if ((m.num_dense_layers() > 0) != (m.dense_ffn_hidden_size > 0))
    bad("a dense-layer MLP size (" + std::to_string(m.dense_ffn_hidden_size) + ") is needed exactly when there are dense layers (" +
        std::to_string(m.num_dense_layers()) + ")");
  if (m.dense_ffn_hidden_size < 0 || m.dense_ffn_hidden_size > kMaxWidth || m.shared_expert_ffn_size < 0 ||
      m.shared_expert_ffn_size > kMaxWidth)
    bad("dense-layer and shared-expert MLP sizes must be from 0 to " + std::to_string(kMaxWidth));
  if (!m.is_moe() && (m.shared_expert_ffn_size > 0 || m.shared_expert_gate || m.router_bias))
    bad("shared experts and router biases need experts (num_experts > 0)");
  if (m.shared_expert_gate && m.shared_expert_ffn_size == 0) bad("a shared-expert gate needs a shared expert");
  if (m.moe_groups > 0) {  // group-limited routing (ModelSpec::moe_groups)
    const std::string groups = "n_group " + std::to_string(m.moe_groups);
    if (!m.is_moe() || m.num_experts % m.moe_groups != 0)
      bad(groups + " must divide the " + std::to_string(m.num_experts) + " routed experts");
    else if (m.moe_group_topk < 1 || m.moe_group_topk > m.moe_groups)
      bad("topk_group " + std::to_string(m.moe_group_topk) + " must be from 1 to " + groups);
    else if (m.moe_group_topk * (m.num_experts / m.moe_groups) < m.experts_per_token)
      bad("the topk_group " + std::to_string(m.moe_group_topk) + " chosen groups of " + std::to_string(m.num_experts / m.moe_groups) +
          " experts hold fewer than num_experts_per_tok (" + std::to_string(m.experts_per_token) + ")");
    else if (m.moe_router_score == ModelSpec::RouterScore::sigmoid && m.num_experts / m.moe_groups < 2)
      bad("a sigmoid router scores a group by its two best experts: " + groups + " leaves fewer than two in each");
  }
}

// Multi-head latent attention's ranks and head widths, and only with latent attention.
void validate_latent_attention(const ModelSpec& m, const BadModel& bad) {
  if (m.q_lora_rank < 0 || m.kv_lora_rank < 0 || m.qk_rope_head_dim < 0 || m.v_head_dim < 0 ||
      m.q_lora_rank > kMaxWidth || m.kv_lora_rank > kMaxWidth || m.v_head_dim > kMaxWidth)
    bad("q_lora_rank, kv_lora_rank, qk_rope_head_dim and v_head_dim must be from 0 to " + std::to_string(kMaxWidth));
  if (m.is_mla()) {
    if (m.qk_rope_head_dim < 1 || m.qk_rope_head_dim >= m.head_dim)
      bad("qk_rope_head_dim (" + std::to_string(m.qk_rope_head_dim) + ") must be from 1 to below the query/key head dim (" +
          std::to_string(m.head_dim) + "), leaving qk_nope_head_dim at least 1");
    if (m.v_head_dim < 1) bad("multi-head latent attention needs v_head_dim");
    if (m.num_kv_heads != m.num_heads) bad("multi-head latent attention has as many key/value heads as heads");
  } else if (m.q_lora_rank > 0 || m.qk_rope_head_dim > 0 || m.v_head_dim > 0) {
    bad("q_lora_rank, qk_rope_head_dim and v_head_dim belong to multi-head latent attention (kv_lora_rank > 0)");
  }
  if (static_cast<long long>(m.num_heads) * (m.v_head_dim > 0 ? m.v_head_dim : m.head_dim) > kMaxWidth)
    bad("num_attention_heads x v_head_dim must be at most " + std::to_string(kMaxWidth));
}

// Sliding-window layers: a window and ascending layer indices; partial rotary: an even share.
void validate_sliding_window(const ModelSpec& m, const BadModel& bad) {
  if (m.sliding_window < 0 || m.sliding_window > kMaxTokens)
    bad("the sliding window must be from 0 to " + std::to_string(kMaxTokens) + " tokens");
  for (size_t i = 0; i < m.sliding_layers.size(); ++i)
    if (m.sliding_layers[i] < 0 || m.sliding_layers[i] >= m.num_layers || (i > 0 && m.sliding_layers[i] <= m.sliding_layers[i - 1]))
      bad("the sliding-window layers must be distinct layer indices from 0 to " + std::to_string(m.num_layers - 1) +
          ", ascending");
  if ((m.num_sliding_layers() > 0) != (m.sliding_window > 0))
    bad("a sliding window (sliding_window > 0) needs the layers it applies to, and sliding-window layers need a window");
  if (m.rotary_dim < 0 || m.rotary_dim > m.head_dim || m.rotary_dim % 2 != 0)
    bad("the rotary dims (" + std::to_string(m.rotary_dim) + ") must be even, from 0 (all) to head_dim (" +
        std::to_string(m.head_dim) + ")");
  if (m.rotary_dim > 0 && m.position != PositionKind::rotary) bad("partial rotary needs rotary positions");
}

}  // namespace

void validate(const ModelSpec& m, const std::string& where) {
  const BadModel bad{where};
  validate_shape(m, bad);
  validate_routing(m, bad);
  if (std::find(kActivations.begin(), kActivations.end(), m.activation) == kActivations.end())
    bad("unknown activation \"" + m.activation + "\"; valid: " + join_choices(kActivations));
  validate_layer_mix(m, bad);
  validate_latent_attention(m, bad);
  validate_sliding_window(m, bad);
}

ModelSpec model_from_hf_config(const json& config, const std::string& file, const std::string& name) {
  ObjectReader r(config, file);
  if (!r.has("model_type"))
    throw InputError(file + ": missing key \"model_type\"; supported model types: " + join_choices(kFamilies));
  std::string family = r.string("model_type");
  bool known = false;
  for (const auto& f : kFamilies) known = known || f == family;
  if (!known)
    throw InputError(file + ": /model_type: unsupported model type \"" + family +
                     "\"; supported: " + join_choices(kFamilies));
  ModelSpec m;
  m.name = name;
  m.family = family;
  if (family == "gpt2") {
    read_gpt2(r, m);
  } else if (family == "gpt_neox") {
    read_gpt_neox(r, m);
  } else if (family == "nemotron") {
    read_nemotron(r, m);
  } else if (family == "deepseek_v2" || family == "deepseek_v3") {
    read_deepseek_v3(r, m);  // DeepSeek-V2 has the same modules (V3 adds the noaux_tc bias)
  } else if (family == "gpt_oss") {
    read_gpt_oss(r, m);
  } else {
    read_llama_like(r, family, m);
  }
  const double rotary_fraction = read_numerics(r, m);
  read_aux_loss(r, m);
  read_sliding_window(r, m);
  if (m.head_dim == 0) {
    if (m.hidden_size % m.num_heads != 0)
      throw InputError(file + ": hidden size " + std::to_string(m.hidden_size) +
                       " is not divisible by the number of heads " + std::to_string(m.num_heads) +
                       "; give head_dim");
    m.head_dim = m.hidden_size / m.num_heads;
  }
  set_rotary_dim(m, rotary_fraction, file);
  r.ignore(kIgnoredHfKeys);
  r.finish();
  validate(m, file);
  return m;
}

json to_json(const ModelSpec& m) {
  // "mlp" keeps the names plan files have always used (gelu: plain, swiglu: gated); the keys added
  // since (activation, MoE structure, MLA, windows) are written only where they differ from what
  // model_from_json assumes in their absence, so that earlier plan files read back byte for byte.
  json j{{"name", m.name},
         {"family", m.family},
         {"num_layers", m.num_layers},
         {"hidden_size", m.hidden_size},
         {"num_heads", m.num_heads},
         {"num_kv_heads", m.num_kv_heads},
         {"head_dim", m.head_dim},
         {"ffn_hidden_size", m.ffn_hidden_size},
         {"vocab_size", m.vocab_size},
         {"max_seq_len", m.max_seq_len},
         {"mlp", m.mlp == MlpKind::plain ? "gelu" : "swiglu"},
         {"norm", to_string(m.norm)},
         {"position", m.position == PositionKind::learned ? "learned" : "rotary"},
         {"tied_embeddings", m.tied_embeddings},
         {"qkv_bias", m.qkv_bias},
         {"out_bias", m.out_bias},
         {"mlp_bias", m.mlp_bias},
         {"num_experts", m.num_experts},
         {"experts_per_token", m.experts_per_token},
         {"attention_dropout", m.attention_dropout},
         {"hidden_dropout", m.hidden_dropout},
         {"num_params", num_params(m)}};
  if (m.activation != (m.mlp == MlpKind::plain ? "gelu" : "silu")) j["activation"] = m.activation;
  auto count = [&](const char* key, int value) {
    if (value != 0) j[key] = value;
  };
  auto flag = [&](const char* key, bool value) {
    if (value) j[key] = true;
  };
  if (!m.dense_layers.empty()) j["dense_layers"] = m.dense_layers;
  count("dense_ffn_hidden_size", m.dense_ffn_hidden_size);
  count("shared_expert_ffn_size", m.shared_expert_ffn_size);
  flag("shared_expert_gate", m.shared_expert_gate);
  flag("router_bias", m.router_bias);
  count("q_lora_rank", m.q_lora_rank);
  count("kv_lora_rank", m.kv_lora_rank);
  count("qk_rope_head_dim", m.qk_rope_head_dim);
  count("v_head_dim", m.v_head_dim);
  flag("qk_norm", m.qk_norm);
  flag("attention_sinks", m.attention_sinks);
  count("sliding_window", m.sliding_window);
  if (!m.sliding_layers.empty()) j["sliding_layers"] = m.sliding_layers;
  count("rotary_dim", m.rotary_dim);
  flag("parallel_residual", m.parallel_residual);
  count("mtp_layers", m.mtp_layers);
  const ModelSpec old_plan;  // what plans written before these keys ran with
  if (m.norm_eps != old_plan.norm_eps) j["norm_eps"] = m.norm_eps;
  if (m.rope_theta != old_plan.rope_theta) j["rope_theta"] = m.rope_theta;
  if (!m.rope_scaling.empty()) j["rope_scaling"] = m.rope_scaling;
  if (!m.rope_scaling_params.empty()) j["rope_scaling_params"] = m.rope_scaling_params;
  if (m.moe_aux_loss_coef != old_plan.moe_aux_loss_coef) j["moe_aux_loss_coef"] = m.moe_aux_loss_coef;
  if (m.mtp_layers > 0) j["mtp_loss_scale"] = m.mtp_loss_scale;
  if (!m.moe_norm_topk_prob) j["moe_norm_topk_prob"] = false;
  if (m.moe_router_score == ModelSpec::RouterScore::sigmoid) j["moe_router_score"] = "sigmoid";
  count("moe_groups", m.moe_groups);
  count("moe_group_topk", m.moe_group_topk);
  if (m.moe_routed_scaling != old_plan.moe_routed_scaling) j["moe_routed_scaling"] = m.moe_routed_scaling;
  flag("rope_interleave", m.rope_interleave);
  if (m.swiglu_limit != old_plan.swiglu_limit) j["swiglu_limit"] = m.swiglu_limit;
  if (m.swiglu_alpha != old_plan.swiglu_alpha) j["swiglu_alpha"] = m.swiglu_alpha;
  return j;
}

ModelSpec model_from_json(const json& j, const std::string& file, const std::string& pointer) {
  ObjectReader r(j, file, pointer);
  ModelSpec m;
  m.name = r.string("name");
  m.family = r.one_of("family", kFamilies);
  m.num_layers = static_cast<int>(r.int_in("num_layers", 1, kMaxLayers));
  m.hidden_size = width(r, "hidden_size");
  m.num_heads = width(r, "num_heads");
  m.num_kv_heads = width(r, "num_kv_heads");
  m.head_dim = width(r, "head_dim");
  m.ffn_hidden_size = width(r, "ffn_hidden_size");
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("max_seq_len", 1, kMaxTokens));
  // The MLP kind by its plan-file name (gelu: plain, swiglu: gated; plain and gated read too).
  const std::string mlp = r.one_of("mlp", {"gelu", "swiglu", "plain", "gated"});
  m.mlp = mlp == "plain" || mlp == "gelu" ? MlpKind::plain : MlpKind::gated;
  m.norm = r.one_of("norm", {"layernorm", "rmsnorm"}) == "layernorm" ? NormKind::layernorm : NormKind::rmsnorm;
  m.position = r.one_of("position", {"learned", "rotary"}) == "learned" ? PositionKind::learned : PositionKind::rotary;
  m.tied_embeddings = r.boolean("tied_embeddings");
  m.qkv_bias = r.boolean("qkv_bias");
  m.out_bias = r.boolean("out_bias");
  m.mlp_bias = r.boolean("mlp_bias");
  m.num_experts = static_cast<int>(r.int_in("num_experts", 0, kMaxExperts));
  m.experts_per_token = static_cast<int>(r.int_in("experts_per_token", 0, kMaxExperts));
  m.attention_dropout = r.fraction("attention_dropout");
  m.hidden_dropout = r.fraction("hidden_dropout");
  // Keys added with the qwen3, qwen*_moe, deepseek_v3, gpt_oss and nemotron families; absent in
  // older plan files and wherever they hold these values (to_json).
  m.activation = r.has("activation") ? r.one_of("activation", kActivations) : m.mlp == MlpKind::plain ? "gelu" : "silu";
  auto count = [&](const char* key, long long hi) { return r.has(key) ? static_cast<int>(r.int_in(key, 0, hi)) : 0; };
  auto flag = [&](const char* key) { return r.has(key) ? r.boolean(key) : false; };
  if (r.has("dense_layers")) {
    m.dense_layers = layer_list(r, "dense_layers", m.num_layers);
  } else if (r.has("num_dense_layers")) {
    // Plans written before dense_layers counted them; DeepSeek's are its first k (first_k_dense_replace),
    // the pattern such a count stands for.
    const int n = count("num_dense_layers", kMaxLayers);
    if (n > 0 && m.family != "deepseek_v2" && m.family != "deepseek_v3")
      throw InputError(r.where("num_dense_layers") + ": " + std::to_string(n) +
                       " dense layers, but not which; plan again from the model's config.json");
    for (int i = 0; i < n && i < m.num_layers; ++i) m.dense_layers.push_back(i);
  }
  m.dense_ffn_hidden_size = count("dense_ffn_hidden_size", kMaxWidth);
  m.shared_expert_ffn_size = count("shared_expert_ffn_size", kMaxWidth);
  m.shared_expert_gate = flag("shared_expert_gate");
  m.router_bias = flag("router_bias");
  m.q_lora_rank = count("q_lora_rank", kMaxWidth);
  m.kv_lora_rank = count("kv_lora_rank", kMaxWidth);
  m.qk_rope_head_dim = count("qk_rope_head_dim", kMaxWidth);
  m.v_head_dim = count("v_head_dim", kMaxWidth);
  m.qk_norm = flag("qk_norm");
  m.attention_sinks = flag("attention_sinks");
  m.sliding_window = count("sliding_window", kMaxTokens);
  if (r.has("sliding_layers")) {
    m.sliding_layers = layer_list(r, "sliding_layers", m.num_layers);
  } else if (r.has("num_sliding_layers")) {
    // Plans written before sliding_layers counted gpt-oss's windowed layers only: its default
    // pattern, the even layers, is the one such a count can stand for.
    const int n = count("num_sliding_layers", kMaxLayers);
    if (n != (m.num_layers + 1) / 2)
      throw InputError(r.where("num_sliding_layers") + ": " + std::to_string(n) +
                       " windowed layers, but not which; plan again from the model's config.json");
    for (int i = 0; i < m.num_layers; i += 2) m.sliding_layers.push_back(i);
  }
  m.rotary_dim = count("rotary_dim", kMaxWidth);
  m.parallel_residual = flag("parallel_residual");
  m.mtp_layers = count("mtp_layers", kMaxLayers);
  if (r.has("mtp_loss_scale")) m.mtp_loss_scale = r.number_in("mtp_loss_scale", 0.0, 1e3);
  if (r.has("norm_eps")) m.norm_eps = r.number_in("norm_eps", 1e-12, 1.0);
  if (r.has("rope_theta")) m.rope_theta = r.number_in("rope_theta", 1.0, 1e12);
  if (r.has("rope_scaling")) m.rope_scaling = r.string("rope_scaling");
  if (r.has("rope_scaling_params")) {
    m.rope_scaling_params = r.raw("rope_scaling_params");
    if (!m.rope_scaling_params.is_object())
      throw InputError(r.where("rope_scaling_params") + ": expected an object (the rotary scaling's parameters)");
  }
  if (r.has("moe_aux_loss_coef")) m.moe_aux_loss_coef = r.number_in("moe_aux_loss_coef", 0.0, 1e3);
  if (r.has("moe_norm_topk_prob")) m.moe_norm_topk_prob = r.boolean("moe_norm_topk_prob");
  if (r.has("moe_router_score"))
    m.moe_router_score = r.one_of("moe_router_score", {"softmax", "sigmoid"}) == "sigmoid" ? ModelSpec::RouterScore::sigmoid
                                                                                       : ModelSpec::RouterScore::softmax;
  m.moe_groups = count("moe_groups", kMaxExperts);
  m.moe_group_topk = count("moe_group_topk", kMaxExperts);
  if (r.has("moe_routed_scaling")) m.moe_routed_scaling = r.number_in("moe_routed_scaling", 1e-6, 1e6);
  m.rope_interleave = flag("rope_interleave");
  if (r.has("swiglu_limit")) m.swiglu_limit = r.number_in("swiglu_limit", 0.0, 1e6);
  if (r.has("swiglu_alpha")) m.swiglu_alpha = r.number_in("swiglu_alpha", 1e-6, 1e6);
  r.ignore("num_params");  // derived, written for readers
  r.finish();
  validate(m, file);
  return m;
}

}  // namespace dplan::costmodel
