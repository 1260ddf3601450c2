// The checkpoint manifest through the strict reader (checkpoint.h manifest_from_json): it
// round-trips, and a tampered one (a newer format, a missing or unknown key, a wrong type, sums
// or ranks that do not add up, a shard named for another rank) is one line naming the file and
// the JSON pointer. The same for the metadata inside each shard file (shard_metadata_from_json):
// the pieces, their slices of the global tensors, the tensors stored for them, the RNG states.
#include <string>

#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "checkpoint.h"
#include "dplan/costmodel/errors.h"
#include "input_errors.h"

using dplan::InputError;
using dplan::executor::CheckpointManifest;
using dplan::executor::manifest_from_json;
using dplan::executor::ManifestShard;
using nlohmann::json;

namespace {

CheckpointManifest two_ranks() {
  CheckpointManifest m;
  m.step = 6;
  m.world_size = 2;
  m.plan = {{"path", "plan.json"}, {"model", {{"name", "gpt-tiny"}}}, {"parallel", {{"tp", 2}}},
            {"global_batch", 8}, {"seq_len", 128}};
  m.epoch = 0;
  m.samples = 48;
  m.shards = {{0, "rank-00000.safetensors", "0a1b2c3d", 1000, 900, {"blocks.0.qkv_w", "wte"}},
              {1, "rank-00001.safetensors", "deadbeef", 1100, 950, {"blocks.0.qkv_w"}}};
  m.state_bytes = 1850;
  m.file_bytes = 2100;
  return m;
}

using dplan::testing::one_line_error;

std::string error_of(const json& j) {
  return one_line_error([&] { manifest_from_json(j, "ck/step-00000006/manifest.json"); });
}

}  // namespace

TEST_CASE("checkpoint manifest: written and read back by its one owner", "[checkpoint][formats]") {
  const CheckpointManifest m = two_ranks();
  const json j = to_json(m);
  CHECK(j["format_version"] == dplan::executor::kCheckpointFormatVersion);
  CHECK(j["checksum"] == "crc32 (zlib)");
  CHECK(manifest_from_json(j, "manifest.json") == m);
  CHECK(manifest_from_json(json::parse(j.dump(1)), "manifest.json") == m);
}

TEST_CASE("checkpoint manifest: a tampered one is one line naming the file and the JSON pointer", "[checkpoint][formats]") {
  const json good = to_json(two_ranks());
  const std::string file = "ck/step-00000006/manifest.json: ";
  json j = good;
  j["format_version"] = 2;
  CHECK(error_of(j) == file + "/format_version: expected 1 (a newer dplan wrote this checkpoint), got 2");
  j = good;
  j.erase("shards");
  CHECK(error_of(j) == file + "/: missing key \"shards\"");
  j = good;
  j["step"] = "six";
  CHECK_THAT(error_of(j), Catch::StartsWith(file + "/step: expected an integer"));
  j = good;
  j["extra"] = 1;
  CHECK_THAT(error_of(j), Catch::StartsWith(file + "/: unknown key \"extra\""));
  j = good;
  j["shards"][1]["bytes"] = -5;
  CHECK_THAT(error_of(j), Catch::StartsWith(file + "/shards/1/bytes: expected an integer"));
  j = good;
  j["shards"][1]["crc32"] = "DEADBEEF";
  CHECK(error_of(j) == file + "/shards/1/crc32: expected 8 lowercase hex digits, got \"DEADBEEF\"");
  j = good;
  j["shards"][1]["file"] = "../../etc/passwd";
  CHECK(error_of(j) == file + "/shards/1/file: expected \"rank-00001.safetensors\" (rank 1's shard), got \"../../etc/passwd\"");
  j = good;
  j["shards"][1]["params"][0] = 7;
  CHECK(error_of(j) == file + "/shards/1/params/0: expected a parameter name, got 7");
  j = good;
  std::swap(j["shards"][0], j["shards"][1]);
  CHECK(error_of(j) == file + "/shards/0/rank: expected 0 (rank order), got 1");
  j = good;
  j["file_bytes"] = 2101;
  CHECK(error_of(j) == file + "/file_bytes: expected 2100 (the shards' sum), got 2101");
  j = good;
  j["world_size"] = 3;
  CHECK(error_of(j) == file + "/shards: expected 3 shards (world_size), got 2");
  j = good;
  j["plan"].erase("seq_len");
  CHECK(error_of(j) == file + "/plan: missing key \"seq_len\"");
  j = good;
  j["data"]["samples"] = 1.5;
  CHECK_THAT(error_of(j), Catch::StartsWith(file + "/data/samples: expected an integer"));
}

namespace {
using dplan::executor::shard_metadata_from_json;
using dplan::executor::ShardMetadata;

// Rank 1 of two: a tp slice of the fused QKV weight (three sections) and a whole norm weight.
ShardMetadata rank1_shard() {
  ShardMetadata m;
  m.step = 6;
  m.rank = 1;
  m.world = 2;
  m.plan = {{"path", "plan.json"}};
  m.epoch = 0;
  m.samples = 48;
  m.rng = {"rng/cpu"};
  dplan::executor::GlobalSlice qkv;
  qkv.shape = {192, 64};
  qkv.dim = 0;
  qkv.parts = 2;
  qkv.index = 1;
  qkv.sections = {{64, 64}, {64, 64}, {64, 64}};
  dplan::executor::GlobalSlice norm;
  norm.shape = {64};
  m.pieces = {{"blocks.0.qkv_w", qkv, 0, 6144, {{"weight", "weight/blocks.0.qkv_w/0"}, {"exp_avg", "exp_avg/blocks.0.qkv_w/0"}}, 6},
              {"blocks.0.ln1_w", norm, 32, 32, {{"weight", "weight/blocks.0.ln1_w/32"}}, 6}};
  return m;
}

std::string shard_error_of(const json& j) {
  return one_line_error([&] { shard_metadata_from_json(j, "ck/step-00000006/rank-00001.safetensors"); });
}
}  // namespace

TEST_CASE("checkpoint shard metadata: written and read back by its one owner", "[checkpoint][formats]") {
  const ShardMetadata m = rank1_shard();
  const json j = to_json(m);
  CHECK(j["format_version"] == dplan::executor::kCheckpointFormatVersion);
  CHECK(shard_metadata_from_json(j, "shard") == m);
  CHECK(shard_metadata_from_json(json::parse(j.dump()), "shard") == m);
}

TEST_CASE("checkpoint shard metadata: a tampered one is one line naming the shard and the JSON pointer",
          "[checkpoint][formats]") {
  const json good = to_json(rank1_shard());
  const std::string file = "ck/step-00000006/rank-00001.safetensors: ";
  json j = good;
  j["format_version"] = 2;
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/format_version: expected 1 (a newer dplan wrote this checkpoint)"));
  j = good;
  j.erase("pieces");
  CHECK(shard_error_of(j) == file + "/: missing key \"pieces\"");
  j = good;
  j["rank"] = 2;
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/rank: expected"));
  j = good;
  j["pieces"][0]["slice"]["index"] = 2;  // slice 2 of 2
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces/0/slice/index: expected"));
  j = good;
  j["pieces"][0]["slice"]["dim"] = 2;  // a 2-d tensor has no dim 2
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces/0/slice/dim: expected"));
  j = good;
  j["pieces"][0]["slice"]["sections"][1] = {64, 32};  // padded below its length
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces/0/slice/sections/1: expected [length, padded]"));
  j = good;
  j["pieces"][1]["lo"] = -1;
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces/1/lo: expected"));
  j = good;
  j["pieces"][1]["tensors"]["weight"] = 3;
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces/1/tensors/weight: expected a string"));
  j = good;
  j["pieces"][1]["extra"] = 1;
  CHECK_THAT(shard_error_of(j), Catch::Contains("/pieces/1") && Catch::Contains("extra"));
  j = good;
  j["rng"][0] = 7;
  CHECK(shard_error_of(j) == file + "/rng/0: expected a tensor name, got 7");
  j = good;
  j["pieces"] = json::object();
  CHECK_THAT(shard_error_of(j), Catch::StartsWith(file + "/pieces: expected a list"));
}
