#include "checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "dplan/costmodel/errors.h"

namespace dplan::executor {
namespace fs = std::filesystem;

std::string step_folder_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return name;
}

std::string checkpoint_folder(const std::string& dir, int step) { return (fs::path(dir) / step_folder_name(step)).string(); }

int step_of_folder_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;
  return std::stoi(name.substr(5));
}

std::string shard_file_name(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}

json to_json(const ManifestShard& s) {
  return {{"rank", s.rank},           {"file", s.file},     {"bytes", s.bytes}, {"crc32", s.crc32},
          {"state_bytes", s.state_bytes}, {"params", s.params}};
}

json to_json(const CheckpointManifest& m) {
  json shards = json::array();
  for (const ManifestShard& s : m.shards) shards.push_back(to_json(s));
  return {{"format_version", kCheckpointFormatVersion},
          {"step", m.step},
          {"world_size", m.world_size},
          {"plan", m.plan},
          {"data", {{"epoch", m.epoch}, {"samples", m.samples}}},
          {"checksum", "crc32 (zlib)"},
          {"state_bytes", m.state_bytes},
          {"file_bytes", m.file_bytes},
          {"shards", shards}};
}

namespace {
constexpr long long kMaxBytes = std::numeric_limits<int64_t>::max();

// A JSON list at `key`, each element read by `item(element, its pointer)`.
template <typename Item>
auto read_list(ObjectReader& r, const std::string& pointer, const std::string& key, Item item) {
  const json& list = r.raw(key);
  if (!list.is_array()) r.fail(key, "a list");
  std::vector<decltype(item(list[0], std::string()))> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back(item(list[i], pointer + "/" + key + "/" + std::to_string(i)));
  return out;
}
}  // namespace

ManifestShard manifest_shard_from_json(const json& j, const std::string& file, const std::string& pointer) {
  if (!j.is_object()) throw InputError(file + ": " + pointer + ": expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file, pointer);
  ManifestShard s;
  s.rank = r.non_negative_int("rank");
  s.file = r.string("file");
  if (s.file != shard_file_name(s.rank)) r.fail("file", "\"" + shard_file_name(s.rank) + "\" (rank " + std::to_string(s.rank) + "'s shard)");
  s.bytes = r.int_in("bytes", 0, kMaxBytes);
  s.crc32 = r.string("crc32");
  if (s.crc32.size() != 8 || s.crc32.find_first_not_of("0123456789abcdef") != std::string::npos)
    r.fail("crc32", "8 lowercase hex digits");
  s.state_bytes = r.int_in("state_bytes", 0, kMaxBytes);
  s.params = read_list(r, pointer, "params", [&](const json& name, const std::string& at) {
    if (!name.is_string() || !is_printable_text(name.get<std::string>()))
      throw InputError(file + ": " + at + ": expected a parameter name, got " + describe_json_value(name));
    return name.get<std::string>();
  });
  r.finish();
  return s;
}

namespace {
// A reader over a checkpoint file's JSON (the manifest, a shard's metadata), its format_version
// read: one this dplan writes or an older one.
ObjectReader checkpoint_reader(const json& j, const std::string& file) {
  if (!j.is_object()) throw InputError(file + ": /: expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file);
  const long long version = r.int_in("format_version", 1, std::numeric_limits<int>::max());
  if (version > kCheckpointFormatVersion)
    r.fail("format_version", std::to_string(kCheckpointFormatVersion) + " (a newer dplan wrote this checkpoint)");
  return r;
}
}  // namespace

CheckpointManifest manifest_from_json(const json& j, const std::string& file) {
  ObjectReader r = checkpoint_reader(j, file);
  CheckpointManifest m;
  m.step = r.non_negative_int("step");
  m.world_size = r.positive_int("world_size");
  m.plan = r.raw("plan");
  {
    ObjectReader plan = r.object("plan");
    plan.string("path");
    if (!plan.raw("model").is_object()) plan.fail("model", "an object");
    if (!plan.raw("parallel").is_object()) plan.fail("parallel", "an object");
    plan.positive_int("global_batch");
    plan.positive_int("seq_len");
    if (plan.has("rank_layout") && !plan.raw("rank_layout").is_object()) plan.fail("rank_layout", "an object");
    plan.finish();
  }
  {
    ObjectReader data = r.object("data");
    m.epoch = data.non_negative_int("epoch");
    m.samples = data.int_in("samples", 0, kMaxBytes);
    data.finish();
  }
  r.one_of("checksum", {"crc32 (zlib)"});
  m.state_bytes = r.int_in("state_bytes", 0, kMaxBytes);
  m.file_bytes = r.int_in("file_bytes", 0, kMaxBytes);
  m.shards = read_list(r, "", "shards", [&](const json& shard, const std::string& at) {
    return manifest_shard_from_json(shard, file, at);
  });
  r.finish();
  if (static_cast<int>(m.shards.size()) != m.world_size)
    throw InputError(file + ": /shards: expected " + std::to_string(m.world_size) + " shards (world_size), got " +
                     std::to_string(m.shards.size()));
  int64_t state = 0, bytes = 0;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (m.shards[i].rank != static_cast<int>(i))
      throw InputError(file + ": /shards/" + std::to_string(i) + "/rank: expected " + std::to_string(i) + " (rank order), got " +
                       std::to_string(m.shards[i].rank));
    state += m.shards[i].state_bytes;
    bytes += m.shards[i].bytes;
  }
  if (state != m.state_bytes) r.fail("state_bytes", std::to_string(state) + " (the shards' sum)");
  if (bytes != m.file_bytes) r.fail("file_bytes", std::to_string(bytes) + " (the shards' sum)");
  return m;
}

namespace {
// The most elements a checkpointed tensor may have (2^40): bounds every product the readers form.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

// A slice (global_slice.h) as slice_to_json writes it; the slice must lie in its tensor.
GlobalSlice slice_from_json(const json& j, const std::string& file, const std::string& pointer) {
  if (!j.is_object()) throw InputError(file + ": " + pointer + ": expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file, pointer);
  GlobalSlice s;
  s.shape = read_list(r, pointer, "shape", [&](const json& d, const std::string& at) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxTensorElements)
      throw InputError(file + ": " + at + ": expected a dimension, got " + describe_json_value(d));
    return d.get<int64_t>();
  });
  if (s.shape.empty()) r.fail("shape", "a tensor's shape (one dimension at least)");
  s.dim = static_cast<int>(r.int_in("dim", 0, static_cast<long long>(s.shape.size()) - 1));
  s.parts = static_cast<int>(r.int_in("parts", 1, std::numeric_limits<int>::max()));
  s.index = static_cast<int>(r.int_in("index", 0, s.parts - 1));
  s.sections = read_list(r, pointer, "sections", [&](const json& sec, const std::string& at) {
    if (!sec.is_array() || sec.size() != 2 || !sec[0].is_number_integer() || !sec[1].is_number_integer() ||
        sec[0].get<int64_t>() < 0 || sec[1].get<int64_t>() < sec[0].get<int64_t>() ||
        sec[1].get<int64_t>() > kMaxTensorElements || sec[1].get<int64_t>() % s.parts != 0)
      throw InputError(file + ": " + at + ": expected [length, padded] with padded >= length and a multiple of parts (" +
                       std::to_string(s.parts) + "), got " +
                       describe_json_value(sec));
    return GlobalSlice::Section{sec[0].get<int64_t>(), sec[1].get<int64_t>()};
  });
  int64_t length = 0, padded = 0;
  for (const auto& sec : s.sections) length += sec.length, padded += sec.padded;
  if (length != s.shape[s.dim])
    r.fail("sections", "sections whose lengths add up to dimension " + std::to_string(s.dim) + " (" +
                           std::to_string(s.shape[s.dim]) + ")");
  int64_t rest = 1;  // the elements of one index along dim
  for (size_t i = 0; i < s.shape.size(); ++i)
    if (static_cast<int>(i) != s.dim && s.shape[i] != 0)
      rest = s.shape[i] > kMaxTensorElements / rest ? kMaxTensorElements + 1 : rest * s.shape[i];
  if (padded > kMaxTensorElements || rest > kMaxTensorElements / std::max<int64_t>(padded, 1))
    r.fail("sections", "padded sections of at most " + std::to_string(kMaxTensorElements) + " elements in all");
  // One unpadded section over the whole dim is what an empty list means (global_slice.h).
  if (s.sections == std::vector<GlobalSlice::Section>{{s.shape[s.dim], s.shape[s.dim]}}) s.sections.clear();
  r.finish();
  return s;
}

ShardPiece shard_piece_from_json(const json& j, const std::string& file, const std::string& pointer) {
  if (!j.is_object()) throw InputError(file + ": " + pointer + ": expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file, pointer);
  ShardPiece p;
  p.name = r.string("name");
  p.slice = slice_from_json(r.raw("slice"), file, pointer + "/slice");
  p.lo = r.int_in("lo", 0, kMaxBytes);
  p.n = r.int_in("n", 0, kMaxBytes);
  ObjectReader tensors = r.object("tensors");
  for (const auto& [kind, name] : r.raw("tensors").items()) p.tensors[kind] = tensors.string(kind);
  tensors.finish();
  p.optimizer_step = r.non_negative_int("optimizer_step");
  r.finish();
  return p;
}
}  // namespace

json to_json(const ShardMetadata& m) {
  json pieces = json::array();
  for (const ShardPiece& p : m.pieces)
    pieces.push_back({{"name", p.name}, {"slice", slice_to_json(p.slice)}, {"lo", p.lo}, {"n", p.n},
                      {"tensors", p.tensors}, {"optimizer_step", p.optimizer_step}});
  return {{"format_version", kCheckpointFormatVersion}, {"step", m.step}, {"rank", m.rank}, {"world", m.world},
          {"plan", m.plan}, {"data", {{"epoch", m.epoch}, {"samples", m.samples}}}, {"rng", m.rng}, {"pieces", pieces}};
}

ShardMetadata shard_metadata_from_json(const json& j, const std::string& file) {
  ObjectReader r = checkpoint_reader(j, file);
  ShardMetadata m;
  m.step = static_cast<int>(r.non_negative_int("step"));
  m.world = static_cast<int>(r.positive_int("world"));
  m.rank = static_cast<int>(r.int_in("rank", 0, m.world - 1));
  r.object("plan");  // the manifest's copy is the one compared (checkpoint_plan_info)
  m.plan = r.raw("plan");
  ObjectReader data = r.object("data");
  m.epoch = static_cast<int>(data.int_in("epoch", -1, std::numeric_limits<int>::max()));
  m.samples = data.int_in("samples", 0, kMaxBytes);
  data.finish();
  m.rng = read_list(r, "", "rng", [&](const json& name, const std::string& at) {
    if (!name.is_string()) throw InputError(file + ": " + at + ": expected a tensor name, got " + describe_json_value(name));
    return name.get<std::string>();
  });
  m.pieces = read_list(r, "", "pieces", [&](const json& piece, const std::string& at) {
    return shard_piece_from_json(piece, file, at);
  });
  r.finish();
  return m;
}


json slice_to_json(const GlobalSlice& s) {
  json sections = json::array();
  for (const auto& sec : s.sections_or_whole()) sections.push_back({sec.length, sec.padded});
  return {{"shape", s.shape}, {"dim", s.dim}, {"parts", s.parts}, {"index", s.index}, {"sections", sections}};
}

std::vector<int64_t> local_shape(const GlobalSlice& s) {
  std::vector<int64_t> shape = s.shape;
  int64_t along = 0;
  for (const auto& sec : s.sections_or_whole()) along += sec.padded / s.parts;
  shape.at(s.dim) = along;
  return shape;
}

// Padding is not written: each slice's elements past this count are zeros, and stay zeros (no
// token reaches them). Only a padded section (the vocabulary padded to a multiple of tp, split
// along dim 0) puts padding rows at the end of the last slices.
int64_t real_elements(const GlobalSlice& s) {
  const std::vector<int64_t> shape = local_shape(s);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;  // bounded by the reader (slice_from_json)
  const auto sections = s.sections_or_whole();
  if (s.dim != 0 || sections.size() != 1 || sections[0].padded == sections[0].length || shape[0] == 0) return numel;
  const int64_t chunk = sections[0].padded / s.parts;
  const int64_t rows = std::clamp<int64_t>(sections[0].length - s.index * chunk, 0, chunk);
  return rows * (numel / shape[0]);
}

CheckpointManifest manifest_from_text(const std::string& text, const std::string& file) {
  return manifest_from_json(parse_json_text(text, file), file);
}

ShardMetadata check_shard(const SafetensorsHeader& header, const CheckpointManifest& manifest, const ManifestShard& shard,
                          const std::string& folder) {
  const std::string where = "checkpoint " + folder + ": shard " + shard.file;
  auto fail = [&](const std::string& what) { throw InputError(where + ": " + what); };
  auto it = header.metadata.find(kShardMetadataKey);
  if (it == header.metadata.end())
    fail("no \"" + std::string(kShardMetadataKey) + "\" metadata (not a shard dplan wrote)");
  json j;
  try {
    j = parse_json_text(it->second, "its \"" + std::string(kShardMetadataKey) + "\" metadata");
  } catch (const InputError& e) {
    fail(e.what());
  }
  const ShardMetadata meta = shard_metadata_from_json(j, (fs::path(folder) / shard.file).string());
  if (meta.step != manifest.step || meta.rank != shard.rank || meta.world != manifest.world_size)
    fail("its metadata says step " + std::to_string(meta.step) + ", rank " + std::to_string(meta.rank) + " of " +
         std::to_string(meta.world) + "; the manifest says step " + std::to_string(manifest.step) + ", rank " +
         std::to_string(shard.rank) + " of " + std::to_string(manifest.world_size));
  std::map<std::string, const SafetensorsEntry*> entries;
  for (const SafetensorsEntry& e : header.entries) entries[e.name] = &e;
  std::set<std::string> named;  // the tensors the metadata names
  auto tensor = [&](const std::string& name, const std::string& of) -> const SafetensorsEntry& {
    auto found = entries.find(name);
    if (found == entries.end())
      fail("its metadata names a tensor \"" + quote_for_message(name) + "\" (" + of + ") that it does not hold");
    if (!named.insert(name).second) fail("its metadata names tensor \"" + quote_for_message(name) + "\" twice");
    return *found->second;
  };
  std::set<std::string> pieces_of;
  for (const ShardPiece& piece : meta.pieces) {
    const std::string of = "a piece of " + quote_for_message(piece.name);
    if (std::find(shard.params.begin(), shard.params.end(), piece.name) == shard.params.end())
      fail(of + ", a parameter the manifest does not list for this shard");
    pieces_of.insert(piece.name);
    if (piece.n < 1 || piece.lo > real_elements(piece.slice) - piece.n)
      fail(of + " covers elements [" + std::to_string(piece.lo) + ", " + std::to_string(piece.lo) + " + " +
           std::to_string(piece.n) + "), outside its slice's " + std::to_string(real_elements(piece.slice)));
    for (const char* kind : {"weight", "exp_avg", "exp_avg_sq"})
      if (!piece.tensors.count(kind)) fail(of + " has no " + kind + " tensor");
    for (const auto& [kind, name] : piece.tensors) {
      if (std::find(kPieceKinds.begin(), kPieceKinds.end(), kind) == kPieceKinds.end())
        fail(of + " has a tensor of kind \"" + quote_for_message(kind) + "\"; the kinds are weight, master, exp_avg, exp_avg_sq");
      const SafetensorsEntry& e = tensor(name, kind + " of " + of);
      const bool fp32_only = kind != "weight";
      if (e.dtype != "F32" && (fp32_only || e.dtype != "BF16"))
        fail("tensor \"" + quote_for_message(name) + "\" is " + e.dtype + "; a " + kind + " tensor is " +
             (fp32_only ? "F32" : "F32 or BF16"));
      if (e.shape != std::vector<int64_t>{piece.n})
        fail("tensor \"" + quote_for_message(name) + "\" has shape " + json(e.shape).dump() + "; " + of + " is [" +
             std::to_string(piece.n) + "]");
    }
  }
  for (const std::string& param : shard.params)
    if (!pieces_of.count(param))
      fail("the manifest lists parameter " + quote_for_message(param) + " for this shard, which holds no piece of it");
  for (const std::string& name : meta.rng) {
    if (std::find(kRngStates.begin(), kRngStates.end(), name) == kRngStates.end())
      fail("its metadata names an RNG state \"" + quote_for_message(name) + "\"; the states are rng.cpu and rng.cuda");
    const SafetensorsEntry& e = tensor(name, "an RNG state");
    if (e.dtype != "U8" || e.shape.size() != 1) fail("RNG state " + name + " is not a list of U8 bytes");
  }
  for (const SafetensorsEntry& e : header.entries)
    if (!named.count(e.name)) fail("it holds a tensor \"" + quote_for_message(e.name) + "\" that its metadata does not name");
  return meta;
}

std::string read_checkpoint_file(const std::string& dir, const std::string& step_name, const std::string& name,
                                 int64_t max_bytes, int64_t exact_bytes, const std::string& what) {
  const std::string folder = (fs::path(dir) / step_name).string();
  auto fail = [&](const std::string& problem) -> std::string {
    throw InputError("checkpoint " + folder + ": " + what + " " + problem);
  };
  // The user's folder as named (it may be a link of theirs); below it, nothing through a link.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) throw InputError("checkpoint folder " + dir + ": cannot open it (" + std::strerror(errno) + ")");
  const int step_fd = ::openat(dir_fd, step_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  const int step_errno = errno;
  ::close(dir_fd);
  if (step_fd < 0)
    throw InputError("checkpoint " + folder + ": " +
                     (step_errno == ELOOP || step_errno == ENOTDIR ? "is not a folder dplan wrote (a link or a file)"
                                                                   : "cannot open it (" + std::string(std::strerror(step_errno)) + ")"));
  const int fd = ::openat(step_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  const int file_errno = errno;
  ::close(step_fd);
  if (fd < 0) {
    if (file_errno == ENOENT) return fail("is missing; remove " + folder + " to resume from an earlier checkpoint");
    if (file_errno == ELOOP) return fail("is a symbolic link; dplan reads only the regular files it wrote there");
    return fail("cannot be opened (" + std::string(std::strerror(file_errno)) + ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail("cannot be read (" + std::string(std::strerror(errno)) + ")");
  if (!S_ISREG(st.st_mode)) return fail("is a " + file_kind(st.st_mode) + "; dplan reads only the regular files it wrote there");
  const int64_t size = st.st_size;
  if (exact_bytes >= 0 && size != exact_bytes)
    return fail("has " + std::to_string(size) + " bytes, the manifest says " + std::to_string(exact_bytes) + "; remove " +
                folder + " to resume from an earlier checkpoint");
  if (size > max_bytes) return fail("has " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) + " it may have");
  std::string bytes(static_cast<size_t>(size), '\0');
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot be read (" + std::string(std::strerror(errno)) + ")");
    if (n == 0) return fail("shrank to " + std::to_string(at) + " bytes while it was read");
    at += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace dplan::executor
