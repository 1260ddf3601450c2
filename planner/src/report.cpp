#include "dplan/planner/report.h"

#include <cstdio>
#include <sstream>

namespace dplan::planner {
using namespace costmodel;

namespace {
constexpr double kGiB = 1073741824.0;

std::string fmt(const char* format, double v) {
  char buf[64];
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

std::string describe_layout(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  std::ostringstream o;
  o << "tp " << p.tp << " · pp " << p.pp << " · dp " << p.dp << " · cp " << p.cp;
  if (model.is_moe()) o << " · ep " << p.ep;
  if (p.schedule == Schedule::interleaved) o << " · vpp " << p.vpp;
  o << ", micro-batch " << p.micro_batch << ", global batch " << t.global_batch << " ("
    << num_microbatches(t, p) << (num_microbatches(t, p) == 1 ? " micro-batch" : " micro-batches")
    << " per pipeline), seq " << t.seq_len << "\n"
    << "        " << to_string(t.precision) << (t.fp32_grads ? " (fp32 grads)" : "") << ", ";
  if (p.distributed_optimizer)
    o << "distributed optimizer";
  else
    o << "ZeRO " << p.zero_stage;
  o << (p.offload_optimizer ? " + optimizer offload" : "") << ", recompute " << to_string(p.recompute)
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
    for (const auto& r : mem.reasons) o << "  - " << r << "\n";
  }
  return o.str();
}

}  // namespace dplan::planner
