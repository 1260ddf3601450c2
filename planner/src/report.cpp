#include "dplan/planner/report.h"
#include "dplan/costmodel/units.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace dplan::planner {
using namespace costmodel;

namespace {

std::string fmt(const char* format, double v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
}  // namespace

std::string format_params(double params) {
  if (params >= 1e12) return fmt("%.2f T", params / 1e12);
  if (params >= 1e9) return fmt("%.2f B", params / 1e9);
  if (params >= 1e6) return fmt("%.2f M", params / 1e6);
  return fmt("%.0f", params);
}

std::string format_duration(double seconds) {
  if (seconds < 90) return fmt("%.0f s", seconds);
  if (seconds < 90 * 60) return fmt("%.1f min", seconds / 60);
  if (seconds < 48 * 3600) return fmt("%.1f hours", seconds / 3600);
  return fmt("%.1f days", seconds / 86400);
}

namespace {
// Decimal bytes, as storage bandwidths are: "810 GB", "5.67 TB", "12.3 MB".
std::string storage_bytes(double bytes) {
  if (bytes >= 1e12) return fmt("%.2f TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt("%.2f MB", bytes / 1e6);
  return fmt("%.0f bytes", bytes);
}
std::string seconds(double s) { return s >= 0.1 ? fmt("%.2f s", s) : fmt("%.2f ms", s * 1e3); }
std::string percent(double f) { return fmt("%.2f %%", 100 * f); }
}  // namespace

CheckpointReport checkpoint_report(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
                                   const ParallelConfig& parallel, const TimeBreakdown& time,
                                   const FailureModel& failures, double tokens) {
  CheckpointReport r;
  r.failures = failures;
  r.cost = checkpoint_cost(model, cluster, training, parallel);
  if (r.cost.times)
    r.goodput = goodput(r.cost, failures, parallel.world_size(), time.step_time_s, tokens, time.tokens_per_s);
  return r;
}

std::string checkpoint_block(const CheckpointReport& r, double tokens) {
  const CheckpointCost& c = r.cost;
  const bool mixed = c.bytes_per_param.master > 0;
  std::ostringstream o;
  o << "checkpoints and failures\n";
  o << "checkpoint: " << storage_bytes(c.total_bytes()) << " (" << format_params(c.num_params) << " parameters: weights "
    << (mixed ? "16-bit " : "fp32 ") << storage_bytes(c.weights_bytes);
  if (mixed) o << ", fp32 master " << storage_bytes(c.master_bytes);
  o << ", AdamW moments " << storage_bytes(c.moments_bytes) << "); largest shard " << storage_bytes(c.max_rank_bytes)
    << ", largest node " << storage_bytes(c.max_node_bytes) << "\n";
  if (!c.times) {
    o << "save and load times: the cluster profile has no storage bandwidths (a \"storage\" block, profiles/README.md)\n";
    return o.str();
  }
  const CheckpointTimes& t = *c.times;
  o << "save: stalls the step " << seconds(t.async_blocking_s) << " (asynchronous; synchronous " << seconds(t.sync_blocking_s)
    << "), written in the background in " << seconds(t.write_s) << "; load on restart " << seconds(t.load_s) << "\n";
  const Goodput& g = *r.goodput;
  o << "failures: " << fmt("%.3g", r.failures.failures_per_gpu_hour) << " per GPU-hour"
    << (r.failures.failures_per_gpu_hour == kLlama3FailuresPerGpuHour ? " (Llama 3's)" : "") << ", one every "
    << format_duration(g.mtbf_s) << " on " << fmt("%.0f", g.gpus) << " GPUs; a restart costs "
    << format_duration(g.restart_s) << " (" << fmt("%.0f", r.failures.restart_overhead_s) << " s overhead + load + the write in flight)\n";
  o << "save every " << g.interval_steps << (g.interval_steps == 1 ? " step" : " steps") << " (" << format_duration(g.interval_s)
    << "; Young " << format_duration(g.young_interval_s) << ", Daly " << format_duration(g.daly_interval_s) << "): "
    << percent(g.lost_fraction) << " of time lost (saves " << percent(g.checkpoint_fraction) << ", rework "
    << percent(g.rework_fraction) << ", restarts " << percent(g.restart_fraction) << ")\n";
  o << "time to train " << format_params(tokens) << " tokens with failures: " << format_duration(g.time_to_train_with_failures_s)
    << " (" << format_duration(g.time_to_train_s) << " without)\n";
  return o.str();
}

json to_json(const CheckpointReport& r, bool per_rank) {
  json out{{"checkpoint", to_json(r.cost, per_rank)}};
  if (r.goodput) {
    out["goodput"] = to_json(*r.goodput);
    out["goodput"]["failures_per_gpu_hour"] = r.failures.failures_per_gpu_hour;
    out["goodput"]["restart_overhead_s"] = r.failures.restart_overhead_s;
  } else {
    out["goodput"] = nullptr;
  }
  return out;
}

std::string expected_run_time(double step_s, int steps) {
  return "expected run time: about " + format_duration(step_s * steps) + " (" + std::to_string(steps) + " steps x " +
         fmt("%.2f", step_s) + " s predicted)";
}

std::string describe_layout(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  std::ostringstream o;
  o << "tp " << p.tp << " · pp " << p.pp << " · dp " << p.dp << " · cp " << p.cp;
  if (model.is_moe()) o << " · ep " << p.ep << " · etp " << p.expert_tp();
  if (p.moe_dispatcher == MoeDispatcher::deepep) o << " · DeepEP";
  if (p.overlap_ep_comm) o << " · EP overlap";
  if (p.schedule == Schedule::interleaved) o << " · vpp " << p.vpp;
  // Megatron's uneven pipeline split, named by its flags.
  if (p.first_stage_layers) o << " (first stage " << p.first_stage_layers << " layers)";
  if (p.last_stage_layers) o << " (last stage " << p.last_stage_layers << " layers)";
  if (p.account_for_embedding || p.account_for_loss)
    o << " (" << (p.account_for_embedding ? "embedding" : "") << (p.account_for_embedding && p.account_for_loss ? " and " : "")
      << (p.account_for_loss ? "loss" : "") << " counted as a layer)";
  o << ", micro-batch " << p.micro_batch << ", global batch " << t.global_batch << " ("
    << num_microbatches(t, p) << (num_microbatches(t, p) == 1 ? " micro-batch" : " micro-batches")
    << " per pipeline), seq " << t.seq_len << "\n"
    << "        " << to_string(t.precision) << (t.fp32_grads ? " (fp32 grads)" : "")
    << (t.grad_reduce_in_bf16 ? " (bf16 grads)" : "") << (t.bf16_adam_moments ? " (bf16 Adam moments)" : "") << ", ";
  if (p.distributed_optimizer)
    o << "distributed optimizer";
  else
    o << "ZeRO " << p.zero_stage;
  o << (p.offload_optimizer ? " + optimizer offload" : "") << ", recompute " << to_string(p.recompute);
  if (p.recompute == Recompute::selective && !t.recompute_modules.is_default()) {
    o << " (" << to_string(t.recompute_modules, ", ") << ")";
  }
  o
    << ", schedule " << (p.pp > 1 ? to_string(p.schedule) : "none (pp 1)") << ", " << to_string(t.attention)
    << " attention" << (p.sequence_parallel ? ", sequence parallel" : "");
  return o.str();
}

std::string memory_table(const ClusterSpec& cluster, const MemoryEstimate& mem) {
  std::ostringstream o;
  o << "memory per GPU by pipeline stage (GiB; " << cluster.gpu.name << " holds " << fmt("%.1f", mem.capacity_bytes / kGiB)
    << " GiB)\n";
  o << "stage  layers  in-flight  weights    grads  optimizer  activations   logits  buffers  reserve    total  of HBM\n";
  for (const auto& s : mem.stages) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "%5d  %6d  %9.2f  %7.2f  %7.2f  %9.2f  %11.2f  %7.2f  %7.2f  %7.2f  %7.2f  %5.0f %%%s\n", s.stage,
                  s.num_layers, s.microbatches_in_flight, s.weights_bytes / kGiB, s.grads_bytes / kGiB,
                  s.optimizer_bytes / kGiB, s.activations_bytes / kGiB, s.logits_bytes / kGiB,
                  s.buffers_bytes / kGiB, s.reserve_bytes / kGiB, s.total_bytes() / kGiB,
                  100.0 * s.total_bytes() / mem.capacity_bytes, s.stage == mem.worst_stage ? "  <- worst" : "");
    o << line;
  }
  double host = 0;
  for (const auto& s : mem.stages) host = std::max(host, s.host_bytes);
  if (host > 0)
    o << "host memory: " << fmt("%.2f", host / kGiB) << " GiB of offloaded optimizer state per GPU, "
      << fmt("%.1f", mem.host_bytes_per_node / kGiB) << " GiB per node of " << fmt("%.0f", mem.host_capacity_bytes / kGiB)
      << " GiB\n";
  double headroom = mem.capacity_bytes - mem.peak_bytes;
  if (mem.fits) {
    o << "fits: worst stage " << mem.worst_stage << " needs " << fmt("%.1f", mem.peak_bytes / kGiB) << " of "
      << fmt("%.1f", mem.capacity_bytes / kGiB) << " GiB (" << fmt("%.1f", headroom / kGiB) << " GiB headroom, "
      << fmt("%.0f", 100.0 * headroom / mem.capacity_bytes) << " %)\n";
  } else {
    o << "does not fit:\n";
    for (const auto& r : memory_problems(mem)) o << "  - " << r << "\n";
  }
  const auto imbalanced = std::max_element(mem.stages.begin(), mem.stages.end(), [](const auto& a, const auto& b) {
    return a.moe_worst_case_extra_bytes < b.moe_worst_case_extra_bytes;
  });
  if (imbalanced != mem.stages.end() && imbalanced->moe_worst_case_extra_bytes > 0)
    o << "MoE routing counted balanced; dropless at worst (every token of the ep group to one rank's experts) "
      << "adds " << fmt("%.1f", imbalanced->moe_worst_case_extra_bytes / kGiB) << " GiB to stage " << imbalanced->stage
      << "'s activations\n";
  o << "plans keep " << fmt("%.0f", 100 * mem.headroom_fraction)
    << " % of HBM free for allocator fragmentation and communication buffers: --headroom\n";
  return o.str();
}

std::string time_table(const TimeBreakdown& t, const TrainingSpec& training) {
  std::ostringstream o;
  o << "step time by phase (critical path)\n";
  o << "phase            time (ms)  share\n";
  const std::pair<const char*, double> rows[] = {
      {"forward", t.forward_s},           {"backward", t.backward_s},         {"recompute", t.recompute_s},
      {"tp comm", t.tp_comm_s},           {"cp comm", t.cp_comm_s},           {"ep comm", t.ep_comm_s},
      {"pp send/recv", t.pp_p2p_s},       {"pp bubble", t.pp_bubble_s},       {"dp grad reduce", t.dp_comm_s},
      {"param gather", t.param_gather_s}, {"optimizer", t.optimizer_s},       {"offload", t.offload_s},
      {"step overhead", t.overhead_s}};
  for (const auto& [name, seconds] : rows) {
    if (seconds <= 0) continue;
    char line[128];
    std::snprintf(line, sizeof line, "%-15s %10.1f  %4.1f %%\n", name, seconds * 1e3, 100 * seconds / t.step_time_s);
    o << line;
  }
  char line[256];
  std::snprintf(line, sizeof line, "%-15s %10.1f\n", "step", t.step_time_s * 1e3);
  o << line;
  std::snprintf(line, sizeof line,
                "communication: %.1f ms exposed, %.1f ms hidden under compute\n"
                "throughput: %.0f tokens/s (global batch %d x seq %d), MFU %.1f %%, HFU %.1f %%\n",
                t.exposed_comm_s() * 1e3, t.hidden_comm_s * 1e3, t.tokens_per_s, training.global_batch,
                training.seq_len, 100 * t.mfu, 100 * t.hfu);
  o << line;
  return o.str();
}

std::vector<std::string> layout_warnings(const ParallelConfig& p, const TrainingSpec& t, const Network& net,
                                         const MemoryEstimate& mem, const TimeBreakdown& time) {
  std::vector<std::string> w;
  int m = num_microbatches(t, p);
  if (time.bubble_fraction > 0.2)
    w.push_back(fmt("pipeline bubble is %.0f %% of the step (> 20 %%): more micro-batches or interleaving help",
                    100 * time.bubble_fraction));
  if (p.pp > 1 && m < 4 * p.pp)
    w.push_back("only " + std::to_string(m) + " micro-batches for pp " + std::to_string(p.pp) +
                " (fewer than 4*pp = " + std::to_string(4 * p.pp) + ")");
  if (p.tp > 1 && net.crosses_nodes(Mesh(p).shape(Dim::tp)))
    w.push_back("tensor parallel group of " + std::to_string(p.tp) + " spans nodes (" +
                std::to_string(net.cluster().gpus_per_node) + " GPUs per node): its all-reduces leave NVLink");
  double headroom = (mem.capacity_bytes - mem.peak_bytes) / mem.capacity_bytes;
  if (mem.fits && headroom < 0.10)
    w.push_back(fmt("only %.1f %% memory headroom on the worst stage (< 10 %%): fragmentation may push it over", 100 * headroom));
  if (p.dp * p.cp > 1) {
    double dp_efficiency = 1 - (time.dp_comm_s + (p.zero_stage >= 3 ? 0 : time.param_gather_s)) / time.step_time_s;
    if (dp_efficiency < 0.8)
      w.push_back(fmt("data-parallel scaling efficiency %.0f %% (< 80 %%): gradient reduction is exposed", 100 * dp_efficiency));
  }
  return w;
}

}  // namespace dplan::planner
