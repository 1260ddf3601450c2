// Named tensors in the safetensors format (https://github.com/huggingface/safetensors), the file
// PyTorch, JAX and Hugging Face tools read without unpickling: an 8-byte little-endian header
// length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}} (offsets
// into the data that follows, optionally "__metadata__": {string: string}), padded with spaces
// to a multiple of 8, then the tensors' raw little-endian bytes, back to back.
//
// The executor writes its reference inputs this way (dplan-worker --save-reference, read by
// bench/torch_gpt.py); checkpoints can use the same writer.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "safetensors_header.h"

namespace dplan::executor {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The file's bytes for `tensors` (any device; copied to CPU, made contiguous), in the given order.
// dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL. Throws std::invalid_argument on a
// repeated or empty name, a name starting with "__", or another dtype.
std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// safetensors_bytes written atomically (a temporary file renamed over `path`): a reader never
// sees half a file. Throws dplan::InputError when the folder is not writable or the disk is full.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The tensors of a safetensors file's bytes, in the order of their data offsets, and its
// metadata. Throws std::invalid_argument naming what is malformed (parse_safetensors_header: a
// short file, a header that is not JSON or whose offsets do not tile the data, an unknown dtype,
// a size that does not match the shape).
NamedTensors parse_safetensors(const std::string& bytes, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace dplan::executor
