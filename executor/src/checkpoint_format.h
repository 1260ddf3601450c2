// The files of a checkpoint folder and their strict readers, free of LibTorch and of any process
// group: the executor reads checkpoints through them (checkpoint.h), and so does the checkpoint
// fuzz target (fuzz/checkpoint_fuzz.cpp). docs/executor.md, "Checkpoints and resume", describes
// the folder; this header owns its format.
//
// A checkpoint folder is dplan's own: in DIR it writes step-NNNNNNNN folders (each holding
// rank-RRRRR.safetensors shards and manifest.json), the lock file, and hidden temporary folders
// while a save is in flight. Its readers open only regular files, never through a symbolic link,
// with a size bound before they read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"
#include "global_slice.h"
#include "safetensors_header.h"

namespace dplan::executor {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kShardMetadataKey = "dplan_checkpoint";  // the shard's safetensors metadata
// The lock file a run holds (flock) while it writes into DIR: one writer at a time; it holds
// "<host> pid <pid>" of the run's rank 0.
inline constexpr const char* kLockFileName = "dplan-checkpoint.lock";
// The largest manifest read: a manifest lists one shard per rank and the parameters each holds.
inline constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
// The tensors a piece may have, by kind, and the RNG states a shard may hold.
inline const std::vector<std::string> kPieceKinds = {"weight", "master", "exp_avg", "exp_avg_sq"};
inline const std::vector<std::string> kRngStates = {"rng.cpu", "rng.cuda"};

// DIR/step-NNNNNNNN, its name alone, the step a name stands for (-1: not a step folder's name),
// and a shard's file name in it.
std::string checkpoint_folder(const std::string& dir, int step);
std::string step_folder_name(int step);
int step_of_folder_name(const std::string& name);
std::string shard_file_name(int rank);

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
// a wrong type, a fraction where an integer belongs, a shard named other than its rank's plain
// file name (so never a path: no "/", no "..", nothing absolute), a shard listed twice or out of
// rank order, sums that do not add up: one InputError line naming the file and the JSON pointer.
ManifestShard manifest_shard_from_json(const json& j, const std::string& file, const std::string& pointer);
CheckpointManifest manifest_from_json(const json& j, const std::string& file);
// The manifest's text read strictly (parse_json_text: no repeated key), then manifest_from_json.
CheckpointManifest manifest_from_text(const std::string& text, const std::string& file);

// The metadata each shard file carries (its safetensors header, key "dplan_checkpoint"): the pieces of
// parameters it holds, each with the slice of the global tensor (GlobalSlice) its flat range
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
// Strict like manifest_from_json; `file` names the shard in errors. A slice must lie in its tensor
// (its sections add up to the split dimension and divide into its parts).
ShardMetadata shard_metadata_from_json(const json& j, const std::string& file);

json slice_to_json(const GlobalSlice& slice);
// The local tensor's shape for `slice`, and how many of its leading elements (flattened) are the
// global tensor's rather than a padded vocabulary's padding rows.
std::vector<int64_t> local_shape(const GlobalSlice& slice);
int64_t real_elements(const GlobalSlice& slice);

// A shard's header against its manifest entry: the "dplan_checkpoint" metadata present and read
// strictly, its step, rank and world the manifest's, its pieces the parameters the manifest lists,
// each piece's tensors present with the kinds it may have (weight, exp_avg and exp_avg_sq always),
// a floating dtype (the moments and master weights F32) and the shape [n] of its range, the range
// inside the slice's elements, the RNG states by their known names as U8 lists, and no tensor in
// the file that the metadata does not name or names twice. `folder` names the checkpoint in the
// one-line InputError. Returns the metadata.
ShardMetadata check_shard(const SafetensorsHeader& header, const CheckpointManifest& manifest, const ManifestShard& shard,
                          const std::string& folder);

// The bytes of `name` in the folder DIR/`step_name`, opened without following a link at either
// step (O_NOFOLLOW) and without blocking, refused unless a regular file of at most `max_bytes`
// (and, when `exact_bytes` >= 0, of exactly that many: what the manifest says), read no further
// than its size. `what` names it in the one-line InputError ("shard rank-00001.safetensors").
std::string read_checkpoint_file(const std::string& dir, const std::string& step_name, const std::string& name,
                                 int64_t max_bytes, int64_t exact_bytes, const std::string& what);

}  // namespace dplan::executor
