// Where this rank sits, from its launcher's environment: RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT (dplan run, torchrun, or any launcher that sets
// them), or SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID under srun; and the rendezvous store the
// ranks meet at.
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
};

// The environment variable `name`, or `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback = "");

// Throws InputError on an inconsistent environment (one of RANK and WORLD_SIZE, a rank past the
// world, Slurm without MASTER_ADDR).
Place read_place();

// The store every rank meets at: a TCPStore on MASTER_ADDR:MASTER_PORT (served by rank 0 unless
// torchrun's agent serves it), or an in-process one for a single rank. `server`: this connection
// hosts it.
c10::intrusive_ptr<c10d::Store> connect_store(const Place& place, bool server, std::chrono::milliseconds timeout);

}  // namespace dplan::executor
