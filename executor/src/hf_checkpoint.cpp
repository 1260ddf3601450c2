#include "hf_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "safetensors_header.h"

namespace dplan::executor {
namespace {
namespace fs = std::filesystem;
using costmodel::MlpKind;
using costmodel::ModelSpec;
using costmodel::NormKind;
using costmodel::PositionKind;

const std::vector<std::string> kLlamaLike = {"llama",     "mistral",   "qwen2",    "qwen3",   "mixtral",    "qwen2_moe",
                                             "qwen3_moe", "nemotron", "gpt_oss", "deepseek_v2", "deepseek_v3"};

bool is_llama_like(const ModelSpec& m) {
  return std::find(kLlamaLike.begin(), kLlamaLike.end(), m.family) != kLlamaLike.end();
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// gpt-oss's GptOssMLP (modeling_gpt_oss.py): a biased router, and the experts stacked, x @ W:
// gate_up_proj [E, h, 2f] with each expert's gate and up columns interleaved (gate even, up odd;
// GptOssExperts._apply_gate), gate_up_proj_bias [E, 2f], down_proj [E, f, h], down_proj_bias [E, h].
void gpt_oss_experts(const ModelSpec& m, const std::string& d, const std::string& b, std::vector<HfParameter>& out) {
  const int64_t H = m.hidden_size, F = m.ffn_hidden_size, E = m.num_experts;
  out.push_back({d + "mlp.router.weight", {{b + "router.weight", {E, H}}}, false});
  out.push_back({d + "mlp.router.bias", {{b + "router.bias", {E}}}, false});
  const std::string x = b + "experts.";
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = d + "mlp.experts." + std::to_string(e) + ".";
    for (int64_t which : {0, 1}) {  // gate, up
      const std::string name = p + (which == 0 ? "gate" : "up");
      out.push_back({name + ".weight", {{x + "gate_up_proj", {E, H, 2 * F}, e, which, 2}}, true});
      out.push_back({name + ".bias", {{x + "gate_up_proj_bias", {E, 2 * F}, e, which, 2}}, false});
    }
    out.push_back({p + "down.weight", {{x + "down_proj", {E, F, H}, e}}, true});
    out.push_back({p + "down.bias", {{x + "down_proj_bias", {E, H}, e}}, false});
  }
}

// DeepSeek's multi-head latent attention (modeling_deepseek_v3.py DeepseekV3Attention): q_a_proj,
// q_a_layernorm and q_b_proj (or q_proj), kv_a_proj_with_mqa (its last qk_rope_head_dim rows the
// rotary key), kv_a_layernorm, kv_b_proj; biases on the down projections with attention_bias. The
// rotary rows of q and of the key are stored interleaved where the model says (rope_interleave).
void latent_attention(const ModelSpec& m, const std::string& d, const std::string& a, std::vector<HfParameter>& out) {
  const int64_t H = m.hidden_size, q = m.q_dim(), rope = m.qk_rope_head_dim, nope = m.head_dim - rope;
  const int64_t rq = m.q_lora_rank, rkv = m.kv_lora_rank, v = m.attn_out_dim() / m.num_heads;
  auto one = [&](const std::string& name, const std::string& hf, std::vector<int64_t> shape) {
    out.push_back({name, {{hf, std::move(shape)}}, false});
  };
  auto rotary_rows = [&](int64_t block, int64_t first) {
    if (!m.rope_interleave) return;
    out.back().rotary_block = block;
    out.back().rotary_first = first;
    out.back().rotary_count = rope;
  };
  if (rq > 0) {
    one(d + "attn.q_a.weight", a + "q_a_proj.weight", {rq, H});
    if (m.qkv_bias) one(d + "attn.q_a.bias", a + "q_a_proj.bias", {rq});
    one(d + "attn.q_a_norm.weight", a + "q_a_layernorm.weight", {rq});
    one(d + "attn.q_b.weight", a + "q_b_proj.weight", {q, rq});
  } else {
    one(d + "attn.q.weight", a + "q_proj.weight", {q, H});
  }
  rotary_rows(m.head_dim, nope);
  one(d + "attn.kv_a.weight", a + "kv_a_proj_with_mqa.weight", {rkv + rope, H});
  rotary_rows(rkv + rope, rkv);
  if (m.qkv_bias) {
    one(d + "attn.kv_a.bias", a + "kv_a_proj_with_mqa.bias", {rkv + rope});
    rotary_rows(rkv + rope, rkv);
  }
  one(d + "attn.kv_a_norm.weight", a + "kv_a_layernorm.weight", {rkv});
  one(d + "attn.kv_b.weight", a + "kv_b_proj.weight", {m.num_heads * (nope + v), rkv});
}

// transformers' modeling_llama.py LlamaForCausalLM and the families built from its modules;
// Nemotron's (modeling_nemotron.py) has the same names, with LayerNorm1P norms (a bias, and the
// scale stored minus 1) and an ungated MLP.
std::vector<HfParameter> llama_like(const ModelSpec& m, const std::string& prefix) {
  const int64_t H = m.hidden_size, V = m.vocab_size, q = m.q_dim(), kv = m.kv_dim(), F = m.ffn_hidden_size;
  std::vector<HfParameter> out;
  auto one = [&](const std::string& name, const std::string& hf, std::vector<int64_t> shape) {
    out.push_back({name, {{hf, std::move(shape)}}, false});
  };
  auto norm = [&](const std::string& name, const std::string& hf) {
    one(name + ".weight", hf + ".weight", {H});
    if (m.family == "nemotron") out.back().offset = 1.0;
    if (m.norm == NormKind::layernorm) one(name + ".bias", hf + ".bias", {H});
  };
  one("wte", prefix + "embed_tokens.weight", {V, H});
  // The MTP modules (ModelSpec::mtp_layers) follow the layers, as DeepSeek-V3's checkpoints number
  // them: each a layer's tensors and its enorm, hnorm, eh_proj and shared_head.norm (its
  // embed_tokens and shared_head.head, copies of the model's, are left: leftover).
  for (int i = 0; i < m.num_layers + m.mtp_layers; ++i) {
    const std::string d = "layers." + std::to_string(i) + ".", h = prefix + "layers." + std::to_string(i) + ".";
    if (i >= m.num_layers) {
      norm(d + "mtp.enorm", h + "enorm");
      norm(d + "mtp.hnorm", h + "hnorm");
      one(d + "mtp.eh_proj.weight", h + "eh_proj.weight", {H, 2 * H});
      norm(d + "mtp.final_norm", h + "shared_head.norm");
    }
    norm(d + "norm1", h + "input_layernorm");
    const std::string a = h + "self_attn.";
    if (m.is_mla()) {
      latent_attention(m, d, a, out);
    } else {
      out.push_back({d + "attn.qkv.weight", {{a + "q_proj.weight", {q, H}}, {a + "k_proj.weight", {kv, H}}, {a + "v_proj.weight", {kv, H}}}, false});
      if (m.qkv_bias)
        out.push_back({d + "attn.qkv.bias", {{a + "q_proj.bias", {q}}, {a + "k_proj.bias", {kv}}, {a + "v_proj.bias", {kv}}}, false});
    }
    one(d + "attn.proj.weight", a + "o_proj.weight", {H, m.attn_out_dim()});
    if (m.out_bias) one(d + "attn.proj.bias", a + "o_proj.bias", {H});
    if (m.qk_norm) {
      one(d + "attn.q_norm.weight", a + "q_norm.weight", {m.head_dim});
      one(d + "attn.k_norm.weight", a + "k_norm.weight", {m.head_dim});
    }
    norm(d + "norm2", h + "post_attention_layernorm");
    if (m.attention_sinks) one(d + "attn.sinks", a + "sinks", {m.num_heads});
    // A dense MLP of width f: its up (fc1), gate (gated) and down (fc2) projections and their biases.
    auto dense = [&](const std::string& x, const std::string& y, int64_t f) {
      one(x + "fc1.weight", y + "up_proj.weight", {f, H});
      if (m.mlp_bias) one(x + "fc1.bias", y + "up_proj.bias", {f});
      if (m.mlp == MlpKind::gated) {
        one(x + "gate.weight", y + "gate_proj.weight", {f, H});
        if (m.mlp_bias) one(x + "gate.bias", y + "gate_proj.bias", {f});
      }
      one(x + "fc2.weight", y + "down_proj.weight", {H, f});
      if (m.mlp_bias) one(x + "fc2.bias", y + "down_proj.bias", {H});
    };
    if (m.family == "gpt_oss") {
      gpt_oss_experts(m, d, h + "mlp.", out);
    } else if (m.is_moe() && !m.is_dense_layer(i)) {
      // The checkpoint names: modeling_mixtral.py's block_sparse_moe (gate; experts.e.w1, w3, w2),
      // modeling_qwen{2,3}_moe.py's mlp (gate; experts.e.gate_proj, up_proj, down_proj; Qwen2-MoE's
      // shared_expert and its shared_expert_gate), modeling_deepseek_v{2,3}.py's the same as Qwen's
      // (gate.e_score_correction_bias: V3's router bias; shared_experts).
      const bool qwen = m.family != "mixtral";
      const std::string b = h + (qwen ? "mlp." : "block_sparse_moe.");
      const std::string gate = qwen ? "gate_proj" : "w1", up = qwen ? "up_proj" : "w3", down = qwen ? "down_proj" : "w2";
      one(d + "mlp.router.weight", b + "gate.weight", {m.num_experts, H});
      if (m.router_bias) one(d + "mlp.router.bias", b + "gate.e_score_correction_bias", {m.num_experts});
      for (int e = 0; e < m.num_experts; ++e) {
        const std::string x = d + "mlp.experts." + std::to_string(e) + ".", y = b + "experts." + std::to_string(e) + ".";
        one(x + "gate.weight", y + gate + ".weight", {F, H});
        one(x + "up.weight", y + up + ".weight", {F, H});
        one(x + "down.weight", y + down + ".weight", {H, F});
      }
      const bool deepseek = m.family == "deepseek_v2" || m.family == "deepseek_v3";
      if (m.shared_expert_ffn_size > 0)
        dense(d + "mlp.shared.", b + (deepseek ? "shared_experts." : "shared_expert."), m.shared_expert_ffn_size);
      if (m.shared_expert_gate) one(d + "mlp.shared_gate.weight", b + "shared_expert_gate.weight", {1, H});
    } else {
      dense(d + "mlp.", h + "mlp.", m.is_moe() ? m.dense_ffn_hidden_size : F);
    }
  }
  norm("final_norm", prefix + "norm");
  if (!m.tied_embeddings) one("lm_head.weight", "lm_head.weight", {V, H});
  return out;
}

// transformers' modeling_gpt_neox.py GPTNeoXForCausalLM: one fused query_key_value per layer,
// each head's q, k and v rows together; LayerNorms and biases throughout; embed_out the head.
std::vector<HfParameter> gpt_neox(const ModelSpec& m, const std::string& prefix) {
  const int64_t H = m.hidden_size, V = m.vocab_size, F = m.ffn_hidden_size, qkv = m.q_dim() + 2 * m.kv_dim();
  std::vector<HfParameter> out;
  auto one = [&](const std::string& name, const std::string& hf, std::vector<int64_t> shape) {
    out.push_back({name, {{hf, std::move(shape)}}, false});
  };
  one("wte", prefix + "embed_in.weight", {V, H});
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string d = "layers." + std::to_string(i) + ".", h = prefix + "layers." + std::to_string(i) + ".";
    // A linear's weight [out, in] and, where the model has it, its bias [out].
    auto linear = [&](const std::string& name, const std::string& hf, int64_t rows, int64_t cols, bool bias) {
      one(d + name + ".weight", h + hf + ".weight", {rows, cols});
      if (bias) one(d + name + ".bias", h + hf + ".bias", {rows});
    };
    one(d + "norm1.weight", h + "input_layernorm.weight", {H});
    one(d + "norm1.bias", h + "input_layernorm.bias", {H});
    linear("attn.qkv", "attention.query_key_value", qkv, H, m.qkv_bias);
    for (size_t k = out.size() - (m.qkv_bias ? 2 : 1); k < out.size(); ++k) out[k].heads_interleaved = m.num_heads;
    linear("attn.proj", "attention.dense", H, H, m.out_bias);
    one(d + "norm2.weight", h + "post_attention_layernorm.weight", {H});
    one(d + "norm2.bias", h + "post_attention_layernorm.bias", {H});
    linear("mlp.fc1", "mlp.dense_h_to_4h", F, H, m.mlp_bias);
    linear("mlp.fc2", "mlp.dense_4h_to_h", H, F, m.mlp_bias);
  }
  one("final_norm.weight", prefix + "final_layer_norm.weight", {H});
  one("final_norm.bias", prefix + "final_layer_norm.bias", {H});
  if (!m.tied_embeddings) one("lm_head.weight", "embed_out.weight", {V, H});
  return out;
}

// transformers' modeling_gpt2.py GPT2LMHeadModel: Conv1D weights stored [in, out].
std::vector<HfParameter> gpt2(const ModelSpec& m, const std::string& prefix) {
  const int64_t H = m.hidden_size, V = m.vocab_size, F = m.ffn_hidden_size;
  std::vector<HfParameter> out;
  auto one = [&](const std::string& name, const std::string& hf, std::vector<int64_t> shape, bool transpose = false) {
    out.push_back({name, {{hf, std::move(shape)}}, transpose});
  };
  one("wte", prefix + "wte.weight", {V, H});
  one("wpe", prefix + "wpe.weight", {m.max_seq_len, H});
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string d = "layers." + std::to_string(i) + ".", h = prefix + "h." + std::to_string(i) + ".";
    one(d + "norm1.weight", h + "ln_1.weight", {H});
    one(d + "norm1.bias", h + "ln_1.bias", {H});
    one(d + "attn.qkv.weight", h + "attn.c_attn.weight", {H, 3 * H}, true);
    one(d + "attn.qkv.bias", h + "attn.c_attn.bias", {3 * H});
    one(d + "attn.proj.weight", h + "attn.c_proj.weight", {H, H}, true);
    one(d + "attn.proj.bias", h + "attn.c_proj.bias", {H});
    one(d + "norm2.weight", h + "ln_2.weight", {H});
    one(d + "norm2.bias", h + "ln_2.bias", {H});
    one(d + "mlp.fc1.weight", h + "mlp.c_fc.weight", {H, F}, true);
    one(d + "mlp.fc1.bias", h + "mlp.c_fc.bias", {F});
    one(d + "mlp.fc2.weight", h + "mlp.c_proj.weight", {F, H}, true);
    one(d + "mlp.fc2.bias", h + "mlp.c_proj.bias", {H});
  }
  one("final_norm.weight", prefix + "ln_f.weight", {H});
  one("final_norm.bias", prefix + "ln_f.bias", {H});
  if (!m.tied_embeddings) one("lm_head.weight", "lm_head.weight", {V, H});
  return out;
}

// Tensors a checkpoint may hold that the model does not train: rotary tables and causal masks
// (buffers older transformers saved), and a tied model's LM head saved anyway.
bool leftover(const ModelSpec& m, const std::string& name) {
  auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool masks = (m.family == "gpt2" && (ends(".attn.bias") || ends(".attn.masked_bias"))) ||
                     (m.family == "gpt_neox" && (ends(".attention.bias") || ends(".attention.masked_bias")));
  // An MTP module's own copies of the embedding and the head (DeepSeek-V3's model.layers.61.embed_tokens,
  // .shared_head.head): the executor shares the model's.
  bool mtp_copy = false;
  for (int k = 0; k < m.mtp_layers; ++k) {
    const std::string layer = "layers." + std::to_string(m.num_layers + k) + ".";
    mtp_copy = mtp_copy || ends(layer + "embed_tokens.weight") || ends(layer + "shared_head.head.weight");
  }
  return ends(".rotary_emb.inv_freq") || masks || mtp_copy ||
         (m.tied_embeddings && name == (m.family == "gpt_neox" ? "embed_out.weight" : "lm_head.weight"));
}

// The headers of the checkpoint's files: {checkpoint name: where it is}.
std::map<std::string, HfStored> read_headers(const std::vector<std::string>& files) {
  std::map<std::string, HfStored> stored;
  for (const std::string& file : files) {
    const uint64_t size = regular_file_bytes(file);
    SafetensorsHeader header;
    auto first = [&](uint64_t n) {
      std::string bytes(std::min(n, size), '\0');
      read_file_range(file, 0, bytes.size(), bytes.data());
      return bytes;
    };
    try {
      header = parse_safetensors_header(first(safetensors_header_bytes(first(8), size)), size);
    } catch (const std::invalid_argument& e) {
      throw InputError(file + ": not a safetensors checkpoint (" + e.what() + ")");
    }
    for (const SafetensorsEntry& e : header.entries) {
      if (stored.count(e.name)) throw InputError(file + ": " + e.name + " is in " + stored[e.name].file + " too");
      stored[e.name] = {file, e.dtype, e.shape, header.data_start + e.begin, e.end - e.begin};
    }
  }
  return stored;
}

// The safetensors files `path` names: the file, an index's shards, or a folder's.
std::vector<std::string> checkpoint_files(const std::string& path) {
  std::error_code ec;
  std::string index = path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "model.safetensors.index.json", ec)) {
      index = (fs::path(path) / "model.safetensors.index.json").string();
    } else if (fs::exists(fs::path(path) / "model.safetensors", ec)) {
      return {(fs::path(path) / "model.safetensors").string()};
    } else {
      throw InputError(path + ": holds neither model.safetensors nor model.safetensors.index.json");
    }
  } else if (!fs::exists(path, ec)) {
    throw InputError(path + ": no such file or folder");
  }
  const std::string suffix = ".json";
  if (index.size() < suffix.size() || index.compare(index.size() - suffix.size(), suffix.size(), suffix) != 0)
    return {index};
  // transformers' sharded checkpoints: {"weight_map": {tensor name: shard file}}; shards in the
  // index's own folder (a name with a path in it is refused: nothing is read outside it).
  const json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(index + ": expected an object with \"weight_map\": {tensor name: shard file}");
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos)
      throw InputError(index + ": /weight_map/" + name + ": expected a file name in the index's folder");
    shards.insert(file.get<std::string>());
  }
  if (shards.empty()) throw InputError(index + ": the weight_map is empty");
  std::vector<std::string> files;
  for (const std::string& s : shards) files.push_back((fs::path(index).parent_path() / s).string());
  return files;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}
// A family or feature the mapping lacks: InputError.
void check_readable(const ModelSpec& m) {
  if (m.family == "gpt_neox" && m.num_kv_heads != m.num_heads)  // transformers' GPT-NeoX has none
    throw InputError("--init-from does not read a GPT-NeoX checkpoint with grouped-query attention: transformers' "
                     "GPTNeoX has one key/value head per head");
  if (m.family == "gpt2" || m.family == "gpt_neox") return;
  if (!is_llama_like(m))
    throw InputError("--init-from does not read " + m.family + " checkpoints yet; it reads " + joined(hf_init_families()));
}

}  // namespace

uint64_t regular_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError(path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": not a regular file (a " + file_kind(st.st_mode) + ")");
  return static_cast<uint64_t>(st.st_size);
}

void read_file_range(const std::string& path, uint64_t offset, uint64_t bytes, char* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": " + std::strerror(errno));
  for (uint64_t got = 0; got < bytes;) {
    const ssize_t r = ::pread(fd, out + got, bytes - got, static_cast<off_t>(offset + got));
    if (r <= 0) {
      const std::string why = r < 0 ? std::strerror(errno) : "the file ended early";
      ::close(fd);
      throw InputError(path + ": cannot read " + std::to_string(bytes) + " bytes at " + std::to_string(offset) + " (" +
                       why + ")");
    }
    got += static_cast<uint64_t>(r);
  }
  ::close(fd);
}

const std::vector<std::string>& hf_init_families() {
  static const std::vector<std::string> families = [] {
    std::vector<std::string> f = kLlamaLike;
    f.push_back("gpt2");
    f.push_back("gpt_neox");
    return f;
  }();
  return families;
}

std::vector<HfParameter> hf_parameters(const ModelSpec& m, const std::string& prefix) {
  check_readable(m);
  return m.family == "gpt2" ? gpt2(m, prefix) : m.family == "gpt_neox" ? gpt_neox(m, prefix) : llama_like(m, prefix);
}

HfCheckpoint read_hf_checkpoint(const std::string& path, const ModelSpec& m) {
  check_readable(m);  // before any file is read
  const std::vector<std::string> files = checkpoint_files(path);
  std::map<std::string, HfStored> stored = read_headers(files);
  // The names with or without the base model's prefix (a CausalLM's save, or its base model's).
  const std::string base = m.family == "gpt2" ? "transformer." : m.family == "gpt_neox" ? "gpt_neox." : "model.";
  const char* embedding = m.family == "gpt2" ? "wte.weight" : m.family == "gpt_neox" ? "embed_in.weight" : "embed_tokens.weight";
  const std::string prefix = stored.count(base + embedding) ? base : "";
  HfCheckpoint out;
  out.parameters = hf_parameters(m, prefix);
  std::set<std::string> used;
  for (const HfParameter& p : out.parameters) {
    for (const HfTensor& t : p.parts) {
      auto it = stored.find(t.name);
      if (it == stored.end())
        throw InputError(path + ": no tensor " + t.name + ", which the plan's " + m.family + " model needs for " + p.name);
      const HfStored& s = it->second;
      if (s.shape != t.shape)
        throw InputError(path + ": " + t.name + " is " + shape_text(s.shape) + ", the plan's model has " + shape_text(t.shape));
      if (s.dtype != "F32" && s.dtype != "BF16" && s.dtype != "F16" && s.dtype != "F64")
        throw InputError(path + ": " + t.name + " is " + s.dtype + "; valid: F32, BF16, F16, F64");
      used.insert(t.name);
      out.stored[t.name] = s;
    }
  }
  for (const auto& [name, s] : stored)
    if (!used.count(name) && !leftover(m, name))
      throw InputError(path + ": " + name + " " + shape_text(s.shape) + " has no place in the plan's model (" +
                       std::to_string(m.num_layers) + " layers of " + m.family + "); a checkpoint of another model?");
  return out;
}

}  // namespace dplan::executor
