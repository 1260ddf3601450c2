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

const std::vector<std::string> kLlamaLike = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"};

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

// transformers' modeling_llama.py LlamaForCausalLM and the families built from its modules.
std::vector<HfParameter> llama_like(const ModelSpec& m, const std::string& prefix) {
  const int64_t H = m.hidden_size, V = m.vocab_size, q = m.q_dim(), kv = m.kv_dim(), F = m.ffn_hidden_size;
  std::vector<HfParameter> out;
  auto one = [&](const std::string& name, const std::string& hf, std::vector<int64_t> shape) {
    out.push_back({name, {{hf, std::move(shape)}}, false});
  };
  one("wte", prefix + "embed_tokens.weight", {V, H});
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string d = "layers." + std::to_string(i) + ".", h = prefix + "layers." + std::to_string(i) + ".";
    one(d + "norm1.weight", h + "input_layernorm.weight", {H});
    const std::string a = h + "self_attn.";
    out.push_back({d + "attn.qkv.weight", {{a + "q_proj.weight", {q, H}}, {a + "k_proj.weight", {kv, H}}, {a + "v_proj.weight", {kv, H}}}, false});
    if (m.qkv_bias)
      out.push_back({d + "attn.qkv.bias", {{a + "q_proj.bias", {q}}, {a + "k_proj.bias", {kv}}, {a + "v_proj.bias", {kv}}}, false});
    one(d + "attn.proj.weight", a + "o_proj.weight", {H, q});
    if (m.out_bias) one(d + "attn.proj.bias", a + "o_proj.bias", {H});
    if (m.qk_norm) {
      one(d + "attn.q_norm.weight", a + "q_norm.weight", {m.head_dim});
      one(d + "attn.k_norm.weight", a + "k_norm.weight", {m.head_dim});
    }
    one(d + "norm2.weight", h + "post_attention_layernorm.weight", {H});
    if (m.is_moe()) {
      // The checkpoint names: modeling_mixtral.py's block_sparse_moe (gate; experts.e.w1, w3, w2),
      // modeling_qwen3_moe.py's mlp (gate; experts.e.gate_proj, up_proj, down_proj).
      const bool qwen = m.family == "qwen3_moe";
      const std::string b = h + (qwen ? "mlp." : "block_sparse_moe.");
      const std::string gate = qwen ? "gate_proj" : "w1", up = qwen ? "up_proj" : "w3", down = qwen ? "down_proj" : "w2";
      one(d + "mlp.router.weight", b + "gate.weight", {m.num_experts, H});
      for (int e = 0; e < m.num_experts; ++e) {
        const std::string x = d + "mlp.experts." + std::to_string(e) + ".", y = b + "experts." + std::to_string(e) + ".";
        one(x + "gate.weight", y + gate + ".weight", {F, H});
        one(x + "up.weight", y + up + ".weight", {F, H});
        one(x + "down.weight", y + down + ".weight", {H, F});
      }
    } else {
      one(d + "mlp.fc1.weight", h + "mlp.up_proj.weight", {F, H});
      one(d + "mlp.gate.weight", h + "mlp.gate_proj.weight", {F, H});
      one(d + "mlp.fc2.weight", h + "mlp.down_proj.weight", {H, F});
    }
  }
  one("final_norm.weight", prefix + "norm.weight", {H});
  if (!m.tied_embeddings) one("lm_head.weight", "lm_head.weight", {V, H});
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
  return ends(".rotary_emb.inv_freq") || (m.family == "gpt2" && (ends(".attn.bias") || ends(".attn.masked_bias"))) ||
         (m.tied_embeddings && name == "lm_head.weight");
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
  if (m.family == "gpt2") return;
  if (!is_llama_like(m))
    throw InputError("--init-from does not read " + m.family + " checkpoints yet; it reads " + joined(hf_init_families()));
  if (m.mlp_bias)  // the executor's gated MLP has no bias on its gate (gpt.cpp dense_mlp)
    throw InputError("--init-from does not read a gated MLP with biases (mlp_bias) yet");
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
    return f;
  }();
  return families;
}

std::vector<HfParameter> hf_parameters(const ModelSpec& m, const std::string& prefix) {
  check_readable(m);
  return m.family == "gpt2" ? gpt2(m, prefix) : llama_like(m, prefix);
}

HfCheckpoint read_hf_checkpoint(const std::string& path, const ModelSpec& m) {
  check_readable(m);  // before any file is read
  const std::vector<std::string> files = checkpoint_files(path);
  std::map<std::string, HfStored> stored = read_headers(files);
  // The names with or without the base model's prefix (a CausalLM's save, or its base model's).
  const std::string base = m.family == "gpt2" ? "transformer." : "model.";
  const std::string prefix = stored.count(base + (m.family == "gpt2" ? "wte.weight" : "embed_tokens.weight")) ? base : "";
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
