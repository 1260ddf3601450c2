// The checkpoint folder as the resume reads it (checkpoint.h find_checkpoint, checkpoint_format.h
// read_checkpoint_file and check_shard), on a one-rank checkpoint built here byte by byte:
//  - nothing but regular files inside the folder is opened: a shard or manifest that is a link (to
//    a file outside, to /dev/zero), a FIFO, or a step-N that is a link is one line, without a read
//    (so without a hang) and never more than the manifest's size;
//  - a shard whose checksum matches but whose contents are wrong (shapes, dtypes, names, missing
//    tensors, an unknown RNG state, a negative dimension) is one line naming the shard;
//  - the folder's lock: a second holder is refused naming the first; a file is no folder.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "checkpoint.h"
#include "dplan/costmodel/errors.h"
#include "process.h"
#include "input_errors.h"
#include "safetensors.h"

namespace {
namespace fs = std::filesystem;
using dplan::InputError;
using dplan::testing::TempDir;
using namespace dplan::executor;
using Catch::Matchers::Contains;
using nlohmann::json;

using dplan::testing::one_line_error;

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string crc_hex(const std::string& bytes) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x",
                static_cast<unsigned>(::crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size())));
  return buf;
}

// One rank's shard of a parameter "w" of 4 elements (weight and AdamW's moments) and its CPU RNG
// state, as the saver writes it; `edit` changes the tensors and the metadata first.
using Edit = std::function<void(NamedTensors&, json&)>;
std::string shard_bytes(const Edit& edit) {
  ShardMetadata meta;
  meta.step = 3;
  meta.rank = 0;
  meta.world = 1;
  meta.plan = {{"path", "plan.json"}};
  meta.epoch = 0;
  meta.samples = 12;
  meta.rng = {"rng.cpu"};
  GlobalSlice whole;
  whole.shape = {4};
  meta.pieces = {{"w", whole, 0, 4, {{"weight", "weight/w/0"}, {"exp_avg", "exp_avg/w/0"}, {"exp_avg_sq", "exp_avg_sq/w/0"}}, 3}};
  NamedTensors tensors = {{"weight/w/0", at::arange(4, at::kFloat)},
                          {"exp_avg/w/0", at::ones({4}, at::kFloat)},
                          {"exp_avg_sq/w/0", at::ones({4}, at::kFloat)},
                          {"rng.cpu", at::zeros({8}, at::kByte)}};
  json j = to_json(meta);
  if (edit) edit(tensors, j);
  return safetensors_bytes(tensors, {{"format", "pt"}, {kShardMetadataKey, j.dump()}});
}

// DIR/step-00000003 with that shard and a manifest that matches its bytes and CRC-32.
fs::path write_checkpoint(const fs::path& dir, const std::string& shard) {
  const fs::path folder = dir / step_folder_name(3);
  fs::create_directories(folder);
  write(folder / shard_file_name(0), shard);
  CheckpointManifest m;
  m.step = 3;
  m.world_size = 1;
  m.plan = {{"path", "plan.json"}, {"model", {{"name", "tiny"}}}, {"parallel", {{"tp", 1}}}, {"global_batch", 4},
            {"seq_len", 8}};
  m.samples = 12;
  m.shards = {{0, shard_file_name(0), crc_hex(shard), static_cast<int64_t>(shard.size()), 48, {"w"}}};
  m.state_bytes = 48;
  m.file_bytes = static_cast<int64_t>(shard.size());
  write(folder / kManifestName, to_json(m).dump(1));
  return folder;
}

std::string resume_error(const fs::path& dir) {
  return one_line_error([&] { find_checkpoint(dir.string(), /*verify_checksums=*/true); });
}
}  // namespace

TEST_CASE("checkpoint folder: a good one-rank checkpoint is found", "[checkpoint][folder]") {
  TempDir tmp;
  write_checkpoint(tmp.path(), shard_bytes(nullptr));
  const auto found = find_checkpoint(tmp.path().string(), true);
  REQUIRE(found);
  CHECK(found->step == 3);
  CHECK(found->name == "step-00000003");
}

TEST_CASE("checkpoint folder: a shard or manifest that is a link or a FIFO or a device is refused unread", "[checkpoint][folder]") {
  TempDir tmp;
  const std::string shard = shard_bytes(nullptr);
  const fs::path folder = write_checkpoint(tmp.path(), shard);
  const fs::path shard_path = folder / shard_file_name(0), manifest = folder / kManifestName;
  const std::string where = "checkpoint " + folder.string() + ": ";

  SECTION("a shard linked to a file outside the folder, of the manifest's size and CRC-32") {
    const fs::path outside = tmp.path() / "outside.safetensors";
    fs::rename(shard_path, outside);
    fs::create_symlink(outside, shard_path);
    CHECK(resume_error(tmp.path()) ==
          where + "shard rank-00000.safetensors is a symbolic link; dplan reads only the regular files it wrote there");
  }
  SECTION("a shard that is a FIFO") {
    fs::remove(shard_path);
    REQUIRE(::mkfifo(shard_path.c_str(), 0600) == 0);
    CHECK(resume_error(tmp.path()) ==
          where + "shard rank-00000.safetensors is a FIFO (named pipe); dplan reads only the regular files it wrote there");
  }
  SECTION("a manifest that is a FIFO: refused at once, no hang") {
    fs::remove(manifest);
    REQUIRE(::mkfifo(manifest.c_str(), 0600) == 0);
    const auto start = std::chrono::steady_clock::now();
    CHECK(resume_error(tmp.path()) ==
          where + "manifest.json is a FIFO (named pipe); dplan reads only the regular files it wrote there");
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  }
  SECTION("a manifest linked to /dev/zero") {
    fs::remove(manifest);
    fs::create_symlink("/dev/zero", manifest);
    CHECK(resume_error(tmp.path()) == where + "manifest.json is a symbolic link; dplan reads only the regular files it wrote there");
  }
  SECTION("a manifest larger than the bound is refused before it is read") {
    std::ofstream(manifest, std::ios::binary | std::ios::app).flush();
    fs::resize_file(manifest, kMaxManifestBytes + 1);
    CHECK_THAT(resume_error(tmp.path()), Contains("manifest.json has " + std::to_string(kMaxManifestBytes + 1) + " bytes, more than"));
  }
  SECTION("a step-N that is a link to a folder outside") {
    const fs::path elsewhere = tmp.path() / "elsewhere";
    fs::rename(folder, elsewhere);
    fs::create_symlink(elsewhere, folder);
    CHECK(resume_error(tmp.path()) == "checkpoint " + folder.string() + " is not a folder dplan wrote (a link or a file); remove it");
  }
  SECTION("read_checkpoint_file never reads more than the manifest's size") {
    write(shard_path, shard + "extra");
    CHECK(one_line_error([&] {
            read_checkpoint_file(tmp.path().string(), "step-00000003", shard_file_name(0), 1 << 20,
                                 static_cast<int64_t>(shard.size()), "shard rank-00000.safetensors");
          }) == where + "shard rank-00000.safetensors has " + std::to_string(shard.size() + 5) + " bytes, the manifest says " +
                    std::to_string(shard.size()) + "; remove " + folder.string() + " to resume from an earlier checkpoint");
  }
}

TEST_CASE("checkpoint folder: a damaged shard whose checksum matches is one line naming the shard", "[checkpoint][folder]") {
  TempDir tmp;
  const std::string shard = "checkpoint " + (tmp.path() / "step-00000003").string() + ": shard rank-00000.safetensors: ";
  auto error_with = [&](const Edit& edit) {
    write_checkpoint(tmp.path(), shard_bytes(edit));
    return resume_error(tmp.path());
  };
  CHECK(error_with([](NamedTensors& t, json&) { t[0].second = at::arange(4, at::kFloat).reshape({2, 2}); }) ==
        shard + "tensor \"weight/w/0\" has shape [2,2]; a piece of w is [4]");
  CHECK(error_with([](NamedTensors& t, json&) { t[0].second = at::arange(4, at::kInt); }) ==
        shard + "tensor \"weight/w/0\" is I32; a weight tensor is F32 or BF16");
  CHECK(error_with([](NamedTensors& t, json&) { t[1].second = at::ones({4}, at::kBFloat16); }) ==
        shard + "tensor \"exp_avg/w/0\" is BF16; a exp_avg tensor is F32");
  CHECK(error_with([](NamedTensors& t, json&) { t.erase(t.begin() + 2); }) ==
        shard + "its metadata names a tensor \"exp_avg_sq/w/0\" (exp_avg_sq of a piece of w) that it does not hold");
  CHECK(error_with([](NamedTensors&, json& j) { j["pieces"][0]["tensors"].erase("exp_avg"); }) ==
        shard + "a piece of w has no exp_avg tensor");
  CHECK(error_with([](NamedTensors&, json& j) { j["pieces"][0]["tensors"]["bias"] = "exp_avg/w/0"; }) ==
        shard + "a piece of w has a tensor of kind \"bias\"; the kinds are weight, master, exp_avg, exp_avg_sq");
  CHECK(error_with([](NamedTensors&, json& j) { j["pieces"][0]["name"] = "v"; }) ==
        shard + "a piece of v, a parameter the manifest does not list for this shard");
  CHECK(error_with([](NamedTensors&, json& j) { j["pieces"][0]["n"] = 5; }) ==
        shard + "a piece of w covers elements [0, 0 + 5), outside its slice's 4");
  CHECK(error_with([](NamedTensors&, json& j) { j["rng"][0] = "rng.gpu"; }) ==
        shard + "its metadata names an RNG state \"rng.gpu\"; the states are rng.cpu and rng.cuda");
  CHECK(error_with([](NamedTensors& t, json&) { t.emplace_back("stray", at::ones({1})); }) ==
        shard + "it holds a tensor \"stray\" that its metadata does not name");
  CHECK(error_with([](NamedTensors&, json& j) { j["step"] = 4; }) ==
        shard + "its metadata says step 4, rank 0 of 1; the manifest says step 3, rank 0 of 1");
  CHECK_THAT(error_with([](NamedTensors&, json& j) { j["step"] = 3.5; }),
             Contains("rank-00000.safetensors: /step: expected an integer"));
  CHECK_THAT(error_with([](NamedTensors&, json& j) { j["pieces"][0]["slice"]["shape"] = {5}; }),
             Contains("/pieces/0/slice/sections: expected sections whose lengths add up to dimension 0 (5)"));
  CHECK_THAT(error_with([](NamedTensors&, json& j) { j["pieces"][0]["slice"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; }),
             Contains("/pieces/0/slice/"));
}

TEST_CASE("safetensors: a negative or overflowing dimension is refused by name before any tensor is made", "[safetensors]") {
  const std::string good = safetensors_bytes({{"a", at::ones({2})}});
  auto with_shape = [&](const std::string& shape) {
    std::string header = R"({"a":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,8]}})";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return out + header + good.substr(good.size() - 8);
  };
  CHECK_THROWS_WITH(parse_safetensors_header(with_shape("[-2]")), "safetensors: a: shape holds -2, not a dimension");
  CHECK_THROWS_WITH(parse_safetensors_header(with_shape("[4294967296,4294967296]")), Contains("a: shape [4294967296,4294967296] holds more than"));
  CHECK_THROWS_AS(parse_safetensors(with_shape("[-2]")), std::invalid_argument);
  CHECK(parse_safetensors_header(with_shape("[2]")).entries.size() == 1);
}

TEST_CASE("checkpoint folder: one run holds the lock and a second is refused naming it and a file is no folder", "[checkpoint][folder]") {
  TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  {
    CheckpointFolderLock first(dir);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    CHECK(one_line_error([&] { CheckpointFolderLock second(dir); }) ==
          "--checkpoint-dir " + dir + " is in use by another run (" + host + " pid " + std::to_string(::getpid()) +
              "); wait for it to end or give another folder");
  }
  CHECK(one_line_error([&] { CheckpointFolderLock again(dir); }) == "(no error)");  // released with its holder
  write(tmp.path() / "file", "x");
  CHECK(one_line_error([&] { CheckpointFolderLock lock((tmp.path() / "file").string()); }) ==
        "--checkpoint-dir " + (tmp.path() / "file").string() +
            " is a regular file, not a folder; give a folder (it is made when missing)");
  fs::create_directories(tmp.path() / "linked");
  fs::create_symlink("/dev/null", tmp.path() / "linked" / kLockFileName);
  CHECK_THAT(one_line_error([&] { CheckpointFolderLock lock((tmp.path() / "linked").string()); }),
             Contains("cannot open its lock file dplan-checkpoint.lock") && Contains("it is a link; remove it"));
}
