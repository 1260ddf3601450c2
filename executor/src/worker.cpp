// dplan-worker: one rank of the executor. Started by `dplan run` (one per rank, on this machine),
// by torchrun (`torchrun --nproc-per-node N --no-python dplan-worker plan.json ...`) or by Slurm
// (`srun dplan-worker plan.json ...`). Reads its place from RANK / WORLD_SIZE / LOCAL_RANK /
// MASTER_ADDR / MASTER_PORT, or SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, trains the plan's
// layout for --steps steps, and rank 0 writes run.json (docs/run-json.md).
//
// Exit status: 0 done; 2 bad input (plan, flags, data); 1 a failure while running (a rank that
// died, a timeout), reported in one line that names the rank.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include "comm.h"
#include "data.h"
#include "dplan/costmodel/errors.h"
#include "gpt.h"
#include "grad_sync.h"
#include "machine_probe.h"
#include "memory_meter.h"
#include "phase_clock.h"
#include "plan_file.h"
#include "trainer.h"

namespace {
using namespace dplan;
using namespace dplan::executor;
using Seconds = std::chrono::duration<double>;

struct Args {
  std::string plan_path, data_path, output, device = "auto", precision = "auto";
  int steps = 20, warmup = 2, log_every = 1;
  uint64_t seed = 1234;
  double timeout_s = 60, lr = 1e-3, max_grad_norm = 1.0;
  bool quiet = false;
  bool probe = false;
};

// Where this process sits, from the launcher's environment.
struct Place {
  int rank = 0, world = 1, local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";
  std::string store_prefix;  // torchrun's agent store: keys live under /worker/attempt_<n>
  bool agent_store = false;
};

std::string env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  std::string v = env(name);
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InputError(std::string("environment variable ") + name + "=" + v + " is not an integer");
}

Place read_place() {
  Place p;
  if (!env("RANK").empty() || !env("WORLD_SIZE").empty()) {
    p.rank = env_int("RANK", -1);
    p.world = env_int("WORLD_SIZE", -1);
    if (p.rank < 0 || p.world < 1) throw InputError("set both RANK and WORLD_SIZE (torchrun does), or neither");
    p.local_rank = env_int("LOCAL_RANK", p.rank);
    p.local_world = env_int("LOCAL_WORLD_SIZE", p.world);
    p.launcher = env("DPLAN_LAUNCHER", env("TORCHELASTIC_RUN_ID").empty() ? "env" : "torchrun");
    p.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (p.agent_store) p.store_prefix = "/worker/attempt_" + env("TORCHELASTIC_RESTART_COUNT", "0");
  } else if (!env("SLURM_PROCID").empty()) {
    p.rank = env_int("SLURM_PROCID", 0);
    p.world = env_int("SLURM_NTASKS", 1);
    p.local_rank = env_int("SLURM_LOCALID", 0);
    p.local_world = env_int("SLURM_NTASKS_PER_NODE", env_int("SLURM_TASKS_PER_NODE", p.world));
    p.launcher = "slurm";
    if (p.world > 1 && env("MASTER_ADDR").empty())
      throw InputError("under Slurm set MASTER_ADDR to the first node of the job, e.g. "
                       "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)");
  }
  if (p.world > 1) {
    p.master_addr = env("MASTER_ADDR", "127.0.0.1");
    p.master_port = env_int("MASTER_PORT", 29500);
  }
  if (p.rank >= p.world) throw InputError("RANK " + std::to_string(p.rank) + " is not below WORLD_SIZE " + std::to_string(p.world));
  return p;
}

c10::intrusive_ptr<c10d::Store> connect_store(const Place& place, bool server, std::chrono::milliseconds timeout) {
  if (place.world == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(place.master_port);
  o.isServer = server;
  o.numWorkers = place.agent_store || !server ? c10::optional<std::size_t>() : c10::optional<std::size_t>(place.world);
  o.waitWorkers = false;
  o.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(place.master_addr, o);
  if (!place.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(place.store_prefix, store);
  return store;
}

// A CPU rank's intra-op threads: one. The plan's device is one core (the
// local-cpu cluster's cpu-core GPU; the time model gives each rank min(1, cores
// / ranks) of a core), so a rank must not spread over idle cores when there are
// fewer ranks than cores; LibTorch's reference-BLAS GEMMs run on one thread
// anyway.
void set_rank_threads(const Place&) { torch::set_num_threads(1); }

GroupOptions group_options(const Place& place, Backend backend, std::chrono::milliseconds timeout) {
  GroupOptions go;
  go.backend = backend;
  go.timeout = timeout;
  if (place.local_world == place.world) go.gloo_address = "127.0.0.1";  // one machine
  return go;
}

Group world_group(const c10::intrusive_ptr<c10d::Store>& store, const Place& place, const GroupOptions& go) {
  std::vector<int> all(place.world);
  for (int r = 0; r < place.world; ++r) all[r] = r;
  return Group::create(store, "world", all, place.rank, go);
}

// Each rank bumps its counter every kBeat over its own store connection; a rank whose counter
// stands still for several beats is gone. That is how a survivor names the rank that died.
constexpr auto kBeat = std::chrono::milliseconds(250);
constexpr int kStaleBeats = 6;  // a peer is gone when it missed this many of my own beats

class Heartbeat {
 public:
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank) : store_(std::move(store)), rank_(rank) {
    thread_ = std::thread([this] {
      while (!stop_) {
        try {
          store_->add(key(rank_), 1);
        } catch (const std::exception&) {
          // Keep trying: a beat that stopped while this rank still runs would name it as dead. If
          // the store is gone for good, the main thread finds out in its next collective.
        }
        std::this_thread::sleep_for(kBeat);
      }
    });
  }
  ~Heartbeat() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  static std::string key(int rank) { return "dplan/heartbeat/" + std::to_string(rank); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// After a collective failed: which other ranks stopped beating? Empty if none (or the store is gone).
std::string diagnose(const c10::intrusive_ptr<c10d::Store>& store, const Place& place) {
  try {
    // A survivor that already named the culprit wrote it down; agree with it.
    std::vector<int64_t> before(place.world), after(place.world);
    for (int r = 0; r < place.world; ++r) before[r] = store->add(Heartbeat::key(r), 0);
    // The window is counted in my own beats, not on the wall clock: when the machine stalls (a busy
    // host, a paused VM), my heartbeat stalls with everyone else's, and a peer that was merely not
    // scheduled yet is not taken for dead. If my own beat has stopped, the wall clock decides.
    const auto cap = std::chrono::steady_clock::now() + kBeat * kStaleBeats * 4;
    do std::this_thread::sleep_for(kBeat);
    while (store->add(Heartbeat::key(place.rank), 0) - before[place.rank] < kStaleBeats &&
           std::chrono::steady_clock::now() < cap);
    for (int r = 0; r < place.world; ++r) after[r] = store->add(Heartbeat::key(r), 0);
    std::vector<int> stale;
    for (int r = 0; r < place.world; ++r)
      if (r != place.rank && after[r] == before[r]) stale.push_back(r);
    if (stale.empty()) return "";
    std::string names;
    for (int r : stale) names += (names.empty() ? "" : ", ") + std::to_string(r);
    std::string mine = (stale.size() == 1 ? "rank " : "ranks ") + names + " stopped (no heartbeat for " +
                       std::to_string(kStaleBeats * kBeat.count()) + " ms)";
    // The first survivor to name a culprit records it; later ones (whose peers exited in the
    // cascade) report that root cause instead of everyone who has left since.
    std::vector<uint8_t> expected, desired(mine.begin(), mine.end());
    std::vector<uint8_t> got = store->compareSet("dplan/first_failure", expected, desired);
    return std::string(got.begin(), got.end());
  } catch (const std::exception&) {
    if (place.rank == 0) return "";
    return "the rendezvous store on rank 0 (" + place.master_addr + ":" + std::to_string(place.master_port) +
           ") is unreachable: rank 0 stopped";
  }
}

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

// "dplan-worker", or "dplan" when dplan run started this rank: bad input then reads as dplan's own.
std::string prefix() { return env("DPLAN_ERROR_PREFIX", "dplan-worker") + ": error: "; }

[[noreturn]] void exit_now(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);  // no destructors: a process group torn down mid-failure can block
}

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

// Rank 0: everyone's results into run.json.
json assemble_run(const Args& args, const Place& place, const ExecPlan& plan, const std::vector<json>& ranks,
                  const json& config, const std::string& memory_source) {
  const auto& p = plan.parallel;
  json steps = json::array();
  std::vector<double> measured;
  const double tokens = double(plan.training.global_batch) * plan.training.seq_len;
  for (int s = 0; s < args.steps; ++s) {
    double t = 0;  // a step ends when its slowest rank does
    for (const auto& r : ranks) t = std::max(t, r["step_times_s"][s].get<double>());
    bool warm = s < args.warmup;
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
        {"world_size", place.world}}},
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

int train(const Args& args, const Place& place) {
  ExecPlan plan = read_plan(args.plan_path);
  const auto& p = plan.parallel;
  if (plan.world_size() != place.world)
    throw InputError(args.plan_path + " is a layout for " + std::to_string(plan.world_size()) + " ranks (tp " +
                     std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " x dp " + std::to_string(p.dp) +
                     ") but " + std::to_string(place.world) + " were started; start " +
                     std::to_string(plan.world_size()));
  if (args.steps < 1) throw InputError("--steps must be a positive integer, got " + std::to_string(args.steps));
  if (args.warmup < 0 || args.warmup >= args.steps)
    throw InputError("--warmup must be at least 0 and below --steps (" + std::to_string(args.steps) + ")");
  if (!(args.timeout_s > 0)) throw InputError("--timeout-s must be positive");
  if (!(args.max_grad_norm >= 0)) throw InputError("--max-grad-norm must be 0 (no clipping) or positive");

  // Device and backend.
  bool cuda = false;
  if (args.device == "cuda") {
    if (!torch::cuda::is_available()) throw InputError("--device cuda: no CUDA device is visible to this LibTorch");
    cuda = true;
  } else if (args.device == "auto") {
    cuda = torch::cuda::is_available() && nccl_available();
  } else if (args.device != "cpu") {
    throw InputError("--device " + args.device + " is not one of: auto, cpu, cuda");
  }
  // Precision: 16-bit plans train in bf16 with fp32 master weights and AdamW states on CUDA;
  // fp16 and fp8 plans too (no loss scaling, no fp8 GEMMs). CPU trains fp32 unless asked.
  const bool planned_16bit = plan.training.precision != costmodel::Precision::fp32;
  bool bf16 = false;
  std::string precision_note;
  if (args.precision == "auto") {
    bf16 = cuda && planned_16bit;
    if (planned_16bit && !cuda) precision_note = "ran fp32: 16-bit training runs on CUDA (--precision bf16 forces it)";
  } else if (args.precision == "bf16") {
    bf16 = true;
  } else if (args.precision != "fp32") {
    throw InputError("--precision " + args.precision + " is not one of: auto, fp32, bf16");
  }
  if (bf16 && (plan.training.precision == costmodel::Precision::fp16 || plan.training.precision == costmodel::Precision::fp8))
    precision_note = std::string("ran bf16 for a ") + costmodel::to_string(plan.training.precision) + " plan";
  MemoryMeter meter(cuda ? place.local_rank : -1);  // before the first tensor
  at::Device device = cuda ? at::Device(at::kCUDA, place.local_rank) : at::Device(at::kCPU);
  if (!cuda) {
    set_rank_threads(place);
  }
  DataSource data(args.data_path, plan.training.seq_len, plan.model.vocab_size, plan.training.global_batch, p.dp,
                  plan.ranks[place.rank].dp, args.seed);

  // Rendezvous, heartbeats, process groups in the plan's rank layout.
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  auto store = connect_store(place, !place.agent_store && place.rank == 0, timeout);
  auto beat_store = place.world > 1 ? connect_store(place, false, timeout) : store;
  Heartbeat heartbeat(beat_store, place.rank);

  try {
    const GroupOptions go = group_options(place, cuda ? Backend::nccl : Backend::gloo, timeout);
    const RankPlace me = plan.ranks[place.rank];
    // The ranks that share my other coordinates, in order along one axis: the plan's rank layout
    // decides who they are (Megatron's order, tp fastest).
    auto along = [](int size, auto rank_of) {
      std::vector<int> members;
      for (int i = 0; i < size; ++i) members.push_back(rank_of(i));
      return members;
    };
    auto coords = [](std::initializer_list<int> c) {
      std::string s;
      for (int x : c) {
        s += '-';
        s += std::to_string(x);
      }
      return s;
    };
    ParallelContext ctx;
    ctx.device = device;
    ctx.stage = me.pp;
    ctx.num_stages = p.pp;
    ctx.sequence_parallel = p.sequence_parallel;
    ctx.recompute = p.recompute;
    ctx.attention = plan.training.attention;
    ctx.dtype = bf16 ? at::kBFloat16 : at::kFloat;
    // Megatron accumulates and reduces 16-bit training's gradients in fp32 (main_grad) when the
    // plan says fp32_grads (its default for bf16); the cost model counts them the same way.
    const at::ScalarType grad_dtype = !bf16 || plan.training.fp32_grads ? at::kFloat : at::kBFloat16;
    ctx.world = world_group(store, place, go);
    ctx.tp = Group::create(store, "tp" + coords({me.cp, me.dp, me.pp}),
                           along(p.tp, [&](int i) { return plan.rank_at(i, me.cp, me.dp, me.pp); }), place.rank, go);
    ctx.dp = Group::create(store, "dp" + coords({me.tp, me.cp, me.pp}),
                           along(p.dp, [&](int i) { return plan.rank_at(me.tp, me.cp, i, me.pp); }), place.rank, go);
    ctx.pp = Group::create(store, "pp" + coords({me.tp, me.cp, me.dp}),
                           along(p.pp, [&](int i) { return plan.rank_at(me.tp, me.cp, me.dp, i); }), place.rank, go);
    if (plan.model.tied_embeddings && p.pp > 1 && (me.pp == 0 || me.pp == p.pp - 1)) {
      ctx.embedding = Group::create(store, "embedding" + coords({me.tp, me.cp, me.dp}),
                                    {plan.rank_at(me.tp, me.cp, me.dp, 0), plan.rank_at(me.tp, me.cp, me.dp, p.pp - 1)},
                                    place.rank, go);
      ctx.has_embedding_group = true;
    }

    // Model, gradient buckets, optimizer.
    torch::manual_seed(args.seed + 7919 * place.rank);  // dropout streams differ by rank
    GptStage stage(plan.model, plan.stages[me.pp], plan.training.seq_len, ctx, args.seed);
    GradSync grads(stage, ctx, static_cast<int64_t>(plan.training.bucket_bytes), p.zero_stage, p.distributed_optimizer,
                   grad_dtype);
    std::vector<at::Tensor> decay, no_decay;
    for (auto& op : grads.optimizer_params()) (op.weight_decay ? decay : no_decay).push_back(op.tensor);
    auto adamw = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decay.empty()) groups.emplace_back(decay, adamw(0.1));
    if (!no_decay.empty()) groups.emplace_back(no_decay, adamw(0.0));
    torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(args.lr));
    if (cuda) PhaseClock::instance().set_sync([dev = place.local_rank] { torch::cuda::synchronize(dev); });

    StepOptions so;
    so.schedule = p.schedule == costmodel::Schedule::gpipe ? PipelineSchedule::gpipe : PipelineSchedule::one_f_one_b;
    so.micro_batch = p.micro_batch;
    so.loss_scale = 1.0 / (double(plan.training.global_batch) * plan.training.seq_len);
    so.max_grad_norm = args.max_grad_norm;
    Trainer trainer(stage, ctx, grads, optimizer, so);

    // Train.
    std::vector<double> step_times, losses, grad_norms;
    std::vector<std::array<double, kNumPhases>> phases;
    int64_t activations_peak = 0, buffers_peak = 0, run_peak = 0;
    const double tokens = double(plan.training.global_batch) * plan.training.seq_len;
    const auto run_start = std::chrono::steady_clock::now();
    for (int s = 0; s < args.steps; ++s) {
      std::vector<Batch> batches = data.next_step(p.micro_batch);
      const int64_t resident = meter.current_bytes();
      meter.reset_peak();
      PhaseClock::instance().start_step();
      const StepResult result = trainer.step(batches);
      const double loss = result.loss;
      auto ph = PhaseClock::instance().end_step();
      double t = 0;
      for (double x : ph) t += x;
      run_peak = std::max(run_peak, meter.peak_bytes());
      // Activations: the high-water mark of what a step allocates above what it started with,
      // communication buffers (counted apart) excluded; the first step also creates the
      // optimizer states, so it is left out.
      if (s > 0 || args.steps == 1) {
        activations_peak = std::max(activations_peak, meter.peak_excluding_buffers_bytes() - resident);
        buffers_peak = std::max(buffers_peak, meter.peak_buffer_bytes());
      }
      step_times.push_back(t);
      losses.push_back(loss);
      grad_norms.push_back(result.grad_norm);
      if (s >= args.warmup) phases.push_back(ph);
      if (place.rank == 0 && !args.quiet && ((s + 1) % args.log_every == 0 || s + 1 == args.steps)) {
        double elapsed = Seconds(std::chrono::steady_clock::now() - run_start).count();
        double eta = elapsed / (s + 1) * (args.steps - s - 1);
        std::fprintf(stderr, "step %d/%d  loss %.4f  %.3f s  %.0f tokens/s  ETA %.0f s%s\n", s + 1, args.steps, loss, t,
                     tokens / t, eta, s < args.warmup ? "  (warm-up)" : "");
      }
      if (!std::isfinite(loss)) throw std::runtime_error("the loss is " + std::to_string(loss) + " at step " + std::to_string(s));
    }

    // Results through the store; rank 0 writes run.json.
    grads.gather_all_units();  // ZeRO-3: the whole model, to hash it
    json mine = {{"rank", place.rank},
                 {"stage", me.pp},
                 {"step_times_s", step_times},
                 {"losses", losses},
                 {"grad_norms", grad_norms},
                 {"phases_s", median_phases(phases)},
                 {"weights_hash", weights_hash(stage.parameters())},
                 {"memory",
                  {{"weights", grads.weight_bytes()},
                   {"gradients", grads.gradient_bytes()},
                   {"optimizer", optimizer_bytes(optimizer) + grads.master_bytes()},
                   {"activations", activations_peak},
                   {"buffers", buffers_peak},
                   {"peak", run_peak}}}};
    std::string text = mine.dump();
    store->set("dplan/result/" + std::to_string(place.rank), std::vector<uint8_t>(text.begin(), text.end()));
    if (place.rank == 0) {
      std::vector<json> all_results;
      for (int r = 0; r < place.world; ++r) {
        auto bytes = store->get("dplan/result/" + std::to_string(r));
        all_results.push_back(json::parse(std::string(bytes.begin(), bytes.end())));
      }
      json config = {{"steps", args.steps}, {"warmup_steps", args.warmup}, {"seed", args.seed},
                     {"data", data.describe()}, {"device", cuda ? "cuda" : "cpu"},
                     {"device_name", cuda ? "cuda" : "cpu"}, {"backend", to_string(go.backend)},
                     {"precision", bf16 ? "bf16" : "fp32"}, {"planned_precision", costmodel::to_string(plan.training.precision)},
                     {"grad_dtype", grad_dtype == at::kFloat ? "fp32" : "bf16"},
                     {"threads_per_rank", torch::get_num_threads()}, {"timeout_s", args.timeout_s},
                     {"launcher", place.launcher}, {"lr", args.lr}, {"max_grad_norm", args.max_grad_norm}, {"bucket_bytes", plan.training.bucket_bytes},
                     {"num_buckets", grads.num_buckets()}};
      if (!precision_note.empty()) config["precision_note"] = precision_note;
      json run = assemble_run(args, place, plan, all_results, config, meter.source());
      if (!args.output.empty()) write_file_atomically(args.output, run.dump(1) + "\n");
      if (!args.quiet) {
        std::fprintf(stderr, "median step %.4f s (%zu measured steps), %.0f tokens/s, final loss %.4f%s\n",
                     run["step_time_s"]["median"].get<double>(), phases.size(), run["tokens_per_s"].get<double>(),
                     losses.back(), args.output.empty() ? "" : ("; wrote " + args.output).c_str());
      }
      if (!run["replicas"]["identical"].get<bool>()) throw std::runtime_error("data-parallel replicas diverged");
    }
    ctx.world.barrier();  // rank 0 hosts the store: nobody leaves before it has read everything
    heartbeat.stop();
    return 0;
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    std::string culprit = diagnose(store, place);  // not the heartbeat thread's connection
    std::fprintf(stderr, "%srank %d: %s%s(%s)\n", prefix().c_str(), place.rank, culprit.c_str(),
                 culprit.empty() ? "" : "; stopping ", first_line(e.what()).c_str());
    if (place.rank == 0 && place.world > 1) std::this_thread::sleep_for(kBeat * 12);  // let survivors read the store
    exit_now(1);
  }
}

// --probe: every rank measures at once, with a training rank's threads, over a Gloo world group.
int probe_machine(const Args& args, const Place& place) {
  if (args.output.empty()) throw InputError("--probe needs -o FILE for the measurements");
  set_rank_threads(place);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  auto store = connect_store(place, !place.agent_store && place.rank == 0, timeout);
  Group world = world_group(store, place, group_options(place, Backend::gloo, timeout));
  run_machine_probe({args.output}, world);
  if (place.rank == 0 && !args.quiet) std::fprintf(stderr, "wrote %s\n", args.output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"dplan-worker: one rank of dplan's executor (started by dplan run, torchrun or srun)", "dplan-worker"};
  app.add_option("plan", args.plan_path, "plan.json written by dplan -o (not with --probe)");
  app.add_flag("--probe", args.probe,
               "measure this machine instead (GEMMs, memory bandwidth, Gloo collectives over the ranks) into -o FILE");
  app.add_option("--steps", args.steps, "optimizer steps")->capture_default_str();
  app.add_option("--warmup", args.warmup, "first steps marked warm-up, left out of the statistics")->capture_default_str();
  app.add_option("--data", args.data_path, "byte-level text file (default: a seeded synthetic stream)");
  app.add_option("--seed", args.seed, "seed for weights, data order and synthetic data")->capture_default_str();
  app.add_option("-o,--output", args.output, "write run.json here (rank 0)");
  app.add_option("--timeout-s", args.timeout_s, "collective timeout: a dead rank is reported within it")->capture_default_str();
  app.add_option("--device", args.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--precision", args.precision, "auto, fp32 or bf16")->capture_default_str();
  app.add_option("--lr", args.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--max-grad-norm", args.max_grad_norm, "clip the global gradient norm to this; 0: no clipping")
      ->capture_default_str();
  app.add_option("--log-every", args.log_every, "progress line every N steps")->capture_default_str();
  app.add_flag("--quiet", args.quiet, "no progress lines");
  Place place;
  try {
    app.parse(argc, argv);
    place = read_place();
    if (args.probe) return probe_machine(args, place) == 0 ? (exit_now(0), 0) : 1;
    if (args.plan_path.empty()) throw InputError("give plan.json (written by dplan -o), or --probe -o FILE");
    return train(args, place) == 0 ? (exit_now(0), 0) : 1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (place.rank == 0) std::fprintf(stderr, "%s%s\n", prefix().c_str(), e.what());
    exit_now(2);
  } catch (const InputError& e) {
    if (place.rank == 0) std::fprintf(stderr, "%s%s\n", prefix().c_str(), e.what());
    exit_now(2);
  } catch (const std::invalid_argument& e) {
    if (place.rank == 0) std::fprintf(stderr, "%s%s\n", prefix().c_str(), e.what());
    exit_now(2);
  } catch (const nlohmann::json::exception& e) {
    if (place.rank == 0) std::fprintf(stderr, "%s%s: malformed plan: %s\n", prefix().c_str(), args.plan_path.c_str(), e.what());
    exit_now(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%srank %d: %s\n", prefix().c_str(), place.rank, first_line(e.what()).c_str());
    exit_now(1);
  }
}
