// dplan run when a rank other than 0 refuses its input: the launcher says that rank's own line,
// naming it, and exits 2 (run_dir.h: the rank leaves its line in the run folder). Here rank 1's
// shard holds a shape its bytes do not fit, under a checksum that matches, so rank 0 (which checks
// every shard's checksum) loads its own and waits while rank 1 alone refuses.
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

TEST_CASE("dplan run names the rank other than 0 that refused its input, with its own line and exit 2",
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
  CHECK_THAT(r.err, StartsWith("dplan: error: rank 1: checkpoint "));
  CHECK_THAT(r.err, Contains("rank-00001.safetensors"));
}
