#include "machine_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

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

// The GEMMs of a transformer layer (Y[t, n] = X[t, k] W[n, k]^T: QKV, output projection, fc1, fc2)
// for hidden sizes and token counts a CPU trains, and squares.
json probe_gemms(const MachineProbeOptions& o) {
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t h : {64, 128, 256, 512})
    for (int64_t t : {128, 512})
      for (auto s : {std::array<int64_t, 3>{t, 3 * h, h}, {t, h, h}, {t, 4 * h, h}, {t, h, 4 * h}}) shapes.push_back(s);
  for (int64_t n = 64; n <= 1024; n *= 2) shapes.push_back({n, n, n});
  json rows = json::array();
  for (auto [m, n, k] : shapes) {
    at::Tensor x = at::randn({m, k}), w = at::randn({n, k});
    const double t = time_per_call_s([&] { at::linear(x, w); }, o.seconds_per_point);
    rows.push_back({{"precision", "fp32"}, {"m", m}, {"n", n}, {"k", k}, {"time_s", t},
                    {"flops_per_s", 2.0 * m * n * k / t}});
  }
  return rows;
}

json probe_memory(const MachineProbeOptions& o) {
  const int64_t elements = int64_t(64) << 20 >> 2;  // 64 MiB of fp32
  at::Tensor src = at::ones({elements}), dst = at::empty({elements});
  const double t = time_per_call_s([&] { dst.copy_(src); }, o.seconds_per_point * 4);
  return {{"copy_bytes", elements * 4}, {"time_s", t}, {"bytes_per_s", 2.0 * elements * 4 / t}};
}

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
  text += "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
  for (int64_t bytes = 4096; bytes <= int64_t(o.max_collective_mib * 1024 * 1024); bytes *= 4) {
    const int64_t count = bytes / 4;
    at::Tensor buf = at::ones({count});
    at::Tensor mine = at::ones({count / n});
    auto call = [&] {
      if (test == "all_reduce_perf")
        world.all_reduce(buf);
      else  // all_gather_perf: the size column is the gathered output
        world.all_gather(mine, 0);
    };
    // Every rank must make the same calls: the repetitions follow the slowest rank's first call,
    // and the time is the slowest rank's.
    auto slowest = [&](double t) {
      at::Tensor all = at::full({n}, 0.0, at::kDouble);
      all[world.rank()] = t;
      world.all_reduce(all);
      return all.max().item<double>();
    };
    world.barrier();
    auto t0 = Clock::now();
    call();
    const double once = slowest(std::chrono::duration<double>(Clock::now() - t0).count());
    const int reps = std::max(3, static_cast<int>(o.seconds_per_point / std::max(once, 1e-7)));
    world.barrier();
    t0 = Clock::now();
    for (int i = 0; i < reps; ++i) call();
    const double t = slowest(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
    const double algbw = bytes / t / 1e9;
    const double factor = test == "all_reduce_perf" ? 2.0 * (n - 1) / n : double(n - 1) / n;
    char row[256];
    std::snprintf(row, sizeof row, "%12lld %12lld float %s -1 %10.2f %7.3f %7.3f 0 %10.2f %7.3f %7.3f 0\n",
                  static_cast<long long>(bytes), static_cast<long long>(count),
                  test == "all_reduce_perf" ? "sum" : "none", t * 1e6, algbw, algbw * factor, t * 1e6, algbw,
                  algbw * factor);
    text += row;
  }
  return text;
}

}  // namespace

void run_machine_probe(const MachineProbeOptions& o, Group& world) {
  at::NoGradGuard no_grad;
  json result = {{"format_version", 1},
                 {"generator", "dplan-cpu-probe"},
                 {"device", {{"name", "cpu"}, {"sm_count", 1}, {"count", world.size()},
                             {"threads_per_rank", torch::get_num_threads()},
                             {"cores", std::max(1u, std::thread::hardware_concurrency())}}}};
  world.barrier();  // every rank measures at the same time, sharing the cores as training ranks do
  result["gemm"] = probe_gemms(o);
  world.barrier();
  result["memory"] = probe_memory(o);
  json files = json::array();
  if (world.size() > 1) {
    for (const std::string test : {"all_reduce_perf", "all_gather_perf"}) {
      const std::string text = probe_collective(o, world, test);
      const fs::path out(o.output);
      const fs::path file = out.parent_path() / (out.stem().string() + "-" + test + ".txt");
      if (world.rank() == 0) write_file_atomically(file.string(), text);
      files.push_back(file.filename().string());  // beside the probe file
    }
  }
  result["nccl_tests_files"] = files;
  if (world.rank() == 0) write_file_atomically(o.output, result.dump(1) + "\n");
  world.barrier();
}

}  // namespace dplan::executor
