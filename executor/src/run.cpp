// One rank of the executor, the program dplan-worker runs (run_worker, the public header
// dplan/executor/executor.h). Started by `dplan run` (one per rank, on this machine), by torchrun
// (`torchrun --nproc-per-node N --no-python dplan-worker plan.json ...`) or by Slurm
// (`srun dplan-worker plan.json ...`). Reads its place from RANK / WORLD_SIZE / LOCAL_RANK /
// MASTER_ADDR / MASTER_PORT, or SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, trains the plan's
// layout for --steps steps, and rank 0 writes run.json (docs/run-json.md).
//
// Exit status: 0 done; 2 bad input (plan, flags, data); 1 a failure while running (a rank that
// died, a timeout), reported in one line that names the rank.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/executor/executor.h"
#include "dplan/executor/run_dir.h"
#include "dplan/executor/run_options.h"
#include "gpt.h"
#include "grad_sync.h"
#include "heartbeat.h"
#include "hf_load.h"
#include "machine_probe.h"
#include "memory_meter.h"
#include "offload.h"
#include "phase_clock.h"
#include "place.h"
#include "plan_file.h"
#include "rank_setup.h"
#include "run_record.h"
#include "safetensors.h"
#include "startup_clock.h"
#include "trainer.h"

namespace {
using namespace dplan;
using namespace dplan::executor;
using Seconds = std::chrono::duration<double>;

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

// "dplan-worker", or "dplan" when dplan run started this rank: bad input then reads as dplan's own.
std::string prefix() { return env_or("DPLAN_ERROR_PREFIX", "dplan-worker") + ": error: "; }

[[noreturn]] void exit_now(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);  // no destructors: a process group torn down mid-failure can block
}

// Input this rank refuses: one line, exit 2. Under dplan run the line goes to the run folder
// (run_dir.h, error.<rank>) and the launcher prints the first rank's, whichever rank that is, once;
// under another launcher rank 0 prints it (every rank reads the same plan and options).
[[noreturn]] void refuse_input(const Place& place, const std::string& what) {
  const std::string line = error_line(what);
  if (!place.run_dir.empty())
    write_rank_error(place.run_dir, place.rank, line);
  else if (place.rank == 0)
    std::fprintf(stderr, "%s%s\n", prefix().c_str(), line.c_str());
  exit_now(2);
}

// SIGTERM and SIGINT with --checkpoint-dir: the first asks the run to stop after the current step
// (the ranks agree on the step, save, and exit 0); a second aborts at once. Without
// --checkpoint-dir the default stands: the signal ends the rank.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  if (g_stop_signal) {
    static const char line[] = "dplan-worker: a second signal: aborting without saving\n";
    [[maybe_unused]] auto n = ::write(2, line, sizeof line - 1);
    ::_exit(128 + sig);
  }
  g_stop_signal = sig;
}
// Installs it for SIGTERM and SIGINT, except one this process was started ignoring (dplan run
// starts its ranks ignoring SIGINT: a terminal's Ctrl-C is the launcher's to forward).
void install_stop_signals() {
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// A CPU rank's threads: one. The plan's device is one core (the local-cpu cluster's cpu-core GPU;
// the time model gives each rank min(1, cores / ranks) of a core), so a rank must not spread over
// idle cores when there are fewer ranks than cores. One intra-op thread, and one BLAS thread: an
// OpenBLAS built with threads (Debian's libopenblas0-pthread or -openmp, where it is the
// libblas.so.3 that Debian's LibTorch calls) would otherwise run each GEMM on every core, under
// every rank at once (setup.sh installs libopenblas0-pthread).
void set_rank_threads(const Place&) {
  // Tensors on the CPU come from glibc's malloc (c10's posix_memalign). Above its mmap threshold
  // each is a fresh mapping, which the kernel zeroes page by page as the step first touches it and
  // unmaps when the tensor dies: every step paid page faults for its activations and gradients
  // (about 5 % of a gpt-bench step in perf). A fixed threshold at glibc's ceiling (32 MiB on 64-bit;
  // mallopt(3)) and no trimming keep freed blocks in the heap for the next step's tensors.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  torch::set_num_threads(1);
  using SetThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas_threads(1);
}

std::chrono::milliseconds collective_timeout(const RunOptions& args) {
  return std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
}

GroupOptions group_options(const Place& place, Backend backend, std::chrono::milliseconds timeout) {
  GroupOptions go;
  go.backend = backend;
  go.timeout = timeout;
  if (place.local_world == place.world) go.gloo_address = "127.0.0.1";  // one machine
  return go;
}

// The flags against the plan and the ranks that were started; InputError on a mismatch.
void check_run_options(const RunOptions& args, const ExecPlan& plan, const Place& place) {
  const auto& p = plan.parallel;
  if (plan.world_size() != place.world)
    throw InputError(args.plan_path + " is a layout for " + std::to_string(plan.world_size()) + " ranks (tp " +
                     std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " x dp " + std::to_string(p.dp) +
                     ") but " + std::to_string(place.world) + " were started; start " +
                     std::to_string(plan.world_size()));
  if (const std::string problem = run_options_problem(args); !problem.empty()) throw InputError(problem);
  // The reference holds whole tensors, which only a one-rank run has without gathering them.
  if (!args.save_reference.empty() && place.world != 1)
    throw InputError("--save-reference needs a one-rank run (tp = pp = dp = 1); " + args.plan_path + " has " +
                     std::to_string(place.world) + " ranks");
  // The rules of -o: never the plan, a link or a file dplan did not write (an earlier reference
  // file is one it did) unless --force.
  if (!args.save_reference.empty()) {
    static const OutputKind reference_kind{"reference file", [](const std::string& text) {
                                             std::map<std::string, std::string> metadata;
                                             try {
                                               parse_safetensors(text, &metadata);
                                             } catch (const std::invalid_argument&) {
                                               return false;
                                             }
                                             return metadata.count("dplan") == 1;
                                           }};
    check_output_path(args.save_reference, reference_kind, args.force);
  }
  // Before training, not after it: the run's output must be writable (dplan run checked it too;
  // under torchrun or srun this is the only check).
  if (place.rank == 0 && !args.output.empty())
    check_output_path(args.output, costmodel::run_record_output(), args.force);
}

// What a run trains on and in which number formats: what --device and --precision ask for, on what
// this machine has.
struct DeviceChoice {
  bool cuda = false;
  bool bf16 = false;  // parameters and activations in bf16, master weights and AdamW states in fp32
  at::ScalarType grad_dtype = at::kFloat;
  std::string precision_note;  // run.json's config.precision_note, when not empty
};

DeviceChoice choose_device(const RunOptions& args, const ExecPlan& plan) {
  DeviceChoice d;
  if (args.device == "cuda") {
    if (!torch::cuda::is_available()) throw InputError("--device cuda: no CUDA device is visible to this LibTorch");
    d.cuda = true;
  } else if (args.device == "auto") {
    d.cuda = torch::cuda::is_available() && nccl_available();
  } else if (args.device != "cpu") {
    throw InputError("--device " + args.device + " is not one of: auto, cpu, cuda");
  }
  // Precision: 16-bit plans train in bf16 with fp32 master weights and AdamW states on CUDA;
  // fp16 and fp8 plans too (no loss scaling, no fp8 GEMMs). CPU trains fp32 unless asked.
  const bool planned_16bit = plan.training.precision != costmodel::Precision::fp32;
  if (args.precision == "auto") {
    d.bf16 = d.cuda && planned_16bit;
    if (planned_16bit && !d.cuda) d.precision_note = "ran fp32: 16-bit training runs on CUDA (--precision bf16 forces it)";
  } else if (args.precision == "bf16") {
    d.bf16 = true;
  } else if (args.precision != "fp32") {
    throw InputError("--precision " + args.precision + " is not one of: auto, fp32, bf16");
  }
  if (d.bf16 && (plan.training.precision == costmodel::Precision::fp16 || plan.training.precision == costmodel::Precision::fp8))
    d.precision_note = std::string("ran bf16 for a ") + costmodel::to_string(plan.training.precision) + " plan";
  // Gradients accumulate and reduce in fp32 (Megatron's main_grad) where the plan's are
  // (costmodel::gradients_in_fp32: --fp32-grads, or an engine that keeps bf16's in fp32), as its
  // memory was priced.
  d.grad_dtype = !d.bf16 || costmodel::gradients_in_fp32(plan.training) ? at::kFloat : at::kBFloat16;
  return d;
}

// --save-reference: what an outside implementation needs to train the same steps from the same
// start (bench/torch_gpt.py --reference): every parameter as it is before step 1 under its global
// name (a one-rank run holds them whole), "tokens.step<k>" int64 [global_batch, seq + 1] for each
// step k (row j is global sample j: inputs row[:-1], targets row[1:]; data-parallel rank r of dp
// reads rows r, r + dp, ...), and in the metadata "dplan" a JSON object with the model, the batch
// and the optimizer's settings; and what step 1 computed from them (save_reference_step1). Draws
// the steps' data from a copy of the run's data source, so training sees the same batches.
struct ReferenceFile {
  NamedTensors tensors;
  json info;
};
ReferenceFile reference_inputs(const RunOptions& args, const ExecPlan& plan, GptStage& stage, const DataSource& data) {
  NamedTensors tensors;
  for (const Parameter& p : stage.parameters()) tensors.emplace_back(p.name, p.tensor.detach().to(at::kFloat).clone());
  DataSource ahead = data;
  for (int s = 0; s < args.steps; ++s) {
    std::vector<at::Tensor> rows;
    for (const Batch& b : ahead.next_step(plan.parallel.micro_batch))
      rows.push_back(at::cat({b.inputs, b.targets.narrow(1, b.targets.size(1) - 1, 1)}, 1));
    tensors.emplace_back("tokens.step" + std::to_string(s), at::cat(rows, 0));
  }
  const costmodel::ModelSpec& m = plan.model;
  const json info = {
      {"format_version", 1},
      {"model",
       {{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"num_heads", m.num_heads},
        {"num_kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim}, {"ffn_hidden_size", m.ffn_hidden_size},
        {"vocab_size", m.vocab_size}, {"padded_vocab_size", stage.padded_vocab()}, {"max_seq_len", m.max_seq_len},
        {"mlp", m.mlp == costmodel::MlpKind::gelu ? "gelu" : "swiglu"},
        {"norm", m.norm == costmodel::NormKind::layernorm ? "layernorm" : "rmsnorm"},
        {"position", m.position == costmodel::PositionKind::learned ? "learned" : "rotary"},
        {"tied_embeddings", m.tied_embeddings}, {"qkv_bias", m.qkv_bias}, {"out_bias", m.out_bias},
        {"mlp_bias", m.mlp_bias}, {"attention_dropout", m.attention_dropout}, {"hidden_dropout", m.hidden_dropout},
        {"norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta}, {"activation", m.activation},
        {"qk_norm", m.qk_norm}}},
      {"training",
       {{"steps", args.steps}, {"global_batch", plan.training.global_batch}, {"seq_len", plan.training.seq_len},
        {"loss", "mean over the global batch's tokens"}}},
      {"optimizer",
       {{"name", "AdamW"}, {"lr", args.lr}, {"betas", {kAdamBeta1, kAdamBeta2}}, {"eps", kAdamEps},
        {"weight_decay", kWeightDecay}, {"weight_decay_on", "matrices and embeddings (not norms, not biases)"},
        {"max_grad_norm", args.max_grad_norm}, {"clip_eps", 1e-6}}}};
  return {std::move(tensors), info};
}

// Step 1's results, added once its gradients are complete (before clipping): "logits.step0" fp32
// [global_batch, seq, vocab] (the micro-batches' in order), "grad.<global name>" for every
// parameter, and with --init-from "hf_grad.<checkpoint name>" for every checkpoint tensor (the
// gradient of the mean loss over the global batch, as loss.backward() of that mean gives it);
// then the file is written.
void save_reference_step1(const RunOptions& args, ReferenceFile& ref, GptStage& stage, const HfCheckpoint* init) {
  ref.tensors.emplace_back("logits.step0", at::cat(stage.kept_logits(), 0).cpu());
  std::map<std::string, at::Tensor> grads;
  for (const Parameter& p : stage.parameters()) {
    at::Tensor g = p.tensor.grad().defined() ? p.tensor.grad().detach().to(at::kFloat).cpu() : at::zeros_like(p.tensor, at::kFloat).cpu();
    if (g.size(0) > p.slice.shape[0]) g = g.narrow(0, 0, p.slice.shape[0]);  // a padded vocabulary's extra rows dropped
    grads[p.name] = g;
    ref.tensors.emplace_back("grad." + p.name, g);
  }
  if (init)
    for (auto& [name, g] : to_hf_tensors(*init, grads, /*gradients=*/true)) ref.tensors.emplace_back("hf_grad." + name, g);
  write_safetensors(args.save_reference, ref.tensors, {{"format", "pt"}, {"dplan", ref.info.dump()}});
  if (!args.quiet)
    std::fprintf(stderr, "wrote the reference inputs of %d steps and step 1's logits and gradients to %s\n", args.steps,
                 args.save_reference.c_str());
}

struct TrainLog {
  std::vector<StepRecord> steps;
  MemoryPeaks peaks;
  int stop_signal = 0;  // the signal after which the ranks stopped early (0: ran every step)
};

// Checkpoints during the loop: where they go, and the state they read.
struct CheckpointPlan {
  Checkpointer* checkpointer = nullptr;  // null: no --checkpoint-dir
  const TrainingState* state = nullptr;
  Group* world = nullptr;
  at::Device device = at::kCPU;
};

// The loop: from step `first_step` (a resumed run's checkpoint) to --steps optimizer steps, each
// timed by phase and metered; rank 0 prints a progress line every --log-every steps. With
// checkpoints: a save every --save-every steps, and after each step the ranks agree (a one-number
// all-reduce over the world) whether any received SIGTERM or SIGINT; if one did, every rank
// saves at this step and the loop ends. Throws when the loss is no longer finite.
TrainLog train_steps(const RunOptions& args, const Place& place, const ExecPlan& plan, Trainer& trainer,
                     DataSource& data, PhaseClock& clock, MemoryMeter& meter, int first_step,
                     const CheckpointPlan& checkpoints) {
  TrainLog log;
  const double tokens = double(plan.training.global_batch) * plan.training.seq_len;
  const auto run_start = std::chrono::steady_clock::now();
  for (int s = first_step; s < args.steps; ++s) {
    std::vector<Batch> batches = data.next_step(plan.parallel.micro_batch);
    const int64_t resident = meter.current_bytes();
    meter.reset_peak();
    clock.start_step();
    const StepResult result = trainer.step(batches);
    StepRecord step;
    step.loss = result.loss;
    step.grad_norm = result.grad_norm;
    step.phases_s = clock.end_step();
    for (double x : step.phases_s) step.time_s += x;
    log.peaks.peak_bytes = std::max(log.peaks.peak_bytes, meter.peak_bytes());
    log.peaks.host_peak_bytes = meter.host_peak_bytes();  // over the run
    log.peaks.reserved_peak_bytes = std::max(log.peaks.reserved_peak_bytes, meter.reserved_peak_bytes());
    log.peaks.outside_allocator_bytes = std::max(log.peaks.outside_allocator_bytes, meter.outside_allocator_bytes());
    // Activations: the high-water mark of what a step allocates above what it started with,
    // communication buffers (counted apart) excluded; the first step also creates the
    // optimizer states, so it is left out.
    if (s > first_step || args.steps == first_step + 1) {
      log.peaks.activations_bytes =
          std::max(log.peaks.activations_bytes, meter.peak_excluding_buffers_bytes() - resident);
      log.peaks.buffers_bytes = std::max(log.peaks.buffers_bytes, meter.peak_buffer_bytes());
    }
    log.steps.push_back(step);
    if (place.rank == 0 && !args.quiet && ((s + 1) % args.log_every == 0 || s + 1 == args.steps)) {
      double elapsed = Seconds(std::chrono::steady_clock::now() - run_start).count();
      double eta = elapsed / (s + 1 - first_step) * (args.steps - s - 1);
      std::fprintf(stderr, "step %d/%d  loss %.4f  %.3f s  %.0f tokens/s  ETA %.0f s%s\n", s + 1, args.steps,
                   step.loss, step.time_s, tokens / step.time_s, eta,
                   s - first_step < args.warmup_steps() ? "  (warm-up)" : "");
    }
    if (!std::isfinite(step.loss))
      throw std::runtime_error("the loss is " + std::to_string(step.loss) + " at step " + std::to_string(s));
    if (!checkpoints.checkpointer) continue;
    // The ranks agree on whether to stop: any rank's signal stops all after this step.
    at::Tensor stop = at::full({1}, g_stop_signal ? double(g_stop_signal) : 0.0,
                               at::TensorOptions().dtype(at::kFloat).device(checkpoints.device));
    checkpoints.world->all_reduce(stop);
    const bool stopping = stop.item<double>() > 0;
    const bool due = args.save_every > 0 && (s + 1) % args.save_every == 0;
    if (due || stopping) checkpoints.checkpointer->save(s + 1, *checkpoints.state);
    if (stopping) {
      log.stop_signal = g_stop_signal ? int(g_stop_signal) : SIGTERM;  // a peer's signal: it was asked to stop
      break;
    }
  }
  return log;
}

// run.json's "config": how this run was set up.
json run_config(const RunOptions& args, const Place& place, const ExecPlan& plan, const DeviceChoice& device,
                Backend backend, const GradSync& grads, const DataSource& data) {
  json config = {{"steps", args.steps}, {"warmup_steps", args.warmup_steps()}, {"seed", args.seed},
                 {"data", data.describe()}, {"device", device.cuda ? "cuda" : "cpu"},
                 {"device_name", device.cuda ? "cuda" : "cpu"}, {"backend", to_string(backend)},
                 {"precision", device.bf16 ? "bf16" : "fp32"},
                 {"planned_precision", costmodel::to_string(plan.training.precision)},
                 {"grad_dtype", device.grad_dtype == at::kFloat ? "fp32" : "bf16"},
                 {"deterministic", args.deterministic},
                 {"threads_per_rank", torch::get_num_threads()}, {"timeout_s", args.timeout_s},
                 {"launcher", place.launcher}, {"lr", args.lr}, {"max_grad_norm", args.max_grad_norm},
                 {"bucket_bytes", plan.training.bucket_bytes}, {"num_buckets", grads.num_buckets()}};
  if (!device.precision_note.empty()) config["precision_note"] = device.precision_note;
  return config;
}

// Every rank's report through the store: rank 0 gets them all, in rank order; the others none.
std::vector<json> gather_reports(c10d::Store& store, const Place& place, const json& mine) {
  std::string text = mine.dump();
  store.set("dplan/result/" + std::to_string(place.rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<json> all;
  if (place.rank != 0) return all;
  for (int r = 0; r < place.world; ++r) {
    auto bytes = store.get("dplan/result/" + std::to_string(r));
    all.push_back(json::parse(std::string(bytes.begin(), bytes.end())));
  }
  return all;
}

// Rank 0: run.json to -o, and the summary line. Throws when data-parallel replicas diverged.
// Returns what went wrong writing -o (empty: nothing): the caller reports it once the other ranks
// are done, and the measurements are not lost: they are saved in the temporary folder instead.
std::string write_run_record(const RunOptions& args, const Place& place, const ExecPlan& plan,
                             const std::vector<json>& reports, const json& config, const MemoryMeter& meter,
                             const TrainLog& log, int first_step, const std::optional<costmodel::RunCheckpoints>& checkpoints) {
  const int ran = static_cast<int>(log.steps.size());
  json run = assemble_run(plan, place.world, ran, std::min(args.warmup_steps(), std::max(0, ran - 1)), reports, config,
                          meter.source(), first_step, checkpoints);
  std::string write_error;
  if (!args.output.empty()) {
    const std::string text = run.dump(1) + "\n";
    try {
      write_file_atomically(args.output, text);
    } catch (const InputError& e) {
      const std::string rescue =
          (std::filesystem::temp_directory_path() / ("dplan-run-" + std::to_string(::getpid()) + ".json")).string();
      write_file_atomically(rescue, text);
      write_error = std::string(e.what()) + "; the measurements were saved to " + rescue + " instead";
    }
  }
  if (!args.quiet) {
    std::fprintf(stderr, "median step %.4f s (%zu measured steps), %.0f tokens/s, final loss %.4f%s\n",
                 run["step_time_s"]["median"].get<double>(), static_cast<size_t>(run["step_time_s"]["count"].get<long long>()),
                 run["tokens_per_s"].get<double>(), log.steps.back().loss,
                 args.output.empty() || !write_error.empty() ? "" : ("; wrote " + args.output).c_str());
  }
  if (!run["replicas"]["identical"].get<bool>()) throw std::runtime_error("data-parallel replicas diverged");
  return write_error;
}

// A failure while training: one line naming the rank that stopped (when one did), then out. Under
// dplan run the stopped ranks also go to DPLAN_RUN_DIR/diagnosis.<rank> (their numbers, on one
// line), written before this rank exits: the launcher reads it when it reaps this rank.
[[noreturn]] void stop_after_failure(const StorePtr& store, const Place& place, const std::exception& e) {
  // Under dplan run a rank that refused its input is the cause, and the launcher says its line
  // (run_dir.h): the collective that failed here only followed from it.
  if (!place.run_dir.empty())
    for (int r = 0; r < place.world; ++r)
      if (r != place.rank && read_rank_error(place.run_dir, r)) exit_now(1);
  const Diagnosis culprit = diagnose(store, place);  // not the heartbeat thread's connection
  std::fprintf(stderr, "%srank %d: %s%s(%s)\n", prefix().c_str(), place.rank, culprit.line.c_str(),
               culprit.line.empty() ? "" : "; stopping ", first_line(e.what()).c_str());
  if (!place.run_dir.empty() && !culprit.stopped.empty()) {
    std::string ranks;
    for (int r : culprit.stopped) ranks += (ranks.empty() ? "" : " ") + std::to_string(r);
    if (FILE* f = std::fopen(diagnosis_file(place.run_dir, place.rank).c_str(), "w")) {
      std::fprintf(f, "%s\n", ranks.c_str());
      std::fclose(f);
    }
  }
  // Rank 0 serves a TCPStore: it stays a moment so that the survivors can still read it.
  if (place.rank == 0 && place.world > 1 && place.run_dir.empty()) std::this_thread::sleep_for(kBeat * 12);
  exit_now(1);
}

// Where to resume from: --resume, or under a torchrun restart the --checkpoint-dir (empty: none).
std::string resume_folder(const RunOptions& args) {
  const bool restarted = std::atoi(env_or("TORCHELASTIC_RESTART_COUNT", "0").c_str()) > 0;
  if (args.resume.empty() && restarted && !args.checkpoint_dir.empty() && std::filesystem::is_directory(args.checkpoint_dir))
    return args.checkpoint_dir;
  return args.resume;
}

// The newest complete checkpoint in `dir` loaded into `state` (none there: an error with --resume,
// a fresh start after a restart); the step it was saved after, also noted in `record`.
int resume_from(const std::string& dir, const RunOptions& args, const Place& place, const TrainingState& state,
                const json& plan_info, costmodel::RunCheckpoints& record) {
  const std::optional<FoundCheckpoint> found = find_checkpoint(dir, place.rank == 0);
  if (!found && !args.resume.empty())
    throw InputError("--resume " + dir + ": no complete checkpoint there (a folder step-N with its manifest.json)");
  if (!found) return 0;
  if (found->step >= args.steps)
    throw InputError(found->folder + " is at step " + std::to_string(found->step) + ", not before --steps " +
                     std::to_string(args.steps) + "; give more steps");
  load_checkpoint(*found, state, place.rank, place.world, plan_info);
  record.resumed_from_step = found->step;
  record.resumed_from = found->folder;
  return found->step;
}

// --deterministic, before the first cuBLAS handle: a fixed workspace makes cuBLAS's GEMMs
// reproducible (cuBLAS documentation, "Results reproducibility"); ATen then picks deterministic
// kernels, and an operator that has none stops the run naming itself. Not warn-only: under
// warn_only ATen keeps the non-deterministic attention backwards and only warns (PyTorch 2.x,
// aten/src/ATen/native/transformers/cuda/attention_backward.cu; sdp_utils.cpp's
// check_cudnn_deterministic passes cuDNN attention only when warn-only). An H100 run with
// warn_only=true took cuDNN attention and its resumed losses differed from the uninterrupted
// run's from the second step after the resume (docs/gpu-check.md).
void use_deterministic_kernels() {
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

// --checkpoint-dir: the saver, over a store connection of its own; `token` names its saves' hidden
// folders (rank 0's CheckpointFolderLock's, agreed through the store).
std::unique_ptr<Checkpointer> start_checkpointer(const RunOptions& args, const Place& place, const StorePtr& store,
                                                 std::chrono::milliseconds timeout, const json& plan_info,
                                                 const std::string& token) {
  StorePtr checkpoint_store = place.world > 1 ? connect_store(place, false, timeout) : store;
  return std::make_unique<Checkpointer>(args.checkpoint_dir, args.keep, !args.sync_save, place.rank, place.world,
                                        checkpoint_store, plan_info, token);
}

// Input another rank refused (agree_on): that rank and its line. The rank that refused says it
// (under dplan run, run_dir.h); under another launcher rank 0 says it for that rank.
struct PeerRefused : std::runtime_error {
  PeerRefused(int rank, const std::string& line) : std::runtime_error(line), refusing_rank(rank) {}
  int refusing_rank;
};

// Runs `check` on every rank and has the ranks agree on it through the store before any goes on:
// when a rank's check throws InputError, the lowest such rank throws its own again and every other
// rank throws PeerRefused naming it (one line in all, exit 2), so no rank goes on to a collective
// that the others left (which would add a misleading "no heartbeat" line). Returns rank 0's value
// on every rank. `what` names the step.
std::string agree_on(c10d::Store& store, const Place& place, const std::string& what,
                     const std::function<std::string()>& check) {
  const std::string prefix = "dplan/agree/" + env_or("TORCHELASTIC_RESTART_COUNT", "0") + "/" + what + "/";
  std::string mine;
  try {
    mine = "ok " + check();
  } catch (const InputError& e) {
    mine = "error " + std::string(e.what());
  }
  store.set(prefix + std::to_string(place.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::string first, error;
  int refusing = -1;
  for (int r = 0; r < place.world && error.empty(); ++r) {
    const auto bytes = r == place.rank ? std::vector<uint8_t>(mine.begin(), mine.end()) : store.get(prefix + std::to_string(r));
    const std::string text(bytes.begin(), bytes.end());
    if (text.rfind("error ", 0) == 0) {
      error = text.substr(6);
      refusing = r;
    }
    if (r == 0) first = text.substr(3);
  }
  if (error.empty()) return first;
  // Rank 0 may serve the store (torchrun without an agent store, srun): it leaves only once every
  // rank has read the verdict.
  store.set(prefix + "read/" + std::to_string(place.rank), std::vector<uint8_t>{1});
  if (place.rank == 0)
    for (int r = 1; r < place.world; ++r) store.get(prefix + "read/" + std::to_string(r));
  if (refusing != place.rank) throw PeerRefused(refusing, error);
  throw InputError(error);
}

// --checkpoint-dir: rank 0 makes the folder and locks it for the run (the lock lives as long as
// the returned object); every rank learns the run's token, or the one line that refused the folder.
std::unique_ptr<CheckpointFolderLock> lock_checkpoint_dir(const RunOptions& args, const Place& place, c10d::Store& store,
                                                          std::string& token) {
  std::unique_ptr<CheckpointFolderLock> lock;
  token = agree_on(store, place, "checkpoint-dir", [&] {
    if (place.rank != 0) return std::string();
    lock = std::make_unique<CheckpointFolderLock>(args.checkpoint_dir);
    check_save_targets(args.checkpoint_dir, args.steps, args.save_every);
    return lock->token();
  });
  return lock;
}

// What the rank's report says of each save (its "checkpoint_saves").
json save_records(const Checkpointer& checkpointer) {
  json saves = json::array();
  for (const SaveRecord& r : checkpointer.records())
    saves.push_back({{"step", r.step}, {"blocking_s", r.blocking_s}, {"wait_s", r.wait_s}, {"write_s", r.write_s},
                     {"file_bytes", r.file_bytes}, {"state_bytes", r.state_bytes}});
  return saves;
}

// Rank 0, when a signal stopped the run early: which signal, after which step, and the checkpoint saved then.
void report_stop(const RunOptions& args, const Place& place, const TrainLog& log, int first_step) {
  if (place.rank != 0 || !log.stop_signal) return;
  const int last_step = first_step + static_cast<int>(log.steps.size());
  std::fprintf(stderr, "stopped by %s after step %d; saved checkpoint %s\n", signal_name(log.stop_signal), last_step,
               checkpoint_folder(args.checkpoint_dir, last_step).c_str());
}

int train(const RunOptions& args, const Place& place, StartupClock& startup) {
  const ExecPlan plan = read_plan(args.plan_path);
  check_run_options(args, plan, place);
  // --init-from: the checkpoint checked against the plan's model before the rendezvous.
  const std::optional<HfCheckpoint> init =
      args.init_from.empty() ? std::nullopt : std::optional<HfCheckpoint>(read_hf_checkpoint(args.init_from, plan.model));
  if (args.deterministic) use_deterministic_kernels();
  const DeviceChoice device = choose_device(args, plan);
  MemoryMeter meter(device.cuda ? place.local_rank : -1);  // before the first tensor
  PhaseClock clock(device.cuda ? std::function<void()>([dev = place.local_rank] { torch::cuda::synchronize(dev); })
                               : std::function<void()>());
  if (!device.cuda) set_rank_threads(place);
  DataSource data(args.data_path, plan.training.seq_len, plan.model.vocab_size, plan.training.global_batch,
                  plan.parallel.dp, plan.mesh().coordinates(place.rank).dp, args.seed);
  startup.mark("setup");  // the plan read and checked, the device, the meter, the threads, the data

  // Rendezvous and heartbeats.
  const auto timeout = collective_timeout(args);
  StorePtr store = connect_store(place, !place.agent_store && place.rank == 0, timeout);
  StorePtr beat_store = place.world > 1 ? connect_store(place, false, timeout) : store;
  Heartbeat heartbeat(beat_store, place.rank);
  startup.mark("rendezvous");
  // The checkpoint folder first: one run writes into it at a time (rank 0 holds its lock till exit).
  std::string checkpoint_token;
  const std::unique_ptr<CheckpointFolderLock> checkpoint_lock =
      args.checkpoint_dir.empty() ? nullptr : lock_checkpoint_dir(args, place, *store, checkpoint_token);
  try {
    const GroupOptions go = group_options(place, device.cuda ? Backend::nccl : Backend::gloo, timeout);
    ParallelContext ctx =
        build_parallel_context(plan, place.rank, device.cuda ? at::Device(at::kCUDA, place.local_rank) : at::Device(at::kCPU),
                               device.bf16 ? at::kBFloat16 : at::kFloat, store, go, clock, meter);
    startup.mark("groups");
    GptStage stage = build_model(plan, ctx, args.seed, place.rank);
    if (init) load_hf_checkpoint(*init, stage.parameters());
    startup.mark("model");
    GradSync grads(stage, ctx, static_cast<int64_t>(plan.training.bucket_bytes), plan.parallel.zero_stage,
                   plan.parallel.distributed_optimizer, device.grad_dtype);
    std::unique_ptr<torch::optim::AdamW> optimizer = build_optimizer(grads, args.lr, plan.parallel.offload_optimizer);
    Trainer trainer(stage, ctx, grads, *optimizer, step_options(plan, args.max_grad_norm));
    startup.mark("optimizer");
    std::optional<ReferenceFile> reference;
    if (!args.save_reference.empty()) {
      reference = reference_inputs(args, plan, stage, data);
      stage.keep_logits(true);
      trainer.observe_gradients([&, written = false]() mutable {
        if (written) return;  // step 1's only
        save_reference_step1(args, *reference, stage, init ? &*init : nullptr);
        stage.keep_logits(false);
        written = true;
      });
    }

    // Checkpoints: resume (--resume, or a torchrun restart with --checkpoint-dir), then save.
    const TrainingState state{stage, grads, *optimizer, data, ctx.device};
    std::optional<costmodel::RunCheckpoints> checkpoint_record;
    json plan_info;
    const std::string resume_dir = resume_folder(args);
    if (!resume_dir.empty() || !args.checkpoint_dir.empty()) {
      plan_info = checkpoint_plan_info(args.plan_path);
      checkpoint_record.emplace();
      checkpoint_record->dir = args.checkpoint_dir;
      checkpoint_record->async = !args.sync_save;
    }
    // Every rank loads, then they agree: a damaged checkpoint is one line and exit 2 on all of them.
    int first_step = 0;
    if (!resume_dir.empty()) {
      agree_on(*store, place, "resume", [&] {
        first_step = resume_from(resume_dir, args, place, state, plan_info, *checkpoint_record);
        return std::string();
      });
      if (place.rank == 0 && !args.quiet && first_step > 0)
        std::fprintf(stderr, "resuming from %s (step %d)\n", checkpoint_record->resumed_from.c_str(), first_step);
    }
    std::unique_ptr<Checkpointer> checkpointer;
    CheckpointPlan checkpoints;
    if (!args.checkpoint_dir.empty()) {
      checkpointer = start_checkpointer(args, place, store, timeout, plan_info, checkpoint_token);
      checkpoints = {checkpointer.get(), &state, &ctx.world, ctx.device};
    }

    startup.mark("before_first_step");  // a reference file, a resume, the checkpoint saver
    const TrainLog log = train_steps(args, place, plan, trainer, data, clock, meter, first_step, checkpoints);
    if (checkpointer) checkpointer->wait();  // the last save's write, and rank 0's manifest
    if (log.stop_signal) checkpoint_record->stopped_by_signal = log.stop_signal;

    grads.gather_all_units();  // ZeRO-3: the whole model, to hash it
    json mine = rank_report(place.rank, ctx.stage, log.steps,
                            std::min(args.warmup_steps(), std::max(0, static_cast<int>(log.steps.size()) - 1)), log.peaks,
                            stage, grads, *optimizer);
    mine["startup_s"] = startup.to_json();
    if (checkpointer) mine["checkpoint_saves"] = save_records(*checkpointer);
    const std::vector<json> reports = gather_reports(*store, place, mine);
    std::string write_error;
    if (place.rank == 0)
      write_error = write_run_record(args, place, plan, reports,
                                     run_config(args, place, plan, device, go.backend, grads, data), meter, log,
                                     first_step, checkpoint_record);
    report_stop(args, place, log, first_step);
    ctx.world.barrier();  // a TCPStore lives in rank 0: nobody leaves before it has read everything
    heartbeat.stop();
    if (!write_error.empty()) throw InputError(write_error);
    return 0;
  } catch (const InputError&) {
    throw;
  } catch (const PeerRefused&) {
    throw;
  } catch (const std::exception& e) {
    stop_after_failure(store, place, e);
  }
}

// --probe: every rank measures at once, with a training rank's threads, over a Gloo world group.
int probe_machine(const RunOptions& args, const Place& place) {
  if (args.output.empty()) throw InputError("--probe needs -o FILE for the measurements");
  set_rank_threads(place);
  const auto timeout = collective_timeout(args);
  auto store = connect_store(place, !place.agent_store && place.rank == 0, timeout);
  Group world = world_group(store, place.rank, place.world, group_options(place, Backend::gloo, timeout));
  run_machine_probe({args.output}, world);
  if (place.rank == 0 && !args.quiet) std::fprintf(stderr, "wrote %s\n", args.output.c_str());
  return 0;
}

// --check-backend NAME: the backend's collectives on a group of this process alone (comm.h,
// check_collectives), one line each, and with -o the same as JSON.
int check_backend(const RunOptions& args, const std::string& name) {
  if (name != "gloo" && name != "nccl") throw InputError("--check-backend " + name + " is not one of: gloo, nccl");
  const Backend backend = name == "nccl" ? Backend::nccl : Backend::gloo;
  static const OutputKind check_kind = json_output_kind("backend check", [](const json& file) {
    if (file.value("generator", "") != "dplan-worker --check-backend") throw std::invalid_argument("not a backend check");
  });
  if (!args.output.empty()) check_output_path(args.output, check_kind, args.force);
  const at::Device device = backend == Backend::nccl ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const std::vector<CollectiveCheck> checks = check_collectives(backend, device, collective_timeout(args));
  json out = {{"generator", "dplan-worker --check-backend"}, {"backend", name}, {"device", device.str()},
              {"world_size", 1}, {"torch_version", TORCH_VERSION}};
  bool all_ok = true;
  for (const CollectiveCheck& c : checks) {
    all_ok = all_ok && c.ok;
    std::printf("%s %-14s %10lld bytes %9.3f ms  max |error| %g  %s\n", name.c_str(), c.collective.c_str(),
                static_cast<long long>(c.bytes), c.time_s * 1e3, c.max_abs_error, c.ok ? "ok" : "WRONG");
    out["collectives"].push_back({{"collective", c.collective}, {"bytes", c.bytes}, {"time_s", c.time_s},
                                  {"max_abs_error", c.max_abs_error}, {"ok", c.ok}});
  }
  out["ok"] = all_ok;
  if (!args.output.empty()) write_file_atomically(args.output, out.dump(1) + "\n");
  return all_ok ? 0 : 1;
}

}  // namespace

int dplan::executor::run_worker(int argc, char** argv) {
  StartupClock startup;  // first: the start-up is timed from here (and from the launch, when known)
  RunOptions args;
  bool probe = false;
  CLI::App app{"dplan-worker: one rank of dplan's executor (started by dplan run, torchrun or srun)", "dplan-worker"};
  app.add_option("plan", args.plan_path, "plan.json written by dplan -o (not with --probe)");
  app.add_flag("--probe", probe,
               "measure this machine instead (GEMMs, memory bandwidth, Gloo collectives over the ranks) into -o FILE");
  std::string backend_to_check;
  app.add_option("--check-backend", backend_to_check,
                 "check a c10d backend instead (gloo on the CPU, nccl on CUDA device 0): its collectives on a group of "
                 "this process alone, against the expected values (-o FILE: also as JSON)");
  add_run_flags(app, args);
  Place place;
  try {
    app.parse(argc, argv);
    place = read_place();
    if (probe) return probe_machine(args, place) == 0 ? (exit_now(0), 0) : 1;
    if (!backend_to_check.empty()) return check_backend(args, backend_to_check) == 0 ? (exit_now(0), 0) : 1;
    if (args.plan_path.empty()) throw InputError("give plan.json (written by dplan -o), or --probe -o FILE");
    if (!args.checkpoint_dir.empty()) install_stop_signals();
    return train(args, place, startup) == 0 ? (exit_now(0), 0) : 1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    refuse_input(place, e.what());
  } catch (const InputError& e) {
    refuse_input(place, e.what());
  } catch (const PeerRefused& e) {
    if (place.run_dir.empty() && place.rank == 0)
      std::fprintf(stderr, "%srank %d: %s\n", prefix().c_str(), e.refusing_rank, error_line(e.what()).c_str());
    exit_now(2);
  } catch (const std::invalid_argument& e) {
    refuse_input(place, e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse_input(place, args.plan_path + ": malformed plan: " + e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%srank %d: %s\n", prefix().c_str(), place.rank, first_line(e.what()).c_str());
    exit_now(1);
  }
}
