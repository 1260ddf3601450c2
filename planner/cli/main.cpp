// dplan: plan, estimate and explain distributed training layouts.
//   dplan --model 70B --gpus 64             the layout to use, its memory per GPU
//   dplan estimate --model M --gpus N ...   one layout, evaluated
//   dplan list                               presets, size shorthands, clusters
// Errors in input print "dplan: error: ..." on stderr and exit 2.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"
#include "dplan/planner/default_layout.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/report.h"

namespace {
using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;

constexpr double kDefaultBatchTokens = 4194304;  // about 4M tokens per global batch
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
  bool fp32_grads = false;
  bool json = false;
  // estimate only
  int tp = 1, pp = 1, cp = 1, ep = 1, vpp = 1, mbs = 1, zero = 0;
  std::optional<int> dp;
  bool dist_opt = false, sp = false, offload = false;
  std::string recompute = "none";
  std::string schedule;
};

struct Inputs {
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
};

Inputs load_inputs(const Options& o, const ProfileStore& store) {
  Inputs in;
  in.model = store.load_model(o.model);
  in.cluster = store.load_cluster(o.cluster);
  in.training.precision = precision_from_string(o.precision);
  in.training.attention = attention_from_string(o.attention);
  in.training.fp32_grads = o.fp32_grads;
  // The model's sequence length: max_position_embeddings, capped at 8192 for long-context
  // checkpoints whose pre-training ran at 8192 (Llama 3.1, Mistral).
  in.training.seq_len = o.seq.value_or(std::min(in.model.max_seq_len, kDefaultSeqCap));
  if (o.gpus < 1) throw InputError("--gpus must be a positive integer, got " + std::to_string(o.gpus));
  if (in.training.seq_len < 1) throw InputError("--seq must be a positive integer, got " + std::to_string(in.training.seq_len));
  if (o.global_batch && *o.global_batch < 1)
    throw InputError("--global-batch must be a positive integer, got " + std::to_string(*o.global_batch));
  return in;
}

std::string header(const Inputs& in, int gpus) {
  std::ostringstream o;
  int nodes = (gpus + in.cluster.gpus_per_node - 1) / in.cluster.gpus_per_node;
  o << in.model.name << " (" << format_params(num_params(in.model)) << " parameters";
  if (in.model.is_moe()) o << ", " << format_params(num_active_params(in.model)) << " active";
  o << ") on " << gpus << " x " << in.cluster.gpu.name << " (" << in.cluster.name << ", " << nodes
    << (nodes == 1 ? " node" : " nodes") << ")\n";
  return o.str();
}

int run_estimate(const Options& o, const ProfileStore& store) {
  Inputs in = load_inputs(o, store);
  ParallelConfig p;
  p.tp = o.tp;
  p.pp = o.pp;
  p.cp = o.cp;
  p.ep = o.ep;
  p.vpp = o.vpp;
  p.micro_batch = o.mbs;
  p.zero_stage = o.zero;
  p.distributed_optimizer = o.dist_opt;
  p.sequence_parallel = o.sp;
  p.offload_optimizer = o.offload;
  p.recompute = recompute_from_string(o.recompute);
  p.schedule = o.schedule.empty() ? (o.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b)
                                  : schedule_from_string(o.schedule);
  int model_parallel = std::max(1, p.tp * p.pp * p.cp);
  p.dp = o.dp.value_or(o.gpus % model_parallel == 0 ? o.gpus / model_parallel : 0);
  if (!o.dp && o.gpus % model_parallel != 0)
    throw InputError("tp*pp*cp = " + std::to_string(model_parallel) + " does not divide --gpus " +
                     std::to_string(o.gpus) + "; choose sizes whose product divides the GPU count");
  in.training.global_batch =
      o.global_batch.value_or(global_batch_for_tokens(kDefaultBatchTokens, in.training.seq_len,
                                                      std::max(1, p.micro_batch * std::max(1, p.dp))));
  validate(in.model, in.cluster, in.training, p, o.gpus);
  MemoryEstimate mem = estimate_memory(in.model, in.cluster, in.training, p);
  if (o.json) {
    json out = {{"model", to_json(in.model)},
                {"cluster", in.cluster.name},
                {"gpus", o.gpus},
                {"training", to_json(in.training)},
                {"parallel", to_json(p)},
                {"num_microbatches", num_microbatches(in.training, p)},
                {"fits", mem.fits},
                {"memory", to_json(mem)}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << header(in, o.gpus) << "layout  " << describe_layout(in.model, in.training, p) << "\n\n"
              << memory_table(in.cluster, mem);
  }
  return 0;  // an infeasible layout is an answer, not an error
}

int run_plan(const Options& o, const ProfileStore& store) {
  Inputs in = load_inputs(o, store);
  double tokens = o.global_batch ? double(*o.global_batch) * in.training.seq_len : kDefaultBatchTokens;
  DefaultLayout d = default_layout(in.model, in.cluster, in.training, o.gpus, tokens);
  if (o.global_batch && d.training.global_batch != *o.global_batch) {
    // Keep the user's batch exactly when the layout allows it.
    TrainingSpec t = d.training;
    t.global_batch = *o.global_batch;
    validate(in.model, in.cluster, t, d.parallel, o.gpus);
    d.training = t;
    d.memory = estimate_memory(in.model, in.cluster, t, d.parallel);
  }
  if (o.json) {
    json out = {{"model", to_json(in.model)},   {"cluster", in.cluster.name}, {"gpus", o.gpus},
                {"training", to_json(d.training)}, {"parallel", to_json(d.parallel)}, {"fits", d.memory.fits},
                {"memory", to_json(d.memory)}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << header(in, o.gpus)
              << "layout  " << describe_layout(in.model, d.training, d.parallel) << "\n"
              << "        (default layout: tensor parallel inside a node, the fewest pipeline stages that fit,\n"
              << "         data parallel over the rest; the ranked search over all layouts comes with the planner)\n\n"
              << memory_table(in.cluster, d.memory);
  }
  return d.memory.fits ? 0 : 1;
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
    std::printf("  %-14s %d x %s per node: %s\n", name.c_str(), c.gpus_per_node, c.gpu.name.c_str(),
                c.description.c_str());
  }
  return 0;
}

void add_common(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "preset, size shorthand (70B) or path to a config.json")->required();
  app.add_option("--gpus", o.gpus, "number of GPUs")->required();
  app.add_option("--cluster", o.cluster, "cluster profile name or path")->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "sequences per optimizer step (default: about 4M tokens)");
  app.add_option("--seq", o.seq, "sequence length (default: the model's, at most 8192)");
  app.add_option("--precision", o.precision, "bf16, fp16, fp8 or fp32")->capture_default_str();
  app.add_option("--attention", o.attention, "flash or standard")->capture_default_str();
  app.add_flag("--fp32-grads", o.fp32_grads, "keep gradients in fp32 (Megatron main_grad)");
  app.add_flag("--json", o.json, "print JSON instead of tables");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dplan: plan, estimate and explain distributed training layouts", "dplan"};
  app.add_option("--profiles", o.profiles, "profiles folder (default: $DPLAN_PROFILES or the built-in one)");
  app.require_subcommand(0, 1);
  app.fallthrough(false);

  // Top level: `dplan --model M --gpus N`.
  app.add_option("--model", o.model, "preset, size shorthand (70B) or path to a config.json");
  CLI::Option* top_gpus = app.add_option("--gpus", o.gpus, "number of GPUs");
  app.add_option("--cluster", o.cluster, "cluster profile name or path")->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "sequences per optimizer step (default: about 4M tokens)");
  app.add_option("--seq", o.seq, "sequence length (default: the model's, at most 8192)");
  app.add_option("--precision", o.precision, "bf16, fp16, fp8 or fp32")->capture_default_str();
  app.add_option("--attention", o.attention, "flash or standard")->capture_default_str();
  app.add_flag("--fp32-grads", o.fp32_grads, "keep gradients in fp32 (Megatron main_grad)");
  app.add_flag("--json", o.json, "print JSON instead of tables");

  CLI::App* estimate = app.add_subcommand("estimate", "evaluate one layout: memory per GPU per pipeline stage");
  add_common(*estimate, o);
  estimate->add_option("--tp", o.tp, "tensor parallel size")->capture_default_str();
  estimate->add_option("--pp", o.pp, "pipeline parallel size")->capture_default_str();
  estimate->add_option("--dp", o.dp, "data parallel size (default: gpus / (tp*pp*cp))");
  estimate->add_option("--cp", o.cp, "context parallel size")->capture_default_str();
  estimate->add_option("--ep", o.ep, "expert parallel size (MoE)")->capture_default_str();
  estimate->add_option("--vpp", o.vpp, "virtual pipeline stages per rank (interleaved)")->capture_default_str();
  estimate->add_option("--mbs", o.mbs, "micro-batch size (sequences)")->capture_default_str();
  estimate->add_option("--zero", o.zero, "ZeRO stage 0..3")->capture_default_str();
  estimate->add_flag("--dist-opt", o.dist_opt, "Megatron distributed optimizer");
  estimate->add_option("--recompute", o.recompute, "none, selective or full")->capture_default_str();
  estimate->add_flag("--sp", o.sp, "sequence parallel");
  estimate->add_flag("--offload", o.offload, "optimizer states in host memory");
  estimate->add_option("--schedule", o.schedule, "gpipe, 1f1b or interleaved (default 1f1b; interleaved with --vpp)");

  CLI::App* list = app.add_subcommand("list", "model presets, size shorthands and clusters");

  try {
    app.parse(argc, argv);
    ProfileStore store(find_profiles_dir(o.profiles, "/proc/self/exe", DPLAN_PROFILES_DIR));
    if (*list) return run_list(store);
    if (*estimate) return run_estimate(o, store);
    if (o.model.empty() || top_gpus->count() == 0) {
      std::cerr << "dplan: error: give --model and --gpus (e.g. dplan --model 70B --gpus 64), or a subcommand: "
                   "estimate, list; see dplan --help\n";
      return 2;
    }
    return run_plan(o, store);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dplan: error: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "dplan: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dplan: error: internal: " << e.what() << "\n";
    return 1;
  }
}
