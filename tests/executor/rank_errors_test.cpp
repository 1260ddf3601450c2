// dplan run when a rank refuses its input during the run (here a shard whose header does not fit
// its bytes, under a checksum that matches): one line naming the shard, whichever rank found it
// (`rank N:` before it when that is not rank 0; run_dir.h), exit 2, and no survivor's line about a
// heartbeat. Which rank says it first is the launcher's logic (tests/cli/rank_watch_test.cpp).
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "process.h"

namespace {
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;
using namespace dplan::testing::executor;

std::string crc32_hex(const std::string& bytes) {
  const uLong crc = ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08lx", crc);
  return hex;
}

}  // namespace

TEST_CASE("dplan run: a shard damaged under a matching checksum is one line naming it and exit 2, whichever rank finds it",
          "[executor][launch-errors]") {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string plan = write_plan(dir, "gpt-tiny", {1, 1, 2}, 8);
  run_plan_to(plan, (dir.path() / "run.json").string(), 2, {"--checkpoint-dir", ckpt.string(), "--save-every", "2"});
  const fs::path step = ckpt / "step-00000002";
  const std::string shard = (step / "rank-00001.safetensors").string();
  std::string bytes = read_file(shard);
  // The first tensor's shape one element short in the JSON header (same length, so the offsets
  // stay), and the manifest's checksum made to match.
  const size_t shape = bytes.find("\"shape\":[");
  REQUIRE(shape != std::string::npos);
  size_t digit = bytes.find(']', shape) - 1;
  REQUIRE(bytes[digit] >= '1');
  bytes[digit] = static_cast<char>(bytes[digit] - 1);
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  json manifest = json::parse(read_file((step / "manifest.json").string()));
  for (json& s : manifest.at("shards"))
    if (s.at("file") == "rank-00001.safetensors") s["crc32"] = crc32_hex(bytes);
  std::ofstream((step / "manifest.json").string(), std::ios::trunc) << manifest.dump(1);

  Result r = run_program(DPLAN_BINARY,
                         {"run", plan, "--steps", "4", "--quiet", "--resume", ckpt.string(), "--timeout-s", "5"});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, StartsWith("dplan: error: "));
  CHECK_THAT(r.err, Contains("checkpoint " + ckpt.string() + "/step-00000002: shard rank-00001.safetensors: "));
  CHECK_THAT(r.err, !Contains("heartbeat"));
}
