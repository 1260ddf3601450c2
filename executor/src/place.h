// Where this rank sits, from its launcher's environment: RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT (dplan run, torchrun, or any launcher that sets
// them), or SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID under srun; and the rendezvous store the
// ranks meet at. `dplan run` also sets DPLAN_RUN_DIR, its private folder for this run (mode 0700,
// removed when the run ends): the ranks meet in a c10d FileStore there instead of a TCPStore, so a
// local run opens no port for its store, and a rank that names a stopped peer leaves that there for
// the launcher (diagnosis.<rank>).
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace dplan::executor {

struct Place {
  int rank = 0, world = 1, local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";
  std::string store_prefix;  // torchrun's agent store: keys live under /worker/attempt_<n>
  bool agent_store = false;
  std::string run_dir;  // DPLAN_RUN_DIR: dplan run's private folder (FileStore); empty: TCPStore
};

// The environment variable `name`, or `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback = "");

// Throws InputError on an inconsistent environment (one of RANK and WORLD_SIZE, a rank past the
// world, Slurm without MASTER_ADDR).
Place read_place();

// The store every rank meets at: a FileStore in DPLAN_RUN_DIR (dplan run: one machine, no port);
// else a TCPStore on MASTER_ADDR:MASTER_PORT (served by rank 0 unless torchrun's agent serves it;
// under LibTorch 2.x the server listens on MASTER_ADDR alone, through a socket bound there and
// handed over as TCPStoreOptions::masterListenFd; LibTorch 1.13's listens on every interface,
// whatever MASTER_ADDR says); or an in-process
// one for a single rank. `server`: this connection hosts the TCPStore.
c10::intrusive_ptr<c10d::Store> connect_store(const Place& place, bool server, std::chrono::milliseconds timeout);

}  // namespace dplan::executor
