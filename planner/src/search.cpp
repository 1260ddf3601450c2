#include "dplan/planner/search.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"

namespace dplan::planner {
using namespace costmodel;

int global_batch_for_tokens(double tokens, int seq_len) {
  return static_cast<int>(std::max(1.0, std::round(tokens / seq_len)));
}

int layout_complexity(const ParallelConfig& p) {
  return (p.tp > 1) + (p.pp > 1) + (p.cp > 1) + (p.ep > 1) + (p.zero_stage > 0 || p.distributed_optimizer) +
         (p.zero_stage > 1) + (p.recompute != Recompute::none) + (p.recompute == Recompute::full) +
         p.sequence_parallel + p.offload_optimizer + (p.schedule == Schedule::interleaved);
}

namespace {
TrainingSpec standard_attention() {
  TrainingSpec t;
  t.attention = Attention::standard;
  return t;
}
}  // namespace

// The space restricted, as a speed-up, by what executor_refusal (costmodel/executor_support.h)
// refuses: each feature it refuses on its own is left out of the enumeration, which leaves exactly
// the layouts it accepts (tests/planner/search_test.cpp checks it).
SearchSpace SearchSpace::runnable_by_executor(int gpus) {
  return runnable_by_executor(gpus, ModelSpec{}, standard_attention());
}

SearchSpace SearchSpace::runnable_by_executor(int gpus, const ModelSpec& model, const TrainingSpec& training) {
  if (auto why = executor_refusal(model, training, ParallelConfig{})) throw InputError(*why);
  auto runs = [&](void (*change)(ParallelConfig&)) {
    ParallelConfig p;
    change(p);
    return !executor_refusal(model, training, p);
  };
  SearchSpace s;
  s.gpus = gpus;
  if (!runs([](ParallelConfig& p) { p.cp = 2; })) s.max_cp = 1;
  if (!runs([](ParallelConfig& p) { p.vpp = 2, p.schedule = Schedule::interleaved; })) s.max_vpp = 1;
  if (!runs([](ParallelConfig& p) { p.zero_stage = 1, p.offload_optimizer = true; })) s.allow_offload = false;
  if (!runs([](ParallelConfig& p) { p.dp = 2, p.ep = 2; })) s.allow_expert_parallel = false;
  if (!runs([](ParallelConfig& p) { p.recompute = Recompute::selective; }) ||
      !runs([](ParallelConfig& p) { p.recompute = Recompute::full; }))
    s.allow_recompute = false;
  return s;
}

std::vector<ParallelConfig> enumerate_layouts(const ModelSpec& m, const TrainingSpec& t, const SearchSpace& space) {
  std::vector<ParallelConfig> out;
  const int n = space.gpus;
  const int heads = std::gcd(m.num_heads, m.num_kv_heads);
  for (int tp = 1; tp <= n && tp <= heads; ++tp) {
    if (n % tp || heads % tp || m.ffn_hidden_size % tp) continue;
    for (int cp = 1; cp <= space.max_cp && tp * cp <= n; cp *= 2) {
      if ((n / tp) % cp || (cp > 1 && t.seq_len % (2 * cp))) continue;
      for (int pp = 1; pp <= m.num_layers && tp * cp * pp <= n; ++pp) {
        if ((n / (tp * cp)) % pp) continue;
        const int dp = n / (tp * cp * pp);
        std::vector<int> eps = {1};
        if (m.is_moe() && space.allow_expert_parallel)
          for (int ep = 2; ep <= m.num_experts; ++ep)
            if (m.num_experts % ep == 0 && (dp * cp) % ep == 0) eps.push_back(ep);
        for (int mbs : space.micro_batches) {
          if (t.global_batch % (mbs * dp)) continue;
          const int microbatches = t.global_batch / (mbs * dp);
          std::vector<std::pair<Schedule, int>> schedules = {{Schedule::one_f_one_b, 1}};
          if (pp > 1 && m.num_layers % pp == 0 && microbatches >= pp)
            for (int vpp = 2; vpp <= space.max_vpp; ++vpp)
              if ((m.num_layers / pp) % vpp == 0) schedules.push_back({Schedule::interleaved, vpp});
          for (int ep : eps)
            for (auto [schedule, vpp] : schedules)
              for (int zero = 0; zero <= 4; ++zero) {  // 4 stands for the distributed optimizer
                if (dp * cp == 1 && zero > 0) continue;
                if (zero == 4 ? !space.allow_distributed_optimizer : zero > space.max_zero_stage) continue;
                for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                  for (bool sp : {false, true}) {
                    if (sp && tp == 1) continue;
                    if (rc != Recompute::none && !space.allow_recompute) continue;
                    for (bool offload : {false, true}) {
                      if (offload && (!space.allow_offload || zero == 0)) continue;
                      ParallelConfig p;
                      p.tp = tp;
                      p.pp = pp;
                      p.dp = dp;
                      p.cp = cp;
                      p.ep = ep;
                      p.vpp = vpp;
                      p.micro_batch = mbs;
                      p.zero_stage = zero == 4 ? 0 : zero;
                      p.distributed_optimizer = zero == 4;
                      p.sequence_parallel = sp;
                      p.offload_optimizer = offload;
                      p.recompute = rc;
                      p.schedule = schedule;
                      out.push_back(p);
                    }
                  }
              }
        }
      }
    }
  }
  return out;
}

namespace {
// Ranking: faster first; exactly equal step times go to the simpler layout.
bool better(const Candidate& a, const Candidate& b) {
  if (a.evaluation.step_time_s != b.evaluation.step_time_s) return a.evaluation.step_time_s < b.evaluation.step_time_s;
  return a.complexity < b.complexity;
}
}  // namespace

SearchResult search(const std::vector<ParallelConfig>& layouts, const CostFunction& cost, int top_k) {
  if (layouts.empty()) throw InputError("no valid parallel layout exists for this GPU count, model and batch");
  SearchResult r;
  std::vector<Candidate> feasible;
  for (const auto& p : layouts) {
    Evaluation e = cost(p);
    ++r.evaluated;
    if (!e.fits) {
      ++r.rejected[e.reject_reason];
      continue;
    }
    feasible.push_back({p, e, layout_complexity(p)});
  }
  r.feasible = static_cast<long>(feasible.size());
  size_t k = std::min<size_t>(std::max(top_k, 1), feasible.size());
  std::partial_sort(feasible.begin(), feasible.begin() + k, feasible.end(), better);
  r.ranked.assign(feasible.begin(), feasible.begin() + k);
  // Pareto frontier of (step time, peak memory): sweep by time, keep strictly smaller peaks.
  std::sort(feasible.begin(), feasible.end(), better);
  double best_peak = 1e300;
  for (const auto& cand : feasible)
    if (cand.evaluation.peak_bytes < best_peak) {
      best_peak = cand.evaluation.peak_bytes;
      r.pareto.push_back(cand);
    }
  return r;
}

CostFunction dplan_cost_function(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                 const OverlapOptions& overlap) {
  return [&m, &net, t, overlap](const ParallelConfig& p) {
    Evaluation e;
    MemoryEstimate mem = estimate_memory(m, net.cluster(), t, p);
    e.peak_bytes = mem.peak_bytes;
    if (!mem.fits) {
      e.reject_reason = mem.peak_bytes <= mem.capacity_bytes
                            ? "offloaded optimizer exceeds host memory"
                            : std::string("exceeds HBM, largest part ") + largest_part(mem.stages[mem.worst_stage]).name;
      return e;
    }
    e.fits = true;
    e.step_time_s = estimate_time(m, net, t, p, mem, overlap).step_time_s;
    return e;
  };
}

}  // namespace dplan::planner
