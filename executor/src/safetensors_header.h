// The header of a safetensors file (safetensors.h describes the format), read without LibTorch: the
// checkpoint reader checks a shard's tensors against its metadata before any tensor is made, and
// the checkpoint fuzz target reads headers the same way.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dplan::executor {

// The bytes of one element of a dtype the format names (F64, F32, F16, BF16, I64, I32, I16, I8, U8,
// BOOL); 0 for any other name.
int64_t safetensors_dtype_bytes(const std::string& dtype);

struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, into the data after the header
};
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in the order of their data offsets
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // where the data begins in the file: 8 + the header's length
};

// The header of a safetensors file's bytes, checked: a length within the file (and at most 100 MB,
// as the reference reader), strict JSON (no repeated key), every entry {"dtype", "shape",
// "data_offsets"} with a known dtype, non-negative dimensions, and a byte range that holds exactly
// its shape and dtype, the ranges tiling the data with nothing left over; "__metadata__" string to
// string. Throws std::invalid_argument naming what is malformed.
SafetensorsHeader parse_safetensors_header(std::string_view bytes);
// The same from the file's first bytes (at least its header) and the file's size, for a reader
// that does not load the data: safetensors_header_bytes says how many first bytes that is (8 +
// the header's length, checked against the size) from the first 8.
uint64_t safetensors_header_bytes(std::string_view first8, uint64_t file_bytes);
SafetensorsHeader parse_safetensors_header(std::string_view head, uint64_t file_bytes);

}  // namespace dplan::executor
