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

// A header larger than this is refused when reading (the Rust reference refuses above 100 MB too):
// a corrupt length must not make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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
  auto bad = [](const std::string& what) { return std::invalid_argument("safetensors: " + what); };
  if (bytes.size() < 8) throw bad("the file has " + std::to_string(bytes.size()) + " bytes, fewer than the 8 of its header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > kMaxHeaderBytes || header_bytes > bytes.size() - 8)
    throw bad("header length " + std::to_string(header_bytes) + " exceeds the file (" + std::to_string(bytes.size()) + " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, header_bytes));
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header is not a JSON object");
  const uint64_t data_start = 8 + header_bytes, data_bytes = bytes.size() - data_start;

  struct Entry {
    uint64_t begin, end;
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Entry> entries;
  try {
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") {
        if (metadata) *metadata = info.get<std::map<std::string, std::string>>();
        continue;
      }
      const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2) throw bad(name + ": data_offsets must be [begin, end]");
      entries.push_back({offsets[0], offsets[1], name, dtype_of(info.at("dtype").get<std::string>(), name),
                         info.at("shape").get<std::vector<int64_t>>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed header: ") + e.what());
  }
  // The offsets must tile the data exactly: no gap, no overlap, nothing after the last tensor.
  // (An empty tensor's [b, b) sorts before a tensor starting at b.)
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  uint64_t expected = 0;
  NamedTensors out;
  for (const Entry& e : entries) {
    if (e.begin != expected || e.end < e.begin || e.end > data_bytes)
      throw bad(e.name + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                ") do not follow the previous tensor (which ends at " + std::to_string(expected) + ") within the " +
                std::to_string(data_bytes) + " data bytes");
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (uint64_t(t.numel()) * t.element_size() != e.end - e.begin)
      throw bad(e.name + ": " + std::to_string(e.end - e.begin) + " bytes do not hold its shape and dtype");
    if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes.data() + data_start + e.begin, e.end - e.begin);
    out.emplace_back(e.name, t);
    expected = e.end;
  }
  if (expected != data_bytes)
    throw bad(std::to_string(data_bytes - expected) + " bytes after the last tensor belong to none");
  return out;
}

}  // namespace dplan::executor
