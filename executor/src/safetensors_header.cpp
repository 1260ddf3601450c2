#include "safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::executor {
namespace {
// A header larger than this is refused when reading (the Rust reference refuses above 100 MB too):
// a corrupt length must not make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::invalid_argument bad(const std::string& what) { return std::invalid_argument("safetensors: " + what); }
}  // namespace

int64_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> bytes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                       {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = bytes.find(dtype);
  return it == bytes.end() ? 0 : it->second;
}

uint64_t safetensors_header_bytes(std::string_view first8, uint64_t file_bytes) {
  if (first8.size() < 8 || file_bytes < 8)
    throw bad("the file has " + std::to_string(file_bytes) + " bytes, fewer than the 8 of its header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, first8.data(), 8);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8)
    throw bad("header length " + std::to_string(header_bytes) + " exceeds the file (" + std::to_string(file_bytes) + " bytes)");
  return 8 + header_bytes;
}

SafetensorsHeader parse_safetensors_header(std::string_view bytes) { return parse_safetensors_header(bytes, bytes.size()); }

SafetensorsHeader parse_safetensors_header(std::string_view bytes, uint64_t file_bytes) {
  const uint64_t header_bytes = safetensors_header_bytes(bytes, file_bytes) - 8;
  if (bytes.size() < 8 + header_bytes) throw bad("the header ends before its length (" + std::to_string(header_bytes) + " bytes)");
  nlohmann::json header;
  try {
    header = parse_json_text(std::string(bytes.substr(8, header_bytes)), "the header");
  } catch (const InputError& e) {
    throw bad(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header is not a JSON object");
  SafetensorsHeader out;
  out.data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - out.data_start;
  for (const auto& [name, info] : header.items()) {
    const std::string quoted = quote_for_message(name);
    if (name == "__metadata__") {
      if (!info.is_object()) throw bad("__metadata__ is not an object of strings");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) throw bad("__metadata__ \"" + quote_for_message(key) + "\" is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!info.is_object() || info.size() != 3 || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      throw bad(quoted + ": expected {\"dtype\", \"shape\", \"data_offsets\"}");
    SafetensorsEntry e;
    e.name = name;
    const auto& dtype = info["dtype"];
    if (!dtype.is_string() || safetensors_dtype_bytes(dtype.get<std::string>()) == 0)
      throw bad(quoted + ": dtype " + (dtype.is_string() ? quote_for_message(dtype.get<std::string>()) : describe_json_value(dtype)) + " is not one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
    e.dtype = dtype.get<std::string>();
    const auto& shape = info["shape"];
    const auto& offsets = info["data_offsets"];
    if (!shape.is_array()) throw bad(quoted + ": shape is not a list");
    // The element count, refused before it overflows (no tensor holds more bytes than the file).
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw bad(quoted + ": shape holds " + describe_json_value(d) + ", not a dimension");
      const uint64_t n = d.get<uint64_t>();
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || (n != 0 && numel > data_bytes / n + 1))
        throw bad(quoted + ": shape " + shape.dump() + " holds more than the file's " + std::to_string(data_bytes) + " data bytes");
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw bad(quoted + ": data_offsets must be [begin, end]");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t element = static_cast<uint64_t>(safetensors_dtype_bytes(e.dtype));
    if (e.end < e.begin) throw bad(quoted + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") end before they begin");
    if (numel > data_bytes / element + 1 || numel * element != e.end - e.begin)
      throw bad(quoted + ": " + std::to_string(e.end - e.begin) + " bytes do not hold its shape " + shape.dump() + " of " +
                e.dtype);
    out.entries.push_back(std::move(e));
  }
  // The offsets must tile the data exactly: no gap, no overlap, nothing after the last tensor.
  // (An empty tensor's [b, b) sorts before a tensor starting at b.)
  std::sort(out.entries.begin(), out.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  uint64_t expected = 0;
  for (const SafetensorsEntry& e : out.entries) {
    if (e.begin != expected || e.end > data_bytes)
      throw bad(quote_for_message(e.name) + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                ") do not follow the previous tensor (which ends at " + std::to_string(expected) + ") within the " +
                std::to_string(data_bytes) + " data bytes");
    expected = e.end;
  }
  if (expected != data_bytes)
    throw bad(std::to_string(data_bytes - expected) + " bytes after the last tensor belong to none");
  return out;
}

}  // namespace dplan::executor
