#include "safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "dplan/costmodel/json_io.h"

namespace dplan::executor {
namespace {
// The format is little-endian; the tensors' bytes are copied as they lie in memory.
static_assert(std::endian::native == std::endian::little, "safetensors.cpp assumes a little-endian host");

const std::vector<std::pair<at::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, std::string>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
      {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},   {at::kByte, "U8"},       {at::kBool, "BOOL"}};
  return names;
}

std::string dtype_name(at::ScalarType t, const std::string& tensor) {
  for (const auto& [type, name] : dtype_names())
    if (type == t) return name;
  throw std::invalid_argument("safetensors: tensor " + tensor + " has dtype " + std::string(c10::toString(t)) +
                              ", which the writer does not store");
}

at::ScalarType dtype_of(const std::string& name, const std::string& tensor) {
  for (const auto& [type, n] : dtype_names())
    if (n == name) return type;
  throw std::invalid_argument("safetensors: tensor " + tensor + " has dtype " + name + ", which the reader does not know");
}
}  // namespace

std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name.rfind("__", 0) == 0)
      throw std::invalid_argument("safetensors: tensor name '" + name + "' is empty or starts with __ (reserved)");
    if (!seen.insert(name).second) throw std::invalid_argument("safetensors: tensor name " + name + " is repeated");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t n = uint64_t(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type(), name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    cpu.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference writer does
  std::string out(8, '\0');
  const uint64_t header_bytes = text.size();
  std::memcpy(out.data(), &header_bytes, 8);
  out.reserve(8 + text.size() + offset);
  out += text;
  for (const at::Tensor& t : cpu)
    if (t.numel() > 0) out.append(static_cast<const char*>(t.data_ptr()), size_t(t.numel()) * t.element_size());
  return out;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, safetensors_bytes(tensors, metadata));
}

NamedTensors parse_safetensors(const std::string& bytes, std::map<std::string, std::string>* metadata) {
  const SafetensorsHeader header = parse_safetensors_header(bytes);
  if (metadata) *metadata = header.metadata;
  NamedTensors out;
  for (const SafetensorsEntry& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(dtype_of(e.dtype, e.name)));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes.data() + header.data_start + e.begin, e.end - e.begin);
    out.emplace_back(e.name, t);
  }
  return out;
}

}  // namespace dplan::executor
