#include "checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>

#include "comm.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "safetensors.h"

namespace dplan::executor {
namespace fs = std::filesystem;
namespace {
using Seconds = std::chrono::duration<double>;
using Clock = std::chrono::steady_clock;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kMetadataKey = "dplan_checkpoint";
// The tensors a piece may have, by kind.
constexpr const char* kKinds[] = {"weight", "master", "exp_avg", "exp_avg_sq"};

// zlib's CRC-32 (the IEEE polynomial of gzip and PNG), in chunks: zlib takes a uInt length.
uint32_t crc32_of(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1u << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(n));
    at += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", x);
  return buf;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

json slice_to_json(const GlobalSlice& s) {
  json sections = json::array();
  for (const auto& sec : s.sections_or_whole()) sections.push_back({sec.length, sec.padded});
  return {{"shape", s.shape}, {"dim", s.dim}, {"parts", s.parts}, {"index", s.index}, {"sections", sections}};
}

// The local tensor's shape for `slice`.
std::vector<int64_t> local_shape(const GlobalSlice& s) {
  std::vector<int64_t> shape = s.shape;
  int64_t along = 0;
  for (const auto& sec : s.sections_or_whole()) along += sec.padded / s.parts;
  shape.at(s.dim) = along;
  return shape;
}

// How many leading elements of the flattened local tensor are the global tensor's: all of them,
// except where a padded section (the vocabulary padded to a multiple of tp, split along dim 0) puts
// padding rows at the end of the last slices. Padding is not written: each slice's elements past
// this count are zeros, and stay zeros (no token reaches them).
int64_t real_elements(const GlobalSlice& s) {
  const std::vector<int64_t> shape = local_shape(s);
  const int64_t numel = c10::multiply_integers(shape);
  const auto sections = s.sections_or_whole();
  if (s.dim != 0 || sections.size() != 1 || sections[0].padded == sections[0].length || shape[0] == 0) return numel;
  const int64_t chunk = sections[0].padded / s.parts;
  const int64_t rows = std::clamp<int64_t>(sections[0].length - s.index * chunk, 0, chunk);
  return rows * (numel / shape[0]);
}

// The CPU generator's state and, on CUDA, the device's: the streams dropout draws from.
NamedTensors rng_states(const at::Device& device) {
  NamedTensors out;
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("rng.cpu", gen.get_state());
  }
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("rng.cuda", gen.get_state());
  }
  return out;
}

void set_rng_state(const std::string& name, const at::Tensor& state, const at::Device& device) {
  at::Generator gen = name == "rng.cpu" ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The optimizer's parameters by the address of their first element (each piece's master view).
std::map<const void*, at::Tensor> optimizer_params_by_address(torch::optim::Optimizer& optimizer) {
  std::map<const void*, at::Tensor> out;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) out[p.data_ptr()] = p;
  return out;
}

// A shard's contents, copied to host memory: what the writer thread needs, nothing of the trainer's.
struct HostShard {
  int step = 0;
  NamedTensors tensors;
  ShardMetadata metadata;
  int64_t state_bytes = 0;
  double blocking_s = 0, wait_s = 0;
};

HostShard copy_to_host(int step, int rank, int world, const json& plan_info, const TrainingState& state) {
  HostShard shard;
  shard.step = step;
  std::vector<Parameter>& params = state.stage.parameters();
  const auto by_address = optimizer_params_by_address(state.optimizer);
  ShardMetadata& meta = shard.metadata;
  auto host = [](const at::Tensor& t) { return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous(); };
  for (const GradSync::StatePiece& piece : state.grads.state_pieces()) {
    if (!piece.writes) continue;
    const Parameter& p = params[piece.param];
    const int64_t n = std::min(piece.n, real_elements(p.slice) - piece.lo);  // padding left out
    if (n <= 0) continue;
    const std::string suffix = "/" + p.name + "/" + std::to_string(piece.lo);
    std::map<std::string, std::string> keys;
    auto put = [&](const std::string& kind, const at::Tensor& whole) {
      const at::Tensor t = whole.narrow(0, 0, n);
      shard.tensors.emplace_back(kind + suffix, host(t));
      shard.state_bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
      keys[kind] = kind + suffix;
    };
    put("weight", piece.weight);
    if (piece.weight.scalar_type() != piece.master.scalar_type()) put("master", piece.master);
    auto it = by_address.find(piece.master.data_ptr());
    if (it == by_address.end()) throw std::logic_error("a checkpoint piece of " + p.name + " that the optimizer does not step");
    auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(optimizer_state(state.optimizer, it->second));
    if (adam == nullptr || !adam->exp_avg().defined())
      throw std::logic_error("no AdamW state for " + p.name + " at step " + std::to_string(step));
    put("exp_avg", adam->exp_avg());
    put("exp_avg_sq", adam->exp_avg_sq());
    meta.pieces.push_back({p.name, p.slice, piece.lo, n, keys, adam->step()});
  }
  for (auto& [name, t] : rng_states(state.device)) {
    meta.rng.push_back(name);
    shard.tensors.emplace_back(name, t);
  }
  const DataSource::Position at = state.data.position();
  meta.step = step;
  meta.rank = rank;
  meta.world = world;
  meta.plan = plan_info;
  meta.epoch = at.epoch;
  meta.samples = at.samples;
  return shard;
}

std::string report_key(int step, int rank) {
  return "dplan/checkpoint/" + std::to_string(step) + "/" + std::to_string(rank);
}

// Steps of the folders DIR/step-N, newest first.
std::vector<std::pair<int, fs::path>> step_folders(const std::string& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0 || !entry.is_directory()) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    out.emplace_back(std::stoi(name.substr(5)), entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::string checkpoint_folder(const std::string& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return (fs::path(dir) / name).string();
}

std::string shard_file_name(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}

json checkpoint_plan_info(const std::string& plan_path) {
  const json plan = json::parse(read_bytes(plan_path));
  json info = {{"path", plan_path}, {"model", plan.at("model")}, {"parallel", plan.at("parallel")},
               {"global_batch", plan.at("training").at("global_batch")}, {"seq_len", plan.at("training").at("seq_len")}};
  if (plan.contains("rank_layout")) info["rank_layout"] = plan["rank_layout"];
  return info;
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

CheckpointManifest manifest_from_json(const json& j, const std::string& file) {
  if (!j.is_object()) throw InputError(file + ": /: expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file);
  const long long version = r.int_in("format_version", 1, std::numeric_limits<int>::max());
  if (version > kCheckpointFormatVersion)
    r.fail("format_version", std::to_string(kCheckpointFormatVersion) + " (a newer dplan wrote this checkpoint)");
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
// A slice (gpt.h GlobalSlice) as slice_to_json writes it; the slice must lie in its tensor.
GlobalSlice slice_from_json(const json& j, const std::string& file, const std::string& pointer) {
  if (!j.is_object()) throw InputError(file + ": " + pointer + ": expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file, pointer);
  GlobalSlice s;
  s.shape = read_list(r, pointer, "shape", [&](const json& d, const std::string& at) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw InputError(file + ": " + at + ": expected a dimension, got " + describe_json_value(d));
    return d.get<int64_t>();
  });
  if (s.shape.empty()) r.fail("shape", "a tensor's shape (one dimension at least)");
  s.dim = static_cast<int>(r.int_in("dim", 0, static_cast<long long>(s.shape.size()) - 1));
  s.parts = static_cast<int>(r.int_in("parts", 1, std::numeric_limits<int>::max()));
  s.index = static_cast<int>(r.int_in("index", 0, s.parts - 1));
  s.sections = read_list(r, pointer, "sections", [&](const json& sec, const std::string& at) {
    if (!sec.is_array() || sec.size() != 2 || !sec[0].is_number_integer() || !sec[1].is_number_integer() ||
        sec[0].get<int64_t>() < 0 || sec[1].get<int64_t>() < sec[0].get<int64_t>())
      throw InputError(file + ": " + at + ": expected [length, padded] with padded >= length, got " +
                       describe_json_value(sec));
    return GlobalSlice::Section{sec[0].get<int64_t>(), sec[1].get<int64_t>()};
  });
  // One unpadded section over the whole dim is what an empty list means (gpt.h).
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
  if (!j.is_object()) throw InputError(file + ": /: expected an object, got " + describe_json_value(j));
  ObjectReader r(j, file);
  const long long version = r.int_in("format_version", 1, std::numeric_limits<int>::max());
  if (version > kCheckpointFormatVersion)
    r.fail("format_version", std::to_string(kCheckpointFormatVersion) + " (a newer dplan wrote this checkpoint)");
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

at::Tensor local_from_global(const at::Tensor& global, const GlobalSlice& s) {
  if (s.parts == 1 && s.sections.empty()) return global;
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (const auto& sec : s.sections_or_whole()) {
    at::Tensor real = global.narrow(s.dim, at, sec.length);
    at::Tensor padded = real;
    if (sec.padded != sec.length) {
      std::vector<int64_t> shape = global.sizes().vec();
      shape[s.dim] = sec.padded;
      padded = at::zeros(shape, global.options());
      padded.narrow(s.dim, 0, sec.length).copy_(real);
    }
    const int64_t chunk = sec.padded / s.parts;
    parts.push_back(padded.narrow(s.dim, s.index * chunk, chunk));
    at += sec.length;
  }
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, s.dim);
}

void global_from_local(const at::Tensor& local, const GlobalSlice& s, at::Tensor& global) {
  int64_t global_at = 0, local_at = 0;
  for (const auto& sec : s.sections_or_whole()) {
    const int64_t chunk = sec.padded / s.parts, first = s.index * chunk;
    const int64_t real = std::max<int64_t>(0, std::min(chunk, sec.length - first));  // the part that is not padding
    if (real > 0) global.narrow(s.dim, global_at + first, real).copy_(local.narrow(s.dim, local_at, real));
    global_at += sec.length;
    local_at += chunk;
  }
}

// ---------------------------------------------------------------------------------------------
struct Checkpointer::Impl {
  std::string dir;
  int keep = 2;
  bool async = true;
  int rank = 0, world = 1;
  c10::intrusive_ptr<c10d::Store> store;
  json plan_info;
  std::thread writer;
  std::exception_ptr failure;
  mutable std::mutex mutex;
  std::vector<SaveRecord> records;

  void write(HostShard shard) {
    const auto start = Clock::now();
    const std::string folder = checkpoint_folder(dir, shard.step);
    fs::create_directories(folder);
    const std::string bytes =
        safetensors_bytes(shard.tensors, {{"format", "pt"}, {kMetadataKey, to_json(shard.metadata).dump()}});
    shard.tensors.clear();  // the host copy goes as soon as it is serialised
    const std::string file = shard_file_name(rank);
    write_file_atomically((fs::path(folder) / file).string(), bytes);
    ManifestShard report{rank, file, hex32(crc32_of(bytes)), static_cast<int64_t>(bytes.size()), shard.state_bytes, {}};
    std::set<std::string> names;
    for (const ShardPiece& p : shard.metadata.pieces) names.insert(p.name);
    report.params.assign(names.begin(), names.end());
    const std::string text = to_json(report).dump();
    store->set(report_key(shard.step, rank), std::vector<uint8_t>(text.begin(), text.end()));
    if (rank == 0) write_manifest(shard, folder);
    SaveRecord rec;
    rec.step = shard.step;
    rec.blocking_s = shard.blocking_s;
    rec.wait_s = shard.wait_s;
    rec.write_s = Seconds(Clock::now() - start).count();
    rec.file_bytes = static_cast<int64_t>(bytes.size());
    rec.state_bytes = shard.state_bytes;
    std::lock_guard<std::mutex> lock(mutex);
    records.push_back(rec);
  }

  // Rank 0: every rank's report (store.get waits for it, up to the store's timeout), then the
  // manifest, atomically and last; then the checkpoints beyond the newest `keep` go.
  void write_manifest(const HostShard& shard, const std::string& folder) {
    CheckpointManifest manifest;
    manifest.step = shard.step;
    manifest.world_size = world;
    manifest.plan = plan_info;
    manifest.epoch = shard.metadata.epoch;
    manifest.samples = shard.metadata.samples;
    for (int r = 0; r < world; ++r) {
      const auto bytes = store->get(report_key(shard.step, r));
      const std::string key = "rank " + std::to_string(r) + "'s checkpoint report";
      manifest.shards.push_back(manifest_shard_from_json(json::parse(std::string(bytes.begin(), bytes.end())), key, ""));
      manifest.state_bytes += manifest.shards.back().state_bytes;
      manifest.file_bytes += manifest.shards.back().bytes;
    }
    write_file_atomically((fs::path(folder) / kManifest).string(), to_json(manifest).dump(1) + "\n");
    // Keep the newest `keep` complete checkpoints; older folders (complete or not) go, only now
    // that the new manifest exists.
    int complete = 0;
    for (const auto& [step, path] : step_folders(dir)) {
      if (step > shard.step) continue;  // a later folder of an earlier run: not ours to judge
      if (complete < keep && fs::exists(path / kManifest)) {
        ++complete;
        continue;
      }
      if (complete >= keep) {
        std::error_code ec;
        fs::remove_all(path, ec);
      }
    }
  }
};

Checkpointer::Checkpointer(std::string dir, int keep, bool async, int rank, int world,
                           c10::intrusive_ptr<c10d::Store> store, json plan_info)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  impl_->keep = keep;
  impl_->async = async;
  impl_->rank = rank;
  impl_->world = world;
  impl_->store = std::move(store);
  impl_->plan_info = std::move(plan_info);
}

Checkpointer::~Checkpointer() {
  if (impl_->writer.joinable()) impl_->writer.join();
}

void Checkpointer::wait() {
  if (impl_->writer.joinable()) impl_->writer.join();
  if (impl_->failure) {
    std::exception_ptr e = impl_->failure;
    impl_->failure = nullptr;
    std::rethrow_exception(e);
  }
}

void Checkpointer::save(int step, const TrainingState& state) {
  const auto start = Clock::now();
  wait();  // the previous save's write first: one write at a time
  const double wait_s = Seconds(Clock::now() - start).count();
  HostShard shard = copy_to_host(step, impl_->rank, impl_->world, impl_->plan_info, state);
  shard.wait_s = wait_s;
  shard.blocking_s = Seconds(Clock::now() - start).count();
  if (!impl_->async) {  // the step loop stalls for the write too
    impl_->write(std::move(shard));
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->records.back().blocking_s = Seconds(Clock::now() - start).count();
    return;
  }
  impl_->writer = std::thread([this, shard = std::move(shard)]() mutable {
    try {
      impl_->write(std::move(shard));
    } catch (...) {
      impl_->failure = std::current_exception();
    }
  });
}

std::vector<SaveRecord> Checkpointer::records() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->records;
}

// ---------------------------------------------------------------------------------------------
std::optional<FoundCheckpoint> find_checkpoint(const std::string& dir, bool verify_checksums) {
  if (!fs::is_directory(dir)) throw InputError("--resume " + dir + ": no such folder");
  for (const auto& [step, path] : step_folders(dir)) {
    const fs::path manifest_path = path / kManifest;
    if (!fs::exists(manifest_path)) continue;  // incomplete: does not exist for resume
    json text;
    try {
      text = json::parse(read_bytes(manifest_path.string()));
    } catch (const json::exception& e) {
      throw InputError(manifest_path.string() + ": malformed manifest (" + e.what() + ")");
    }
    const CheckpointManifest manifest = manifest_from_json(text, manifest_path.string());
    if (manifest.step != step)
      throw InputError(manifest_path.string() + ": /step: expected " + std::to_string(step) + " (its folder's), got " +
                       std::to_string(manifest.step));
    for (const ManifestShard& shard : manifest.shards) {
      const std::string& file = shard.file;
      const fs::path shard_path = path / file;
      std::error_code ec;
      const auto size = fs::file_size(shard_path, ec);
      if (ec)
        throw InputError("checkpoint " + path.string() + ": shard " + file + " is missing; remove " + path.string() +
                         " to resume from an earlier checkpoint");
      if (static_cast<int64_t>(size) != shard.bytes)
        throw InputError("checkpoint " + path.string() + ": shard " + file + " has " + std::to_string(size) +
                         " bytes, the manifest says " + std::to_string(shard.bytes) + "; remove " + path.string() +
                         " to resume from an earlier checkpoint");
      if (verify_checksums) {
        const std::string crc = hex32(crc32_of(read_bytes(shard_path.string())));
        if (crc != shard.crc32)
          throw InputError("checkpoint " + path.string() + ": shard " + file + " is damaged: its CRC-32 is " + crc +
                           ", the manifest says " + shard.crc32 + "; remove " + path.string() +
                           " to resume from an earlier checkpoint");
      }
    }
    return FoundCheckpoint{path.string(), step, manifest};
  }
  return std::nullopt;
}

namespace {
// The local slices of the needed tensors, from the shards that hold them: (name, parts, index)
// -> kind -> flat buffer, and how many of its elements the pieces covered.
struct Local {
  GlobalSlice slice;
  std::map<std::string, at::Tensor> flat;
  int64_t covered = 0, numel = 0, real = 0;  // real: the elements that are not padding
};
using Locals = std::map<std::tuple<std::string, int, int>, Local>;
using Globals = std::map<std::string, std::map<std::string, at::Tensor>>;  // name -> kind -> tensor

// The checkpoint's model and batch against the plan's (InputError when they differ); whether it
// was saved under the plan's own layout.
bool same_layout_as_saved(const FoundCheckpoint& found, int world, const json& plan_info) {
  const CheckpointManifest& m = found.manifest;
  if (m.plan.at("model") != plan_info.at("model"))
    throw InputError("checkpoint " + found.folder + " holds another model (" +
                     quote_for_message(m.plan["model"].value("name", std::string("?"))) + ") than the plan's (" +
                     plan_info["model"].value("name", std::string("?")) + ")");
  if (m.plan.at("global_batch") != plan_info.at("global_batch") || m.plan.at("seq_len") != plan_info.at("seq_len"))
    throw InputError("checkpoint " + found.folder + " was saved with global batch " + m.plan["global_batch"].dump() +
                     " and seq_len " + m.plan["seq_len"].dump() + "; the plan has " +
                     plan_info["global_batch"].dump() + " and " + plan_info["seq_len"].dump());
  return m.world_size == world && m.plan.at("parallel") == plan_info.at("parallel") &&
         m.plan.value("rank_layout", json()) == plan_info.value("rank_layout", json());
}

// A shard's metadata: present, JSON, and read strictly (shard_metadata_from_json).
ShardMetadata shard_metadata(const std::string& folder, const std::string& file,
                             const std::map<std::string, std::string>& metadata) {
  const std::string where = "checkpoint " + folder + ": shard " + file;
  auto it = metadata.find(kMetadataKey);
  if (it == metadata.end())
    throw InputError(where + ": no \"" + std::string(kMetadataKey) + "\" metadata (not a shard dplan wrote)");
  const json j = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InputError(where + ": its \"" + std::string(kMetadataKey) + "\" metadata is not JSON");
  return shard_metadata_from_json(j, (fs::path(folder) / file).string());
}

// Every piece of the needed parameters from the shards that hold them (their checksums checked);
// restores this rank's RNG states from its own shard when the layout is the saved one. Returns the
// optimizer's step count.
int64_t read_pieces(const FoundCheckpoint& found, const std::set<std::string>& needed, bool same_layout, int rank,
                    const TrainingState& state, Locals& locals) {
  int64_t optimizer_step = -1;
  for (const ManifestShard& shard : found.manifest.shards) {
    const std::string& file = shard.file;
    const bool mine = same_layout && shard.rank == rank;  // its RNG states are this rank's
    bool wanted = mine;
    for (const std::string& name : shard.params) wanted = wanted || needed.count(name) > 0;
    if (!wanted) continue;
    const std::string path = (fs::path(found.folder) / file).string();
    const std::string bytes = read_bytes(path);
    if (hex32(crc32_of(bytes)) != shard.crc32)
      throw InputError("checkpoint " + found.folder + ": shard " + file + " is damaged: its CRC-32 does not match the manifest's");
    std::map<std::string, std::string> metadata;
    NamedTensors tensors;
    try {
      tensors = parse_safetensors(bytes, &metadata);
    } catch (const std::invalid_argument& e) {
      throw InputError("checkpoint " + found.folder + ": shard " + file + ": " + e.what());
    }
    std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
    const ShardMetadata meta = shard_metadata(found.folder, file, metadata);
    auto tensor = [&](const std::string& name) -> const at::Tensor& {
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw InputError("checkpoint " + found.folder + ": shard " + file + ": its metadata names a tensor \"" +
                         quote_for_message(name) + "\" that it does not hold");
      return it->second;
    };
    if (mine)
      for (const std::string& name : meta.rng) set_rng_state(name, tensor(name), state.device);
    for (const ShardPiece& piece : meta.pieces) {
      const std::string& name = piece.name;
      if (!needed.count(name)) continue;
      const GlobalSlice& slice = piece.slice;
      Local& local = locals[{name, slice.parts, slice.index}];
      if (local.numel == 0) {
        local.slice = slice;
        local.numel = c10::multiply_integers(local_shape(slice));
        local.real = real_elements(slice);
      }
      const int64_t lo = piece.lo, n = piece.n;
      if (lo + n > local.numel) throw InputError("checkpoint " + found.folder + ": shard " + file + ": a piece of " + name + " outside its tensor");
      for (const auto& [kind, key] : piece.tensors) {
        const at::Tensor& t = tensor(key);
        if (t.numel() != n)
          throw InputError("checkpoint " + found.folder + ": shard " + file + ": tensor \"" + quote_for_message(key) +
                           "\" holds " + std::to_string(t.numel()) + " elements for a piece of " + std::to_string(n));
        at::Tensor& flat = local.flat[kind];
        if (!flat.defined()) flat = at::zeros({local.numel}, t.options());
        flat.narrow(0, lo, n).copy_(t.reshape({-1}));
      }
      local.covered += n;
      optimizer_step = piece.optimizer_step;
    }
  }
  return optimizer_step;
}

// The global tensors, kind by kind, out of the local slices; InputError when a slice is incomplete,
// saved under two layouts, or missing.
Globals assemble_globals(const FoundCheckpoint& found, const std::set<std::string>& needed, Locals& locals) {
  Globals global;
  std::map<std::string, std::set<int>> indices;                      // name -> the tp (etp) slices seen
  for (auto& [key, local] : locals) {
    const std::string& name = std::get<0>(key);
    if (local.covered != local.real)
      throw InputError("checkpoint " + found.folder + " holds " + std::to_string(local.covered) + " of the " +
                       std::to_string(local.real) + " elements of " + name + "'s slice " +
                       std::to_string(local.slice.index) + " of " + std::to_string(local.slice.parts));
    indices[name].insert(local.slice.index);
    for (auto& [kind, flat] : local.flat) {
      at::Tensor& g = global[name][kind];
      if (!g.defined()) g = at::zeros(local.slice.shape, flat.options());
      global_from_local(flat.view(local_shape(local.slice)), local.slice, g);
    }
    if (static_cast<int>(indices[name].size()) > local.slice.parts)
      throw InputError("checkpoint " + found.folder + ": " + name + " is saved under two layouts");
  }
  for (const std::string& name : needed) {
    if (!global.count(name) || !global[name].count("weight"))
      throw InputError("checkpoint " + found.folder + " does not hold " + name);
    const int parts = locals.lower_bound({name, 0, 0})->second.slice.parts;
    if (static_cast<int>(indices[name].size()) != parts)
      throw InputError("checkpoint " + found.folder + " holds " + std::to_string(indices[name].size()) + " of the " +
                       std::to_string(parts) + " slices of " + name);
  }

  return global;
}

// This rank's weights, master weights and AdamW moments out of the global tensors.
void restore_rank_state(const TrainingState& state, Globals& global, int64_t optimizer_step) {
  std::vector<Parameter>& params = state.stage.parameters();
  at::NoGradGuard no_grad;
  std::map<std::string, std::map<std::string, at::Tensor>> mine;  // name -> kind -> this rank's local tensor, flat
  auto local_of = [&](const Parameter& p, const std::string& kind) -> at::Tensor {
    at::Tensor& t = mine[p.name][kind];
    if (!t.defined()) {
      auto it = global[p.name].find(kind);
      if (it == global[p.name].end()) return at::Tensor();
      t = local_from_global(it->second, p.slice).contiguous().reshape({-1});
    }
    return t;
  };
  for (Parameter& p : params) {
    if (p.tensor.storage().nbytes() == 0) continue;  // ZeRO-3: released; its shard is set below
    p.tensor.copy_(local_of(p, "weight").view(p.tensor.sizes()));
  }
  const auto by_address = optimizer_params_by_address(state.optimizer);
  for (const GradSync::StatePiece& piece : state.grads.state_pieces()) {
    const Parameter& p = params[piece.param];
    piece.weight.copy_(local_of(p, "weight").narrow(0, piece.lo, piece.n));
    if (piece.master.data_ptr() != piece.weight.data_ptr()) {
      at::Tensor master = local_of(p, "master");
      piece.master.copy_((master.defined() ? master : local_of(p, "weight")).narrow(0, piece.lo, piece.n));
    }
    auto it = by_address.find(piece.master.data_ptr());
    if (it == by_address.end()) throw std::logic_error("a checkpoint piece of " + p.name + " that the optimizer does not step");
    auto adam = std::make_unique<torch::optim::AdamWParamState>();
    adam->step(optimizer_step);
    const auto options = piece.master.options();
    adam->exp_avg(local_of(p, "exp_avg").narrow(0, piece.lo, piece.n).to(options).clone());
    adam->exp_avg_sq(local_of(p, "exp_avg_sq").narrow(0, piece.lo, piece.n).to(options).clone());
    set_optimizer_state(state.optimizer, it->second, std::move(adam));
  }
}
}  // namespace

void load_checkpoint(const FoundCheckpoint& found, const TrainingState& state, int rank, int world,
                     const json& plan_info) {
  const bool same_layout = same_layout_as_saved(found, world, plan_info);
  std::set<std::string> needed;
  for (const Parameter& p : state.stage.parameters()) needed.insert(p.name);
  Locals locals;
  const int64_t optimizer_step = read_pieces(found, needed, same_layout, rank, state, locals);
  Globals global = assemble_globals(found, needed, locals);
  restore_rank_state(state, global, optimizer_step);
  state.data.seek({found.manifest.epoch, found.manifest.samples});
}

}  // namespace dplan::executor
