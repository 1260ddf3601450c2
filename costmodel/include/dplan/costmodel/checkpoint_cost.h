// Checkpoints and failures: what a sharded checkpoint of a plan holds (bytes per rank and in
// total, weights and optimizer states by precision), how long saving it stalls the step loop and
// takes to reach the shared filesystem, how long a restart takes to load it, and, given a failure
// rate, the checkpoint interval that maximises goodput (Young 1974, Daly 2006), the fraction of
// time failures and checkpoints cost, and the time to train with them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Bytes per parameter a checkpoint holds (docs/executor.md, "what a checkpoint holds"): the
// weights in the dtype training keeps them (4 for fp32; 2 for bf16, fp16 and fp8, whose fp8 GEMM
// copy is transient), the fp32 master copy the optimizer steps when the weights are 16-bit (4,
// else 0), and AdamW's two fp32 moments (8). Small state (step, RNG states, data position, loss
// scaler) is not counted.
struct CheckpointBytesPerParam {
  double weights = 0, master = 0, moments = 0;
  double total() const { return weights + master + moments; }
};
CheckpointBytesPerParam checkpoint_bytes_per_param(const TrainingSpec& training);

// One rank's shard: the bytes it writes (each unique element written once over the job) and the
// bytes it holds and so reads back on a restart, split by state.
struct RankCheckpoint {
  int rank = 0, node = 0;
  double weights_bytes = 0;      // model weights (training dtype) it writes
  double master_bytes = 0;       // fp32 master weights it writes (16-bit training)
  double moments_bytes = 0;      // AdamW moments it writes
  double device_bytes = 0;       // of what it writes, what lives on the device (not offloaded)
  double read_bytes = 0;         // what it holds under its layout, read on a restart
  double device_read_bytes = 0;  // of read_bytes, what goes back to the device
  double total_bytes() const { return weights_bytes + master_bytes + moments_bytes; }
};

// Times of one save and one load (seconds); absent (nullopt) where the cluster profile gives no
// storage bandwidth.
struct CheckpointTimes {
  double async_blocking_s = 0;  // the step loop's stall: the slowest rank's copy to host memory
  double write_s = 0;           // background write of the whole checkpoint to the filesystem
  double sync_blocking_s = 0;   // a synchronous save's stall: copy, then write
  double load_s = 0;            // a restart's load: read from the filesystem, then to the devices
};

struct CheckpointCost {
  CheckpointBytesPerParam bytes_per_param;
  double num_params = 0;  // unique parameters written (P: the model's, counted once)
  double weights_bytes = 0, master_bytes = 0, moments_bytes = 0;
  double total_bytes() const { return weights_bytes + master_bytes + moments_bytes; }
  double max_rank_bytes = 0;   // the largest shard
  double max_node_bytes = 0;   // the most any node writes
  std::vector<RankCheckpoint> ranks;  // by global rank
  std::optional<CheckpointTimes> times;
};

// The checkpoint of `parallel` on `cluster`: every rank's shard (stage_params' counts of what it
// holds, the model's own vocabulary unpadded), sums per node and in total, and the save and load
// times when the cluster has a storage block. The total is (num_params + mtp_params)(model) x
// checkpoint_bytes_per_param(training).total() whatever the layout. Without per_rank, `ranks` is
// left empty (the search prices many layouts and needs only the sums).
// REQUIRES: validate(model, cluster, training, parallel, parallel.world_size()) passed.
CheckpointCost checkpoint_cost(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
                               const ParallelConfig& parallel, bool per_rank = true);

// Bytes per second one rank copies between device and host memory: kHostLinkBytesPerS for GPUs;
// for devices that are cores of one host (shared-memory clusters), the host's memory bandwidth
// (read and write: half of it) shared by the node's ranks.
double host_copy_bytes_per_s(const ClusterSpec& cluster, int ranks_per_node);

// Failures. The default rate is the Llama 3 paper's (Dubey et al. 2024, "The Llama 3 Herd of
// Models", arXiv 2407.21783, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot of
// pre-training on 16,384 H100 GPUs, 419 / (54 x 24 x 16,384 GPU-hours) = 1.97e-5 per GPU-hour.
inline constexpr double kLlama3FailuresPerGpuHour = 419.0 / (54.0 * 24.0 * 16384.0);
// What a restart costs besides loading the checkpoint: the job rescheduled, processes launched,
// communicators and data loaders set up again. An assumption (10 minutes), not a measurement:
// --restart-s sets it.
inline constexpr double kDefaultRestartOverheadS = 600;

struct FailureModel {
  double failures_per_gpu_hour = kLlama3FailuresPerGpuHour;
  double restart_overhead_s = kDefaultRestartOverheadS;
};

// Young's first-order optimum interval between checkpoints (compute time, seconds) for a
// checkpoint costing `checkpoint_s` and a mean time between failures `mtbf_s`: sqrt(2 δ M)
// (Young 1974). Daly's higher-order one (Daly 2006, section 4): sqrt(2δM)[1 + (1/3)sqrt(δ/2M) +
// (δ/2M)/9] − δ for δ < 2M, else M. REQUIRES: checkpoint_s > 0, mtbf_s > 0.
double young_interval_s(double checkpoint_s, double mtbf_s);
double daly_interval_s(double checkpoint_s, double mtbf_s);

// The expected fraction of wall time lost to checkpoints, rework and restarts when checkpointing
// every `interval_s` of compute at `checkpoint_s` each, with exponential failures of mean
// `mtbf_s` and `restart_s` per restart (Daly 2006's wall time; derivation in checkpoint_cost.cpp).
// REQUIRES: interval_s > 0, mtbf_s > 0, checkpoint_s >= 0, restart_s >= 0.
double lost_fraction(double interval_s, double checkpoint_s, double mtbf_s, double restart_s);

struct Goodput {
  double gpus = 0;
  double mtbf_s = 0;               // of the whole job: 3600 / (rate x GPUs)
  double checkpoint_s = 0;         // δ: the stall per save (asynchronous)
  double restart_s = 0;            // R: overhead + load + the in-flight write lost
  double young_interval_s = 0;
  double daly_interval_s = 0;
  int interval_steps = 1;          // the save interval in steps (Daly's, rounded, at least 1, and
                                   // no shorter than a background write)
  double interval_s = 0;           // interval_steps x step time
  double lost_fraction = 0;        // at interval_s: all three below
  double checkpoint_fraction = 0;  // of wall time: the saves' stalls
  double rework_fraction = 0;      //   work redone since the last durable checkpoint
  double restart_fraction = 0;     //   restarts and loads
  double time_to_train_s = 0;      // without failures: tokens / throughput
  double time_to_train_with_failures_s = 0;
};

// Goodput of a plan whose step takes `step_s` and trains `tokens` at `tokens_per_s`, with its
// checkpoint `cost` (which must have times) on `gpus` GPUs. Throws InputError where the cost has
// no times (the cluster profile has no storage block) or the failure model is out of range.
Goodput goodput(const CheckpointCost& cost, const FailureModel& failures, int gpus, double step_s, double tokens,
                double tokens_per_s);

// Totals, the largest shard and node, the times; with per_rank each rank's bytes ("rank_bytes").
json to_json(const CheckpointCost& cost, bool per_rank = true);
json to_json(const Goodput& goodput);

}  // namespace dplan::costmodel
