#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/json_io.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::error_of;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {
json h100_profile() {
  return json::parse(R"({"format_version": 1, "gpu": {
      "name": "h100", "description": "test", "hbm_gb": 80, "hbm_gbytes_per_s": 3350,
      "peak_tflops": {"bf16": 989, "fp32": 67}, "framework_reserve_gib": 2,
      "matmul": {"max_efficiency": 0.8, "sm_count": 132, "kernel_overhead_us": 4}, "memory_efficiency": 0.85, "sustained_fraction": 0.85,
      "sources": {"all": "test"}}})");
}
}  // namespace

TEST_CASE("a GPU profile reads with units converted at the edge", "[json]") {
  GpuSpec g = gpu_from_json(h100_profile(), "h100.json");
  CHECK(g.hbm_bytes == 80e9);                          // GB = 1e9
  CHECK(g.framework_reserve_bytes == 2.0 * 1073741824);  // GiB = 2^30
  CHECK(g.peak_flops_per_s.at("bf16") == 989e12);
  CHECK(peak_flops_per_s(g, Precision::bf16) == 989e12);
  // Without the device's own figure the nominal capacity is what plans fit into; no NCCL buffers.
  CHECK(g.memory_capacity_bytes() == 80e9);
  CHECK(g.nccl_buffers_per_communicator_bytes == 0);
  json j = h100_profile();
  j["gpu"]["device_memory_bytes"] = 85045477376LL;
  j["gpu"]["nccl_buffers_per_communicator_mib"] = 294;
  GpuSpec d = gpu_from_json(j, "h100.json");
  CHECK(d.hbm_bytes == 80e9);
  CHECK(d.memory_capacity_bytes() == 85045477376.0);
  CHECK(d.nccl_buffers_per_communicator_bytes == 294 * 1048576.0);
  GpuSpec round = gpu_from_json(json{{"format_version", 1}, {"gpu", to_json(d)}}, "again.json");
  CHECK(round.memory_capacity_bytes() == d.memory_capacity_bytes());
  CHECK(round.nccl_buffers_per_communicator_bytes == d.nccl_buffers_per_communicator_bytes);
}

TEST_CASE("a negative capacity names file, key, expectation and value", "[json]") {
  json j = h100_profile();
  j["gpu"]["hbm_gb"] = -80;
  CHECK_THAT(error_of([&] { gpu_from_json(j, "profiles/x.json"); }),
             Equals("profiles/x.json: /gpu/hbm_gb: expected a number from 0.01 to 100000, got -80"));
}

TEST_CASE("an unknown key is rejected with the list of valid keys", "[json]") {
  json j = h100_profile();
  j["gpu"]["hbm_gib"] = 80;
  std::string msg = error_of([&] { gpu_from_json(j, "x.json"); });
  CHECK_THAT(msg, Contains("x.json: /gpu: unknown key \"hbm_gib\""));
  CHECK_THAT(msg, Contains("hbm_gb"));
  CHECK_THAT(msg, Contains("peak_tflops"));
}

TEST_CASE("a missing key is named", "[json]") {
  json j = h100_profile();
  j["gpu"].erase("hbm_gbytes_per_s");
  CHECK_THAT(error_of([&] { gpu_from_json(j, "x.json"); }),
             Equals("x.json: /gpu: missing key \"hbm_gbytes_per_s\""));
}

TEST_CASE("a GPU without fp8 units refuses fp8 training", "[json]") {
  GpuSpec g = gpu_from_json(h100_profile(), "h100.json");
  CHECK_THAT(error_of([&] { peak_flops_per_s(g, Precision::fp8); }), Contains("no fp8 peak"));
}

TEST_CASE("fp32 training uses TF32 tensor cores when the GPU has them", "[json]") {
  json j = h100_profile();
  j["gpu"]["peak_tflops"]["tf32"] = 494.5;
  CHECK(peak_flops_per_s(gpu_from_json(j, "x"), Precision::fp32) == 494.5e12);
}

TEST_CASE("reading a file reports missing files and malformed JSON by name", "[json]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "dplan_json_test";
  fs::create_directories(dir);
  CHECK_THAT(error_of([&] { read_json_file((dir / "absent.json").string()); }), Contains("absent.json: no such file"));
  std::ofstream((dir / "bad.json").string()) << "{\"a\": 1,\n \"b\": }";
  std::string msg = error_of([&] { read_json_file((dir / "bad.json").string()); });
  CHECK_THAT(msg, Contains("bad.json: malformed JSON"));
  CHECK_THAT(msg, Contains("line 2"));
}

TEST_CASE("atomic writes replace a file whole and leave no temporary behind", "[json]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "dplan_atomic_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string path = (dir / "plan.json").string();
  write_file_atomically(path, "first");
  write_file_atomically(path, "second version");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "second version");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  CHECK_THROWS_AS(write_file_atomically((dir / "no/such/folder/x.json").string(), "x"), InputError);
}

TEST_CASE("did you mean: the nearest choice within two edits, the longest shared start among as near, none past that",
          "[json]") {
  CHECK(dplan::edit_distance("megatrom", "megatron") == 1);
  CHECK(dplan::edit_distance("", "abc") == 3);
  CHECK(dplan::did_you_mean("megatrom", {"torchtitan", "megatron"}) == " (did you mean megatron?)");
  CHECK(dplan::did_you_mean("DGX-H10", {"dgx-h100", "dgx-b200"}) == " (did you mean dgx-h100?)");  // case aside
  CHECK(dplan::did_you_mean("--tpp", {"--top", "--tp"}) == " (did you mean --tp?)");
  CHECK(dplan::did_you_mean("qqqqqqqq", {"gpt-tiny", "llama-3-8b"}).empty());
  CHECK(dplan::did_you_mean("ab", {"cd"}).empty());  // two edits of two characters is no misspelling
  CHECK(dplan::did_you_mean("x", {}).empty());
}
