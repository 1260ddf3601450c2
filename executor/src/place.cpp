#include "place.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include "dplan/costmodel/errors.h"

namespace dplan::executor {
namespace {

int env_int(const char* name, int fallback) {
  std::string v = env_or(name);
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InputError(std::string("environment variable ") + name + "=" + v + " is not an integer");
}

// The tasks srun started on this node: SLURM_NTASKS_PER_NODE when the job asked for a count per
// node, else this node's (SLURM_NODEID's) entry in SLURM_TASKS_PER_NODE, which lists the counts
// node by node with repeats folded, e.g. "2(x3),1" (Slurm 22.05 srun(1) and sbatch(1), OUTPUT
// ENVIRONMENT VARIABLES). `fallback` when neither is set.
int slurm_tasks_on_node(int fallback) {
  if (!env_or("SLURM_NTASKS_PER_NODE").empty()) return env_int("SLURM_NTASKS_PER_NODE", fallback);
  const std::string list = env_or("SLURM_TASKS_PER_NODE");
  if (list.empty()) return fallback;
  const int node = env_int("SLURM_NODEID", 0);
  auto bad = [&] {
    return InputError("environment variable SLURM_TASKS_PER_NODE=" + list +
                      " is not Slurm's list of tasks per node (e.g. 2(x3),1) covering SLURM_NODEID " +
                      std::to_string(node));
  };
  long long first_node = 0;  // of the current entry (long long: repeats summed cannot overflow)
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string entry = list.substr(at, end - at);
    int tasks = 0, repeat = 1;
    try {
      size_t used = 0;
      tasks = std::stoi(entry, &used);
      if (used != entry.size()) {
        if (entry.compare(used, 2, "(x") != 0 || entry.back() != ')') throw bad();
        const std::string count = entry.substr(used + 2, entry.size() - used - 3);
        size_t count_used = 0;
        repeat = std::stoi(count, &count_used);
        if (count_used != count.size()) throw bad();
      }
    } catch (const std::logic_error&) {  // std::stoi's invalid_argument and out_of_range
      throw bad();
    }
    if (tasks < 1 || repeat < 1) throw bad();
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
    at = end + 1;
  }
  throw bad();
}

}  // namespace

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

Place read_place() {
  Place p;
  if (!env_or("RANK").empty() || !env_or("WORLD_SIZE").empty()) {
    p.rank = env_int("RANK", -1);
    p.world = env_int("WORLD_SIZE", -1);
    if (p.rank < 0 || p.world < 1) throw InputError("set both RANK and WORLD_SIZE (torchrun does), or neither");
    p.local_rank = env_int("LOCAL_RANK", p.rank);
    p.local_world = env_int("LOCAL_WORLD_SIZE", p.world);
    p.launcher = env_or("DPLAN_LAUNCHER", env_or("TORCHELASTIC_RUN_ID").empty() ? "env" : "torchrun");
    p.agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (p.agent_store) p.store_prefix = "/worker/attempt_" + env_or("TORCHELASTIC_RESTART_COUNT", "0");
  } else if (!env_or("SLURM_PROCID").empty()) {
    p.rank = env_int("SLURM_PROCID", 0);
    p.world = env_int("SLURM_NTASKS", 1);
    p.local_rank = env_int("SLURM_LOCALID", 0);
    p.local_world = slurm_tasks_on_node(p.world);
    p.launcher = "slurm";
    if (p.world > 1 && env_or("MASTER_ADDR").empty())
      throw InputError("under Slurm set MASTER_ADDR to the first node of the job, e.g. "
                       "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)");
  }
  if (p.world > 1) {
    p.master_addr = env_or("MASTER_ADDR", "127.0.0.1");
    p.master_port = env_int("MASTER_PORT", 29500);
    p.run_dir = env_or("DPLAN_RUN_DIR");
  }
  if (p.rank >= p.world) throw InputError("RANK " + std::to_string(p.rank) + " is not below WORLD_SIZE " + std::to_string(p.world));
  return p;
}

namespace {

// A socket listening on `host`:`port` alone (MASTER_ADDR: the loopback address on one machine, the
// first node's own address on several), not on every interface as a TCPStore server binds by
// itself. Throws InputError naming MASTER_ADDR when it cannot listen there.
[[maybe_unused]] int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw InputError("MASTER_ADDR " + host + ": cannot resolve it (" + ::gai_strerror(rc) + ")");
  std::string why;
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw InputError("MASTER_ADDR " + host + " port " + service + ": cannot listen there (" + why +
                   "); give an address of this machine and a free MASTER_PORT");
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const Place& place, bool server, std::chrono::milliseconds timeout) {
  if (place.world == 1) return c10::make_intrusive<c10d::HashStore>();
  if (!place.run_dir.empty()) {
    // One file that every connection appends to under flock(). c10d deletes it once the number of
    // connections given here have closed theirs (some versions refuse fewer than 1); INT_MAX never
    // are, so it stays until the launcher removes the folder, after the last rank has exited.
    auto store = c10::make_intrusive<c10d::FileStore>(place.run_dir + "/store", std::numeric_limits<int>::max());
    store->setTimeout(timeout);
    return store;
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(place.master_port);
  o.isServer = server;
  o.numWorkers = place.agent_store || !server ? c10::optional<std::size_t>() : c10::optional<std::size_t>(place.world);
  o.waitWorkers = false;
  o.timeout = timeout;
#if TORCH_VERSION_MAJOR >= 2
  // The server listens on MASTER_ADDR alone (LibTorch 1.13 has no way to say so).
  if (server) o.masterListenFd = listen_on(place.master_addr, place.master_port);
#endif
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(place.master_addr, o);
  if (!place.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(place.store_prefix, store);
  return store;
}

}  // namespace dplan::executor
