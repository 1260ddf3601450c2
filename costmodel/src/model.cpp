#include "dplan/costmodel/model.h"

#include <map>
#include <vector>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {
namespace {

// Keys found in real config.json files that do not change memory or time (tokenizer ids, init,
// numerics, RoPE details, sliding windows treated as full attention). Accepted and ignored.
const std::initializer_list<const char*> kIgnoredHfKeys = {
    "_name_or_path", "architectures", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_scaling",
    "rope_parameters", "pretraining_tp", "sliding_window", "use_sliding_window",
    "max_window_layers", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "classifier_dropout", "rotary_pct", "rotary_emb_base", "rotary_emb_dim", "use_parallel_residual",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "n_ctx",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "task_specific_params", "attn_implementation", "use_mrope", "model_type"};

const std::vector<std::string> kFamilies = {"llama", "mistral", "mixtral", "qwen2", "gpt_neox", "gpt2"};

// Bounds on a config's sizes, far above any model built (hidden 2^20, 2^16 layers, 2^24 vocab
// and positions, 2^16 experts) and low enough that products of them (parameters, FLOPs) stay
// exact in double and every int index in range.
constexpr long long kMaxWidth = 1 << 20;
constexpr long long kMaxLayers = 1 << 16;
constexpr long long kMaxTokens = 1 << 24;  // vocabulary and positions
constexpr long long kMaxExperts = 1 << 16;

int width(ObjectReader& r, const char* key) { return static_cast<int>(r.int_in(key, 1, kMaxWidth)); }

// Hugging Face's activation names (transformers/activations.py ACT2FN): none changes the cost,
// but a name outside the list is a broken config.
const std::vector<std::string> kActivations = {
    "gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
    "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu", "relu", "relu2", "relu6",
    "sigmoid", "silu", "swish", "tanh", "xielu"};

// llama, mistral, mixtral, qwen2: gated (SwiGLU) MLP, RMSNorm, rotary positions.
void read_llama_like(ObjectReader& r, const std::string& family, ModelSpec& m) {
  m.hidden_size = width(r, "hidden_size");
  m.ffn_hidden_size = width(r, "intermediate_size");
  m.num_layers = static_cast<int>(r.int_in("num_hidden_layers", 1, kMaxLayers));
  m.num_heads = width(r, "num_attention_heads");
  m.num_kv_heads = r.has("num_key_value_heads")
                       ? width(r, "num_key_value_heads")
                       : m.num_heads;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("max_position_embeddings", 1, kMaxTokens));
  m.head_dim = r.has("head_dim") ? width(r, "head_dim") : 0;
  if (r.has("hidden_act")) r.one_of("hidden_act", kActivations);  // the MLP is gated whatever it is
  m.tied_embeddings = r.has("tie_word_embeddings") ? r.boolean("tie_word_embeddings") : false;
  m.attention_dropout = r.has("attention_dropout") ? r.fraction("attention_dropout") : 0.0;
  m.mlp = MlpKind::swiglu;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rotary;
  if (family == "llama") {
    bool attention_bias = r.has("attention_bias") ? r.boolean("attention_bias") : false;
    m.qkv_bias = m.out_bias = attention_bias;
    m.mlp_bias = r.has("mlp_bias") ? r.boolean("mlp_bias") : false;
  } else if (family == "qwen2") {
    m.qkv_bias = true;  // Qwen2Attention: q/k/v projections with bias, o_proj without
  }
  if (family == "mixtral") {
    m.num_experts = static_cast<int>(r.int_in("num_local_experts", 1, kMaxExperts));
    m.experts_per_token = static_cast<int>(r.int_in("num_experts_per_tok", 1, kMaxExperts));
  }
}

void read_gpt_neox(ObjectReader& r, ModelSpec& m) {
  m.hidden_size = width(r, "hidden_size");
  m.ffn_hidden_size = width(r, "intermediate_size");
  m.num_layers = static_cast<int>(r.int_in("num_hidden_layers", 1, kMaxLayers));
  m.num_heads = width(r, "num_attention_heads");
  m.num_kv_heads = m.num_heads;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("max_position_embeddings", 1, kMaxTokens));
  if (r.has("hidden_act")) r.one_of("hidden_act", kActivations);
  m.tied_embeddings = r.has("tie_word_embeddings") ? r.boolean("tie_word_embeddings") : false;
  bool bias = r.has("attention_bias") ? r.boolean("attention_bias") : true;
  m.qkv_bias = m.out_bias = bias;
  m.mlp_bias = true;
  m.attention_dropout = r.has("attention_dropout") ? r.fraction("attention_dropout") : 0.0;
  m.hidden_dropout = r.has("hidden_dropout") ? r.fraction("hidden_dropout") : 0.0;
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  m.position = PositionKind::rotary;
}

void read_gpt2(ObjectReader& r, ModelSpec& m) {
  m.hidden_size = width(r, "n_embd");
  m.num_layers = static_cast<int>(r.int_in("n_layer", 1, kMaxLayers));
  m.num_heads = width(r, "n_head");
  m.num_kv_heads = m.num_heads;
  m.ffn_hidden_size = r.has("n_inner") ? width(r, "n_inner") : 4 * m.hidden_size;
  m.vocab_size = static_cast<int>(r.int_in("vocab_size", 1, kMaxTokens));
  m.max_seq_len = static_cast<int>(r.int_in("n_positions", 1, kMaxTokens));
  if (r.has("activation_function")) r.one_of("activation_function", kActivations);
  m.tied_embeddings = r.has("tie_word_embeddings") ? r.boolean("tie_word_embeddings") : true;
  m.attention_dropout = r.has("attn_pdrop") ? r.fraction("attn_pdrop") : 0.1;
  m.hidden_dropout = r.has("resid_pdrop") ? r.fraction("resid_pdrop") : 0.1;
  if (r.has("embd_pdrop")) r.fraction("embd_pdrop");
  m.qkv_bias = m.out_bias = m.mlp_bias = true;
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  m.position = PositionKind::learned;
}

double mlp_params(const ModelSpec& m) {
  const double h = m.hidden_size, f = m.ffn_hidden_size;
  // GELU: fc1 (h->f) + fc2 (f->h); gated: gate and up (h->f each) + down (f->h).
  double weights = (m.mlp == MlpKind::swiglu ? 3.0 : 2.0) * h * f;
  double biases = m.mlp_bias ? (m.mlp == MlpKind::swiglu ? 2.0 * f : f) + h : 0.0;
  return weights + biases;
}

}  // namespace

const char* to_string(MlpKind kind) { return kind == MlpKind::gelu ? "gelu" : "swiglu"; }
const char* to_string(NormKind kind) { return kind == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

LayerParams layer_params(const ModelSpec& m) {
  const double h = m.hidden_size, q = m.q_dim(), kv = m.kv_dim();
  LayerParams p;
  // q: h x q, k and v: h x kv each, o: q x h.
  p.attention = h * (q + 2 * kv) + q * h + (m.qkv_bias ? q + 2 * kv : 0) + (m.out_bias ? h : 0);
  if (m.is_moe()) {
    p.mlp = h * m.num_experts;  // router (gate) h x E, no bias (Mixtral)
    p.experts = m.num_experts * mlp_params(m);
  } else {
    p.mlp = mlp_params(m);
  }
  double norm = m.norm == NormKind::layernorm ? 2.0 * h : h;  // LayerNorm: weight + bias
  p.norms = 2 * norm;
  return p;
}

double num_params(const ModelSpec& m, int vocab_size) {
  const double h = m.hidden_size;
  const double v = vocab_size > 0 ? vocab_size : m.vocab_size;
  double embedding = v * h;
  double positions = m.position == PositionKind::learned ? double(m.max_seq_len) * h : 0.0;
  double final_norm = m.norm == NormKind::layernorm ? 2.0 * h : h;
  double head = m.tied_embeddings ? 0.0 : v * h;
  return embedding + positions + m.num_layers * layer_params(m).total() + final_norm + head;
}

double num_active_params(const ModelSpec& m) {
  double total = num_params(m);
  if (!m.is_moe()) return total;
  double per_expert = mlp_params(m);
  return total - double(m.num_layers) * (m.num_experts - m.experts_per_token) * per_expert;
}

void validate(const ModelSpec& m, const std::string& where) {
  auto bad = [&](const std::string& what) { throw InputError(where + ": " + what); };
  if (m.num_layers < 1 || m.hidden_size < 1 || m.num_heads < 1 || m.num_kv_heads < 1 ||
      m.ffn_hidden_size < 1 || m.vocab_size < 1 || m.max_seq_len < 1 || m.head_dim < 1)
    bad("layers, hidden size, heads, kv heads, head dim, ffn size, vocab and max positions must be positive");
  if (static_cast<long long>(m.num_heads) * m.head_dim > kMaxWidth)
    bad("num_attention_heads x head_dim (" + std::to_string(static_cast<long long>(m.num_heads) * m.head_dim) +
        ") must be at most " + std::to_string(kMaxWidth));
  if (m.num_heads % m.num_kv_heads != 0)
    bad("num_attention_heads (" + std::to_string(m.num_heads) + ") must be a multiple of num_key_value_heads (" +
        std::to_string(m.num_kv_heads) + ")");
  if (m.is_moe() && (m.experts_per_token < 1 || m.experts_per_token > m.num_experts))
    bad("num_experts_per_tok (" + std::to_string(m.experts_per_token) + ") must be between 1 and num_local_experts (" +
        std::to_string(m.num_experts) + ")");
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
  } else {
    read_llama_like(r, family, m);
  }
  if (m.head_dim == 0) {
    if (m.hidden_size % m.num_heads != 0)
      throw InputError(file + ": hidden size " + std::to_string(m.hidden_size) +
                       " is not divisible by the number of heads " + std::to_string(m.num_heads) +
                       "; give head_dim");
    m.head_dim = m.hidden_size / m.num_heads;
  }
  r.ignore(kIgnoredHfKeys);
  r.finish();
  validate(m, file);
  return m;
}

json to_json(const ModelSpec& m) {
  return json{{"name", m.name},
              {"family", m.family},
              {"num_layers", m.num_layers},
              {"hidden_size", m.hidden_size},
              {"num_heads", m.num_heads},
              {"num_kv_heads", m.num_kv_heads},
              {"head_dim", m.head_dim},
              {"ffn_hidden_size", m.ffn_hidden_size},
              {"vocab_size", m.vocab_size},
              {"max_seq_len", m.max_seq_len},
              {"mlp", to_string(m.mlp)},
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
  m.mlp = r.one_of("mlp", {"gelu", "swiglu"}) == "gelu" ? MlpKind::gelu : MlpKind::swiglu;
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
  r.ignore("num_params");  // derived, written for readers
  r.finish();
  validate(m, file);
  return m;
}

}  // namespace dplan::costmodel
