#include "run_record.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include <torch/version.h>

#include "dplan/costmodel/run_record.h"

namespace dplan::executor {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

std::string weights_hash(const std::vector<Parameter>& params) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over every byte of every parameter, in order
  for (const auto& p : params) {
    at::Tensor t = p.tensor.detach().to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

int64_t optimizer_bytes(torch::optim::Optimizer& opt) {
  int64_t n = 0;
  for (auto& [key, state] : opt.state()) {
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      if (s->exp_avg().defined()) n += s->exp_avg().nbytes();
      if (s->exp_avg_sq().defined()) n += s->exp_avg_sq().nbytes();
      if (s->max_exp_avg_sq().defined()) n += s->max_exp_avg_sq().nbytes();
    }
  }
  return n;
}

json median_phases(const std::vector<std::array<double, kNumPhases>>& steps) {
  json out = json::object();
  for (int i = 0; i < kNumPhases; ++i) {
    std::vector<double> v;
    for (const auto& s : steps) v.push_back(s[i]);
    out[to_string(static_cast<Phase>(i))] = percentile(v, 0.5);
  }
  return out;
}

}  // namespace

json rank_report(int rank, int stage_index, const std::vector<StepRecord>& steps, int warmup_steps,
                 const MemoryPeaks& peaks, GptStage& stage, const GradSync& grads, torch::optim::Optimizer& optimizer) {
  std::vector<double> step_times, losses, grad_norms;
  std::vector<std::array<double, kNumPhases>> measured_phases;
  for (size_t s = 0; s < steps.size(); ++s) {
    step_times.push_back(steps[s].time_s);
    losses.push_back(steps[s].loss);
    grad_norms.push_back(steps[s].grad_norm);
    if (static_cast<int>(s) >= warmup_steps) measured_phases.push_back(steps[s].phases_s);
  }
  json memory = {{"weights", grads.weight_bytes()},
                 {"gradients", grads.gradient_bytes()},
                 {"optimizer", grads.offloaded() ? 0 : optimizer_bytes(optimizer) + grads.master_bytes()},
                 {"activations", peaks.activations_bytes},
                 {"buffers", peaks.buffers_bytes},
                 {"peak", peaks.peak_bytes}};
  // CUDA: the caching allocator's reserved peak (segments held from the device, fragmentation
  // included): what nvidia-smi sees of this process beside the CUDA context.
  if (peaks.reserved_peak_bytes >= 0) memory["reserved_peak"] = peaks.reserved_peak_bytes;
  // CUDA: what the device holds beyond the allocator (context, library workspaces, NCCL buffers).
  if (peaks.outside_allocator_bytes >= 0) memory["outside_allocator"] = peaks.outside_allocator_bytes;
  if (grads.offloaded()) {  // docs/run-json.md: host memory of an offloaded optimizer, apart from the device's
    const int64_t moments = optimizer_bytes(optimizer), master = grads.host_master_bytes(),
                  gradients = grads.host_gradient_bytes();
    memory["host_optimizer"] = moments;
    memory["host_master"] = master;
    memory["host_gradients"] = gradients;
    // CUDA: the host is not metered; what the host tensors hold is a lower bound of its peak.
    memory["host_peak"] = peaks.host_peak_bytes >= 0 ? peaks.host_peak_bytes : moments + master + gradients;
  }
  // The FLOPs counted over the run, per step: every step runs the same matrix multiplies (a rank's
  // routed experts apart, whose count follows its tokens' choices).
  auto per_step = [&steps](const costmodel::FlopsByPart& total) {
    std::vector<double> out(total.begin(), total.end());
    for (double& x : out) x /= std::max<size_t>(1, steps.size());
    return out;
  };
  const FlopCounts& flops = stage.flop_counts();
  return {{"rank", rank},
          {"stage", stage_index},
          {"flops", {{"forward", per_step(flops.forward)}, {"recompute", per_step(flops.recompute)}}},
          {"step_times_s", step_times},
          {"losses", losses},
          {"grad_norms", grad_norms},
          {"phases_s", median_phases(measured_phases)},
          {"weights_hash", weights_hash(stage.parameters())},
          {"moe_tokens", {{"routed", stage.moe_counts().routed}, {"processed", stage.moe_counts().processed}}},
          {"memory", memory}};
}

json assemble_run(const ExecPlan& plan, int world_size, int num_steps, int warmup_steps, const std::vector<json>& ranks,
                  const json& config, const std::string& memory_source, int first_step,
                  std::optional<costmodel::RunCheckpoints> checkpoints) {
  const auto& p = plan.parallel;
  costmodel::RunRecord run;
  run.plan = plan.path;
  run.layout = {p.tp, p.pp, p.dp, p.cp, p.micro_batch, plan.num_microbatches, plan.training.global_batch,
                plan.training.seq_len, p.schedule, p.zero_stage, p.recompute, p.sequence_parallel};
  run.config = config;
  if (plan.model.is_moe()) {
    // Dropless routing (no capacity factor, as the cost model prices it): every routed copy of a
    // token reached an expert; "dropped" is what the counts say, not an assumption.
    long long routed = 0, processed = 0;
    for (const auto& r : ranks) {
      routed += r["moe_tokens"]["routed"].get<long long>();
      processed += r["moe_tokens"]["processed"].get<long long>();
    }
    run.config["moe"] = {{"capacity_factor", nullptr}, {"routed_copies", routed}, {"processed_copies", processed},
                         {"dropped_copies", routed - processed}};
  }
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  run.environment = {{"torch_version", TORCH_VERSION}, {"hostname", host}, {"cpu", cpu_model()},
                     {"cores", std::thread::hardware_concurrency()}, {"device_name", config["device_name"]},
                     {"world_size", world_size}};
  std::vector<double> measured;
  const double tokens = double(plan.training.global_batch) * plan.training.seq_len;
  for (int s = 0; s < num_steps; ++s) {
    double t = 0;  // a step ends when its slowest rank does
    for (const auto& r : ranks) t = std::max(t, r["step_times_s"][s].get<double>());
    const bool warm = s < warmup_steps;
    if (!warm) measured.push_back(t);
    run.steps.push_back({first_step + s, ranks[0]["losses"][s].get<double>(), ranks[0]["grad_norms"][s].get<double>(), t, warm,
                         tokens / t});
  }
  double mean = 0, var = 0;
  for (double t : measured) mean += t / measured.size();
  for (double t : measured) var += (t - mean) * (t - mean) / std::max<size_t>(1, measured.size() - 1);
  const double median = percentile(measured, 0.5);
  run.step_time = {median, mean, percentile(measured, 0), percentile(measured, 1), percentile(measured, 0.1),
                   percentile(measured, 0.9), std::sqrt(var), static_cast<long long>(measured.size())};
  run.tokens_per_s = median > 0 ? tokens / median : 0.0;
  run.phases_by_rank_s = json::array();
  for (const auto& r : ranks) {
    json row = r["phases_s"];
    for (auto& [k, v] : row.items()) run.phases_s[k] += v.get<double>() / ranks.size();
    row["rank"] = r["rank"];
    row["stage"] = r["stage"];
    run.phases_by_rank_s.push_back(row);
    run.memory_bytes[r["rank"].get<int>()] = r["memory"].get<std::map<std::string, long long>>();
    costmodel::RankStepFlops& flops = run.flops_by_rank[r["rank"].get<int>()];
    for (int i = 0; i < costmodel::kNumFlopParts; ++i) {
      flops.forward[i] = r["flops"]["forward"][i].get<double>();
      flops.recompute[i] = r["flops"]["recompute"][i].get<double>();
    }
    run.weights_hash_by_rank.push_back(r["weights_hash"].get<std::string>());
    run.stage_of_rank.push_back(r["stage"].get<int>());
  }
  run.memory_source = memory_source;
  // The start-up of the rank that took longest (the first collective waits for it).
  for (const auto& r : ranks)
    if (r.contains("startup_s") &&
        (run.startup_s.empty() || r["startup_s"]["total"].get<double>() > run.startup_s.at("total")))
      run.startup_s = r["startup_s"].get<std::map<std::string, double>>();
  if (checkpoints) {
    const size_t saves = ranks[0].value("checkpoint_saves", json::array()).size();
    for (size_t i = 0; i < saves; ++i) {
      costmodel::CheckpointSave save;
      for (const auto& r : ranks) {
        const json& mine = r.at("checkpoint_saves").at(i);
        save.step = mine.at("step").get<int>();
        save.blocking_s = std::max(save.blocking_s, mine.at("blocking_s").get<double>());
        save.wait_s = std::max(save.wait_s, mine.at("wait_s").get<double>());
        save.write_s = std::max(save.write_s, mine.at("write_s").get<double>());
        save.file_bytes_by_rank.push_back(mine.at("file_bytes").get<long long>());
        save.state_bytes_by_rank.push_back(mine.at("state_bytes").get<long long>());
      }
      checkpoints->saves.push_back(save);
    }
    run.checkpoints = std::move(checkpoints);
  }
  // Data-parallel replicas (same tp and pp coordinates; in an MoE model also the same experts: ep
  // and etp) must hold bit-identical weights; so must the cp ranks, which hold the same parameters
  // and step the gradients summed over dp x cp.
  for (const auto& a : plan.ranks)
    for (const auto& b : plan.ranks)
      if (a.tp == b.tp && a.pp == b.pp && a.ep == b.ep && a.etp == b.etp &&
          run.weights_hash_by_rank[a.rank] != run.weights_hash_by_rank[b.rank])
        run.replicas_identical = false;
  return costmodel::to_json(run);
}

}  // namespace dplan::executor
