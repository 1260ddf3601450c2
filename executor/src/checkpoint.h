// Sharded checkpoints (docs/executor.md, "Checkpoints and resume"). A checkpoint is a folder
// DIR/step-NNNNNNNN (the optimizer steps done when it was saved) holding one safetensors shard per
// rank, rank-RRRRR.safetensors, and manifest.json, written last and atomically by rank 0 once every
// rank has reported its shard (file, bytes, CRC-32). A folder without a manifest does not exist
// for resume.
//
// A shard holds the elements of the model state that this rank writes (each element once across
// the job: GradSync::state_pieces), stored per parameter under its GLOBAL name with the slice of
// the global tensor it covers (GlobalSlice) and the element range of that slice; so a loader
// rebuilds any global tensor from the shards that hold it and cuts any layout's part of it
// (resharding on load); the padding of a padded vocabulary is left out. Per piece: the weights in the dtype the executor keeps them, the fp32
// master weights when they differ (mixed precision), and AdamW's two moments. Small state in the
// safetensors metadata and tensors beside them: the optimizer step count, the data position, and
// this rank's RNG states (the CPU generator, which also seeds the dropout masks, and the CUDA
// generator on CUDA). Gradients are not saved: a checkpoint is taken at a step boundary, where
// nothing accumulates across steps (Trainer::step zeroes them first).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include "checkpoint_format.h"
#include "data.h"
#include "dplan/costmodel/json_io.h"
#include "gpt.h"
#include "grad_sync.h"

namespace dplan::executor {

// One save as this rank measured it (run.json "checkpoints").
struct SaveRecord {
  int step = 0;
  double blocking_s = 0;  // the step loop's stall: waiting for the previous write, the copy to host memory (and with
                          // a synchronous save the write)
  double wait_s = 0;      // of which waiting for the previous write to finish
  double write_s = 0;     // the shard written (serialise, checksum, write, rename); rank 0 also its manifest
  int64_t file_bytes = 0;   // the shard file
  int64_t state_bytes = 0;  // its weights, master weights and moments (docs: the checkpoint size)
};

// What a save reads and a load writes: one rank's training state.
struct TrainingState {
  GptStage& stage;
  GradSync& grads;
  torch::optim::Optimizer& optimizer;
  DataSource& data;
  at::Device device = at::kCPU;
};

// What the manifest says of the plan: its model and layout (from plan.json), to check a resume
// against and to tell a same-layout resume (which restores the RNG states) from a resharding one.
json checkpoint_plan_info(const std::string& plan_path);

// The lock a run holds on its --checkpoint-dir while it may write there (rank 0, from the start to
// its exit): an flock on DIR/dplan-checkpoint.lock, which holds "<host> pid <pid>". Makes DIR when
// missing. InputError in one line naming DIR when it is not a folder (a file, say), when the lock
// file is a link or not a regular file, or when another run holds the lock (naming that run).
class CheckpointFolderLock {
 public:
  explicit CheckpointFolderLock(const std::string& dir);
  ~CheckpointFolderLock();
  CheckpointFolderLock(const CheckpointFolderLock&) = delete;
  CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;
  // A name for this run's saves, unique on this machine: their hidden folders carry it.
  const std::string& token() const { return token_; }

 private:
  int fd_ = -1;
  std::string token_;
};

// Before a run saves: InputError in one line when DIR holds a step-N for a step the run will save
// (a multiple of `save_every` up to `steps`) that is neither a complete checkpoint dplan wrote nor a
// link (which a save replaces): a save must not replace what dplan did not write.
void check_save_targets(const std::string& dir, int steps, int save_every);

class Checkpointer {
 public:
  // store: a connection this object may use from its writer thread (rank 0 gathers the shards'
  // reports through it). async: write in a background thread (else within save()). token: the
  // run's (CheckpointFolderLock::token, from rank 0), the same on every rank.
  Checkpointer(std::string dir, int keep, bool async, int rank, int world, c10::intrusive_ptr<c10d::Store> store,
               json plan_info, std::string token);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves the state after `step` optimizer steps: waits for the previous write (a second save never
  // starts while one is writing), copies this rank's state to host memory, and writes it (in the
  // background when async) into the hidden folder DIR/.step-N.partial-TOKEN. Rank 0 then waits for
  // every rank's report, writes the manifest there, renames the folder DIR/step-N, and removes all
  // but the newest `keep` complete checkpoints (folders with a manifest dplan wrote; nothing else).
  // Nothing is opened through a link: a link planted at DIR/step-N is replaced, not followed.
  void save(int step, const TrainingState& state);
  // Waits for the write in flight; rethrows what it failed with.
  void wait();
  // The records of the saves whose write is done.
  std::vector<SaveRecord> records() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct FoundCheckpoint {
  std::string folder;  // DIR/step-N
  int step = 0;
  std::string name;    // step-N
  CheckpointManifest manifest;
};

// The newest complete checkpoint under `dir` (manifest present and readable, every shard present
// with the manifest's size, and with `verify_checksums` its CRC-32 and its header as check_shard
// reads it); nullopt when there is none. Throws InputError with one line naming the shard when a
// checkpoint with a manifest has a shard missing, of another size or kind (a link, a FIFO), or
// (verify_checksums) whose checksum or header is wrong; and naming the entry when a step-N there
// is a link or a file. Reads nothing but regular files inside `dir`, each within its manifest's size.
std::optional<FoundCheckpoint> find_checkpoint(const std::string& dir, bool verify_checksums);

// Loads `found` into this rank's state, whatever layout saved it (the same model; InputError
// otherwise). Reads only the shards that hold this rank's parameters, checking their checksums.
// Restores the RNG states only when the layout is the one that saved it (a resharded run's ranks
// draw other streams anyway).
void load_checkpoint(const FoundCheckpoint& found, const TrainingState& state, int rank, int world,
                     const json& plan_info);

// The global tensor's part that `slice` describes, and the inverse (writes `local` into its place
// in `global`; padding is dropped). Exposed for the tests.
at::Tensor local_from_global(const at::Tensor& global, const GlobalSlice& slice);
void global_from_local(const at::Tensor& local, const GlobalSlice& slice, at::Tensor& global);

}  // namespace dplan::executor
