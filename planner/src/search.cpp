#include "dplan/planner/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <numeric>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"

namespace dplan::planner {
using namespace costmodel;

int global_batch_for_tokens(double tokens, int seq_len) {
  return static_cast<int>(std::max(1.0, std::round(tokens / seq_len)));
}

ParallelConfig data_parallel_layout(int gpus) {
  ParallelConfig p;
  p.dp = gpus;
  p.micro_batch = 1;
  return p;
}

int default_global_batch(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
                         const ParallelConfig& layout, const OverlapOptions& overlap) {
  const int tokens_default = global_batch_for_tokens(kDefaultBatchTokens, training.seq_len);
  if (cluster.cores_per_node <= 0) return tokens_default;  // dedicated devices: today's default, unchanged
  const long long multiple = std::max(1LL, static_cast<long long>(layout.micro_batch) * std::max(1, layout.dp));
  if (multiple > kMaxGlobalBatch) return tokens_default;  // validate() names the problem
  const long long cap = std::max<long long>(multiple, std::min(tokens_default, kMaxGlobalBatch));
  const long long world = bounded_world_size(layout.tp, layout.pp, layout.dp, layout.cp);
  if (world > kMaxGpus) return tokens_default;  // validate() names the problem
  // Whether the layout takes `batch` sequences (the caller's own validation names any problem).
  auto valid = [&](long long batch) {
    TrainingSpec t = training;
    t.global_batch = static_cast<int>(batch);
    try {
      validate(model, cluster, t, layout, static_cast<int>(world));
      return true;
    } catch (const InputError&) {
      return false;
    }
  };
  if (!valid(multiple)) return tokens_default;
  const Network net(cluster, static_cast<int>(world));
  long long batch = multiple;
  while (2 * batch <= cap && valid(2 * batch)) {
    TrainingSpec t = training;
    t.global_batch = static_cast<int>(2 * batch);
    const MemoryEstimate mem = estimate_memory(model, cluster, t, layout);
    if (estimate_time(model, net, t, layout, mem, overlap).step_time_s > kCpuStepTarget_s) break;
    batch *= 2;
  }
  return static_cast<int>(batch);
}

int layout_complexity(const ParallelConfig& p) {
  return (p.tp > 1) + (p.pp > 1) + (p.cp > 1) + (p.ep > 1) + (p.etp > 0 && p.etp != p.tp) + (p.zero_stage > 0 || p.distributed_optimizer) +
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
  if (!runs([](ParallelConfig& p) { p.vpp = 2, p.schedule = Schedule::interleaved; })) s.max_vpp = 1;
  if (!runs([](ParallelConfig& p) { p.zero_stage = 1, p.offload_optimizer = true; })) s.allow_offload = false;
  if (!runs([](ParallelConfig& p) { p.dp = 2, p.ep = 2; })) s.allow_expert_parallel = false;
  if (!runs([](ParallelConfig& p) { p.recompute = Recompute::selective; }) ||
      !runs([](ParallelConfig& p) { p.recompute = Recompute::full; }))
    s.allow_recompute = false;
  return s;
}

namespace {

bool ok(LayoutRule rule) { return rule == LayoutRule::ok; }

// Whether a constraint's list lets `value` through (an empty list fixes nothing).
template <class T>
bool allows(const std::vector<T>& list, T value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

// The ZeRO stage a layout counts as for --zero: the distributed optimizer shards as ZeRO-1 does.
int zero_of(const ParallelConfig& p) { return p.distributed_optimizer ? 1 : p.zero_stage; }

// The dimensions LayoutConstraints fixes, in the order the report names them: each a name, its
// list as ints, and how a layout's value reads.
struct ConstrainedDimension {
  const char* name;
  std::vector<int> LayoutConstraints::*list;  // null for recompute
  int (*of)(const ParallelConfig&);
};
const std::array<ConstrainedDimension, 9> kConstrained = {{
    {"tp", &LayoutConstraints::tp, [](const ParallelConfig& p) { return p.tp; }},
    {"pp", &LayoutConstraints::pp, [](const ParallelConfig& p) { return p.pp; }},
    {"dp", &LayoutConstraints::dp, [](const ParallelConfig& p) { return p.dp; }},
    {"cp", &LayoutConstraints::cp, [](const ParallelConfig& p) { return p.cp; }},
    {"ep", &LayoutConstraints::ep, [](const ParallelConfig& p) { return p.ep; }},
    {"vpp", &LayoutConstraints::vpp, [](const ParallelConfig& p) { return p.vpp; }},
    {"zero", &LayoutConstraints::zero, zero_of},
    {"mbs", &LayoutConstraints::mbs, [](const ParallelConfig& p) { return p.micro_batch; }},
    {"recompute", nullptr, [](const ParallelConfig& p) { return static_cast<int>(p.recompute); }},
}};

std::vector<int> list_of(const LayoutConstraints& c, const ConstrainedDimension& d) {
  if (d.list) return c.*d.list;
  std::vector<int> out;
  for (Recompute r : c.recompute) out.push_back(static_cast<int>(r));
  return out;
}

std::string value_text(const ConstrainedDimension& d, int v) {
  return d.list ? std::to_string(v) : std::string(to_string(static_cast<Recompute>(v)));
}

std::string join_values(const ConstrainedDimension& d, std::vector<int> values, const char* separator) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::string out;
  for (int v : values) out += (out.empty() ? "" : separator) + value_text(d, v);
  return out;
}

// MoE parallel folding (training.h): every ep dividing the experts, with the expert tensor
// parallel size Megatron defaults to (etp = tp) and the one the folding paper recommends
// (etp = 1, Liu et al. 2025, arXiv 2504.14960), where ep*etp divides tp*cp*dp. Each as (ep, etp).
std::vector<std::pair<int, int>> expert_choices(const ModelSpec& m, const SearchSpace& space, ParallelConfig p) {
  std::vector<std::pair<int, int>> eps;
  if (!m.is_moe()) {
    eps.push_back({1, 0});
    return eps;
  }
  for (p.ep = 1; p.ep <= (space.allow_expert_parallel ? m.num_experts : 1); ++p.ep)
    for (int etp : p.tp == 1 ? std::vector<int>{1} : std::vector<int>{p.tp, 1}) {
      if (!allows(space.constraints.ep, p.ep)) continue;
      p.etp = etp;
      if (ok(check_expert_parallel(m, p))) eps.push_back({p.ep, etp});
    }
  return eps;
}

// Each schedule with the split Megatron users give a pp (x vpp) that does not divide the layers
// (megatron_split, training.h); a (pp, vpp) without one is left out.
std::vector<ParallelConfig> schedule_choices(const ModelSpec& m, const TrainingSpec& t, const SearchSpace& space,
                                             ParallelConfig p) {
  std::vector<ParallelConfig> schedules;
  const std::vector<int>& vpps = space.constraints.vpp;
  p.schedule = Schedule::one_f_one_b, p.vpp = 1;
  if (auto split = megatron_split(m.num_layers, p); allows(vpps, 1) && split && ok(check_pipeline_parallel(m, *split)))
    schedules.push_back(*split);
  p.schedule = Schedule::interleaved;
  const int max_vpp = vpps.empty() ? space.max_vpp : *std::max_element(vpps.begin(), vpps.end());
  for (p.vpp = 2; p.vpp <= max_vpp; ++p.vpp)
    if (auto split = megatron_split(m.num_layers, p); allows(vpps, p.vpp) &&
        split && ok(check_pipeline_parallel(m, *split)) && ok(check_schedule(m, t, *split)))
      schedules.push_back(*split);
  return schedules;
}

// Appends `split` (the sizes, micro-batch, schedule and layer split chosen) with the expert sizes
// `expert` = (ep, etp) and every sharding, recompute, sequence-parallel and offload choice the
// space allows. Throws InputError past kMaxLayouts.
void add_layouts(std::vector<ParallelConfig>& out, const ModelSpec& m, const TrainingSpec& t,
                 const ParallelConfig& split, std::pair<int, int> expert, const SearchSpace& space) {
  for (int zero = 0; zero <= 4; ++zero) {  // 4 stands for the distributed optimizer
    // Sharding over one data-parallel rank changes nothing: left out.
    if (split.dp * split.cp == 1 && zero > 0) continue;
    if (zero == 4 ? !space.allow_distributed_optimizer : zero > space.max_zero_stage) continue;
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
      for (bool sp : {false, true}) {
        ParallelConfig q = split;  // with its schedule and layer split
        q.sequence_parallel = sp;
        if (!ok(check_sequence_parallel(q))) continue;
        if (rc != Recompute::none && !space.allow_recompute) continue;
        for (bool offload : {false, true}) {
          // Offload is tried only with sharded optimizer states (ZeRO 1-3, distributed optimizer).
          if (offload && (!space.allow_offload || zero == 0)) continue;
          q.ep = expert.first;
          q.etp = expert.second;
          q.zero_stage = zero == 4 ? 0 : zero;
          q.distributed_optimizer = zero == 4;
          q.offload_optimizer = offload;
          q.recompute = rc;
          // The MoE communication asked for, where the layout takes it (SearchSpace).
          q.moe_dispatcher = MoeDispatcher::alltoall;
          q.overlap_ep_comm = false;
          if (m.is_moe() && space.moe_dispatcher == MoeDispatcher::deepep && q.ep * q.expert_tp() > 1)
            q.moe_dispatcher = MoeDispatcher::deepep;
          if (m.is_moe() && space.overlap_ep_comm) {
            q.overlap_ep_comm = true;
            if (!ok(check_moe_comm(m, t, q))) q.overlap_ep_comm = false;
          }
          if (!allows(space.constraints.zero, zero_of(q)) || !allows(space.constraints.recompute, q.recompute)) continue;
          if (out.size() == kMaxLayouts)
            throw InputError("the search space holds more than " + std::to_string(kMaxLayouts) + " layouts for " +
                             std::to_string(space.gpus) +
                             " GPUs; plan fewer GPUs, or evaluate one layout with dplan estimate");
          out.push_back(q);
        }
      }
  }
}

}  // namespace

// Walks the space dimension by dimension, outermost first, so each rule (training.h) is checked
// once for the layouts that share that dimension; the order of the loops is the order of the
// layouts (exact ties in step time go to the earlier one). `p` holds the dimensions chosen so far:
// each check reads only those.
std::vector<ParallelConfig> enumerate_layouts(const ModelSpec& m, const TrainingSpec& t, const SearchSpace& space) {
  std::vector<ParallelConfig> out;
  const int n = space.gpus;
  const LayoutConstraints& fixed = space.constraints;
  // cp: powers of 2 up to max_cp, or the sizes the user fixed; the micro-batches likewise.
  std::vector<int> cps = fixed.cp;
  if (cps.empty())
    for (int cp = 1; cp <= space.max_cp; cp *= 2) cps.push_back(cp);
  const std::vector<int>& micro_batches = fixed.mbs.empty() ? space.micro_batches : fixed.mbs;
  ParallelConfig p;
  for (p.tp = 1; p.tp <= n; ++p.tp) {  // tp, cp, pp and dp: divisors of n, their product n
    if (n % p.tp || !allows(fixed.tp, p.tp) || !ok(check_tensor_parallel(m, p.tp))) continue;
    for (int cp : cps) {
      p.cp = cp;
      if (p.tp * p.cp > n || (n / p.tp) % p.cp || !ok(check_context_parallel(t, p.cp))) continue;
      for (p.pp = 1; p.tp * p.cp * p.pp <= n; ++p.pp) {
        // The layers' split is checked per schedule, with the split megatron_split gives it.
        if ((n / (p.tp * p.cp)) % p.pp || !allows(fixed.pp, p.pp)) continue;
        p.dp = n / (p.tp * p.cp * p.pp);
        if (!allows(fixed.dp, p.dp)) continue;
        const std::vector<std::pair<int, int>> eps = expert_choices(m, space, p);
        for (int mbs : micro_batches) {
          if (!ok(check_batch(t, mbs, p.dp))) continue;
          p.micro_batch = mbs;
          const std::vector<ParallelConfig> schedules = schedule_choices(m, t, space, p);
          for (auto expert : eps)
            for (const ParallelConfig& split : schedules) add_layouts(out, m, t, split, expert, space);
        }
      }
    }
  }
  return out;
}

bool LayoutConstraints::empty() const {
  for (const ConstrainedDimension& d : kConstrained)
    if (!list_of(*this, d).empty()) return false;
  return true;
}

bool LayoutConstraints::admits(const ParallelConfig& p) const {
  for (const ConstrainedDimension& d : kConstrained)
    if (!allows(list_of(*this, d), d.of(p))) return false;
  return true;
}

std::string LayoutConstraints::describe() const {
  std::string out;
  for (const ConstrainedDimension& d : kConstrained)
    if (const std::vector<int> list = list_of(*this, d); !list.empty())
      out += (out.empty() ? "" : " · ") + std::string(d.name) + " " + join_values(d, list, ",");
  return out;
}

std::string LayoutConstraints::values_taken(const std::vector<ParallelConfig>& layouts) const {
  std::string out;
  for (const ConstrainedDimension& d : kConstrained) {
    if (list_of(*this, d).empty()) continue;
    std::vector<int> values;
    for (const ParallelConfig& p : layouts) values.push_back(d.of(p));
    out += (out.empty() ? "" : "; ") + std::string(d.name) + " takes " +
           (values.empty() ? std::string("no value") : join_values(d, values, ", "));
  }
  return out;
}

RankBy rank_by_from_string(const std::string& s) {
  if (s == "step-time") return RankBy::step_time;
  if (s == "goodput") return RankBy::goodput;
  throw InputError("--rank-by " + quote_for_message(s) + " is not one of: step-time, goodput");
}

namespace {
// Ranking: faster first (step time, or time to train with failures); exact ties go to the simpler
// layout.
struct Better {
  RankBy rank_by;
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (rank_by == RankBy::goodput &&
        a.evaluation.time_to_train_with_failures_s != b.evaluation.time_to_train_with_failures_s)
      return a.evaluation.time_to_train_with_failures_s < b.evaluation.time_to_train_with_failures_s;
    if (a.evaluation.step_time_s != b.evaluation.step_time_s) return a.evaluation.step_time_s < b.evaluation.step_time_s;
    return a.complexity < b.complexity;
  }
};
}  // namespace

SearchResult search(const std::vector<ParallelConfig>& layouts, const CostFunction& cost, int top_k, RankBy rank_by) {
  const Better better{rank_by};
  if (layouts.empty()) throw InputError("no valid parallel layout exists for this GPU count, model and batch");
  SearchResult r;
  std::vector<Candidate> feasible;
  feasible.reserve(layouts.size());  // pages are touched only as candidates arrive
  // Only the best so far and its exact equals keep their memory estimate (the report prints the
  // winner's); the rest give theirs back at once, so the search holds no more memory than one.
  std::vector<size_t> leaders;
  for (const auto& p : layouts) {
    Evaluation e = cost(p);
    ++r.evaluated;
    if (!e.fits) {
      ++r.rejected[e.reject_reason];
      if (e.step_time_s > 0) r.near_misses.push_back({p, std::move(e), layout_complexity(p)});
      continue;
    }
    Candidate c{p, std::move(e), layout_complexity(p)};
    if (leaders.empty() || better(c, feasible[leaders[0]])) {
      for (size_t i : leaders) feasible[i].evaluation.memory = {};
      leaders.assign(1, feasible.size());
    } else if (!better(feasible[leaders[0]], c)) {
      leaders.push_back(feasible.size());
    } else {
      c.evaluation.memory = {};
    }
    feasible.push_back(std::move(c));
  }
  r.feasible = static_cast<long>(feasible.size());
  // Sorted by pointer: the candidates carry their evaluation, and only the ranked and the Pareto
  // ones are copied out. (The same comparisons on the same sequence as sorting the
  // candidates themselves, so the same order, exact ties included.)
  std::vector<Candidate*> order(feasible.size());
  for (size_t i = 0; i < feasible.size(); ++i) order[i] = &feasible[i];
  auto before = [&better](const Candidate* a, const Candidate* b) { return better(*a, *b); };
  size_t k = std::min<size_t>(std::max(top_k, 1), order.size());
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  // Pareto frontier of (step time, peak memory): sweep by time, keep strictly smaller peaks. (Sorted
  // from the order partial_sort left, as a copy: the ranked ones are read from that order below.)
  std::vector<Candidate*> by_time = order;
  std::sort(by_time.begin(), by_time.end(), before);
  double best_peak = 1e300;
  for (const Candidate* cand : by_time)
    if (cand->evaluation.peak_bytes < best_peak) {
      best_peak = cand->evaluation.peak_bytes;
      r.pareto.push_back(*cand);
    }
  if (k == feasible.size()) {
    // Every candidate ranked (dplan ranks them all before the engine's rules pick the top):
    // put them in that order where they are, rather than copy megabytes of them.
    std::vector<size_t> from(k);  // ranked[i] = feasible[from[i]]
    for (size_t i = 0; i < k; ++i) from[i] = static_cast<size_t>(order[i] - feasible.data());
    for (size_t i = 0; i < k; ++i) {
      if (from[i] == i) continue;
      Candidate held = std::move(feasible[i]);
      size_t j = i;
      while (from[j] != i) {
        const size_t next = from[j];
        feasible[j] = std::move(feasible[next]);
        from[j] = j;
        j = next;
      }
      feasible[j] = std::move(held);
      from[j] = j;
    }
    r.ranked = std::move(feasible);
  } else {
    for (size_t i = 0; i < k; ++i) r.ranked.push_back(*order[i]);
  }
  // The near misses worth naming: faster than the best that fits, the fastest few.
  std::sort(r.near_misses.begin(), r.near_misses.end(), better);
  if (!r.ranked.empty())
    std::erase_if(r.near_misses, [&](const Candidate& c) { return !better(c, r.ranked[0]); });
  if (r.near_misses.size() > kNearMissesKept) r.near_misses.resize(kNearMissesKept);
  return r;
}

namespace {

// The layer times (layer_times) of the last kKept layouts a cost function priced, keyed by the
// layout without what layer_times does not read. Copies of the cost function share it (mutex).
struct KeptLayerTimes {
  static constexpr int kKept = 8;  // the enumeration's recompute x sequence-parallel choices fit
  std::mutex mutex;
  std::array<std::pair<ParallelConfig, LayerTimes>, kKept> kept;
  int count = 0, next = 0;

  template <class Make>
  LayerTimes of(const ParallelConfig& p, Make make) {
    ParallelConfig key = p;
    key.zero_stage = 0;
    key.distributed_optimizer = false;
    key.offload_optimizer = false;
    std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < count; ++i)
      if (kept[i].first == key) return kept[i].second;
    const LayerTimes made = make();
    kept[next] = {std::move(key), made};
    next = (next + 1) % kKept;
    count = std::min(count + 1, kKept);
    return made;
  }
};

}  // namespace

CostFunction dplan_cost_function(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                 const OverlapOptions& overlap, double headroom_fraction,
                                 std::optional<GoodputInputs> goodput_inputs) {
  // The device every layout of the network's world size is priced on, made once (time.h), and
  // the layer times of the last few layouts priced: the enumeration's innermost choices (ZeRO
  // stage, distributed optimizer, offload) do not change them (estimate_time's `layer`).
  GpuSpec device = priced_device(net.cluster(), net.world_size(), t);
  auto kept = std::make_shared<KeptLayerTimes>();
  return [&m, &net, t, overlap, headroom_fraction, goodput_inputs, device = std::move(device),
          kept](const ParallelConfig& p) {
    Evaluation e;
    // The step (and, asked, the time to train with failures) of a layout that fits or nearly does.
    auto price = [&](const MemoryEstimate& mem) {
      if (p.world_size() == net.world_size()) {
        const LayerTimes layer = kept->of(p, [&] { return layer_times(m, device, t, p); });
        e.time = estimate_time(m, net, t, p, mem, overlap, device, &layer);
      } else {
        e.time = estimate_time(m, net, t, p, mem, overlap);
      }
      e.step_time_s = e.time.step_time_s;
      if (goodput_inputs) {
        const CheckpointCost checkpoint = checkpoint_cost(m, net.cluster(), t, p, /*per_rank=*/false);
        e.time_to_train_with_failures_s = goodput(checkpoint, goodput_inputs->failures, p.world_size(),
                                                  e.step_time_s, goodput_inputs->tokens, e.time.tokens_per_s)
                                              .time_to_train_with_failures_s;
      }
    };
    MemoryEstimate mem = estimate_memory(m, net.cluster(), t, p, headroom_fraction);
    e.peak_bytes = mem.peak_bytes;
    if (!mem.fits) {
      const LargestPart largest = largest_part(mem.stages[mem.worst_stage]);
      e.reject_reason = mem.peak_bytes <= mem.usable_bytes() ? "offloaded optimizer exceeds host memory"
                        : mem.peak_bytes <= mem.capacity_bytes
                            ? std::string("leaves less than the headroom free, largest part ") + largest.name
                            : std::string("exceeds HBM, largest part ") + largest.name;
      if (mem.peak_bytes > mem.usable_bytes()) {
        e.miss_bytes = mem.peak_bytes - mem.usable_bytes();
        e.usable_bytes = mem.usable_bytes();
        e.capacity_bytes = mem.capacity_bytes;
        e.largest_part = largest.name;
        e.largest_part_bytes = largest.bytes;
        // A near miss is priced, for the report's "closest call" (SearchResult::near_misses).
        if (e.miss_bytes <= kNearMissFraction * mem.usable_bytes() &&
            mem.host_bytes_per_node <= mem.host_capacity_bytes)
          price(mem);
      }
      return e;
    }
    e.fits = true;
    price(mem);
    e.memory = std::move(mem);
    return e;
  };
}

}  // namespace dplan::planner
