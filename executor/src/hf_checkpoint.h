// Starting from a Hugging Face checkpoint (dplan run --init-from): which tensors of a model's
// safetensors files make each of the executor's parameters, per family, and the check that a
// checkpoint holds exactly those, with the shapes the plan's model gives them. Free of LibTorch:
// dplan checks the files before any rank starts, and each rank loads its slices with
// load_hf_checkpoint (hf_load.h).
//
// The names are transformers' own (5.x, save_pretrained): modeling_llama.py and the families that
// share its modules (mistral, qwen2, qwen3, mixtral, qwen3_moe, nemotron, gpt_oss), modeling_gpt2.py (whose
// Conv1D stores weights as [in, out], transposed here), modeling_gpt_neox.py.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dplan/costmodel/model.h"

namespace dplan::executor {

// One executor parameter (its global name, as a one-rank run holds it) and the checkpoint tensors
// it is made of: concatenated along dim 0 in this order, each transposed first where `transpose`
// (GPT-2's Conv1D). The fused QKV is [q; k; v], SwiGLU's fc1 is the up projection, gate the gate.
struct HfTensor {
  std::string name;             // in the checkpoint, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // as stored
  // The part used: entry `select` of dim 0 (-1: all), then every `step`-th entry of the last dim
  // from `start` (gpt-oss stores its experts stacked, each gate and up column interleaved).
  int64_t select = -1, start = 0, step = 1;
};
struct HfParameter {
  std::string name;  // the executor's global name, e.g. "layers.0.attn.qkv.weight"
  std::vector<HfTensor> parts;
  bool transpose = false;
  // GPT-NeoX's fused query_key_value holds each head's q, k and v rows together (heads x 3 x
  // head_dim): regrouped into the executor's [all q; all k; all v] when this is the head count.
  int64_t heads_interleaved = 0;
  double offset = 0;  // added to the stored values: Nemotron's LayerNorm1P stores its scale minus 1
  // DeepSeek's interleaved rotary rows (ModelSpec::rope_interleave): in each block of rotary_block
  // rows (dim 0), the rotary_count rows from rotary_first are stored as pairs (x0, x1), (x2, x3), ...;
  // the executor rotates halves, so it takes them evens first, then odds (and writes them back so).
  int64_t rotary_block = 0, rotary_first = 0, rotary_count = 0;
};

// The families whose checkpoints --init-from reads.
const std::vector<std::string>& hf_init_families();

// Every executor parameter of `model` and where it comes from, for checkpoint tensor names that
// start with `prefix` ("model." or "" for llama-like families, "transformer." or "" for gpt2).
// Throws InputError for a family outside hf_init_families() or a feature the mapping lacks.
std::vector<HfParameter> hf_parameters(const costmodel::ModelSpec& model, const std::string& prefix);

// One tensor as a checkpoint file describes it.
struct HfStored {
  std::string file;  // the safetensors file that holds it
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;  // where its data is in that file, from the file's start
};

// The size of the regular file `path`, and `bytes` bytes of it at `offset` into `out`: InputError
// naming the file otherwise (a FIFO or folder is refused without a read).
uint64_t regular_file_bytes(const std::string& path);
void read_file_range(const std::string& path, uint64_t offset, uint64_t bytes, char* out);

// A checkpoint read and checked against a model: each executor parameter's parts, found.
struct HfCheckpoint {
  std::vector<HfParameter> parameters;
  std::map<std::string, HfStored> stored;  // by checkpoint name: what `parameters` use
};

// Reads `path` — a .safetensors file, a model.safetensors.index.json (its shards in the same
// folder), or a folder holding either — and checks it against `model`: every tensor the model
// needs present with its shape and a floating-point dtype (F32, BF16, F16, F64), and nothing else
// but known leftovers (rotary inv_freq buffers, GPT-2's attention masks, a tied model's lm_head).
// Throws InputError, one line naming the file and the tensor (or the feature) at fault. Reads only
// headers and the index: no tensor data.
HfCheckpoint read_hf_checkpoint(const std::string& path, const costmodel::ModelSpec& model);

}  // namespace dplan::executor
