#include "dplan/planner/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <tuple>
#include <sstream>
#include <utility>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/units.h"

namespace dplan::planner {
using namespace costmodel;

double MfuBreakdown::losses_s() const {
  double s = 0;
  for (const Loss& l : losses) s += l.seconds;
  return s;
}

MfuBreakdown explain_time(const TimeBreakdown& t) {
  MfuBreakdown b;
  b.step_time_s = t.step_time_s;
  b.mfu = t.mfu;
  b.ideal_s = t.mfu * t.step_time_s;
  const double compute_s = t.forward_s + t.backward_s;
  const std::tuple<const char*, const char*, double> rows[] = {
      {"gemm_efficiency", "GEMM efficiency", t.gemm_s - b.ideal_s},
      {"non_gemm", "non-GEMM work", compute_s - t.gemm_s - t.comm_contention_s},
      {"comm_contention", "SMs taken by hidden comm", t.comm_contention_s},
      {"recompute", "recompute", t.recompute_s},
      {"tp_comm", "exposed TP comm", t.tp_comm_s},
      {"cp_comm", "exposed CP comm", t.cp_comm_s},
      {"ep_comm", "exposed EP comm", t.ep_comm_s},
      {"pp_p2p", "exposed PP send/recv", t.pp_p2p_s},
      {"dp_comm", "exposed DP comm", t.dp_comm_s + t.param_gather_s},
      {"pp_bubble", "pipeline bubble", t.pp_bubble_s},
      {"optimizer", "optimizer", t.optimizer_s + t.offload_s},
      {"overhead", "fixed costs", t.overhead_s},
  };
  for (const auto& [key, name, seconds] : rows)
    b.losses.push_back({key, name, seconds, t.step_time_s > 0 ? seconds / t.step_time_s : 0.0});
  return b;
}

ClusterSpec plan_cluster(const Plan& plan, const std::string& file, const ProfileStore& store) {
  const json& cluster = plan.cluster;
  if (!cluster.is_object() || !cluster.contains("name") || !cluster.at("name").is_string())
    throw InputError(file + ": /cluster/name: expected the name of the cluster the plan was made for");
  const std::string name = cluster.at("name").get<std::string>();
  const std::vector<std::string> known = store.cluster_names();
  if (std::find(known.begin(), known.end(), name) == known.end())
    throw InputError(file + ": /cluster/name: " + quote_for_message(name) +
                     " is not a cluster profile here; give --cluster NAME or a path to its profile");
  return store.load_cluster(name);
}

namespace {

// Memory with the case's headroom, then time, of a validated case.
Estimated priced(const PlanCase& c, const Network& net) {
  Estimated e;
  e.memory = estimate_memory(c.model, c.cluster, c.training, c.parallel, c.headroom_fraction);
  e.time = estimate_time(c.model, net, c.training, c.parallel, e.memory, c.overlap);
  return e;
}

}  // namespace

Estimated estimate_case(const PlanCase& c) {
  // Validated before a network is built for its world size.
  validate(c.model, c.cluster, c.training, c.parallel, c.parallel.world_size());
  return priced(c, Network(c.cluster, c.parallel.world_size()));
}

Estimated estimate_case(const PlanCase& c, const Network& net) {
  validate(c.model, c.cluster, c.training, c.parallel, net.world_size());
  return priced(c, net);
}

namespace {

std::string fmt(const char* format, double v) {
  char buf[128];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The flags of `dplan estimate` for a plan, in order, as (flag, value) pairs; value "" for a switch.
std::vector<std::pair<std::string, std::string>> flag_list(const PlanCase& c) {
  const ParallelConfig& p = c.parallel;
  std::vector<std::pair<std::string, std::string>> f = {
      {"--model", c.model.name},
      {"--cluster", c.cluster.name},
      {"--gpus", std::to_string(p.world_size())},
      {"--global-batch", std::to_string(c.training.global_batch)},
      {"--seq", std::to_string(c.training.seq_len)},
      {"--precision", to_string(c.training.precision)},
      {"--tp", std::to_string(p.tp)},
      {"--pp", std::to_string(p.pp)},
      {"--dp", std::to_string(p.dp)}};
  if (p.cp > 1) f.push_back({"--cp", std::to_string(p.cp)});
  if (p.ep > 1) f.push_back({"--ep", std::to_string(p.ep)});
  if (p.etp > 0 && p.etp != p.tp) f.push_back({"--etp", std::to_string(p.etp)});
  if (p.vpp > 1) f.push_back({"--vpp", std::to_string(p.vpp)});
  if (p.first_stage_layers) f.push_back({"--first-stage-layers", std::to_string(p.first_stage_layers)});
  if (p.last_stage_layers) f.push_back({"--last-stage-layers", std::to_string(p.last_stage_layers)});
  if (p.account_for_embedding) f.push_back({"--account-for-embedding", ""});
  if (p.account_for_loss) f.push_back({"--account-for-loss", ""});
  if (p.pp > 1) f.push_back({"--schedule", to_string(p.schedule)});
  f.push_back({"--mbs", std::to_string(p.micro_batch)});
  if (p.distributed_optimizer)
    f.push_back({"--dist-opt", ""});
  else if (p.zero_stage > 0)
    f.push_back({"--zero", std::to_string(p.zero_stage)});
  f.push_back({"--recompute", to_string(p.recompute)});
  if (p.sequence_parallel) f.push_back({"--sp", ""});
  if (p.offload_optimizer) f.push_back({"--offload", ""});
  if (p.moe_dispatcher != MoeDispatcher::alltoall) f.push_back({"--moe-dispatcher", to_string(p.moe_dispatcher)});
  if (p.overlap_ep_comm) f.push_back({"--overlap-ep-comm", ""});
  if (c.overlap.tp_comm) f.push_back({"--tp-comm-overlap", ""});
  if (!c.overlap.grad_reduce) f.push_back({"--no-overlap-grad-reduce", ""});
  if (!c.overlap.param_gather) f.push_back({"--no-overlap-param-gather", ""});
  if (c.training.attention != Attention::flash) f.push_back({"--attention", to_string(c.training.attention)});
  if (c.training.fp32_grads) f.push_back({"--fp32-grads", ""});
  if (c.training.grad_reduce_in_bf16) f.push_back({"--grad-reduce-in-bf16", ""});
  if (c.training.bf16_adam_moments) f.push_back({"--bf16-adam-moments", ""});
  if (c.training.cross_entropy_fusion) f.push_back({"--cross-entropy-fusion", ""});
  if (c.training.embedding_wgrad_deferral)
    f.push_back({"--defer-embedding-wgrad", std::to_string(*c.training.embedding_wgrad_deferral)});
  if (p.recompute == Recompute::selective && !c.training.recompute_modules.is_default()) {
    f.push_back({"--recompute-modules", to_string(c.training.recompute_modules, ",")});
  }
  if (!c.training.gradient_accumulation_fusion) f.push_back({"--no-gradient-accumulation-fusion", ""});
  if (c.headroom_fraction != kDefaultHeadroomFraction) f.push_back({"--headroom", fmt("%g", c.headroom_fraction)});
  return f;
}

std::string join(const std::vector<std::pair<std::string, std::string>>& flags) {
  std::string s;
  for (const auto& [flag, value] : flags) s += (s.empty() ? "" : " ") + flag + (value.empty() ? "" : " " + value);
  return s;
}

// The flags that differ: new or changed ones as given, dropped ones as "(drop --x)".
std::string changed_flags(const PlanCase& from, const PlanCase& to) {
  const auto a = flag_list(from), b = flag_list(to);
  std::vector<std::pair<std::string, std::string>> changed;
  for (const auto& f : b)
    if (std::find(a.begin(), a.end(), f) == a.end()) changed.push_back(f);
  std::string s = join(changed);
  for (const auto& f : a) {
    const std::string& flag = f.first;
    if (std::none_of(b.begin(), b.end(), [&](const auto& g) { return g.first == flag; }))
      s += (s.empty() ? "(drop " : " (drop ") + flag + ")";
  }
  return s;
}

}  // namespace

std::string estimate_flags(const PlanCase& plan) { return join(flag_list(plan)); }

namespace {

// A change to the plan, of a kind: only the best of a kind is shown (one micro-batch size, one vpp, ...).
struct Change {
  std::string kind, what;
  PlanCase changed;
  bool same_math = true;
};

// The changes to one plan, in the order they are tried.
class ChangeList {
 public:
  explicit ChangeList(const PlanCase& plan) : plan_(plan) {}
  // The kind of the changes added from here on.
  void kind(std::string kind) { kind_ = std::move(kind); }
  void add(std::string what, const std::function<void(PlanCase&)>& edit, bool same_math = true) {
    PlanCase c = plan_;
    edit(c);
    changes_.push_back({kind_, std::move(what), std::move(c), same_math});
  }
  std::vector<Change>& changes() { return changes_; }

 private:
  const PlanCase& plan_;
  std::string kind_;
  std::vector<Change> changes_;
};

// The pipeline's fill: the micro-batch size and interleaving.
void add_pipeline_changes(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  const int m = num_microbatches(plan.training, p);
  // Micro-batch size at the same global batch: smaller means more micro-batches per pipeline (a
  // smaller bubble, less activation memory), larger means bigger GEMMs.
  list.kind("micro-batch");
  for (int mbs : {1, 2, 4, 8, 16}) {
    if (mbs == p.micro_batch || check_batch(plan.training, mbs, p.dp) != LayoutRule::ok) continue;
    const int m2 = plan.training.global_batch / (mbs * p.dp);
    list.add((mbs < p.micro_batch ? "more micro-batches: micro-batch " : "larger micro-batches: micro-batch ") +
                 std::to_string(mbs) + " (was " + std::to_string(p.micro_batch) + "), " + std::to_string(m2) +
                 " per pipeline (was " + std::to_string(m) + ")",
             [mbs](PlanCase& c) { c.parallel.micro_batch = mbs; });
  }
  // Interleaving: vpp model chunks per pipeline rank divide the bubble by vpp.
  list.kind("vpp");
  if (p.pp > 1)
    for (int vpp = 1; vpp <= 8; ++vpp) {
      if (vpp == p.vpp) continue;
      list.add(vpp == 1 ? "no interleaving: vpp 1 (was " + std::to_string(p.vpp) + ")"
                        : "interleaved schedule: vpp " + std::to_string(vpp) + " (was " + std::to_string(p.vpp) + ")",
               [vpp](PlanCase& c) {
                 c.parallel.vpp = vpp;
                 c.parallel.schedule = vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
               });
    }
}

// Tensor parallel's communication: overlapped with GEMMs, and sequence parallel.
void add_tensor_parallel_changes(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  list.kind("tp-comm-overlap");
  if (p.tp > 1 && !plan.overlap.tp_comm)
    list.add(p.sequence_parallel ? "overlap tensor-parallel communication with GEMMs"
                                 : "overlap tensor-parallel communication with GEMMs (with sequence parallel, which it needs)",
             [](PlanCase& c) {
               c.overlap.tp_comm = true;
               c.parallel.sequence_parallel = true;
             });
  list.kind("sp");
  if (p.tp > 1 && !p.sequence_parallel)
    list.add("sequence parallel", [](PlanCase& c) { c.parallel.sequence_parallel = true; });
}

// MoE communication (Megatron-Core's): the EP overlap, and DeepEP's dispatcher. Where the rules
// refuse one (pp without interleaving, full recompute, a PCIe node) evaluate_change drops it.
void add_expert_parallel_changes(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  if (!plan.model.is_moe()) return;
  list.kind("ep-overlap");
  if (p.ep > 1 && !p.overlap_ep_comm)
    list.add("hide the expert-parallel dispatch and combine behind another micro-batch's compute (EP overlap)",
             [](PlanCase& c) { c.parallel.overlap_ep_comm = true; });
  list.kind("moe-dispatcher");
  if (p.ep * p.expert_tp() > 1 && p.moe_dispatcher == MoeDispatcher::alltoall)
    list.add("DeepEP's dispatch and combine kernels (was the alltoall dispatcher)",
             [](PlanCase& c) { c.parallel.moe_dispatcher = MoeDispatcher::deepep; });
}

// Less recompute, where it still fits.
void add_recompute_changes(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  list.kind("recompute");
  if (p.recompute == Recompute::full)
    list.add("less recompute: selective (was full)", [](PlanCase& c) { c.parallel.recompute = Recompute::selective; });
  if (p.recompute != Recompute::none)
    list.add(std::string("less recompute: none (was ") + to_string(p.recompute) + ")",
             [](PlanCase& c) { c.parallel.recompute = Recompute::none; });
}

// Data parallel's communication and sharding, and the optimizer's offload.
void add_data_parallel_changes(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  list.kind("overlap-grad-reduce");
  if (!plan.overlap.grad_reduce)
    list.add("overlap gradient reduction with backward", [](PlanCase& c) { c.overlap.grad_reduce = true; });
  list.kind("overlap-param-gather");
  if (!plan.overlap.param_gather)
    list.add("overlap parameter gathers with forward", [](PlanCase& c) { c.overlap.param_gather = true; });
  list.kind("sharding");
  if (p.dp * p.cp > 1 && !p.distributed_optimizer)
    list.add("distributed optimizer (was ZeRO " + std::to_string(p.zero_stage) + ")", [](PlanCase& c) {
      c.parallel.distributed_optimizer = true;
      c.parallel.zero_stage = 0;
    });
  if (p.zero_stage >= 2)
    list.add("ZeRO 1 (was ZeRO " + std::to_string(p.zero_stage) + "): no per-layer gathers or gradient scatters",
             [](PlanCase& c) { c.parallel.zero_stage = 1; });
  list.kind("offload");
  if (p.offload_optimizer)
    list.add("optimizer states on the GPU (no offload)", [](PlanCase& c) { c.parallel.offload_optimizer = false; });
}

// A larger global batch fills the pipeline too, but it changes the training (tokens per step,
// the learning-rate schedule): said apart from the like-for-like changes.
void add_global_batch_change(ChangeList& list, const PlanCase& plan) {
  const ParallelConfig& p = plan.parallel;
  const int m = num_microbatches(plan.training, p);
  list.kind("global-batch");
  if (p.pp > 1 && 2LL * plan.training.global_batch <= kMaxGlobalBatch)
    list.add("larger global batch: " + std::to_string(2 * plan.training.global_batch) + " sequences (was " +
                 std::to_string(plan.training.global_batch) + "), " + std::to_string(2 * m) +
                 " micro-batches per pipeline; changes the training, not only its speed",
             [](PlanCase& c) { c.training.global_batch *= 2; }, false);
}

// The change re-estimated, or nullopt where the rules refuse it, it does not fit, or it gains
// under 0.1 % (not worth a line).
std::optional<Suggestion> evaluate_change(const PlanCase& plan, const TimeBreakdown& time, const Change& ch,
                                          const Network& net) {
  Estimated e;
  try {
    e = estimate_case(ch.changed, net);
  } catch (const InputError&) {
    return std::nullopt;  // a layout the rules refuse (vpp not dividing the stages' layers, ...)
  }
  if (!e.memory.fits) return std::nullopt;
  Suggestion s;
  s.kind = ch.kind;
  s.what = ch.what;
  s.flags = changed_flags(plan, ch.changed);
  s.changed = ch.changed;
  s.step_time_s = e.time.step_time_s;
  s.tokens_per_s = e.time.tokens_per_s;
  s.gain = e.time.tokens_per_s / time.tokens_per_s - 1;
  s.peak_bytes = e.memory.peak_bytes;
  s.same_math = ch.same_math;
  if (!(s.gain > 1e-3)) return std::nullopt;
  return s;
}

// The best like-for-like change of each kind, most gain first, at most max_count of them, then the
// best change that changes the training.
std::vector<Suggestion> rank_suggestions(std::vector<Suggestion> same, std::vector<Suggestion> different,
                                         size_t max_count) {
  auto by_gain = [](const Suggestion& a, const Suggestion& b) { return a.gain > b.gain; };
  std::stable_sort(same.begin(), same.end(), by_gain);
  std::vector<std::string> kinds;
  same.erase(std::remove_if(same.begin(), same.end(),
                            [&](const Suggestion& s) {
                              if (std::find(kinds.begin(), kinds.end(), s.kind) != kinds.end()) return true;
                              kinds.push_back(s.kind);
                              return false;
                            }),
             same.end());
  if (same.size() > max_count) same.resize(max_count);
  std::stable_sort(different.begin(), different.end(), by_gain);
  if (!different.empty()) same.push_back(std::move(different.front()));
  return same;
}

}  // namespace

std::vector<Suggestion> suggest_changes(const PlanCase& plan, const TimeBreakdown& time, size_t max_count) {
  ChangeList list(plan);
  add_pipeline_changes(list, plan);
  add_tensor_parallel_changes(list, plan);
  add_expert_parallel_changes(list, plan);
  add_recompute_changes(list, plan);
  add_data_parallel_changes(list, plan);
  add_global_batch_change(list, plan);

  // Every change keeps the cluster and the world size: one network prices them all.
  const Network net(plan.cluster, plan.parallel.world_size());
  std::vector<Suggestion> same, different;
  std::vector<PlanCase> seen;
  for (const Change& ch : list.changes()) {
    if (std::find_if(seen.begin(), seen.end(), [&](const PlanCase& s) {
          return s.parallel == ch.changed.parallel && s.overlap == ch.changed.overlap &&
                 s.training == ch.changed.training;
        }) != seen.end())
      continue;
    seen.push_back(ch.changed);
    if (std::optional<Suggestion> s = evaluate_change(plan, time, ch, net))
      (s->same_math ? same : different).push_back(std::move(*s));
  }
  return rank_suggestions(std::move(same), std::move(different), max_count);
}

std::string explain_table(const MfuBreakdown& b, const std::vector<Suggestion>& suggestions, const PlanCase* plan) {
  std::ostringstream o;
  o << "why MFU is " << fmt("%.1f", 100 * b.mfu)
    << " %: the step against its ideal (model FLOPs at the GPUs' dense peak)\n";
  o << "                        time (ms)  share\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %10.1f  %5.1f %%\n", "ideal (= MFU)", b.ideal_s * 1e3,
                b.step_time_s > 0 ? 100 * b.ideal_s / b.step_time_s : 0.0);
  o << line;
  for (const Loss& l : b.losses) {
    if (l.seconds == 0) continue;
    std::snprintf(line, sizeof line, "%-22s %10.1f  %5.1f %%\n", l.name.c_str(), l.seconds * 1e3, 100 * l.share);
    o << line;
  }
  std::snprintf(line, sizeof line, "%-22s %10.1f  100.0 %%\n", "step", b.step_time_s * 1e3);
  o << line;
  const auto bubble = std::find_if(b.losses.begin(), b.losses.end(), [](const Loss& l) { return l.key == "pp_bubble"; });
  if (plan && plan->parallel.pp > 1 && bubble != b.losses.end() && bubble->seconds > 0) {
    // The textbook fill-and-drain idle fraction (Narayanan et al. 2021, Sec. 2.2): (pp - 1) / (vpp * m)
    // of the ideal time, m the micro-batches per pipeline; the bubble above is the cost model's play-out.
    const ParallelConfig& p = plan->parallel;
    const int m = num_microbatches(plan->training, p);
    o << "the bubble shrinks as (pp - 1) / (vpp x m): pp " << p.pp << ", vpp " << p.vpp << ", m = " << m
      << " micro-batches per pipeline (global batch " << plan->training.global_batch << " / (micro-batch "
      << p.micro_batch << " x dp " << p.dp << ")); m counts micro-batches, it is not the micro-batch size\n";
  }
  o << "\nchanges that recover the most (each re-estimated; it must still fit in memory with the headroom)\n";
  if (suggestions.empty()) {
    o << "  none found: no single change tried is faster and still fits\n";
    return o.str();
  }
  int i = 0;
  for (const Suggestion& s : suggestions) {
    std::snprintf(line, sizeof line, "%2d  %+6.1f %% throughput, step %.3f s, %.1f GiB peak: ", ++i, 100 * s.gain,
                  s.step_time_s, s.peak_bytes / kGiB);
    o << line << s.what << "\n      dplan estimate " << estimate_flags(s.changed) << "\n      changed: " << s.flags
      << "\n";
  }
  return o.str();
}

json to_json(const MfuBreakdown& b) {
  json losses = json::array();
  for (const Loss& l : b.losses)
    losses.push_back({{"key", l.key}, {"name", l.name}, {"seconds", l.seconds}, {"share", l.share}});
  return json{{"mfu", b.mfu}, {"ideal_s", b.ideal_s}, {"step_time_s", b.step_time_s}, {"losses", losses}};
}

json to_json(const Suggestion& s) {
  return json{{"kind", s.kind},
              {"what", s.what},
              {"flags", s.flags},
              {"estimate_flags", estimate_flags(s.changed)},
              {"step_time_s", s.step_time_s},
              {"tokens_per_s", s.tokens_per_s},
              {"gain", s.gain},
              {"peak_bytes", s.peak_bytes},
              {"same_math", s.same_math},
              {"parallel", to_json(s.changed.parallel)}};
}

}  // namespace dplan::planner
