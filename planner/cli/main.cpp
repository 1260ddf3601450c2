// dplan: plan, estimate and explain distributed training layouts.
//   dplan --model 70B --gpus 64             search every layout, print the best and why
//   dplan estimate --model M --gpus N ...   one layout: memory per stage, step time by phase
//   dplan list                               presets, size shorthands, clusters, GPUs
//   dplan run plan.json                      train with that layout (executor), write run.json
//   dplan compare plan.json run.json         predicted vs measured, phase by phase
//   dplan explain plan.json                  why MFU is low, and the changes that recover the most
//   dplan export plan.json --to ENGINE       the plan as an engine's own files, or a launch of dplan-worker
//                                            (the engines: planner/include/dplan/planner/engines.h)
//   dplan check plan.json --engine ENGINE    the engine's own rules on the plan, one line per failure
// Errors in input print "dplan: error: ..." on stderr and exit 2.
#include <charconv>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <iostream>
#include <iomanip>
#include <numeric>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>

#include "dplan/costmodel/checkpoint_cost.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/costmodel/time.h"
#include "dplan/planner/engine_rules.h"
#include "dplan/planner/engines.h"
#include "dplan/planner/explain.h"
#include "dplan/planner/plan.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/report.h"
#include "dplan/planner/scaling_chart.h"
#include "dplan/planner/search.h"
#include "dplan/costmodel/units.h"

#include "calibrate_command.h"
#include "compare_command.h"
#include "explain_command.h"
#include "export_command.h"
#include "probe_command.h"
#include "run_command.h"

namespace {
namespace fs = std::filesystem;
using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;

constexpr int kDefaultSeqCap = 8192;

// Everything the command line says, parsed once and handed down.
struct Options {
  std::string profiles;
  std::string model;
  std::string cluster = "dgx-h100";
  int gpus = 0;
  std::optional<int> global_batch;
  std::optional<int> seq;
  std::string precision = "bf16";
  std::string attention = "flash";
  std::string engine = "megatron";  // costmodel/engine.h: whose implementation is priced
  bool fp32_grads = false;
  bool grad_reduce_in_bf16 = false;
  bool bf16_adam_moments = false;
  std::string recompute_modules;    // Megatron's --recompute-modules; empty: its default (core_attn)
  std::optional<int> mtp_layers;    // the model's multi-token prediction modules, overridden
  std::optional<double> mtp_loss_scale;  // their losses' weight (ModelSpec::mtp_loss_scale)
  bool cross_entropy_fusion = false;              // Megatron's --cross-entropy-loss-fusion
  std::optional<int> vocab_pad_multiple;          // Megatron's --make-vocab-size-divisible-by
  std::optional<int> embedding_wgrad_deferral;    // Megatron's --wgrad-deferral-limit (0: all)
  bool no_grad_accumulation_fusion = false;
  bool json = false;
  std::string output;               // -o plan.json
  double tokens = 1e12;             // tokens to train, for days-to-train
  int top_k = 10;
  bool no_overlap_grad = false, no_overlap_param = false, tp_overlap = false;
  bool runnable = false;            // search only layouts dplan run executes
  bool force = false;               // -o may replace a file dplan did not write
  double headroom = kDefaultHeadroomFraction;  // of HBM a plan leaves free (--headroom)
  // The search only: the dimensions the user fixed (--tp 4,8 ...), recompute's by name.
  LayoutConstraints fixed;
  std::vector<std::string> fixed_recompute;
  // estimate only
  int tp = 1, pp = 1, cp = 1, ep = 1, vpp = 1, mbs = 1, zero = 0;
  int etp = 0;                      // 0: same as tp (Megatron's default)
  std::optional<int> dp;
  bool dist_opt = false, sp = false, offload = false;
  std::string recompute = "none";
  std::string schedule;
  // MoE communication (both the search and estimate; costmodel ParallelConfig).
  std::string moe_dispatcher = "alltoall";
  bool overlap_ep_comm = false;
  int first_stage_layers = 0, last_stage_layers = 0;  // Megatron's uneven split (0: not given)
  bool account_embedding = false, account_loss = false;
  // Checkpoints and failures (costmodel/checkpoint_cost.h): the report's goodput block, --rank-by.
  FailureModel failures;
  std::string rank_by = "step-time";
};

struct Inputs {
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  OverlapOptions overlap;
};

Inputs load_inputs(const Options& o, const ProfileStore& store) {
  Inputs in;
  in.model = store.load_model(o.model);
  in.cluster = store.load_cluster(o.cluster);
  if (o.mtp_layers) in.model.mtp_layers = *o.mtp_layers;
  if (o.mtp_loss_scale) in.model.mtp_loss_scale = *o.mtp_loss_scale;
  in.training.precision = precision_from_string(o.precision);
  in.training.attention = attention_from_string(o.attention);
  in.training.fp32_grads = o.fp32_grads;
  in.training.grad_reduce_in_bf16 = o.grad_reduce_in_bf16;
  in.training.bf16_adam_moments = o.bf16_adam_moments;
  in.training.cross_entropy_fusion = o.cross_entropy_fusion;
  if (o.vocab_pad_multiple) in.training.vocab_pad_multiple = *o.vocab_pad_multiple;
  in.training.embedding_wgrad_deferral = o.embedding_wgrad_deferral;
  if (!o.recompute_modules.empty()) in.training.recompute_modules = recompute_modules_from_string(o.recompute_modules);
  in.training.gradient_accumulation_fusion = !o.no_grad_accumulation_fusion;
  in.training.engine = costmodel::engine_mechanics_from_label(o.engine);
  // The model's sequence length: max_position_embeddings, capped at 8192 for long-context
  // checkpoints whose pre-training ran at 8192 (Llama 3.1, Mistral).
  in.training.seq_len = o.seq.value_or(std::min(in.model.max_seq_len, kDefaultSeqCap));
  if (in.training.seq_len > kMaxSeqLen)
    throw InputError("the model's sequence length " + std::to_string(in.training.seq_len) + " is above " +
                     std::to_string(kMaxSeqLen) + "; give --seq");
  in.overlap.grad_reduce = !o.no_overlap_grad;
  in.overlap.param_gather = !o.no_overlap_param;
  in.overlap.tp_comm = o.tp_overlap;
  // Every input is read: -o may now be checked against them, before any search.
  if (!o.output.empty()) check_output_path(o.output, plan_output(), o.force);
  return in;
}

std::string header(const Inputs& in, int gpus) {
  std::ostringstream o;
  int nodes = (gpus + in.cluster.gpus_per_node - 1) / in.cluster.gpus_per_node;
  o << in.model.name << " (" << format_params(num_params(in.model)) << " parameters";
  if (in.model.is_moe()) o << ", " << format_params(num_active_params(in.model)) << " active";
  o << ") on " << gpus << " x " << in.cluster.gpu.name << " (" << in.cluster.name << ", " << nodes
    << (nodes == 1 ? " node" : " nodes") << "), " << to_string(in.training.precision) << "\n";
  return o.str();
}

// The never-probed note (planner/profiles.h) as a line of the text report, or nothing.
std::string unprobed_line(const ClusterSpec& cluster) {
  const std::string note = unprobed_profile_note(cluster);
  return note.empty() ? "" : "! " + note + "\n";
}

std::string days(double seconds) {
  char buf[64];
  if (seconds > 86400 * 2)
    std::snprintf(buf, sizeof buf, "%.1f days", seconds / 86400);
  else
    std::snprintf(buf, sizeof buf, "%.1f hours", seconds / 3600);
  return buf;
}

void print_warnings(const std::vector<std::string>& warnings) {
  if (warnings.empty()) return;
  std::cout << "\nwarnings\n";
  for (const auto& w : warnings) std::cout << "  ! " << w << "\n";
}

void write_plan(const Options& o, const Inputs& in, const ParallelConfig& p, const MemoryEstimate& mem,
                const TimeBreakdown& time) {
  if (o.output.empty()) return;
  PlanInputs plan{in.model, in.cluster, in.training, p, in.overlap};
  write_output_file(o.output, plan_to_json(plan, mem, time).dump(1) + "\n", plan_output(), o.force);
  if (!o.json) std::cout << "\nplan written to " << o.output << "\n";
}

int run_estimate(const Options& o, const ProfileStore& store) {
  Inputs in = load_inputs(o, store);
  ParallelConfig p;
  p.tp = o.tp;
  p.pp = o.pp;
  p.cp = o.cp;
  p.ep = o.ep;
  p.etp = o.etp;
  p.vpp = o.vpp;
  p.micro_batch = o.mbs;
  p.zero_stage = o.zero;
  p.distributed_optimizer = o.dist_opt;
  p.sequence_parallel = o.sp;
  p.offload_optimizer = o.offload;
  p.recompute = recompute_from_string(o.recompute);
  if (!o.recompute_modules.empty() && p.recompute != Recompute::selective)
    throw InputError("--recompute-modules names what selective recompute reruns; give --recompute selective");
  p.first_stage_layers = o.first_stage_layers;
  p.last_stage_layers = o.last_stage_layers;
  p.account_for_embedding = o.account_embedding;
  p.account_for_loss = o.account_loss;
  p.moe_dispatcher = moe_dispatcher_from_string(o.moe_dispatcher);
  p.overlap_ep_comm = o.overlap_ep_comm;
  p.schedule = o.schedule.empty() ? (o.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b)
                                  : schedule_from_string(o.schedule);
  const long long model_parallel = bounded_world_size(p.tp, p.pp, 1, p.cp);  // each flag is at most kMaxGpus
  p.dp = o.dp.value_or(o.gpus % model_parallel == 0 ? static_cast<int>(o.gpus / model_parallel) : 0);
  if (!o.dp && o.gpus % model_parallel != 0)
    throw InputError("tp*pp*cp = " + std::to_string(model_parallel) + " does not divide --gpus " +
                     std::to_string(o.gpus) + "; choose sizes whose product divides the GPU count");
  if (o.global_batch) {
    in.training.global_batch = *o.global_batch;
  } else {
    const long long multiple = std::max(1LL, static_cast<long long>(p.micro_batch) * std::max(1, p.dp));
    const long long sequences = default_global_batch(in.model, in.cluster, in.training, p, in.overlap);
    const long long batch = std::max(1LL, (sequences + multiple / 2) / multiple) * multiple;
    if (batch > kMaxGlobalBatch)
      throw InputError("micro-batch * dp = " + std::to_string(multiple) + " makes the global batch larger than " +
                       std::to_string(kMaxGlobalBatch) + " sequences; choose a smaller --mbs or --dp");
    in.training.global_batch = static_cast<int>(batch);
  }
  validate(in.model, in.cluster, in.training, p, o.gpus);
  Network net(in.cluster, o.gpus);
  MemoryEstimate mem = estimate_memory(in.model, in.cluster, in.training, p, o.headroom);
  TimeBreakdown time = estimate_time(in.model, net, in.training, p, mem, in.overlap);
  if (o.json) {
    json out = {{"model", to_json(in.model)},
                {"cluster", in.cluster.name},
                {"gpus", o.gpus},
                {"training", to_json(in.training)},
                {"parallel", to_json(p)},
                {"num_microbatches", num_microbatches(in.training, p)},
                {"headroom_fraction", o.headroom},
                {"fits", mem.fits},
                {"memory", to_json(mem)}};
    out.update(to_json(time));
    out.update(to_json(checkpoint_report(in.model, in.cluster, in.training, p, time, o.failures, o.tokens), true));
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << header(in, o.gpus) << unprobed_line(in.cluster) << "layout  "
              << describe_layout(in.model, in.training, p) << "\n\n"
              << memory_table(in.cluster, mem) << "\n"
              << time_table(time, in.training);
    std::cout << "time to train " << format_params(o.tokens) << " tokens: " << days(o.tokens / time.tokens_per_s)
              << "\n";
    std::cout << "\n"
              << checkpoint_block(checkpoint_report(in.model, in.cluster, in.training, p, time, o.failures, o.tokens),
                                  o.tokens);
    print_warnings(layout_warnings(p, in.training, net, mem, time));
  }
  write_plan(o, in, p, mem, time);
  return 0;  // an infeasible layout is an answer, not an error
}

std::string short_layout(const ParallelConfig& p) {
  std::ostringstream o;
  o << "tp " << p.tp << " pp " << p.pp << " dp " << p.dp;
  if (p.cp > 1) o << " cp " << p.cp;
  if (p.ep > 1) o << " ep " << p.ep;
  if (p.etp > 0 && p.etp != p.tp) o << " etp " << p.etp;
  if (p.schedule == Schedule::interleaved) o << " vpp " << p.vpp;
  return o.str();
}

std::string tricks(const ParallelConfig& p) {
  std::string s = p.distributed_optimizer ? "dist-opt" : "zero " + std::to_string(p.zero_stage);
  if (p.recompute != Recompute::none) s += std::string(", ") + to_string(p.recompute) + " recompute";
  if (p.sequence_parallel) s += ", sp";
  if (p.offload_optimizer) s += ", offload";
  if (p.moe_dispatcher == MoeDispatcher::deepep) s += ", deepep";
  if (p.overlap_ep_comm) s += ", ep overlap";
  return s;
}

// The headroom at which a near miss fits, or nullopt when it needs more than the HBM itself:
// 1 - peak / capacity, rounded down to the hundredth (--headroom's own resolution).
std::optional<double> headroom_that_fits(const Evaluation& e) {
  if (e.capacity_bytes <= 0 || e.peak_bytes > e.capacity_bytes) return std::nullopt;
  return std::floor(100 * (1 - e.peak_bytes / e.capacity_bytes)) / 100;
}

// The Megatron-LM options that keep model states in 16 bits and admit the near miss `p` at
// `headroom`, each alone or both: bf16 gradients (--grad-reduce-in-bf16) where Megatron keeps them
// in fp32, bf16 Adam moments where the optimizer is distributed (its precision-aware optimizer).
// Empty where none does or the engine is not Megatron's.
std::string sixteen_bit_states_that_fit(const Inputs& in, const ParallelConfig& p, double headroom) {
  if (in.training.engine.engine != Engine::megatron) return "";
  std::vector<std::pair<std::string, TrainingSpec>> options;
  TrainingSpec grads = in.training, moments = in.training;
  grads.grad_reduce_in_bf16 = gradients_in_fp32(in.training) && !in.training.fp32_grads;
  moments.bf16_adam_moments = !in.training.bf16_adam_moments && (p.zero_stage >= 1 || p.distributed_optimizer);
  if (grads.grad_reduce_in_bf16) options.push_back({"--grad-reduce-in-bf16", grads});
  if (moments.bf16_adam_moments) options.push_back({"--bf16-adam-moments", moments});
  if (options.size() == 2) {
    TrainingSpec both = grads;
    both.bf16_adam_moments = true;
    options.push_back({"--grad-reduce-in-bf16 --bf16-adam-moments", both});
  }
  for (const auto& [flags, t] : options)
    if (estimate_memory(in.model, in.cluster, t, p, headroom).fits) return flags;
  return "";
}

// The fastest layout rejected for memory, in one line: what it would gain against `best_step_s`
// (0: nothing fits), by how much it missed, the component that decided it, and what admits it.
std::string closest_call(const Candidate& c, double best_step_s, const Inputs& in, double headroom) {
  const Evaluation& e = c.evaluation;
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "closest call: " << short_layout(c.parallel) << ", mbs "
    << c.parallel.micro_batch << ", " << tricks(c.parallel);
  if (best_step_s > 0) o << ", " << 100 * (1 - e.step_time_s / best_step_s) << " % faster";
  o << ": its worst stage needs " << e.peak_bytes / kGiB << " GiB of " << e.usable_bytes / kGiB << " usable, "
    << e.miss_bytes / kGiB << " GiB over (largest part: " << e.largest_part << " " << e.largest_part_bytes / kGiB
    << " GiB); ";
  if (const std::optional<double> h = headroom_that_fits(e))
    o << std::setprecision(2) << "it fits with --headroom " << *h;
  else
    o << "beyond the HBM itself: more recompute, sharding or GPUs";
  if (const std::string flags = sixteen_bit_states_that_fit(in, c.parallel, headroom); !flags.empty())
    o << ", or as it is with " << flags;
  return o.str();
}

// The search's best layout for o.gpus; nullopt (after saying why) when none fits in memory.
struct Planned {
  Inputs in;
  SearchResult result;
  ParallelConfig best;
  MemoryEstimate mem;
  TimeBreakdown time;
  double search_s = 0;
  std::string constraints;         // the user's, as LayoutConstraints::describe says them ("": none)
  long unconstrained_layouts = 0;  // the space without them
};

std::optional<Planned> plan_best(const Options& o, const ProfileStore& store) {
  Planned pl;
  Inputs& in = pl.in;
  in = load_inputs(o, store);
  in.training.global_batch =
      o.global_batch ? *o.global_batch
                     : default_global_batch(in.model, in.cluster, in.training, data_parallel_layout(o.gpus), in.overlap);
  Network net(in.cluster, o.gpus);
  const RankBy rank_by = rank_by_from_string(o.rank_by);
  std::optional<GoodputInputs> goodput_inputs;
  if (rank_by == RankBy::goodput) {
    if (!in.cluster.storage.given())
      throw InputError("--rank-by goodput needs the cluster's storage bandwidths, and " + in.cluster.name +
                       " has none; add a \"storage\" block to its profile (profiles/README.md) or rank by step-time");
    goodput_inputs = GoodputInputs{o.failures, o.tokens};
  }
  SearchSpace space = o.runnable ? SearchSpace::runnable_by_executor(o.gpus, in.model, in.training) : SearchSpace{};
  space.gpus = o.gpus;
  space.moe_dispatcher = moe_dispatcher_from_string(o.moe_dispatcher);
  space.overlap_ep_comm = o.overlap_ep_comm;
  if (auto problem = moe_dispatcher_problem(in.cluster, space.moe_dispatcher)) throw InputError(*problem);
  // The search applies them to the MoE layouts that take them (SearchSpace); what refuses them
  // whatever the layout (a dense model, another engine, fp32, the executor) is refused here, once.
  if (space.moe_dispatcher != MoeDispatcher::alltoall || space.overlap_ep_comm) {
    ParallelConfig asked;
    asked.dp = 2, asked.ep = 2, asked.moe_dispatcher = space.moe_dispatcher, asked.overlap_ep_comm = space.overlap_ep_comm;
    if (auto problem = moe_comm_problem(in.model, in.training, asked)) throw InputError(*problem);
    if (o.runnable)
      if (auto why = executor_refusal(in.model, in.training, asked)) throw InputError(*why);
  }
  space.constraints = o.fixed;
  for (const std::string& r : o.fixed_recompute) space.constraints.recompute.push_back(recompute_from_string(r));
  auto start = std::chrono::steady_clock::now();
  std::vector<ParallelConfig> layouts = enumerate_layouts(in.model, in.training, space);
  if (!space.constraints.empty()) {
    SearchSpace free = space;
    free.constraints = {};
    const std::vector<ParallelConfig> all = enumerate_layouts(in.model, in.training, free);
    pl.constraints = space.constraints.describe();
    pl.unconstrained_layouts = static_cast<long>(all.size());
    if (layouts.empty())
      throw InputError("no layout of " + std::to_string(o.gpus) + " GPUs for " + in.model.name + " has " +
                       space.constraints.describe() + "; of its " + std::to_string(all.size()) + " layouts " +
                       space.constraints.values_taken(all));
  }
  if (layouts.empty())
    throw InputError("no parallel layout of " + std::to_string(o.gpus) + " GPUs divides global batch " +
                     std::to_string(in.training.global_batch) + " of " + in.model.name +
                     "; choose a --global-batch with more factors of 2 or another --gpus");
  // Every layout that fits is ranked, then those the engine priced cannot run are taken out
  // (keep_engine_runnable) before the best top_k are kept.
  const CostFunction cost = dplan_cost_function(in.model, net, in.training, in.overlap, o.headroom, goodput_inputs);
  pl.result = search(layouts, cost, static_cast<int>(layouts.size()), rank_by);
  keep_engine_runnable(pl.result, in.model, in.cluster, in.training, in.overlap, in.training.engine.engine, o.top_k);
  pl.search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (pl.result.ranked.empty()) {
    std::string reasons;
    bool memory = false;  // some layout was turned down for memory, not only by the engine's rules
    for (const auto& [why, n] : pl.result.rejected) {
      reasons += "; " + std::to_string(n) + " " + why;
      memory = memory || why.find("'s rules refuse it") == std::string::npos;
    }
    if (!pl.result.near_misses.empty()) reasons += "; " + closest_call(pl.result.near_misses[0], 0, in, o.headroom);
    const std::string layouts = "none of the " + std::to_string(pl.result.evaluated) + " layouts of " + in.model.name +
                                " on " + std::to_string(o.gpus) + " x " + in.cluster.gpu.name;
    if (!memory) {  // they fit, and the engine runs none of them: its reason and the way out say it all
      std::cerr << "dplan: error: " << layouts << " can be run by " << to_string(in.training.engine.engine) << reasons
                << "\n";
      return std::nullopt;
    }
    std::cerr << "dplan: error: " << layouts << " fits in memory with " << std::lround(100 * o.headroom)
              << " % headroom" << reasons << "; add GPUs, pick a GPU with more memory or lower --headroom\n";
    return std::nullopt;
  }
  pl.best = pl.result.ranked[0].parallel;
  // The search keeps the memory estimate of its own winner only; one the engine's rules promoted
  // is priced again.
  if (pl.result.ranked[0].evaluation.memory.stages.empty()) pl.result.ranked[0].evaluation = cost(pl.best);
  pl.mem = pl.result.ranked[0].evaluation.memory;  // the search's evaluation
  pl.time = pl.result.ranked[0].evaluation.time;
  return pl;
}

int run_plan(const Options& o, const ProfileStore& store) {
  std::optional<Planned> planned = plan_best(o, store);
  if (!planned) return 1;
  const Inputs& in = planned->in;
  const SearchResult& result = planned->result;
  const ParallelConfig& best = planned->best;
  const MemoryEstimate& mem = planned->mem;
  const TimeBreakdown& time = planned->time;
  const double search_s = planned->search_s;
  Network net(in.cluster, o.gpus);
  // Why MFU is what it is, and what would recover the most (planner/explain.h).
  const PlanCase chosen{in.model, in.cluster, in.training, best, in.overlap, o.headroom};
  const MfuBreakdown breakdown = explain_time(time);
  const std::vector<Suggestion> suggestions = suggest_changes(chosen, time, 3);
  if (o.json) {
    PlanInputs plan{in.model, in.cluster, in.training, best, in.overlap};
    json out = plan_to_json(plan, mem, time);
    out.erase("rank_layout");
    if (out["prediction"].contains("checkpoint")) out["prediction"]["checkpoint"].erase("rank_bytes");
    out["headroom_fraction"] = o.headroom;
    out["explain"] = to_json(breakdown);
    json suggestion_list = json::array();
    for (const Suggestion& s : suggestions) suggestion_list.push_back(to_json(s));
    out["suggestions"] = suggestion_list;
    json ranked = json::array();
    for (const auto& c : result.ranked) {
      ranked.push_back({{"parallel", to_json(c.parallel)}, {"step_time_s", c.evaluation.step_time_s},
                        {"peak_bytes", c.evaluation.peak_bytes}});
      if (o.rank_by == "goodput")
        ranked.back()["time_to_train_with_failures_s"] = c.evaluation.time_to_train_with_failures_s;
    }
    json near = json::array();
    for (const Candidate& c : result.near_misses) {
      const Evaluation& e = c.evaluation;
      const std::optional<double> h = headroom_that_fits(e);
      near.push_back({{"parallel", to_json(c.parallel)}, {"step_time_s", e.step_time_s}, {"peak_bytes", e.peak_bytes},
                      {"usable_bytes", e.usable_bytes}, {"miss_bytes", e.miss_bytes}, {"largest_part", e.largest_part},
                      {"largest_part_bytes", e.largest_part_bytes},
                      {"fits_with_headroom", h ? json(*h) : json(nullptr)}});
    }
    out["search"] = {{"evaluated", result.evaluated}, {"feasible", result.feasible}, {"rejected", result.rejected},
                     {"near_misses", near}, {"ranked", ranked}, {"seconds", search_s}, {"rank_by", o.rank_by}};
    if (!planned->constraints.empty())
      out["search"]["constraints"] = {{"fixed", planned->constraints},
                                      {"unconstrained_layouts", planned->unconstrained_layouts}};
    out.update(to_json(checkpoint_report(in.model, in.cluster, in.training, best, time, o.failures, o.tokens), false));
    std::cout << out.dump(2) << "\n";
    write_plan(o, in, best, mem, time);
    return 0;
  }
  std::cout << header(in, o.gpus) << unprobed_line(in.cluster) << "layout  " << describe_layout(in.model, in.training, best)
            << "\n\n";
  // Why it won.
  std::cout << "why: " << (o.rank_by == "goodput" ? "shortest time to train with failures" : "fastest") << " of "
            << result.feasible << " layouts that fit, of " << result.evaluated
            << " evaluated in " << std::fixed << std::setprecision(2) << search_s << " s\n";
  if (!planned->constraints.empty())
    std::cout << "     constrained to " << planned->constraints << ": " << result.evaluated << " of the "
              << planned->unconstrained_layouts << " layouts without the constraints\n";
  for (const auto& [why, n] : result.rejected) std::cout << "     " << n << " rejected: " << why << "\n";
  if (!result.near_misses.empty())
    std::cout << "     " << closest_call(result.near_misses[0], result.ranked[0].evaluation.step_time_s, in, o.headroom) << "\n";
  if (result.ranked.size() > 1 && o.rank_by == "goodput") {
    const Candidate& second = result.ranked[1];
    std::cout << "     the runner-up (" << short_layout(second.parallel) << ", mbs " << second.parallel.micro_batch << ", "
              << tricks(second.parallel) << ") takes " << std::setprecision(1)
              << 100 * (second.evaluation.time_to_train_with_failures_s /
                            result.ranked[0].evaluation.time_to_train_with_failures_s -
                        1)
              << " % longer to train with failures\n";
  } else if (result.ranked.size() > 1) {
    const Candidate& second = result.ranked[1];
    std::cout << "     the runner-up (" << short_layout(second.parallel) << ", mbs " << second.parallel.micro_batch << ", "
              << tricks(second.parallel) << ") is " << std::setprecision(1)
              << 100 * (second.evaluation.step_time_s / result.ranked[0].evaluation.step_time_s - 1) << " % slower\n";
  }
  std::cout << std::setprecision(2) << "\n" << memory_table(in.cluster, mem) << "\n" << time_table(time, in.training);
  std::cout << "time to train " << format_params(o.tokens) << " tokens: " << days(o.tokens / time.tokens_per_s) << "\n";
  std::cout << "\n"
            << checkpoint_block(checkpoint_report(in.model, in.cluster, in.training, best, time, o.failures, o.tokens),
                                o.tokens);
  std::cout << "\n" << explain_table(breakdown, suggestions, &chosen);

  std::cout << "\nnext best layouts\n"
            << " #  layout                        mbs  sharding / recompute          step (s)  tokens/s   mem/GPU (GiB)\n";
  for (size_t i = 0; i < result.ranked.size(); ++i) {
    const Candidate& c = result.ranked[i];
    char line[256];
    std::snprintf(line, sizeof line, "%2zu  %-28s %4d  %-28s %9.3f  %9.0f  %8.1f\n", i + 1, short_layout(c.parallel).c_str(),
                  c.parallel.micro_batch, tricks(c.parallel).c_str(), c.evaluation.step_time_s,
                  double(in.training.global_batch) * in.training.seq_len / c.evaluation.step_time_s,
                  c.evaluation.peak_bytes / kGiB);
    std::cout << line;
  }
  std::cout << "\nmemory vs speed (Pareto frontier: no layout is both faster and smaller)\n";
  for (const auto& c : result.pareto) {
    char line[256];
    std::snprintf(line, sizeof line, "    %-28s mbs %d, %-28s %9.3f s  %8.1f GiB\n", short_layout(c.parallel).c_str(),
                  c.parallel.micro_batch, tricks(c.parallel).c_str(), c.evaluation.step_time_s,
                  c.evaluation.peak_bytes / kGiB);
    std::cout << line;
  }
  print_warnings(layout_warnings(best, in.training, net, mem, time));
  write_plan(o, in, best, mem, time);
  return 0;
}

// `value` printed with `decimals` decimals.
std::string with_decimals(double value, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

int run_list(const ProfileStore& store) {
  std::cout << "model presets (--model NAME, or a path to a Hugging Face config.json):\n";
  for (const auto& name : store.model_names()) {
    ModelSpec m = store.load_model(name);
    std::printf("  %-16s %-10s %10s parameters, %d layers, hidden %d, %d heads (%d kv), vocab %d\n", name.c_str(),
                m.family.c_str(), format_params(num_params(m)).c_str(), m.num_layers, m.hidden_size, m.num_heads,
                m.num_kv_heads, m.vocab_size);
  }
  std::cout << std::flush << "size shorthands:\n";
  for (const auto& [s, preset] : model_shorthands()) std::printf("  %-8s -> %s\n", s.c_str(), preset.c_str());
  std::cout << std::flush << "clusters (--cluster NAME, or a path to a cluster JSON):\n";
  for (const auto& name : store.cluster_names()) {
    ClusterSpec c = store.load_cluster(name);
    std::printf("  %-16s %d x %s per node: %s\n", name.c_str(), c.gpus_per_node, c.gpu.name.c_str(),
                c.description.c_str());
  }
  // Each GPU as its profile states it: dense 16-bit peak and power at the TDP (a cluster's
  // power_limit_w derives the figures for a lower limit, costmodel/power_cap.h).
  std::cout << std::flush << "GPUs (a cluster profile's \"gpu\", or a path to a GPU JSON; a cluster's \"power_limit_w\" "
                             "derives one for a lower power limit):\n";
  std::printf("  %-22s %9s %15s %8s  %s\n", "name", "HBM (GB)", "bf16 (TFLOP/s)", "TDP (W)", "description");
  for (const auto& name : store.gpu_names()) {
    const GpuSpec g = store.load_gpu(name);
    const auto bf16 = g.peak_flops_per_s.find("bf16");
    const std::string peak = bf16 == g.peak_flops_per_s.end() ? "-" : with_decimals(bf16->second / 1e12, 1);
    const std::string tdp = g.tdp_w > 0 ? with_decimals(g.tdp_w, 0) : "-";
    std::printf("  %-22s %9s %15s %8s  %s\n", name.c_str(), with_decimals(g.hbm_bytes / kGB, 0).c_str(), peak.c_str(),
                tdp.c_str(), g.description.c_str());
  }
  return 0;
}

// Options shared by the top level and `estimate`.
// dplan scale: for each size, the search's best runnable layout, trained with dplan run; then
// predicted and measured throughput and scaling efficiency side by side, and scaling.svg.
struct ScaleOptions {
  std::vector<int> gpus;
  int steps = 10;
  std::string dir;
  double timeout_s = 120;
};

int run_scale(Options o, const ScaleOptions& so, const ProfileStore& store) {
  if (o.model.empty()) throw InputError("dplan scale needs --model");
  if (so.gpus.empty()) throw InputError("dplan scale needs --gpus, e.g. --gpus 1,2,4");
  for (size_t i = 0; i < so.gpus.size(); ++i)
    if (so.gpus[i] < 1 || (i > 0 && so.gpus[i] <= so.gpus[i - 1]))
      throw InputError("--gpus must be positive sizes in increasing order, e.g. 1,2,4");
  if (so.steps < 3) throw InputError("--steps must be at least 3 (the first two are warm-up)");
  const std::string dir = so.dir.empty() ? "scale-" + o.model : so.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw InputError(dir + ": cannot be made a folder for the plans and runs");
  std::vector<ScalingPoint> points;
  std::vector<std::string> layouts;
  o.runnable = true;
  o.json = false;
  if (!o.global_batch) {
    // One batch for every size (throughput at a fixed batch), sized on the first size, whose step
    // is the longest (default_global_batch), and made a multiple of every size so that each can
    // run it as data parallel.
    const Inputs in = load_inputs(o, store);
    long long batch = default_global_batch(in.model, in.cluster, in.training, data_parallel_layout(so.gpus[0]), in.overlap);
    long long sizes_lcm = 1;
    for (int n : so.gpus) sizes_lcm = std::min<long long>(std::lcm(sizes_lcm, n), kMaxGlobalBatch + 1LL);
    if (sizes_lcm <= kMaxGlobalBatch) batch = std::max(sizes_lcm, batch / sizes_lcm * sizes_lcm);
    o.global_batch = static_cast<int>(batch);
    std::cerr << "scale: global batch " << batch << " sequences (the default on " << in.cluster.name
              << "; --global-batch to choose)\n";
  }
  // Every size is planned before any trains, so that the expected time is known before the first run.
  std::vector<Planned> plans;
  double expected_s = 0;
  for (int n : so.gpus) {
    o.gpus = n;
    o.output = (fs::path(dir) / ("plan-" + std::to_string(n) + ".json")).string();
    std::optional<Planned> planned = plan_best(o, store);
    if (!planned) return 1;
    Options quiet = o;
    quiet.json = true;  // the progress line below names the plan's layout; the table names the folder
    write_plan(quiet, planned->in, planned->best, planned->mem, planned->time);
    expected_s += planned->time.step_time_s * so.steps;
    plans.push_back(std::move(*planned));
  }
  std::cerr << "scale: expected run time: about " << format_duration(expected_s) << " (" << so.gpus.size() << " runs x "
            << so.steps << " steps, at the predicted step times)\n";
  if (const std::string note = unprobed_profile_note(plans.front().in.cluster); !note.empty())
    std::cerr << "scale: ! " << note << "\n";
  for (size_t i = 0; i < so.gpus.size(); ++i) {
    const int n = so.gpus[i];
    const Planned& planned = plans[i];
    std::cerr << "scale: run " << i + 1 << "/" << so.gpus.size() << ": " << n << " rank" << (n == 1 ? "" : "s") << ", "
              << short_layout(planned.best) << " (" << tricks(planned.best) << "), " << so.steps << " steps, about "
              << format_duration(planned.time.step_time_s * so.steps) << " expected\n";
    cli::RunOptions ra;
    ra.plan_path = (fs::path(dir) / ("plan-" + std::to_string(n) + ".json")).string();
    ra.steps = so.steps;
    ra.warmup = 2;
    ra.output = (fs::path(dir) / ("run-" + std::to_string(n) + ".json")).string();
    ra.quiet = true;
    ra.timeout_s = so.timeout_s;
    ra.force = o.force;
    if (int status = cli::run_run(ra); status != 0) return status;
    points.push_back({n, planned.time.tokens_per_s, costmodel::read_run_record(ra.output).tokens_per_s});
    layouts.push_back(short_layout(planned.best) + ", " + tricks(planned.best));
  }
  fill_efficiencies(points);
  std::printf("\n%5s  %-34s %14s %14s %8s %10s %10s\n", "gpus", "layout", "predicted tok/s", "measured tok/s",
              "error", "pred eff", "meas eff");
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    std::printf("%5d  %-34s %14.0f %14.0f %+7.1f%% %9.1f%% %9.1f%%\n", p.gpus, layouts[i].c_str(),
                p.predicted_tokens_per_s, p.measured_tokens_per_s,
                100 * (p.predicted_tokens_per_s / p.measured_tokens_per_s - 1), 100 * p.predicted_efficiency,
                100 * p.measured_efficiency);
  }
  const std::string svg = (fs::path(dir) / "scaling.svg").string();
  write_output_file(svg, scaling_svg(points, o.model + " on " + o.cluster), scaling_svg_output(), o.force);
  std::printf("wrote %s (plans and runs beside it)\n", svg.c_str());
  return 0;
}

// An integer flag's range, checked on the text before CLI11 converts it (so 4294967298 is refused,
// not wrapped): "--gpus: must be a positive integer up to 1048576, got 0".
CLI::Validator integer_in(long long lo, long long hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        long long v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end && v >= lo && v <= hi) return "";
        return "must be " + what + ", got " + quote_for_message(text);
      },
      std::to_string(lo) + ".." + std::to_string(hi));
}

// A size flag: 1 up to a bound the layout rules own (training.h).
CLI::Validator sizes_up_to(int max) { return integer_in(1, max, "a positive integer up to " + std::to_string(max)); }

// Options every command that reads profiles takes (also after the subcommand's name).
void add_profiles(CLI::App& app, Options& o) {
  app.add_option("--profiles", o.profiles, "profiles folder (default: $DPLAN_PROFILES or the built-in one)");
}

// -o's companion.
void add_force(CLI::App& app, bool& force) {
  app.add_flag("--force", force, "let -o replace an existing file dplan did not write (never an input of the command)");
}

CLI::Option* add_common(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "preset, size shorthand (70B) or path to a config.json");
  CLI::Option* gpus = app.add_option("--gpus", o.gpus, "number of GPUs")->check(sizes_up_to(kMaxGpus));
  app.add_option("--cluster", o.cluster, "cluster profile name or path")->capture_default_str();
  app.add_option("--global-batch", o.global_batch,
                 "sequences per optimizer step (default: about 4M tokens; a step of about a second on a CPU cluster)")
      ->check(sizes_up_to(kMaxGlobalBatch));
  app.add_option("--seq", o.seq, "sequence length (default: the model's, at most 8192)")->check(sizes_up_to(kMaxSeqLen));
  app.add_option("--precision", o.precision, "bf16, fp16, fp8 or fp32")->capture_default_str();
  app.add_option("--attention", o.attention, "flash or standard")->capture_default_str();
  app.add_option("--engine", o.engine,
                 [] {
                   std::string names;
                   for (const std::string& n : costmodel::engine_names()) names += (names.empty() ? "" : ", ") + n;
                   return "the engine whose implementation is priced: " + names +
                          "; NAME@VERSION for an older version's (docs/cost-model.md, Engines)";
                 }())
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens to train, for the time-to-train line")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e18));
  CLI::Option* fp32_grads = app.add_flag("--fp32-grads", o.fp32_grads, "keep gradients in fp32 (Megatron main_grad)");
  app.add_flag("--grad-reduce-in-bf16", o.grad_reduce_in_bf16,
               "keep bf16 training's gradients in bf16 where the engine keeps them in fp32 (Megatron's flag)")
      ->excludes(fp32_grads);
  app.add_flag("--bf16-adam-moments", o.bf16_adam_moments,
               "keep AdamW's moments in bf16 (Megatron's precision-aware optimizer; DeepSeek-V3's recipe)");
  app.add_option("--vocab-pad-multiple", o.vocab_pad_multiple,
                 "pad the vocabulary to a multiple of N x tp rows (Megatron's --make-vocab-size-divisible-by; default 128)")
      ->check(integer_in(1, 1 << 16, "a positive integer up to 65536"));
  app.add_flag("--cross-entropy-fusion", o.cross_entropy_fusion,
               "Megatron's fused cross-entropy (--cross-entropy-loss-fusion): one more fp32 logits tensor in the loss");
  app.add_option("--defer-embedding-wgrad", o.embedding_wgrad_deferral,
                 "defer the LM head's weight gradient of N micro-batches to the pipeline flush, 0: all (Megatron's "
                 "--defer-embedding-wgrad-compute --wgrad-deferral-limit N; needs pp > 1)")
      ->check(integer_in(0, kMaxGlobalBatch, "a micro-batch count from 0 (all) to " + std::to_string(kMaxGlobalBatch)));
  app.add_option("--mtp-layers", o.mtp_layers,
                 "multi-token prediction modules to train (default: the model's, DeepSeek-V3's 1; 0 drops them)")
      ->check(integer_in(0, 16, "a module count from 0 to 16"));
  app.add_option("--mtp-loss-scale", o.mtp_loss_scale,
                 "the MTP losses' weight: lambda / D times their sum joins the objective (Megatron's "
                 "--mtp-loss-scaling-factor; default 0.1)")
      ->check(CLI::Range(0.0, 1e3));
  app.add_option("--recompute-modules", o.recompute_modules,
                 "what selective recompute reruns, Megatron's --recompute-modules as a list: core_attn (default), "
                 "moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts");
  app.add_flag("--no-gradient-accumulation-fusion", o.no_grad_accumulation_fusion,
               "add each micro-batch's gradients in a pass of their own, not in the weight-gradient GEMM (Megatron's flag)");
  app.add_flag("--no-overlap-grad-reduce", o.no_overlap_grad, "reduce gradients after backward, not during");
  app.add_flag("--no-overlap-param-gather", o.no_overlap_param, "all-gather parameters after the step, not under forward");
  app.add_flag("--tp-comm-overlap", o.tp_overlap, "overlap tensor-parallel collectives with GEMMs (needs --sp)");
  app.add_option("--moe-dispatcher", o.moe_dispatcher,
                 "MoE token dispatcher: alltoall (NCCL all-to-all) or deepep (DeepEP kernels, Megatron's flex "
                 "dispatcher; needs ep*etp > 1 and NVSwitch nodes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"alltoall", "deepep"}));
  app.add_flag("--overlap-ep-comm", o.overlap_ep_comm,
               "hide one micro-batch's MoE dispatch/combine behind another's compute (Megatron-Core "
               "--overlap-moe-expert-parallel-comm; needs ep > 1, pp 1, --schedule interleaved or dualpipe, no full "
               "recompute; default off)");
  app.add_option("--headroom", o.headroom,
                 "fraction of HBM a plan must leave free (allocator fragmentation, NCCL buffers)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, kMaxHeadroomFraction));
  app.add_option("-o,--output", o.output, "write the plan to this file (plan.json)");
  add_force(app, o.force);
  app.add_flag("--json", o.json, "print JSON instead of tables");
  app.add_option("--failure-rate-per-gpu-hour", o.failures.failures_per_gpu_hour,
                 "failures per GPU-hour, for the goodput block (default: Llama 3's, 419 in 54 days on 16384 GPUs)")
      ->check(CLI::Range(1e-12, 1.0));
  app.add_option("--restart-s", o.failures.restart_overhead_s,
                 "seconds a restart costs besides loading the checkpoint (default: 600, an assumption)")
      ->check(CLI::Range(0.0, 1e7));
  return gpus;
}

// The export subcommand's line in --help: the engines whose own files it writes, then the
// launchers of dplan-worker, as the engine table lists them.
std::string export_description() {
  std::string files, launches;
  for (const EngineDescriptor& d : engines()) {
    std::string& list = d.runs_dplan_worker ? launches : files;
    list += (list.empty() ? "" : d.runs_dplan_worker ? " / " : ", ") + std::string(to_string(d.id));
  }
  return "the plan as an engine's own files (" + files + ") or a " + launches + " launch of dplan-worker";
}

// Every subcommand, and what each parses into (bound by reference: a Commands stays in place).
struct Commands {
  CLI::Option* top_gpus = nullptr;  // the top level's --gpus
  CLI::App *estimate = nullptr, *list = nullptr, *run = nullptr, *compare = nullptr, *explain = nullptr,
           *export_cmd = nullptr, *check = nullptr, *scale = nullptr, *calibrate = nullptr, *probe = nullptr;
  cli::RunOptions run_args;
  cli::CompareArgs compare_args;
  cli::ExplainArgs explain_args;
  cli::ExportArgs export_args;
  cli::CheckArgs check_args;
  ScaleOptions scale_opts;
  cli::CalibrateArgs calibrate_args;
  cli::ProbeArgs probe_args;
};

// Top level: `dplan --model M --gpus N` searches every layout.
void add_search_options(CLI::App& app, Options& o, Commands& c) {
  c.top_gpus = add_common(app, o);
  app.add_option("--top", o.top_k, "how many ranked layouts to show")->capture_default_str()->check(integer_in(1, 1000, "a positive integer up to 1000"));
  app.add_flag("--runnable", o.runnable,
               "refuse up front a model dplan run cannot train, and search only what it executes (today every "
               "layout, except context parallel with attention dropout; kept for scripts)");
  // The dimensions the search may fix (LayoutConstraints): one size or a comma-separated list each.
  auto sizes = [&](const char* flag, std::vector<int>& into, const std::string& what, int max) {
    app.add_option(flag, into, "search only layouts with these " + what + " (e.g. 4,8)")
        ->delimiter(',')
        ->check(integer_in(1, max, "a positive integer up to " + std::to_string(max)));
  };
  sizes("--tp", o.fixed.tp, "tensor parallel sizes", kMaxGpus);
  sizes("--pp", o.fixed.pp, "pipeline parallel sizes", kMaxGpus);
  sizes("--dp", o.fixed.dp, "data parallel sizes", kMaxGpus);
  sizes("--cp", o.fixed.cp, "context parallel sizes", kMaxGpus);
  sizes("--ep", o.fixed.ep, "expert parallel sizes", kMaxGpus);
  sizes("--vpp", o.fixed.vpp, "virtual pipeline stages per rank (1: no model chunks)", kMaxVirtualStages);
  sizes("--mbs", o.fixed.mbs, "micro-batch sizes", kMaxGlobalBatch);
  app.add_option("--zero", o.fixed.zero, "search only layouts with these ZeRO stages (0..3; the distributed optimizer counts as 1)")
      ->delimiter(',')
      ->check(integer_in(0, 3, "a ZeRO stage: 0, 1, 2 or 3"));
  app.add_option("--recompute", o.fixed_recompute, "search only layouts with these recompute settings: none, selective, full")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--rank-by", o.rank_by,
                 "rank layouts by step-time (default) or goodput (time to train with failures and checkpoints)")
      ->check(CLI::IsMember({"step-time", "goodput"}));
}

CLI::App* add_estimate_command(CLI::App& app, Options& o) {
  CLI::App* estimate = app.add_subcommand("estimate", "evaluate one layout: memory per stage, step time by phase");
  add_common(*estimate, o);
  add_profiles(*estimate, o);
  estimate->get_option("--model")->required();
  estimate->get_option("--gpus")->required();
  estimate->add_option("--tp", o.tp, "tensor parallel size")->capture_default_str()->check(sizes_up_to(kMaxGpus));
  estimate->add_option("--pp", o.pp, "pipeline parallel size")->capture_default_str()->check(sizes_up_to(kMaxGpus));
  estimate->add_option("--dp", o.dp, "data parallel size (default: gpus / (tp*pp*cp))")->check(sizes_up_to(kMaxGpus));
  estimate->add_option("--cp", o.cp, "context parallel size")->capture_default_str()->check(sizes_up_to(kMaxGpus));
  estimate->add_option("--ep", o.ep, "expert parallel size (MoE; ep*etp divides tp*cp*dp)")->capture_default_str()->check(sizes_up_to(kMaxGpus));
  estimate->add_option("--etp", o.etp, "expert tensor parallel size (MoE; default: same as tp)")
      ->check(integer_in(0, kMaxGpus, "a positive integer up to " + std::to_string(kMaxGpus) + " (0: same as tp)"));
  estimate->add_option("--vpp", o.vpp, "virtual pipeline stages per rank (interleaved)")
      ->capture_default_str()
      ->check(sizes_up_to(kMaxVirtualStages));
  estimate->add_option("--mbs", o.mbs, "micro-batch size (sequences)")->capture_default_str()->check(sizes_up_to(kMaxGlobalBatch));
  estimate->add_option("--zero", o.zero, "ZeRO stage 0..3")->capture_default_str()->check(integer_in(0, 3, "a ZeRO stage: 0, 1, 2 or 3"));
  estimate->add_flag("--dist-opt", o.dist_opt, "Megatron distributed optimizer");
  estimate->add_option("--recompute", o.recompute, "none, selective or full")->capture_default_str();
  estimate->add_flag("--sp", o.sp, "sequence parallel");
  estimate->add_flag("--offload", o.offload, "optimizer states in host memory");
  estimate->add_option("--schedule", o.schedule,
                       "gpipe, 1f1b, interleaved or dualpipe (default 1f1b; interleaved with --vpp; dualpipe is "
                       "priced, not run or exported)");
  // Megatron-LM's uneven pipeline split (--decoder-first/last-pipeline-num-layers,
  // --account-for-embedding/loss-in-pipeline-split); training.h assign_chunks.
  estimate->add_option("--first-stage-layers", o.first_stage_layers,
                       "transformer layers on the first pipeline stage (the other stages share the rest evenly)")
      ->check(integer_in(1, 1 << 16, "a layer count from 1 to 65536"));
  estimate->add_option("--last-stage-layers", o.last_stage_layers,
                       "transformer layers on the last pipeline stage (the other stages share the rest evenly)")
      ->check(integer_in(1, 1 << 16, "a layer count from 1 to 65536"));
  estimate->add_flag("--account-for-embedding", o.account_embedding,
                     "count the embedding as one layer in the pipeline split");
  estimate->add_flag("--account-for-loss", o.account_loss, "count the LM head and loss as one layer in the pipeline split");
  return estimate;
}

CLI::App* add_scale_command(CLI::App& app, Options& o, ScaleOptions& scale_opts) {
  CLI::App* scale = app.add_subcommand("scale", "plan and run each size, predicted against measured scaling, and an SVG");
  scale->add_option("--model", o.model, "preset, size shorthand or path to a config.json")->required();
  scale->add_option("--cluster", o.cluster, "cluster profile name or path")->capture_default_str();
  scale->add_option("--gpus", scale_opts.gpus, "sizes to plan and run, e.g. 1,2,4")
      ->delimiter(',')
      ->required()
      ->check(sizes_up_to(kMaxGpus));
  scale->add_option("--global-batch", o.global_batch,
                    "sequences per optimizer step (default: dplan's, sized on the first size, a multiple of every size)");
  scale->add_option("--seq", o.seq, "sequence length");
  scale->add_option("--precision", o.precision, "bf16, fp16, fp8 or fp32")->capture_default_str();
  scale->add_option("--steps", scale_opts.steps, "steps per run (the first two are warm-up)")->capture_default_str();
  scale->add_option("--timeout-s", scale_opts.timeout_s, "collective timeout of each run")->capture_default_str();
  scale->add_option("-o,--output", scale_opts.dir, "folder for the plans, runs and scaling.svg (default scale-<model>)");
  add_force(*scale, o.force);
  add_profiles(*scale, o);
  return scale;
}

// Every subcommand and option, in the order --help lists them.
void add_commands(CLI::App& app, Options& o, Commands& c) {
  add_search_options(app, o, c);
  c.estimate = add_estimate_command(app, o);

  c.list = app.add_subcommand("list", "model presets, size shorthands, clusters and GPUs");
  add_profiles(*c.list, o);

  c.run = app.add_subcommand("run", "train with a plan's layout on this machine and measure every phase");
  cli::add_run_options(*c.run, c.run_args);

  c.compare = app.add_subcommand("compare", "a plan's prediction next to a run's measurement");
  cli::add_compare_options(*c.compare, c.compare_args);

  c.explain = app.add_subcommand("explain", "why a plan's MFU is low, and the changes that recover the most");
  cli::add_explain_options(*c.explain, c.explain_args);
  add_profiles(*c.explain, o);

  c.export_cmd = app.add_subcommand("export", export_description());
  cli::add_export_options(*c.export_cmd, c.export_args);

  c.check = app.add_subcommand("check", "an engine's own rules on a plan, one line per failure (exit 1)");
  cli::add_check_options(*c.check, c.check_args);

  c.scale = add_scale_command(app, o, c.scale_opts);

  c.calibrate = app.add_subcommand("calibrate", "a profile's efficiency figures fitted to measured runs");
  cli::add_calibrate_options(*c.calibrate, c.calibrate_args);
  add_profiles(*c.calibrate, o);

  c.probe = app.add_subcommand("probe", "a cluster profile fitted to measurements (nccl-tests output)");
  cli::add_probe_options(*c.probe, c.probe_args);
  add_profiles(*c.probe, o);
}

// The parsed command, run: its exit status.
int run_command(const Commands& c, const Options& o) {
  ProfileStore store(find_profiles_dir(o.profiles, "/proc/self/exe", DPLAN_PROFILES_DIR));
  if (*c.list) return run_list(store);
  if (*c.run) return cli::run_run(c.run_args);
  if (*c.compare) return cli::run_compare(c.compare_args);
  if (*c.explain) return cli::run_explain(c.explain_args, store);
  if (*c.export_cmd) return cli::run_export(c.export_args);
  if (*c.check) return cli::run_check(c.check_args);
  if (*c.probe) return cli::run_probe(c.probe_args, store);
  if (*c.calibrate) return cli::run_calibrate(c.calibrate_args, store);
  if (*c.scale) return run_scale(o, c.scale_opts, store);
  if (*c.estimate) return run_estimate(o, store);
  if (o.model.empty() || c.top_gpus->count() == 0) {
    std::cerr << "dplan: error: give --model and --gpus (e.g. dplan --model 70B --gpus 64), or a subcommand: "
                 "estimate, list, run, compare, explain, export, check, probe, calibrate, scale; see dplan --help\n";
    return 2;
  }
  return run_plan(o, store);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  Commands commands;
  CLI::App app{"dplan: plan, estimate and explain distributed training layouts", "dplan"};
  add_profiles(app, o);
  app.require_subcommand(0, 1);
  app.fallthrough(false);
  add_commands(app, o, commands);

  try {
    app.parse(argc, argv);
    return run_command(commands, o);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError&) {
    // The arguments left over, in the order given (CLI11's message lists them last first), with
    // the nearest option of the command they were given to.
    CLI::App* command = &app;
    for (CLI::App* sub : app.get_subcommands()) command = sub;
    std::vector<std::string> options;
    for (const CLI::Option* opt : command->get_options())
      for (const std::string& name : opt->get_lnames()) options.push_back("--" + name);
    std::string extras, hint;
    for (const std::string& arg : command->remaining()) {
      extras += (extras.empty() ? "" : " ") + arg;
      if (hint.empty() && arg.rfind("--", 0) == 0) hint = did_you_mean(arg.substr(0, arg.find('=')), options);
    }
    std::cerr << "dplan: error: " << error_line("unexpected argument" + std::string(extras.find(' ') == std::string::npos ? "" : "s") +
                                                 ": " + extras + hint + "; dplan " +
                                                 (command == &app ? "" : command->get_name() + " ") + "--help lists the options")
              << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << "dplan: error: " << error_line(e.what()) << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "dplan: error: " << error_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dplan: error: internal: " << error_line(e.what()) << "\n";
    return 1;
  }
}
