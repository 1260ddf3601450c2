#include "checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

// The entries DIR/step-N, newest first; `folder`: a folder itself (not a link to one, not a file).
struct StepEntry {
  int step = 0;
  std::string name;
  bool folder = false;
};
std::vector<StepEntry> step_entries(const std::string& dir) {
  std::vector<StepEntry> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int step = step_of_folder_name(name);
    if (step < 0) continue;
    std::error_code type_ec;
    out.push_back({step, name, entry.symlink_status(type_ec).type() == fs::file_type::directory});
  }
  std::sort(out.begin(), out.end(), [](const StepEntry& a, const StepEntry& b) { return a.step > b.step; });
  return out;
}

// A file descriptor, closed when it goes.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text() { return std::strerror(errno); }

// The folder DIR/`name` (made when missing), opened without following a link: a link or a file
// planted there is refused, never written through.
Fd open_own_folder(int dir_fd, const std::string& dir, const std::string& name) {
  if (::mkdirat(dir_fd, name.c_str(), 0777) != 0 && errno != EEXIST)
    throw InputError("checkpoint folder " + dir + ": cannot make " + name + " (" + errno_text() + ")");
  Fd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0)
    throw InputError("checkpoint folder " + dir + ": " + name + " is not a folder dplan made (" + errno_text() +
                     "); remove it");
  return Fd(std::exchange(fd.fd, -1));
}

// `bytes` as `name` in the folder open as `dir_fd`: a new file under a temporary name (O_EXCL,
// O_NOFOLLOW), synced, then renamed over `name`, which replaces a link there rather than writing
// through it.
void write_in_folder(int dir_fd, const std::string& folder, const std::string& name, const std::string& bytes) {
  const std::string tmp = "." + name + ".tmp-" + std::to_string(::getpid());
  ::unlinkat(dir_fd, tmp.c_str(), 0);  // a leftover of this pid's crashed save
  auto fail = [&](const std::string& what) {
    const std::string text = "checkpoint " + folder + ": cannot write " + name + " (" + what + ")";
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    throw InputError(text);
  };
  {
    Fd fd(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
    if (fd.fd < 0) fail(errno_text());
    for (size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::write(fd.fd, bytes.data() + at, bytes.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(errno_text());
      at += static_cast<size_t>(n);
    }
    if (::fsync(fd.fd) != 0) fail(errno_text());
  }
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) fail(errno_text());
}

// Whether DIR/`name` is a checkpoint dplan completed: a folder (not a link) whose manifest, a
// regular file, reads strictly and names its step.
bool is_complete_checkpoint(const std::string& dir, const std::string& name) {
  try {
    const std::string folder = (fs::path(dir) / name).string();
    const CheckpointManifest m = manifest_from_text(
        read_checkpoint_file(dir, name, kManifestName, kMaxManifestBytes, -1, kManifestName),
        (fs::path(folder) / kManifestName).string());
    return step_folder_name(m.step) == name;
  } catch (const InputError&) {
    return false;
  }
}

// The hidden folder a save writes into before rank 0 renames it DIR/step-N.
std::string partial_folder_name(int step, const std::string& token) { return "." + step_folder_name(step) + ".partial-" + token; }

}  // namespace

json checkpoint_plan_info(const std::string& plan_path) {
  const json plan = json::parse(read_text_file(plan_path));
  json info = {{"path", plan_path}, {"model", plan.at("model")}, {"parallel", plan.at("parallel")},
               {"global_batch", plan.at("training").at("global_batch")}, {"seq_len", plan.at("training").at("seq_len")}};
  if (plan.contains("rank_layout")) info["rank_layout"] = plan["rank_layout"];
  return info;
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
  std::string token;  // this run's: names its saves' hidden folders
  std::thread writer;
  std::exception_ptr failure;
  mutable std::mutex mutex;
  std::vector<SaveRecord> records;

  // This rank's shard into the save's hidden folder DIR/.step-N.partial-TOKEN, its report to rank 0.
  void write(HostShard shard) {
    const auto start = Clock::now();
    const std::string bytes =
        safetensors_bytes(shard.tensors, {{"format", "pt"}, {kShardMetadataKey, to_json(shard.metadata).dump()}});
    shard.tensors.clear();  // the host copy goes as soon as it is serialised
    const std::string file = shard_file_name(rank);
    const std::string partial = partial_folder_name(shard.step, token);
    {
      Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (dir_fd.fd < 0) throw InputError("--checkpoint-dir " + dir + ": cannot open it (" + errno_text() + ")");
      Fd partial_fd = open_own_folder(dir_fd.fd, dir, partial);
      write_in_folder(partial_fd.fd, (fs::path(dir) / partial).string(), file, bytes);
    }
    ManifestShard report{rank, file, hex32(crc32_of(bytes)), static_cast<int64_t>(bytes.size()), shard.state_bytes, {}};
    std::set<std::string> names;
    for (const ShardPiece& p : shard.metadata.pieces) names.insert(p.name);
    report.params.assign(names.begin(), names.end());
    const std::string text = to_json(report).dump();
    store->set(report_key(shard.step, rank), std::vector<uint8_t>(text.begin(), text.end()));
    if (rank == 0) write_manifest(shard);
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
  // manifest, last, into the hidden folder, which then becomes DIR/step-N in one rename (an
  // exchange with what was there: a complete checkpoint of an earlier run, or a link, which goes;
  // anything else there is refused). Then the complete checkpoints beyond the newest `keep` go.
  void write_manifest(const HostShard& shard) {
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
    const std::string partial = partial_folder_name(shard.step, token), name = step_folder_name(shard.step);
    Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir_fd.fd < 0) throw InputError("--checkpoint-dir " + dir + ": cannot open it (" + errno_text() + ")");
    {
      Fd partial_fd = open_own_folder(dir_fd.fd, dir, partial);
      write_in_folder(partial_fd.fd, (fs::path(dir) / partial).string(), kManifestName, to_json(manifest).dump(1) + "\n");
    }
    const std::string target = (fs::path(dir) / name).string();
    struct stat st {};
    if (::fstatat(dir_fd.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (::renameat(dir_fd.fd, partial.c_str(), dir_fd.fd, name.c_str()) != 0)
        throw InputError("checkpoint " + target + ": cannot rename " + partial + " to it (" + errno_text() + ")");
    } else {
      if (!S_ISLNK(st.st_mode) && !(S_ISDIR(st.st_mode) && is_complete_checkpoint(dir, name)))
        throw InputError("checkpoint " + target + " exists and is not a checkpoint dplan wrote; move it away (this save is in " +
                         (fs::path(dir) / partial).string() + ")");
      if (::renameat2(dir_fd.fd, partial.c_str(), dir_fd.fd, name.c_str(), RENAME_EXCHANGE) != 0)
        throw InputError("checkpoint " + target + ": cannot replace it with " + partial + " (" + errno_text() + ")");
      std::error_code ec;
      fs::remove_all(fs::path(dir) / partial, ec);  // what was there (a link itself, not its target)
    }
    // Keep the newest `keep` complete checkpoints; only complete ones (folders whose manifest reads)
    // go, and only now that the new one is in place. A folder step-N dplan did not complete, or a
    // link, is not ours to remove.
    int complete = 0;
    for (const StepEntry& e : step_entries(dir)) {
      if (e.step > shard.step || !e.folder || !is_complete_checkpoint(dir, e.name)) continue;  // later: an earlier run's
      if (++complete <= keep) continue;
      std::error_code ec;
      fs::remove_all(fs::path(dir) / e.name, ec);
    }
  }
};

CheckpointFolderLock::CheckpointFolderLock(const std::string& dir) {
  std::error_code ec;
  const auto type = fs::status(dir, ec).type();
  if (type != fs::file_type::not_found && type != fs::file_type::directory && !ec)
    throw InputError("--checkpoint-dir " + dir + " is a " +
                     (type == fs::file_type::regular ? std::string("regular file") : std::string("special file")) +
                     ", not a folder; give a folder (it is made when missing)");
  if (!fs::create_directories(dir, ec) && ec)
    throw InputError("--checkpoint-dir " + dir + ": cannot make it (" + ec.message() + ")");
  const std::string path = (fs::path(dir) / kLockFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd_ < 0)
    throw InputError("--checkpoint-dir " + dir + ": cannot open its lock file " + kLockFileName + " (" + errno_text() +
                     (errno == ELOOP ? ": it is a link; remove it" : "") + ")");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError("--checkpoint-dir " + dir + ": its lock file " + kLockFileName + " is a " + file_kind(st.st_mode) +
                     "; remove it");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string();
    who = who.substr(0, who.find('\n'));
    ::close(fd_);
    throw InputError("--checkpoint-dir " + dir + " is in use by another run (" +
                     (who.empty() ? std::string("its lock is held") : quote_for_message(who)) +
                     "); wait for it to end or give another folder");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string text = std::string(host) + " pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    ::close(fd_);
    throw InputError("--checkpoint-dir " + dir + ": cannot write its lock file (" + errno_text() + ")");
  }
  token_ = std::to_string(::getpid()) + "-" +
           std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count());
}

void check_save_targets(const std::string& dir, int steps, int save_every) {
  if (save_every <= 0) return;
  for (const StepEntry& e : step_entries(dir)) {
    if (e.step > steps || e.step % save_every != 0) continue;
    struct stat st {};
    const std::string path = (fs::path(dir) / e.name).string();
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) continue;  // replaced, never followed
    if (!e.folder || !is_complete_checkpoint(dir, e.name))
      throw InputError("--checkpoint-dir " + dir + ": " + e.name + " is not a checkpoint dplan completed, and this run " +
                       "saves step " + std::to_string(e.step) + " there; move it away or give another folder");
  }
}

CheckpointFolderLock::~CheckpointFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

Checkpointer::Checkpointer(std::string dir, int keep, bool async, int rank, int world,
                           c10::intrusive_ptr<c10d::Store> store, json plan_info, std::string token)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
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

namespace {
// A shard's bytes against the manifest's CRC-32: InputError naming the shard when they differ.
void check_crc(const std::string& bytes, const ManifestShard& shard, const std::string& folder) {
  const std::string crc = hex32(crc32_of(bytes));
  if (crc != shard.crc32)
    throw InputError("checkpoint " + folder + ": shard " + shard.file + " is damaged: its CRC-32 is " + crc +
                     ", the manifest says " + shard.crc32 + "; remove " + folder + " to resume from an earlier checkpoint");
}

// A shard's safetensors header, malformed ones as one InputError line naming the shard.
SafetensorsHeader parse_header(const std::string& bytes, const std::string& folder, const std::string& file) {
  try {
    return parse_safetensors_header(bytes);
  } catch (const std::invalid_argument& e) {
    throw InputError("checkpoint " + folder + ": shard " + file + ": " + e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
std::optional<FoundCheckpoint> find_checkpoint(const std::string& dir, bool verify_checksums) {
  if (!fs::is_directory(dir)) throw InputError("--resume " + dir + ": no such folder");
  for (const StepEntry& e : step_entries(dir)) {
    const std::string folder = (fs::path(dir) / e.name).string();
    if (!e.folder)
      throw InputError("checkpoint " + folder + " is not a folder dplan wrote (a link or a file); remove it");
    const std::string manifest_path = (fs::path(folder) / kManifestName).string();
    struct stat st {};
    if (::lstat(manifest_path.c_str(), &st) != 0 && errno == ENOENT) continue;  // incomplete: does not exist for resume
    const CheckpointManifest manifest = manifest_from_text(
        read_checkpoint_file(dir, e.name, kManifestName, kMaxManifestBytes, -1, kManifestName), manifest_path);
    if (manifest.step != e.step)
      throw InputError(manifest_path + ": /step: expected " + std::to_string(e.step) + " (its folder's), got " +
                       std::to_string(manifest.step));
    // Every shard's kind and size first (cheap), before any checksum.
    for (const ManifestShard& shard : manifest.shards) {
      const std::string where = "checkpoint " + folder + ": shard " + shard.file;
      struct stat shard_st {};
      if (::lstat((fs::path(folder) / shard.file).c_str(), &shard_st) != 0)
        throw InputError(where + " is missing; remove " + folder + " to resume from an earlier checkpoint");
      if (!S_ISREG(shard_st.st_mode))
        throw InputError(where + " is a " + file_kind(shard_st.st_mode) + "; dplan reads only the regular files it wrote there");
      if (static_cast<int64_t>(shard_st.st_size) != shard.bytes)
        throw InputError(where + " has " + std::to_string(shard_st.st_size) + " bytes, the manifest says " +
                         std::to_string(shard.bytes) + "; remove " + folder + " to resume from an earlier checkpoint");
    }
    for (const ManifestShard& shard : manifest.shards) {
      if (!verify_checksums) break;
      const std::string bytes = read_checkpoint_file(dir, e.name, shard.file, shard.bytes, shard.bytes, "shard " + shard.file);
      check_crc(bytes, shard, folder);
      check_shard(parse_header(bytes, folder, shard.file), manifest, shard, folder);
    }
    return FoundCheckpoint{folder, e.step, e.name, manifest};
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
  std::map<int64_t, int64_t> ranges;         // the pieces' [lo, lo + n), by lo
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
    const std::string bytes =
        read_checkpoint_file(fs::path(found.folder).parent_path().string(), found.name, file, shard.bytes, shard.bytes,
                             "shard " + file);
    check_crc(bytes, shard, found.folder);
    // Everything the loader relies on, checked on the header before a tensor is made.
    const ShardMetadata meta = check_shard(parse_header(bytes, found.folder, file), found.manifest, shard, found.folder);
    const NamedTensors tensors = parse_safetensors(bytes);
    std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
    auto tensor = [&](const std::string& name) -> const at::Tensor& { return by_name.at(name); };  // check_shard: present
    if (mine)
      for (const std::string& name : meta.rng)
        if (name == "rng.cpu" || state.device.is_cuda()) set_rng_state(name, tensor(name), state.device);
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
      if (local.slice != slice)
        throw InputError("checkpoint " + found.folder + ": shard " + file + ": a piece of " + name +
                         " describes its slice otherwise than another shard's");
      const int64_t lo = piece.lo, n = piece.n;  // inside the slice's elements (check_shard)
      if (!local.ranges.emplace(lo, n).second || local.covered + n > local.real)
        throw InputError("checkpoint " + found.folder + ": shard " + file + ": a piece of " + name +
                         " repeats elements another piece holds");
      for (const auto& [kind, key] : piece.tensors) {
        const at::Tensor& t = tensor(key);
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
    int64_t end = 0;  // the pieces tile [0, real) with no gap and no overlap
    for (const auto& [lo, n] : local.ranges) end = lo == end ? lo + n : -1;
    if (end != local.real)
      throw InputError("checkpoint " + found.folder + " holds " + std::to_string(local.covered) + " of the " +
                       std::to_string(local.real) + " elements of " + name + "'s slice " +
                       std::to_string(local.slice.index) + " of " + std::to_string(local.slice.parts));
    indices[name].insert(local.slice.index);
    for (auto& [kind, flat] : local.flat) {
      at::Tensor& g = global[name][kind];
      if (!g.defined()) g = at::zeros(local.slice.shape, flat.options());
      if (g.sizes().vec() != local.slice.shape)
        throw InputError("checkpoint " + found.folder + ": " + name + " is saved with two shapes");
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
  try {
    Locals locals;
    const int64_t optimizer_step = read_pieces(found, needed, same_layout, rank, state, locals);
    Globals global = assemble_globals(found, needed, locals);
    restore_rank_state(state, global, optimizer_step);
  } catch (const c10::Error& e) {  // what the checks above did not foresee is still the checkpoint's fault
    throw InputError("checkpoint " + found.folder + " does not fit the plan's model: " + e.what_without_backtrace());
  }
  state.data.seek({found.manifest.epoch, found.manifest.samples});
}

}  // namespace dplan::executor
