#include "place.h"

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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
    p.local_world = env_int("SLURM_NTASKS_PER_NODE", env_int("SLURM_TASKS_PER_NODE", p.world));
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
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(place.master_addr, o);
  if (!place.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(place.store_prefix, store);
  return store;
}

}  // namespace dplan::executor
