#include "machine_probe.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "attention.h"
#include "gemm_row.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::executor {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Seconds per call: one call to size the repetitions, then enough calls for `budget_s` (at least 3),
// timed together.
template <typename F>
double time_per_call_s(F&& call, double budget_s) {
  auto t0 = Clock::now();
  call();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  const int reps = std::max(3, static_cast<int>(budget_s / std::max(once, 1e-7)));
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) call();
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

// The GEMMs of a transformer layer as training runs them, for hidden sizes and
// token counts a CPU trains: each linear (QKV, output projection, fc1, fc2)
// Y[t, n] = X[t, k] W[n, k]^T forward, its input gradient dX = dY W (the GEMM
// (t, k, n)) and weight gradient dW = dY^T X (the GEMM (n, k, t)); squares; and
// the attention core's batched GEMMs (scores Q K^T over half the keys, causal,
// and P V) for sequence lengths and head sizes a CPU trains.
json probe_gemms(const MachineProbeOptions& o) {
  json rows = json::array();
  auto add = [&](const char* op, int64_t m, int64_t n, int64_t k, int64_t batch, double t) {
    rows.push_back(probe::gemm_row("fp32", op, m, n, k, batch, t));
  };
  constexpr double kMaxFlops = 6e8;  // larger shapes add probe time, not information, on a CPU core
  for (int64_t h : {64, 128, 256, 512})
    for (int64_t t : {128, 256, 512})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{3 * h, h}, {h, h}, {4 * h, h}, {h, 4 * h}}) {
        if (2.0 * t * n * k > kMaxFlops) continue;
        at::Tensor x = at::randn({t, k}), w = at::randn({n, k}), dy = at::randn({t, n});
        add("forward", t, n, k, 1, time_per_call_s([&] { at::linear(x, w); }, o.seconds_per_point));
        add("dgrad", t, k, n, 1, time_per_call_s([&] { at::mm(dy, w); }, o.seconds_per_point));
        add("wgrad", n, k, t, 1, time_per_call_s([&] { at::mm(dy.t(), x); }, o.seconds_per_point));
      }
  for (int64_t n = 64; n <= 512; n *= 2) {
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
    add("forward", n, n, n, 1, time_per_call_s([&] { at::mm(a, b); }, o.seconds_per_point));
  }
  constexpr int64_t heads = 4;
  for (int64_t s : {128, 256, 512})
    for (int64_t d : {16, 32, 64}) {
      at::Tensor q = at::randn({heads, s, d}), k = at::randn({heads, s / 2, d}), p = at::randn({heads, s, s / 2});
      add("batched", s, s / 2, d, heads,
          time_per_call_s([&] { at::matmul(q, k.transpose(1, 2)); }, o.seconds_per_point));
      add("batched", s, d, s / 2, heads, time_per_call_s([&] { at::matmul(p, k); }, o.seconds_per_point));
    }
  // The whole causal flash-attention core this executor trains with
  // (attention.cpp), forward and backward: on a CPU its blocked softmax and
  // masking cost as much as its GEMMs.
  for (int64_t s : {128, 256, 512})
    for (int64_t d : {16, 32, 64}) {
      at::Tensor q = at::randn({1, heads, s, d}).requires_grad_(), k = at::randn({1, heads, s, d}).requires_grad_(),
                 v = at::randn({1, heads, s, d}).requires_grad_();
      at::Tensor grad = at::randn({1, s, heads * d});  // the output is [b, s, heads * d]
      at::AutoGradMode enable(true);                   // as training runs it: the forward saves what backward needs
      add("attention_forward", s, s, d, heads, time_per_call_s([&] { flash_attention(q, k, v); }, o.seconds_per_point));
      add("attention_backward", s, s, d, heads,
          probe_detail::backward_time_s([&] { return flash_attention(q, k, v); }, grad, o.seconds_per_point));
    }
  return rows;
}

// Copy bandwidth, and the rate training's element-wise kernels reach on a
// layer's tensors (GELU, layer norm, softmax, residual add): on a CPU core they
// are bound by their arithmetic as much as by memory, so they, not the copy,
// are what the cost model's memory-bound work runs at. Bytes are each kernel's
// reads plus writes.
json probe_memory(const MachineProbeOptions& o) {
  const int64_t elements = int64_t(64) << 20 >> 2;  // 64 MiB of fp32
  at::Tensor src = at::ones({elements}), dst = at::empty({elements});
  const double t = time_per_call_s([&] { dst.copy_(src); }, o.seconds_per_point * 4);
  json kernels = json::array();
  double bytes_sum = 0, time_sum = 0;
  auto kernel = [&](const char* name, double bytes, auto&& call) {
    const double s = time_per_call_s(call, o.seconds_per_point);
    kernels.push_back({{"kernel", name}, {"bytes", bytes}, {"time_s", s}});
    bytes_sum += bytes;
    time_sum += s;
  };
  for (int64_t h : {128, 256}) {
    const int64_t tokens = 256;
    at::Tensor x = at::randn({tokens, h}), y = at::randn({tokens, h}), wide = at::randn({tokens, 4 * h});
    at::Tensor gamma = at::ones({h}), beta = at::zeros({h});
    at::Tensor scores = at::randn({4, tokens, tokens / 2});
    kernel("gelu", 8.0 * wide.numel(), [&] { at::gelu(wide); });
    kernel("layer_norm", 8.0 * x.numel(), [&] { at::layer_norm(x, {h}, gamma, beta); });
    kernel("softmax", 8.0 * scores.numel(), [&] { at::softmax(scores, -1); });
    kernel("add", 12.0 * x.numel(), [&] { at::add(x, y); });
  }
  return {{"copy_bytes", elements * 4},
          {"time_s", t},
          {"bytes_per_s", 2.0 * elements * 4 / t},
          {"elementwise", kernels},
          {"elementwise_bytes_per_s", bytes_sum / time_sum}};
}

// The slowest rank's value of `t`: every rank calls it with its own.
double slowest_s(Group& world, double t) {
  at::Tensor all = at::full({world.size()}, 0.0, at::kDouble);
  all[world.rank()] = t;
  world.all_reduce(all);
  return all.max().item<double>();
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

// The median (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One pass over the GEMMs on every rank at once, kept as the slowest rank's: a training step waits
// for its slowest rank, the one whose whole pass took longest (probe_detail::slowest_rank).
json slowest_gemms(const MachineProbeOptions& o, Group& world) {
  json gemms = probe_gemms(o);
  at::Tensor times = at::zeros({world.size(), static_cast<int64_t>(gemms.size())}, at::kDouble);
  for (size_t i = 0; i < gemms.size(); ++i) times[world.rank()][static_cast<int64_t>(i)] = gemms[i]["time_s"].get<double>();
  world.all_reduce(times);
  const at::Tensor slowest = times[probe_detail::slowest_rank(times)];
  for (size_t i = 0; i < gemms.size(); ++i) gemms[i]["time_s"] = slowest[static_cast<int64_t>(i)].item<double>();
  return gemms;
}

// Each GEMM's median time over the rounds, with its rate.
json median_of_rounds(const std::vector<json>& rounds) {
  json gemms = rounds.at(0);
  for (size_t i = 0; i < gemms.size(); ++i) {
    std::vector<double> t;
    for (const json& r : rounds) t.push_back(r[i]["time_s"].get<double>());
    json& g = gemms[i];
    g["time_s"] = median(t);
    g["flops_per_s"] = 2.0 * g["m"].get<double>() * g["n"].get<double>() * g["k"].get<double>() *
                       g["batch"].get<double>() / g["time_s"].get<double>();
  }
  return gemms;
}

// How long each rank computes before each collective call. Training's blocking collectives follow
// milliseconds of compute on a CPU core (a layer's GEMMs between two tensor-parallel all-reduces,
// a whole backward before the gradients'), by when Gloo's threads have gone to sleep and the ranks'
// arrivals have drifted apart; both cost time that back-to-back calls do not pay. Measured here, a
// 4-64 KiB all-reduce over 2 ranks took 1.6-2.3 ms after 0.5 ms of compute and 2.1-3.1 ms after
// 5 ms; the tensor-parallel phase of a tp 2 training run had come to about twice what the 0.5 ms
// figures predicted.
constexpr double kComputeBeforeCall_s = 5e-3;

// One collective by size over the world group, as nccl-tests prints it (busbw with nccl-tests'
// factors, doc/PERFORMANCE.md). Every rank runs it; rank 0 writes the file.
std::string probe_collective(const MachineProbeOptions& o, Group& world, const std::string& test) {
  const int n = world.size();
  std::string text = "# Collective test starting: " + test + "\n# dplan-worker --probe over Gloo, " +
                     std::to_string(n) + " ranks\n";
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  for (int r = 0; r < n; ++r)
    text += "#  Rank " + std::to_string(r) + " Group  0 Pid 0 on " + host + " device " + std::to_string(r) + " [cpu]\n";
  text +=
      "#       size         count      type   redop    root     time   "
      "algbw   busbw #wrong     time   algbw   busbw #wrong\n";
  at::Tensor gap_x = at::randn({128, 128}), gap_w = at::randn({128, 128});
  const double gap_gemm_s = time_per_call_s([&] { at::linear(gap_x, gap_w); }, 0.01);
  const int gap_gemms = std::max(1, static_cast<int>(kComputeBeforeCall_s / gap_gemm_s));
  for (int64_t bytes = 4096; bytes <= int64_t(o.max_collective_mib * 1024 * 1024); bytes *= 4) {
    const int64_t count = bytes / 4;
    at::Tensor buf = at::ones({count});
    at::Tensor mine = at::ones({count / n}), received = at::empty({count});
    const int next = (world.rank() + 1) % n, previous = (world.rank() + n - 1) % n;
    auto call = [&] {
      if (test == "all_reduce_perf") {
        world.all_reduce(buf);
      } else if (test == "all_gather_perf") {  // the size column is the gathered output
        world.all_gather(mine, 0);
      } else {  // sendrecv_perf: every rank sends `bytes` to the next and
                // receives from the previous
        Work sent = world.send(buf, next, 0);
        Work got = world.recv(received, previous, 0);
        sent.wait();
        got.wait();
      }
    };
    // Every rank must make the same calls: the repetitions follow the slowest
    // rank's first call, and the time is the slowest rank's.
    world.barrier();
    auto t0 = Clock::now();
    call();
    const double once = slowest_s(world, std::chrono::duration<double>(Clock::now() - t0).count());
    const int reps = std::max(3, static_cast<int>(4 * o.seconds_per_point / std::max(once, 1e-7)));
    // As in training, every call follows some compute (kComputeBeforeCall_s of GEMMs, not timed):
    // a rank arrives from work, not from the previous collective.
    double total_s = 0;
    for (int i = 0; i < reps; ++i) {
      for (int g = 0; g < gap_gemms; ++g) at::linear(gap_x, gap_w);
      t0 = Clock::now();
      call();
      total_s += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const double t = slowest_s(world, total_s / reps);
    const double algbw = bytes / t / 1e9;
    const double factor = test == "all_reduce_perf" ? 2.0 * (n - 1) / n
                          : test == "sendrecv_perf" ? 1.0
                                                    : double(n - 1) / n;
    char row[256];
    std::snprintf(row, sizeof row, "%12lld %12lld float %s -1 %10.2f %7.3f %7.3f 0 %10.2f %7.3f %7.3f 0\n",
                  static_cast<long long>(bytes), static_cast<long long>(count),
                  test == "all_reduce_perf" ? "sum" : "none", t * 1e6, algbw, algbw * factor, t * 1e6, algbw,
                  algbw * factor);
    text += row;
  }
  return text;
}

// How much of an all-reduce hides under GEMMs running at the same time, as a
// gradient bucket's reduction runs under backward: the all-reduce alone, a GEMM
// loop of about the same length alone, and both at once (the all-reduce in
// flight on Gloo's threads while this thread multiplies), each the median of 3.
// One sample per GEMM pass, so that they spread over the probe like the GEMMs;
// overlap_result combines them.
struct OverlapSamples {
  static constexpr int64_t kBytes = int64_t(4) << 20;  // a gradient bucket of a model a CPU trains
  int gemms = 0;                                       // GEMMs in the loop, sized by the first sample
  std::vector<double> gemm_s, collective_s, both_s;
};

void probe_overlap(Group& world, OverlapSamples& samples) {
  at::Tensor buf = at::ones({OverlapSamples::kBytes / 4});
  at::Tensor x = at::randn({256, 256}), w = at::randn({512, 256});
  auto timed = [&](auto&& f) {
    world.barrier();
    const auto t0 = Clock::now();
    f();
    return slowest_s(world, std::chrono::duration<double>(Clock::now() - t0).count());
  };
  auto median_of_3 = [&](auto&& f) { return median({timed(f), timed(f), timed(f)}); };
  world.all_reduce(buf);  // warm the connections
  const double collective_s = median_of_3([&] { world.all_reduce(buf); });
  if (samples.gemms == 0) {
    const double one_gemm_s = slowest_s(world, time_per_call_s([&] { at::linear(x, w); }, 0.02));
    samples.gemms = std::max(1, static_cast<int>(collective_s / one_gemm_s));
  }
  auto loop = [&] {
    for (int i = 0; i < samples.gemms; ++i) at::linear(x, w);
  };
  samples.collective_s.push_back(collective_s);
  samples.gemm_s.push_back(median_of_3(loop));
  samples.both_s.push_back(median_of_3([&] {
    Work work = world.all_reduce_async(buf);
    loop();
    work.wait();
  }));
}

// fraction = (gemm + all-reduce - both) / min(gemm, all-reduce), in [0, 1]: 1 = it hid
// completely, 0 = they took turns on the core; from the samples' means, not one sample's
// (single samples here ranged from 0 to 1 between probes).
json overlap_result(const OverlapSamples& o) {
  const double gemm_s = mean(o.gemm_s), collective_s = mean(o.collective_s), both_s = mean(o.both_s);
  const double fraction = std::clamp((gemm_s + collective_s - both_s) / std::min(gemm_s, collective_s), 0.0, 1.0);
  return {{"collective", "all_reduce"},   {"bytes", OverlapSamples::kBytes}, {"gemm_s", gemm_s},
          {"collective_s", collective_s}, {"both_s", both_s},                {"fraction", fraction},
          {"samples", o.gemm_s.size()}};
}

// One rank computing alone against every rank at once, over a layer's GEMMs and attention: how
// much the ranks slow each other on this machine's shared caches and memory. Rank 0 is timed both
// ways, so the two timings differ only in whether the others compute: the others wait in a barrier
// (blocked, not spinning) while it runs alone. Appends five alternated pairs of rank 0's timings
// (every rank busy, rank 0 alone) to `busy` and `alone`.
void probe_lone_rank(const MachineProbeOptions& o, Group& world, std::vector<double>& busy, std::vector<double>& alone) {
  at::AutoGradMode enable(true);
  at::Tensor x = at::randn({256, 128}), w = at::randn({512, 128}), dy = at::randn({256, 512});
  at::Tensor q = at::randn({1, 4, 256, 32}).requires_grad_(), k = at::randn({1, 4, 256, 32}).requires_grad_(),
             v = at::randn({1, 4, 256, 32}).requires_grad_(), grad = at::randn({1, 256, 128});
  auto mix = [&] {
    at::NoGradGuard no_grad;
    at::linear(x, w);
    at::mm(dy, w);
    at::mm(dy.t(), x);
  };
  auto with_attention = [&] {
    mix();
    flash_attention(q, k, v).backward(grad);
  };
  auto rank0_s = [&](double t) { return slowest_s(world, world.rank() == 0 ? t : 0.0); };  // shared with every rank
  // Alternated, so that each pair sees the same moment of a drifting machine.
  const double budget_s = 4 * o.seconds_per_point;
  for (int round = 0; round < 5; ++round) {
    world.barrier();
    busy.push_back(rank0_s(time_per_call_s(with_attention, budget_s)));
    world.barrier();
    double t = 0;
    if (world.rank() == 0) t = time_per_call_s(with_attention, budget_s);
    world.barrier();
    alone.push_back(rank0_s(t));
  }
}

}  // namespace

namespace probe_detail {

// (Backward as forward + backward minus forward subtracts two timings of a machine whose pace moves
// by tens of percent within seconds: for gpt-small's attention here that difference scattered over
// 8-16 ms, the backward timed alone over 8-12 ms.)
double backward_time_s(const std::function<at::Tensor()>& forward, const at::Tensor& grad, double budget_s) {
  forward().backward(grad);  // warm: the allocator's first blocks
  double timed_s = 0;
  int calls = 0;
  const auto start = Clock::now();
  do {
    at::Tensor out = forward();
    const auto t0 = Clock::now();
    out.backward(grad);
    timed_s += std::chrono::duration<double>(Clock::now() - t0).count();
    ++calls;
  } while (calls < 3 || std::chrono::duration<double>(Clock::now() - start).count() < 2 * budget_s);
  return timed_s / calls;
}

// A step sums hundreds of GEMMs, so a rank's momentary hiccups average out in it, while the
// per-GEMM maximum over ranks picks every GEMM's unlucky moment and overstates every step: over
// three passes on 2 ranks here, the per-GEMM maxima summed to 6-9 % above the ranks' mean, the
// slowest whole rank to 1-2 %.
int64_t slowest_rank(const at::Tensor& times) { return times.sum(1).argmax().item<int64_t>(); }

}  // namespace probe_detail

void run_machine_probe(const MachineProbeOptions& o, Group& world) {
  at::NoGradGuard no_grad;
  json result = {{"format_version", 1},
                 {"generator", "dplan-cpu-probe"},
                 {"device", {{"name", "cpu"}, {"sm_count", 1}, {"count", world.size()},
                             {"threads_per_rank", torch::get_num_threads()},
                             {"cores", std::max(1u, std::thread::hardware_concurrency())}}}};
  // A shared machine's pace drifts by tens of percent over seconds (another tenant of the host, a
  // clock change), so one pass over the GEMMs measures a moment, not the machine. The pass runs
  // o.gemm_rounds times, spread over the probe between its other measurements, and each shape keeps
  // the median of its rounds: the typical pace, which a training run's median step also sees (the
  // usual remedy for a noisy benchmark host: repeat, spread in time, take a robust statistic).
  // The lone-rank pairs and the overlap samples run in every round too: they drift as well.
  std::vector<json> rounds;
  std::vector<double> busy_s, alone_s;
  OverlapSamples overlap;
  auto gemm_round = [&] {
    world.barrier();  // every rank measures at the same time, sharing the cores as training ranks do
    rounds.push_back(slowest_gemms(o, world));
    if (world.size() > 1) {
      probe_lone_rank(o, world, busy_s, alone_s);
      probe_overlap(world, overlap);
    }
  };
  gemm_round();
  world.barrier();
  result["memory"] = probe_memory(o);
  json files = json::array();
  if (world.size() > 1) {
    for (const std::string test : {"all_reduce_perf", "all_gather_perf", "sendrecv_perf"}) {
      const std::string text = probe_collective(o, world, test);
      const fs::path out(o.output);
      const fs::path file = out.parent_path() / (out.stem().string() + "-" + test + ".txt");
      if (world.rank() == 0) write_file_atomically(file.string(), text);
      files.push_back(file.filename().string());  // beside the probe file
      if (test != "sendrecv_perf" && int(rounds.size()) < o.gemm_rounds) gemm_round();  // between the sweeps
    }
  }
  while (int(rounds.size()) < o.gemm_rounds) gemm_round();
  result["gemm"] = median_of_rounds(rounds);
  result["gemm_rounds"] = rounds.size();
  if (world.size() > 1) {
    // The ratio of the means, not the median of the ratios: a core here runs at one of two paces
    // (a layer in about 29 ms or about 48 ms), flipping within seconds whether or not the other
    // rank computes, so single pairs' ratios cluster at 0.6, 1 and 1.65, and their median jumped
    // between those from one probe to the next (1.04 to 1.83 over a dozen probes); the means weigh
    // each pace by how often it came.
    const double busy = mean(busy_s), alone = mean(alone_s);
    result["lone_rank"] = {{"alone_s", alone}, {"all_busy_s", busy}, {"speedup", busy / alone}, {"pairs", busy_s.size()}};
    result["overlap"] = overlap_result(overlap);
  }
  result["nccl_tests_files"] = files;
  if (world.rank() == 0) write_file_atomically(o.output, result.dump(1) + "\n");
  world.barrier();
}

}  // namespace dplan::executor
