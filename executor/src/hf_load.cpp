#include "hf_load.h"

#include <map>
#include <stdexcept>

#include "checkpoint.h"

namespace dplan::executor {
namespace {

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  return at::kDouble;  // F64: read_hf_checkpoint admits no other
}

// The part of one stored tensor `t` names, as fp32, read from its byte range alone (an entry of
// dim 0 from that entry's bytes: a stack of experts is not read whole for each).
at::Tensor read_stored(const HfStored& s, const HfTensor& t) {
  std::vector<int64_t> shape = s.shape;
  uint64_t offset = s.offset, bytes = s.bytes;
  if (t.select >= 0) {
    bytes = s.bytes / static_cast<uint64_t>(shape.at(0));
    offset += bytes * static_cast<uint64_t>(t.select);
    shape.erase(shape.begin());
  }
  at::Tensor raw = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
  read_file_range(s.file, offset, bytes, static_cast<char*>(raw.data_ptr()));
  at::Tensor x = raw.view(scalar_type(s.dtype)).view(shape).to(at::kFloat);  // safetensors is little-endian, as x86 and ARM
  if (t.step > 1) x = x.slice(-1, t.start, x.size(-1), t.step).contiguous();
  return x;
}

// Rows grouped [outer, inner, d] regrouped as [inner, outer, d] (other dims kept): GPT-NeoX's
// per-head q, k, v rows (outer heads, inner 3) into the executor's [q; k; v] and back.
at::Tensor swap_head_groups(const at::Tensor& t, int64_t outer, int64_t inner) {
  std::vector<int64_t> grouped = {outer, inner, t.size(0) / (outer * inner)};
  for (int64_t i = 1; i < t.dim(); ++i) grouped.push_back(t.size(i));
  return t.reshape(grouped).transpose(0, 1).reshape(t.sizes());
}

// For each of the executor's rows of `p`'s tensor, the stored row it is (HfParameter::rotary_block):
// the interleaved rotary pairs' evens first, then their odds; the identity elsewhere.
at::Tensor stored_rows(const HfParameter& p, int64_t rows) {
  std::vector<int64_t> index(static_cast<size_t>(rows));
  const int64_t half = p.rotary_count / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t in_block = r % p.rotary_block, j = in_block - p.rotary_first;
    index[r] = r;
    if (j >= 0 && j < p.rotary_count) index[r] = r - j + (j < half ? 2 * j : 2 * (j - half) + 1);
  }
  return at::tensor(index, at::kLong);
}

}  // namespace

void load_hf_checkpoint(const HfCheckpoint& checkpoint, std::vector<Parameter>& params) {
  std::map<std::string, const HfParameter*> by_name;
  for (const HfParameter& p : checkpoint.parameters) by_name[p.name] = &p;
  at::NoGradGuard no_grad;
  for (Parameter& p : params) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) throw std::logic_error("--init-from: no checkpoint tensor maps to " + p.name);
    std::vector<at::Tensor> parts;
    for (const HfTensor& t : it->second->parts) {
      at::Tensor x = read_stored(checkpoint.stored.at(t.name), t);
      parts.push_back(it->second->transpose ? x.t() : x);
    }
    at::Tensor global = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    if (it->second->heads_interleaved > 0) global = swap_head_groups(global, it->second->heads_interleaved, 3);
    if (it->second->rotary_block > 0) global = global.index_select(0, stored_rows(*it->second, global.size(0)));
    if (it->second->offset != 0) global = global + it->second->offset;
    if (global.sizes().vec() != p.slice.shape)
      throw std::logic_error("--init-from: " + p.name + " assembles to " + std::to_string(global.numel()) +
                             " elements of another shape than the model's");
    p.tensor.copy_(local_from_global(global, p.slice).view(p.tensor.sizes()));
  }
}

std::map<std::string, at::Tensor> to_hf_tensors(const HfCheckpoint& checkpoint,
                                                const std::map<std::string, at::Tensor>& global, bool gradients) {
  std::map<std::string, at::Tensor> out;
  for (const HfParameter& p : checkpoint.parameters) {
    at::Tensor g = global.at(p.name).to(at::kFloat);
    if (!gradients && p.offset != 0) g = g - p.offset;
    if (p.heads_interleaved > 0) g = swap_head_groups(g, 3, p.heads_interleaved);
    if (p.rotary_block > 0) g = at::zeros_like(g).index_copy_(0, stored_rows(p, g.size(0)), g);
    int64_t row = 0;
    for (const HfTensor& t : p.parts) {
      at::Tensor& whole = out[t.name];
      if (!whole.defined()) whole = at::zeros(t.shape, at::kFloat);
      at::Tensor slot = t.select >= 0 ? whole.select(0, t.select) : whole;
      if (t.step > 1) slot = slot.slice(-1, t.start, slot.size(-1), t.step);
      const int64_t rows = p.transpose ? slot.size(-1) : slot.size(0);
      at::Tensor piece = g.narrow(0, row, rows);
      row += rows;
      slot.copy_(p.transpose ? piece.t() : piece);
    }
  }
  return out;
}

}  // namespace dplan::executor
