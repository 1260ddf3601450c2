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

#include "data.h"
#include "dplan/costmodel/json_io.h"
#include "gpt.h"
#include "grad_sync.h"

namespace dplan::executor {

inline constexpr int kCheckpointFormatVersion = 1;

// DIR/step-NNNNNNNN, and a shard's file name in it.
std::string checkpoint_folder(const std::string& dir, int step);
std::string shard_file_name(int rank);

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

class Checkpointer {
 public:
  // store: a connection this object may use from its writer thread (rank 0 gathers the shards'
  // reports through it). async: write in a background thread (else within save()).
  Checkpointer(std::string dir, int keep, bool async, int rank, int world, c10::intrusive_ptr<c10d::Store> store,
               json plan_info);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves the state after `step` optimizer steps: waits for the previous write (a second save never
  // starts while one is writing), copies this rank's state to host memory, and writes it (in the
  // background when async). Rank 0 then waits for every rank's report, writes the manifest, and
  // removes all but the newest `keep` complete checkpoints.
  void save(int step, const TrainingState& state);
  // Waits for the write in flight; rethrows what it failed with.
  void wait();
  // The records of the saves whose write is done.
  std::vector<SaveRecord> records() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// manifest.json, written by rank 0 last (a checkpoint without it is incomplete): the step, the
// plan that saved it, the data position, and every rank's shard with its size and CRC-32.
struct ManifestShard {
  int rank = 0;
  std::string file, crc32;  // crc32: 8 lowercase hex digits of zlib's CRC-32 of the file
  int64_t bytes = 0, state_bytes = 0;
  std::vector<std::string> params;  // the parameters it holds pieces of
  bool operator==(const ManifestShard&) const = default;
};
struct CheckpointManifest {
  int step = 0, world_size = 1;
  json plan;  // checkpoint_plan_info of the plan that saved it: path, model, parallel, global_batch,
              // seq_len and (plans with one) rank_layout, compared as written
  int epoch = 0;
  int64_t samples = 0;  // the data position after the step
  int64_t state_bytes = 0, file_bytes = 0;  // the shards' sums
  std::vector<ManifestShard> shards;        // one per rank, in rank order
  bool operator==(const CheckpointManifest&) const = default;
};
json to_json(const ManifestShard& shard);
json to_json(const CheckpointManifest& manifest);
// The strict readers (costmodel's ObjectReader): a newer format_version, a missing or unknown key,
// a wrong type, sums or ranks that do not add up are one InputError line naming the file and the
// JSON pointer.
ManifestShard manifest_shard_from_json(const json& j, const std::string& file, const std::string& pointer);
CheckpointManifest manifest_from_json(const json& j, const std::string& file);

// The metadata each shard file carries (its safetensors header, key "dplan_checkpoint"): the pieces of
// parameters it holds, each with the slice of the global tensor (gpt.h GlobalSlice) its flat range
// [lo, lo + n) belongs to, the tensors stored for it by kind (weight, master, exp_avg, exp_avg_sq:
// their names in the file) and AdamW's step; the RNG states by name.
struct ShardPiece {
  std::string name;
  GlobalSlice slice;
  int64_t lo = 0, n = 0;
  std::map<std::string, std::string> tensors;  // kind -> tensor name in the file
  int64_t optimizer_step = 0;
  bool operator==(const ShardPiece&) const = default;
};
struct ShardMetadata {
  int step = 0, rank = 0, world = 1;
  json plan;                     // checkpoint_plan_info (the manifest's copy is the one compared)
  int epoch = -1;                // the data position after the step
  int64_t samples = 0;
  std::vector<std::string> rng;  // tensor names of the RNG states
  std::vector<ShardPiece> pieces;
  bool operator==(const ShardMetadata&) const = default;
};
json to_json(const ShardMetadata& metadata);
// Strict like manifest_from_json; `file` names the shard in errors.
ShardMetadata shard_metadata_from_json(const json& j, const std::string& file);

struct FoundCheckpoint {
  std::string folder;
  int step = 0;
  CheckpointManifest manifest;
};

// The newest complete checkpoint under `dir` (manifest present and readable, every shard present
// with the manifest's size, and with `verify_checksums` its CRC-32); nullopt when there is none.
// Throws InputError with one line naming the shard when a checkpoint with a manifest has a shard
// missing, of another size, or (verify_checksums) whose checksum does not match.
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
