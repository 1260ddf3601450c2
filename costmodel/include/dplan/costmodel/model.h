// The model being trained: a decoder-only transformer described by its shape. Read from a
// Hugging Face config.json (llama, mistral, mixtral, qwen2, gpt_neox and gpt2 families) or from
// dplan's own JSON form (inside plan.json); parameter counts follow the layer structure exactly.
#pragma once

#include <string>

#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

enum class MlpKind { gelu, swiglu };  // swiglu: any gated MLP (gate, up, down matrices)
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

  bool is_moe() const { return num_experts > 0; }
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  bool operator==(const ModelSpec&) const = default;
};

// Parameters of one transformer layer, split by where they live (counts, not bytes).
struct LayerParams {
  double attention = 0;   // q, k, v, o projections and their biases
  double mlp = 0;         // dense MLP, or the shared part of an MoE layer (router)
  double experts = 0;     // all experts of an MoE layer (0 for dense)
  double norms = 0;       // the two norms
  double total() const { return attention + mlp + experts + norms; }
};

LayerParams layer_params(const ModelSpec& model);

// Parameters of the whole model, exact (Llama-3-8B = 8,030,261,248): embedding, learned position
// embedding, layers, final norm and LM head (counted once when tied). `vocab_size` overrides the
// model's vocabulary (for padded vocabularies); 0 means the model's own.
double num_params(const ModelSpec& model, int vocab_size = 0);

// Parameters a token activates: like num_params, but only experts_per_token experts per layer.
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
