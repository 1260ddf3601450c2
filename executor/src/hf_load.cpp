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

// One stored tensor as fp32, read from its byte range alone.
at::Tensor read_stored(const HfStored& s) {
  at::Tensor raw = at::empty({static_cast<int64_t>(s.bytes)}, at::kByte);
  read_file_range(s.file, s.offset, s.bytes, static_cast<char*>(raw.data_ptr()));
  return raw.view(scalar_type(s.dtype)).view(s.shape).to(at::kFloat);  // safetensors is little-endian, as x86 and ARM
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
      at::Tensor x = read_stored(checkpoint.stored.at(t.name));
      parts.push_back(it->second->transpose ? x.t() : x);
    }
    at::Tensor global = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    if (global.sizes().vec() != p.slice.shape)
      throw std::logic_error("--init-from: " + p.name + " assembles to " + std::to_string(global.numel()) +
                             " elements of another shape than the model's");
    p.tensor.copy_(local_from_global(global, p.slice).view(p.tensor.sizes()));
  }
}

}  // namespace dplan::executor
