#include "dplan/costmodel/checkpoint_cost.h"

#include <algorithm>
#include <cmath>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"

namespace dplan::costmodel {

CheckpointBytesPerParam checkpoint_bytes_per_param(const TrainingSpec& t) {
  // Weights as training keeps them; fp8 training keeps bf16 weights and makes its fp8 copies per
  // GEMM (Transformer Engine), so the checkpoint holds 2 bytes. 16-bit weights are stepped through
  // an fp32 master copy (Micikevicius et al. 2018, "Mixed Precision Training"; ZeRO's K = 12 =
  // 4 master + 8 moments, Rajbhandari et al. 2020 Sec. 3.1), which the checkpoint must hold to
  // resume bit-exactly. AdamW's two moments are fp32, or bf16 where training keeps them so
  // (TrainingSpec::bf16_adam_moments).
  const double moments = adam_moment_bytes(t);
  if (t.precision == Precision::fp32) return {4, 0, moments};
  return {2, 4, moments};
}

double host_copy_bytes_per_s(const ClusterSpec& c, int ranks_per_node) {
  if (c.intra_node_kind != IntraNodeKind::shared_memory) return kHostLinkBytesPerS;
  // A core's "device memory" is host memory: the snapshot is a copy within it, each byte read
  // once and written once, the node's ranks copying at once over the same memory.
  const double memory = c.gpu.hbm_bandwidth_bytes_per_s * c.gpu.memory_efficiency;
  return memory / 2 / std::max(1, ranks_per_node);
}

// Who writes what (docs/executor.md, "what a checkpoint holds"): every unique element once.
//  - tp: parameters tensor parallel splits are unique per tp rank; those it replicates (norms,
//    row-parallel biases, the router, learned positions: StageParams::dense_tp_replicated) are
//    written by tp rank 0. Experts likewise over etp.
//  - A tied embedding's copy on the last stage (pp > 1) is written by the first stage only.
//  - dp and cp: a state replicated over the dp*cp ranks of a stage is written by the rank whose dp
//    and cp coordinates are 0; a state ZeRO shards over them (optimizer states and the fp32 master
//    from stage 1 or the distributed optimizer on, weights at stage 3) is written by each shard's
//    owner, 1/(dp*cp) each. Experts are replicated and sharded over edp instead (edp 0 writes).
// So the total over ranks is P (w + m + 8) for the P unique parameters, whatever the layout.
// On a restart each rank reads what it holds under its layout (every replica reads its copy).
CheckpointCost checkpoint_cost(const ModelSpec& m, const ClusterSpec& cluster, const TrainingSpec& t,
                               const ParallelConfig& p, bool per_rank) {
  CheckpointCost c;
  const CheckpointBytesPerParam b = checkpoint_bytes_per_param(t);
  c.bytes_per_param = b;
  // The model's own vocabulary: padding rows are not parameters.
  const std::vector<StageParams> stages = stage_params(m, p, m.vocab_size);
  const bool zero3 = p.zero_stage >= 3;
  const bool shard_optimizer = p.zero_stage >= 1 || p.distributed_optimizer;
  const double dense_shards = double(p.dp) * p.cp, expert_shards = p.expert_dp();
  const int etp = p.expert_tp();
  // Of `params`, what one rank writes: a 1/shards share when the state is sharded, all of it on
  // the first replica otherwise.
  auto written = [](double params, bool sharded, double shards, bool first_replica) {
    return sharded ? params / shards : (first_replica ? params : 0.0);
  };
  const int world = p.world_size();
  const int gpus_per_node = std::max(1, cluster.gpus_per_node);
  std::vector<double> node_write((world + gpus_per_node - 1) / gpus_per_node), node_read(node_write.size());
  double total_read = 0, max_device = 0, max_device_read = 0;
  if (per_rank) c.ranks.reserve(world);
  // Ranks in Megatron's order (mesh.h): tp fastest, then cp, dp, pp; the
  // experts' etp, ep and edp folded over each stage's tp*cp*dp ranks, etp fastest.
  int rank = 0;
  for (int pp = 0; pp < p.pp; ++pp) {
    const StageParams& s = stages[pp];
    const double held_weights = s.dense / (zero3 ? dense_shards : 1.0) + s.expert / (zero3 ? expert_shards : 1.0);
    const double held_optimizer =
        s.dense / (shard_optimizer ? dense_shards : 1.0) + s.expert / (shard_optimizer ? expert_shards : 1.0);
    const double read_bytes = held_weights * b.weights + held_optimizer * (b.master + b.moments);
    const double device_read_bytes = p.offload_optimizer ? held_weights * b.weights : read_bytes;
    for (int dp = 0; dp < p.dp; ++dp)
      for (int cp = 0; cp < p.cp; ++cp)
        for (int tp = 0; tp < p.tp; ++tp, ++rank) {
          const int local = tp + p.tp * (cp + p.cp * dp);  // within the stage's tp*cp*dp ranks
          const bool etp_first = s.expert == 0 || local % etp == 0;
          const bool edp_first = s.expert == 0 || local / (etp * p.ep) == 0;
          const double dense_unique = s.dense - s.embedding_copy - (tp == 0 ? 0.0 : s.dense_tp_replicated);
          const double expert_unique = s.expert - (etp_first ? 0.0 : s.expert_etp_replicated);
          const bool dense_first = dp == 0 && cp == 0;
          // A sharded optimizer's owners write the weights of their elements beside the master and
          // the moments (the executor's GradSync::state_pieces), so the replicated weights of
          // ZeRO 1 and 2 are spread over the shards too, as ZeRO-3's are.
          const double weight_params = written(dense_unique, shard_optimizer, dense_shards, dense_first) +
                                       written(expert_unique, shard_optimizer, expert_shards, edp_first);
          const double optimizer_params = written(dense_unique, shard_optimizer, dense_shards, dense_first) +
                                          written(expert_unique, shard_optimizer, expert_shards, edp_first);
          RankCheckpoint r;
          r.rank = rank;
          r.node = rank / gpus_per_node;
          r.weights_bytes = weight_params * b.weights;
          r.master_bytes = optimizer_params * b.master;
          r.moments_bytes = optimizer_params * b.moments;
          // Offloaded, the master and the moments already live in host memory (ZeRO-Offload).
          r.device_bytes = p.offload_optimizer ? r.weights_bytes : r.total_bytes();
          r.read_bytes = read_bytes;
          r.device_read_bytes = device_read_bytes;

          c.weights_bytes += r.weights_bytes;
          c.master_bytes += r.master_bytes;
          c.moments_bytes += r.moments_bytes;
          c.max_rank_bytes = std::max(c.max_rank_bytes, r.total_bytes());
          node_write[r.node] += r.total_bytes();
          node_read[r.node] += r.read_bytes;
          total_read += r.read_bytes;
          max_device = std::max(max_device, r.device_bytes);
          max_device_read = std::max(max_device_read, r.device_read_bytes);
          if (per_rank) c.ranks.push_back(r);
        }
  }
  c.num_params = b.total() > 0 ? c.total_bytes() / b.total() : 0;
  double max_node_read = 0;
  for (double bytes : node_write) c.max_node_bytes = std::max(c.max_node_bytes, bytes);
  for (double bytes : node_read) max_node_read = std::max(max_node_read, bytes);

  if (!cluster.storage.given()) return c;
  const StorageSpec& fs = cluster.storage;
  const double copy = host_copy_bytes_per_s(cluster, std::min(world, cluster.gpus_per_node));
  CheckpointTimes times;
  // Asynchronous save (PyTorch DCP async_save, the executor's --save-every): the step loop waits
  // only while each rank copies its device-resident shard to host memory, all ranks at once over
  // their own links, so the slowest rank's copy: max_r D_r / B_copy.
  times.async_blocking_s = max_device / copy;
  // The background write: every node pushes its ranks' bytes through its own storage path while
  // the filesystem serves all nodes at once, so the write ends when both the busiest node
  // (max_n N_n / B_node) and the filesystem's aggregate (sum N / B_aggregate) are through; the
  // larger bound decides (a roofline over the two shared resources).
  times.write_s = std::max(c.max_node_bytes / fs.node_write_bytes_per_s, c.total_bytes() / fs.aggregate_write_bytes_per_s);
  // Synchronous save (torch.save in the step loop): the copy, then the write, nothing overlapped.
  times.sync_blocking_s = times.async_blocking_s + times.write_s;
  // Load on restart: each rank reads what it holds (replicas read their own copies), bounded like
  // the write by the busiest node and the aggregate read bandwidth, then copies it to the device.
  times.load_s = std::max(max_node_read / fs.node_read_bytes_per_s, total_read / fs.aggregate_read_bytes_per_s) +
                 max_device_read / copy;
  c.times = times;
  return c;
}

double young_interval_s(double checkpoint_s, double mtbf_s) { return std::sqrt(2 * checkpoint_s * mtbf_s); }

double daly_interval_s(double checkpoint_s, double mtbf_s) {
  // Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart dumps",
  // Future Generation Computer Systems 22, section 4): expanding the minimum of the wall time
  // below to higher order in δ/M gives τ = sqrt(2δM)[1 + (1/3)(δ/2M)^(1/2) + (1/9)(δ/2M)] − δ for
  // δ < 2M; beyond, checkpointing once per mean time between failures (τ = M).
  if (checkpoint_s >= 2 * mtbf_s) return mtbf_s;
  const double x = checkpoint_s / (2 * mtbf_s);
  return std::sqrt(2 * checkpoint_s * mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - checkpoint_s;
}

// The expected wall time (Daly 2006, section 3), failures exponential with mean M: work proceeds
// in segments of τ compute plus δ to save it. A segment of length s = τ + δ completes only when no
// failure falls in it; each failure costs the time since the segment began plus a restart R (which
// can itself fail). The expected time to complete one segment is then M e^(R/M) (e^(s/M) − 1)
// (a renewal argument: solve E = s P(no failure) + (E[time to failure | failure] + R + E) P(failure),
// with the restart's own failures giving the e^(R/M) factor). A job of W compute has W / τ
// segments, so
//   T_wall = (W / τ) M e^(R/M) (e^((τ+δ)/M) − 1),
// and the fraction of wall time that is not useful work is 1 − W / T_wall. Young's sqrt(2δM)
// minimises its first-order expansion δ/τ + τ/(2M) + R/M (Young 1974, "A first order
// approximation to the optimum checkpoint interval", CACM 17(9)).
double lost_fraction(double interval_s, double checkpoint_s, double mtbf_s, double restart_s) {
  const double wall_per_work =
      mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1((interval_s + checkpoint_s) / mtbf_s) / interval_s;
  return 1 - 1 / wall_per_work;
}

Goodput goodput(const CheckpointCost& cost, const FailureModel& f, int gpus, double step_s, double tokens,
                double tokens_per_s) {
  if (!cost.times)
    throw InputError("no checkpoint time without the cluster profile's storage bandwidths; add a \"storage\" "
                     "block to the cluster profile (profiles/README.md)");
  if (!(f.failures_per_gpu_hour > 0) || !std::isfinite(f.failures_per_gpu_hour))
    throw InputError("the failure rate must be a positive number per GPU-hour");
  if (!(f.restart_overhead_s >= 0) || !std::isfinite(f.restart_overhead_s))
    throw InputError("the restart time must be a non-negative number of seconds");
  DPLAN_CHECK(gpus > 0 && step_s > 0 && tokens_per_s > 0);
  Goodput g;
  g.gpus = gpus;
  // Failures of independent GPUs add: the job fails at rate λ N per hour.
  g.mtbf_s = 3600.0 / (f.failures_per_gpu_hour * gpus);
  g.checkpoint_s = cost.times->async_blocking_s;
  // A failure while the latest snapshot is still being written rolls back to the one before: for
  // failures uniform over a segment of τ + δ the extra loss averages the write time w (probability
  // w / (τ + δ) of losing τ + δ more). It adds to the restart like any fixed cost per failure.
  g.restart_s = f.restart_overhead_s + cost.times->load_s + cost.times->write_s;
  // δ = 0 (an empty stall) would make every interval optimal: the smallest positive stall keeps
  // the formulas defined (a save each step).
  const double delta = std::max(g.checkpoint_s, 1e-9);
  g.young_interval_s = young_interval_s(delta, g.mtbf_s);
  g.daly_interval_s = daly_interval_s(delta, g.mtbf_s);
  // Whole steps, and never a save while the previous one is still writing (τ + δ >= w).
  const double min_interval_s = std::max(step_s, cost.times->write_s - g.checkpoint_s);
  const int min_steps = static_cast<int>(std::min(std::ceil(min_interval_s / step_s - 1e-9), 1e9));
  const double steps = std::max(std::round(g.daly_interval_s / step_s), double(std::max(1, min_steps)));
  g.interval_steps = static_cast<int>(std::min(steps, 1e9));
  g.interval_s = g.interval_steps * step_s;
  g.lost_fraction = lost_fraction(g.interval_s, g.checkpoint_s, g.mtbf_s, g.restart_s);
  // The parts: the saves' share of a failure-free wall time (δ per τ + δ), scaled to the wall time
  // with failures; the rest is the failures', split as their first-order costs per failure:
  // (τ + δ) / 2 of rework against R of restart.
  const double useful = 1 - g.lost_fraction;
  g.checkpoint_fraction = useful * g.checkpoint_s / g.interval_s;
  const double failures = std::max(0.0, g.lost_fraction - g.checkpoint_fraction);
  const double rework = (g.interval_s + g.checkpoint_s) / 2;
  g.rework_fraction = failures * rework / (rework + g.restart_s);
  g.restart_fraction = failures - g.rework_fraction;
  g.time_to_train_s = tokens / tokens_per_s;
  g.time_to_train_with_failures_s = g.time_to_train_s / useful;
  return g;
}

json to_json(const CheckpointCost& c, bool per_rank) {
  json out{{"num_params", c.num_params},
           {"bytes_per_param",
            {{"weights", c.bytes_per_param.weights},
             {"master", c.bytes_per_param.master},
             {"moments", c.bytes_per_param.moments}}},
           {"total_bytes", c.total_bytes()},
           {"weights_bytes", c.weights_bytes},
           {"master_bytes", c.master_bytes},
           {"moments_bytes", c.moments_bytes},
           {"max_rank_bytes", c.max_rank_bytes},
           {"max_node_bytes", c.max_node_bytes}};
  if (per_rank) {
    json ranks = json::array();
    for (const RankCheckpoint& r : c.ranks) ranks.push_back(r.total_bytes());
    out["rank_bytes"] = ranks;
  }
  if (c.times)
    out["times"] = {{"async_blocking_s", c.times->async_blocking_s},
                    {"write_s", c.times->write_s},
                    {"sync_blocking_s", c.times->sync_blocking_s},
                    {"load_s", c.times->load_s}};
  else
    out["times"] = nullptr;
  return out;
}

json to_json(const Goodput& g) {
  return json{{"mtbf_s", g.mtbf_s},
              {"checkpoint_s", g.checkpoint_s},
              {"restart_s", g.restart_s},
              {"young_interval_s", g.young_interval_s},
              {"daly_interval_s", g.daly_interval_s},
              {"interval_steps", g.interval_steps},
              {"interval_s", g.interval_s},
              {"lost_fraction", g.lost_fraction},
              {"checkpoint_fraction", g.checkpoint_fraction},
              {"rework_fraction", g.rework_fraction},
              {"restart_fraction", g.restart_fraction},
              {"time_to_train_s", g.time_to_train_s},
              {"time_to_train_with_failures_s", g.time_to_train_with_failures_s}};
}

}  // namespace dplan::costmodel
