#include "run_record.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include <torch/version.h>

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
  return {{"rank", rank},
          {"stage", stage_index},
          {"step_times_s", step_times},
          {"losses", losses},
          {"grad_norms", grad_norms},
          {"phases_s", median_phases(measured_phases)},
          {"weights_hash", weights_hash(stage.parameters())},
          {"memory",
           {{"weights", grads.weight_bytes()},
            {"gradients", grads.gradient_bytes()},
            {"optimizer", optimizer_bytes(optimizer) + grads.master_bytes()},
            {"activations", peaks.activations_bytes},
            {"buffers", peaks.buffers_bytes},
            {"peak", peaks.peak_bytes}}}};
}

json assemble_run(const ExecPlan& plan, int world_size, int num_steps, int warmup_steps, const std::vector<json>& ranks,
                  const json& config, const std::string& memory_source) {
  const auto& p = plan.parallel;
  json steps = json::array();
  std::vector<double> measured;
  const double tokens = double(plan.training.global_batch) * plan.training.seq_len;
  for (int s = 0; s < num_steps; ++s) {
    double t = 0;  // a step ends when its slowest rank does
    for (const auto& r : ranks) t = std::max(t, r["step_times_s"][s].get<double>());
    bool warm = s < warmup_steps;
    if (!warm) measured.push_back(t);
    steps.push_back({{"step", s}, {"loss", ranks[0]["losses"][s]}, {"grad_norm", ranks[0]["grad_norms"][s]},
                     {"time_s", t}, {"warmup", warm},
                     {"tokens_per_s", tokens / t}});
  }
  double mean = 0, var = 0;
  for (double t : measured) mean += t / measured.size();
  for (double t : measured) var += (t - mean) * (t - mean) / std::max<size_t>(1, measured.size() - 1);
  const double median = percentile(measured, 0.5);
  json phases = json::object(), by_rank = json::array(), memory = json::object(), hashes = json::array(),
       stage_of_rank = json::array();
  for (const auto& r : ranks) {
    json row = r["phases_s"];
    for (auto& [k, v] : row.items()) phases[k] = phases.value(k, 0.0) + v.get<double>() / ranks.size();
    row["rank"] = r["rank"];
    row["stage"] = r["stage"];
    by_rank.push_back(row);
    memory[std::to_string(r["rank"].get<int>())] = r["memory"];
    hashes.push_back(r["weights_hash"]);
    stage_of_rank.push_back(r["stage"]);
  }
  // Data-parallel replicas (same tp and pp coordinates) must hold bit-identical weights.
  bool identical = true;
  for (const auto& a : plan.ranks)
    for (const auto& b : plan.ranks)
      if (a.tp == b.tp && a.pp == b.pp && a.cp == b.cp && hashes[a.rank] != hashes[b.rank]) identical = false;
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  return json{
      {"format_version", 1},
      {"generator", "dplan"},
      {"plan", plan.path},
      {"layout",
       {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"cp", p.cp}, {"micro_batch", p.micro_batch},
        {"num_microbatches", plan.num_microbatches}, {"global_batch", plan.training.global_batch},
        {"seq_len", plan.training.seq_len}, {"schedule", costmodel::to_string(p.schedule)}, {"zero_stage", p.zero_stage},
        {"recompute", costmodel::to_string(p.recompute)}, {"sequence_parallel", p.sequence_parallel}}},
      {"config", config},
      {"environment",
       {{"torch_version", TORCH_VERSION}, {"hostname", host}, {"cpu", cpu_model()},
        {"cores", std::thread::hardware_concurrency()}, {"device_name", config["device_name"]},
        {"world_size", world_size}}},
      {"steps", steps},
      {"step_time_s",
       {{"median", median}, {"mean", mean}, {"min", percentile(measured, 0)}, {"max", percentile(measured, 1)},
        {"p10", percentile(measured, 0.1)}, {"p90", percentile(measured, 0.9)}, {"stdev", std::sqrt(var)},
        {"count", measured.size()}}},
      {"tokens_per_s", median > 0 ? tokens / median : 0.0},
      {"phases_s", phases},
      {"phases_by_rank_s", by_rank},
      {"memory", memory},
      {"memory_source", memory_source},
      {"stage_of_rank", stage_of_rank},
      {"replicas", {{"identical", identical}, {"weights_hash_by_rank", hashes}}}};
}

}  // namespace dplan::executor
