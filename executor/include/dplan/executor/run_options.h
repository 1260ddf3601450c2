// The options of a training run, declared once. `dplan run` registers them on its command line,
// turns them back into each rank's dplan-worker arguments, and dplan-worker registers the same
// ones on its own, all from the one table in for_each_run_flag: a new option is one line there
// and one field in RunOptions.
//
// dplan includes this header and builds without LibTorch, so it uses the standard library and
// CLI11 only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

namespace dplan::executor {

// --warmup's default: 2 steps, or all but the last when --steps is smaller (so `--steps 2` runs).
inline constexpr int kAutoWarmup = -1;
inline constexpr int kDefaultWarmupSteps = 2;

struct RunOptions {
  std::string plan_path;  // the positional plan.json (each binary declares it: the worker's is optional)
  std::string data_path, output, device = "auto", precision = "auto";
  std::string save_reference;  // a world-size-1 run writes its initial weights and step batches here
  std::string init_from;       // a Hugging Face checkpoint the weights start from (hf_checkpoint.h)
  int steps = 20, warmup = kAutoWarmup, log_every = 1;
  unsigned long long seed = 1234;
  double timeout_s = 60, lr = 1e-3, max_grad_norm = 1.0;
  // Checkpoints (docs/executor.md): every --save-every steps into --checkpoint-dir, the newest
  // --keep kept; --resume DIR continues from the newest complete one there.
  std::string checkpoint_dir, resume;
  int save_every = 0, keep = 2;
  bool sync_save = false;  // write within the step loop instead of a background thread
  bool quiet = false;
  // Deterministic kernels (ATen's deterministic algorithms, cuBLAS's fixed workspace): two runs of
  // the same plan and seed give bit-identical losses on CUDA too, at some speed.
  bool deterministic = false;
  bool force = false;  // -o may replace a file dplan did not write
  // The first steps left out of the statistics: --warmup, or by default 2 (fewer when --steps is).
  int warmup_steps() const {
    return warmup == kAutoWarmup ? std::clamp(steps - 1, 0, kDefaultWarmupSteps) : warmup;
  }
};

// Calls visit(names, field, help, show_default) for each option after the plan, in --help order.
// `names` is CLI11's ("-o,--output"); a bool field is a flag. Options is RunOptions or const
// RunOptions.
template <typename Options, typename Visit>
void for_each_run_flag(Options& o, Visit&& visit) {
  constexpr bool show_default = true;
  visit("--steps", o.steps, "optimizer steps", show_default);
  visit("--warmup", o.warmup, "first steps marked warm-up, left out of the statistics (default 2, at most --steps - 1)",
        !show_default);
  visit("--data", o.data_path, "byte-level text file (default: a seeded synthetic stream)", !show_default);
  visit("--seed", o.seed, "seed for weights, data order and synthetic data", show_default);
  visit("-o,--output", o.output, "write the measurements to this run.json", !show_default);
  visit("--force", o.force, "let -o and --save-reference replace an existing file dplan did not write (never the plan)",
        !show_default);
  visit("--timeout-s", o.timeout_s, "collective timeout; a dead rank is reported within it", show_default);
  visit("--device", o.device, "auto, cpu or cuda", show_default);
  visit("--precision", o.precision,
        "auto (the plan's 16-bit precision as bf16 on CUDA, fp32 on CPU), fp32, or bf16 (on CPU: slow, "
        "to check the mixed-precision path)",
        show_default);
  visit("--deterministic", o.deterministic,
        "deterministic kernels: the same plan and seed give bit-identical losses on CUDA too (slower)", !show_default);
  visit("--lr", o.lr, "AdamW learning rate", show_default);
  visit("--max-grad-norm", o.max_grad_norm, "clip the global gradient norm to this; 0: no clipping", show_default);
  visit("--init-from", o.init_from,
        "start from this Hugging Face checkpoint (a .safetensors file, a model.safetensors.index.json, or a folder "
        "holding either) of the plan's model instead of the seeded init",
        !show_default);
  visit("--save-reference", o.save_reference,
        "one rank only: write the initial parameters (full, fp32, global names) and every step's token ids "
        "to this safetensors file, the inputs of bench/torch_gpt.py --reference, and step 1's logits and "
        "gradients (also under the checkpoint's names with --init-from)",
        !show_default);
  visit("--checkpoint-dir", o.checkpoint_dir,
        "save sharded checkpoints into this folder (every --save-every steps, and when SIGTERM or SIGINT stops the "
        "run)",
        !show_default);
  visit("--save-every", o.save_every, "steps between checkpoints (0: only when a signal stops the run)", show_default);
  visit("--keep", o.keep, "the newest complete checkpoints kept; older ones go once a newer one is complete",
        show_default);
  visit("--sync-save", o.sync_save, "write checkpoints within the step loop (default: in a background thread)",
        !show_default);
  visit("--resume", o.resume,
        "continue from the newest complete checkpoint in this folder (any layout of the same model)", !show_default);
  visit("--log-every", o.log_every, "progress line every N steps", show_default);
  visit("--quiet", o.quiet, "no progress lines", !show_default);
}

// Every option after the plan, on `app`.
inline void add_run_flags(CLI::App& app, RunOptions& o) {
  for_each_run_flag(o, [&app](const char* names, auto& field, const char* help, bool show_default) {
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, bool>) {
      app.add_flag(names, field, help);
    } else {
      CLI::Option* option = app.add_option(names, field, help);
      if (show_default) option->capture_default_str();
    }
  });
}

// What is wrong with the options, as one line naming the flag and its valid range; empty when
// nothing is. Both binaries check it after parsing, before anything starts.
inline std::string run_options_problem(const RunOptions& o) {
  auto outside = [](double x, double lo, double hi) { return !(std::isfinite(x) && x >= lo && x <= hi); };
  auto text = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return std::string(buf);
  };
  if (o.steps < 1 || o.steps > 10000000) return "--steps must be from 1 to 10000000, got " + std::to_string(o.steps);
  if (o.warmup != kAutoWarmup && (o.warmup < 0 || o.warmup >= o.steps))
    return "--warmup must be at least 0 and below --steps (" + std::to_string(o.steps) + "), got " +
           std::to_string(o.warmup);
  if (o.log_every < 1) return "--log-every must be a positive integer, got " + std::to_string(o.log_every);
  if (outside(o.timeout_s, 0.1, 7 * 86400.0))
    return "--timeout-s must be from 0.1 to 604800 seconds, got " + text(o.timeout_s);
  if (o.save_every < 0) return "--save-every must be 0 (only on a signal) or a positive number of steps, got " + std::to_string(o.save_every);
  if (o.keep < 1) return "--keep must be at least 1, got " + std::to_string(o.keep);
  if (o.save_every > 0 && o.checkpoint_dir.empty()) return "--save-every needs --checkpoint-dir DIR";
  if (o.sync_save && o.checkpoint_dir.empty()) return "--sync-save needs --checkpoint-dir DIR";
  if (outside(o.lr, 1e-12, 10)) return "--lr must be from 1e-12 to 10, got " + text(o.lr);
  if (outside(o.max_grad_norm, 0, 1e9)) return "--max-grad-norm must be from 0 (no clipping) to 1e9, got " + text(o.max_grad_norm);
  return "";
}

// The arguments that give a worker these options: each option with its value (an empty string
// too, which reads back as itself), each flag when set. Doubles are written with 17 significant
// digits, so they read back exactly (std::to_string keeps 6 decimals).
inline std::vector<std::string> run_flags_argv(const RunOptions& o) {
  std::vector<std::string> argv;
  for_each_run_flag(o, [&argv](const std::string& names, const auto& field, const char*, bool) {
    using T = std::decay_t<decltype(field)>;
    const std::string name = names.substr(names.rfind(',') + 1);  // the long name; npos + 1 is 0
    if constexpr (std::is_same_v<T, bool>) {
      if (field) argv.push_back(name);
    } else if constexpr (std::is_same_v<T, std::string>) {
      argv.insert(argv.end(), {name, field});
    } else if constexpr (std::is_floating_point_v<T>) {
      char exact[32];
      std::snprintf(exact, sizeof exact, "%.17g", field);
      argv.insert(argv.end(), {name, exact});
    } else {
      argv.insert(argv.end(), {name, std::to_string(field)});
    }
  });
  return argv;
}

}  // namespace dplan::executor
