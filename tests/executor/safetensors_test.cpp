// The safetensors writer and reader (executor/src/safetensors.h):
//  - the bytes follow the format: an 8-byte little-endian header length, a JSON header padded with
//    spaces to a multiple of 8 naming each tensor's dtype, shape and [begin, end) data offsets in
//    the order written, then the raw bytes back to back;
//  - reading them back gives the same names, dtypes, shapes and values, and the metadata;
//  - write_safetensors leaves exactly those bytes in the file;
//  - repeated or reserved names, and malformed files (short, bad JSON, offsets with a gap or past
//    the end, a size that does not match the shape, trailing bytes), are refused by name.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "safetensors.h"

namespace {
using dplan::executor::NamedTensors;
using dplan::executor::parse_safetensors;
using dplan::executor::safetensors_bytes;
using dplan::executor::write_safetensors;

NamedTensors sample_tensors() {
  return {{"wte", at::arange(12, at::kFloat).reshape({3, 4}) / 7.0},
          {"tokens.step0", at::tensor(std::vector<int64_t>{5, -1, int64_t(1) << 40}, at::kLong).reshape({1, 3})},
          {"layers.0.norm1.bias", at::zeros({0}, at::kFloat)},
          {"flag", at::tensor(std::vector<int64_t>{1, 0}).to(at::kBool)}};
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// The bytes with the header replaced by `header` (re-padded), the data kept.
std::string with_header(const std::string& bytes, const std::string& header) {
  const std::string data = bytes.substr(8 + header_length(bytes));
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}
}  // namespace

TEST_CASE("safetensors: the bytes follow the format", "[safetensors]") {
  const std::string bytes = safetensors_bytes(sample_tensors(), {{"format", "pt"}});
  const uint64_t n = header_length(bytes);
  REQUIRE(n % 8 == 0);
  const auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  CHECK(header["__metadata__"]["format"] == "pt");
  CHECK(header["wte"]["dtype"] == "F32");
  CHECK(header["wte"]["shape"] == nlohmann::json::array({3, 4}));
  CHECK(header["wte"]["data_offsets"] == nlohmann::json::array({0, 48}));
  CHECK(header["tokens.step0"]["dtype"] == "I64");
  CHECK(header["tokens.step0"]["data_offsets"] == nlohmann::json::array({48, 72}));
  CHECK(header["layers.0.norm1.bias"]["data_offsets"] == nlohmann::json::array({72, 72}));
  CHECK(header["flag"]["dtype"] == "BOOL");
  CHECK(header["flag"]["data_offsets"] == nlohmann::json::array({72, 74}));
  CHECK(bytes.size() == 8 + n + 74);
  float second = 0;
  std::memcpy(&second, bytes.data() + 8 + n + 4, 4);
  CHECK(second == 1.0f / 7.0f);
}

TEST_CASE("safetensors: a round trip keeps names, dtypes, shapes, values and metadata", "[safetensors]") {
  const NamedTensors in = sample_tensors();
  std::map<std::string, std::string> metadata;
  const NamedTensors out = parse_safetensors(safetensors_bytes(in, {{"seed", "1234"}}), &metadata);
  CHECK(metadata == std::map<std::string, std::string>{{"seed", "1234"}});
  REQUIRE(out.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    INFO(in[i].first);
    CHECK(out[i].first == in[i].first);
    CHECK(out[i].second.scalar_type() == in[i].second.scalar_type());
    CHECK(out[i].second.sizes() == in[i].second.sizes());
    CHECK(at::equal(out[i].second, in[i].second));
  }
}

TEST_CASE("safetensors: write_safetensors leaves exactly those bytes", "[safetensors]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dplan-safetensors-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ref.safetensors").string();
  const NamedTensors t = sample_tensors();
  write_safetensors(path, t);
  std::ifstream in(path, std::ios::binary);
  const std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(back == safetensors_bytes(t));
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors: bad names and malformed files are refused by name", "[safetensors]") {
  using Catch::Matchers::Contains;
  const at::Tensor x = at::ones({2});
  CHECK_THROWS_WITH(safetensors_bytes({{"a", x}, {"a", x}}), Contains("a is repeated"));
  CHECK_THROWS_WITH(safetensors_bytes({{"__metadata__", x}}), Contains("reserved"));
  CHECK_THROWS_WITH(safetensors_bytes({{"c", at::ones({2}, at::kComplexFloat)}}), Contains("tensor c has dtype"));

  const std::string good = safetensors_bytes({{"a", x}, {"b", x}});
  CHECK_THROWS_WITH(parse_safetensors(good.substr(0, 5)), Contains("fewer than the 8"));
  CHECK_THROWS_WITH(parse_safetensors(good.substr(0, 20)), Contains("exceeds the file"));
  CHECK_THROWS_WITH(parse_safetensors(with_header(good, "{not json")), Contains("not JSON"));
  CHECK_THROWS_WITH(parse_safetensors(with_header(good, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})")),
                    Contains("b: data_offsets [12, 20)"));
  CHECK_THROWS_WITH(parse_safetensors(with_header(good, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]},)"
                                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})")),
                    Contains("a: 8 bytes do not hold"));
  CHECK_THROWS_WITH(parse_safetensors(with_header(good, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})")),
                    Contains("8 bytes after the last tensor"));
  CHECK_THROWS_WITH(parse_safetensors(with_header(good, R"({"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})")),
                    Contains("dtype Q4"));
}
