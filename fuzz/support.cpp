#include "support.h"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <typeinfo>
#include <vector>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/time.h"
#include "dplan/planner/profiles.h"

namespace dplan::fuzz {
namespace fs = std::filesystem;
using namespace dplan::costmodel;

namespace {

std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> s(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && s ? s.get() : name;
}

const planner::ProfileStore& store() {
  static const planner::ProfileStore s(DPLAN_SOURCE_DIR "/profiles");
  return s;
}

// A fixed input read at start-up: one that does not read is the harness's bug, not a finding.
template <typename F>
auto fixed(const char* what, F read) {
  try {
    return read();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz harness: cannot read the fixed input %s: %s\n", what, e.what());
    std::exit(2);
  }
}

// DPLAN_FUZZ_VERBOSE=1: say what each input got to (a reader's refusal, each estimate), to check
// that the seeds reach past the readers.
bool verbose() {
  static const bool v = std::getenv("DPLAN_FUZZ_VERBOSE") != nullptr;
  return v;
}

void check(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

// The first precision the GPU has the math for, so that most GPUs get an estimate.
Precision precision_for(const GpuSpec& gpu) {
  for (Precision p : {Precision::bf16, Precision::fp32, Precision::fp16, Precision::fp8}) {
    const std::string key = to_string(p);
    if (gpu.peak_flops_per_s.count(key) || (p == Precision::fp32 && gpu.peak_flops_per_s.count("tf32"))) return p;
  }
  return Precision::bf16;  // validate() refuses it, naming the GPU's units
}

void estimate_one(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
                  const ParallelConfig& parallel) {
  const int gpus = parallel.world_size();
  try {
    validate(model, cluster, training, parallel, gpus);
  } catch (const InputError& e) {
    if (verbose()) std::fprintf(stderr, "fuzz: layout refused: %s\n", e.what());
    return;  // a layout dplan would refuse before estimating
  }
  const MemoryEstimate memory = estimate_memory(model, cluster, training, parallel);
  const Network network(cluster, gpus);
  const TimeBreakdown time = estimate_time(model, network, training, parallel, memory);
  const std::string layout = "tp " + std::to_string(parallel.tp) + " pp " + std::to_string(parallel.pp) + " dp " +
                             std::to_string(parallel.dp) + " vpp " + std::to_string(parallel.vpp);
  check(std::isfinite(memory.peak_bytes) && memory.peak_bytes > 0,
        "estimate_memory (" + layout + "): peak " + std::to_string(memory.peak_bytes) + " bytes");
  check(std::isfinite(time.step_time_s) && time.step_time_s > 0,
        "estimate_time (" + layout + "): step " + std::to_string(time.step_time_s) + " s");
  for (const auto& [phase, seconds] : time.phases())
    check(std::isfinite(seconds) && seconds >= 0,
          "estimate_time (" + layout + "): phase " + phase + " " + std::to_string(seconds) + " s");
  check(std::isfinite(time.tokens_per_s) && std::isfinite(time.mfu),
        "estimate_time (" + layout + "): tokens/s " + std::to_string(time.tokens_per_s) + ", mfu " +
            std::to_string(time.mfu));
  if (verbose())
    std::fprintf(stderr, "fuzz: %s on %s: peak %.3g bytes, step %.3g s\n", layout.c_str(), cluster.name.c_str(),
                 memory.peak_bytes, time.step_time_s);
}

}  // namespace

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void run_one(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& e) {
    // The readers' one way to refuse an input.
    if (verbose()) std::fprintf(stderr, "fuzz: refused: %s\n", e.what());
  } catch (const std::exception& e) {
    finding("uncaught " + demangled(typeid(e).name()) + ": " + e.what());
  } catch (...) {
    finding("uncaught exception of a type not derived from std::exception");
  }
}

std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

json json_of(const uint8_t* data, size_t size) { return parse_json_text(text_of(data, size), "fuzz.json"); }

const ModelSpec& small_model() {
  static const ModelSpec m = fixed("gpt-small", [] { return store().load_model("gpt-small"); });
  return m;
}

const ClusterSpec& fixed_cluster(const std::string& name) {
  static std::map<std::string, ClusterSpec> clusters;
  auto it = clusters.find(name);
  if (it == clusters.end())
    it = clusters.emplace(name, fixed(name.c_str(), [&] { return store().load_cluster(name); })).first;
  return it->second;
}

const json& fixed_cluster_file(const std::string& name) {
  static std::map<std::string, json> files;
  auto it = files.find(name);
  if (it == files.end())
    it = files.emplace(name, fixed(name.c_str(), [&] { return read_json_file(store().cluster_path(name)); })).first;
  return it->second;
}

const json& fixed_gpu_file_of_cluster(const std::string& name) {
  static std::map<std::string, json> files;
  auto it = files.find(name);
  if (it == files.end())
    it = files
             .emplace(name, fixed(name.c_str(),
                                  [&] {
                                    const std::string gpu = fixed_cluster_file(name).at("cluster").at("gpu");
                                    return read_json_file(store().gpu_path(gpu));
                                  }))
             .first;
  return it->second;
}

GpuSpec gpu_named(const std::string& name) {
  static const std::map<std::string, GpuSpec> gpus = fixed("profiles/gpus", [] {
    std::map<std::string, GpuSpec> all;
    for (const std::string& n : store().gpu_names()) all.emplace(n, store().load_gpu(n));
    return all;
  });
  auto it = gpus.find(fs::path(name).stem().string());
  return it != gpus.end() ? it->second : gpus.at("h100-sxm5-80gb");
}

namespace {
// tests/data/compare/<name>.json first, then tests/data/accuracy/<prefix>*.json.
template <typename T, typename Read>
std::vector<T> stored(const std::string& compare_file, const std::string& prefix, Read read) {
  return fixed(prefix.c_str(), [&] {
    std::vector<T> all{read(DPLAN_SOURCE_DIR "/tests/data/compare/" + compare_file)};
    std::vector<std::string> paths;
    for (const auto& entry : fs::directory_iterator(DPLAN_SOURCE_DIR "/tests/data/accuracy"))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) paths.push_back(entry.path().string());
    std::sort(paths.begin(), paths.end());
    for (const std::string& path : paths) all.push_back(read(path));
    return all;
  });
}
}  // namespace

const Plan& plan_like(const RunRecord& run) {
  static const std::vector<Plan> plans = stored<Plan>("plan.json", "plan-", read_plan);
  for (const Plan& p : plans)
    if (p.parallel.tp == run.layout.tp && p.parallel.pp == run.layout.pp && p.parallel.dp == run.layout.dp &&
        p.parallel.cp == run.layout.cp)
      return p;
  return plans.front();
}

const RunRecord& run_like(const Plan& plan) {
  static const std::vector<RunRecord> runs = stored<RunRecord>("run.json", "run-", read_run_record);
  for (const RunRecord& r : runs)
    if (r.layout.tp == plan.parallel.tp && r.layout.pp == plan.parallel.pp && r.layout.dp == plan.parallel.dp &&
        r.layout.cp == plan.parallel.cp)
      return r;
  return runs.front();
}

void estimate_layouts(const ModelSpec& model, const ClusterSpec& cluster) {
  TrainingSpec training;
  training.seq_len = std::min(model.max_seq_len, 256);
  training.global_batch = 16;
  training.precision = precision_for(cluster.gpu);
  // Four ranks: pipeline 1F1B with ZeRO 1 (one node on most clusters; local-cpu's cores are shared).
  estimate_one(model, cluster, training, ParallelConfig{.pp = 2, .dp = 2, .zero_stage = 1});
  // Eight ranks: tensor parallel with sequence parallel, the interleaved schedule, selective recompute.
  estimate_one(model, cluster, training,
               ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .vpp = 2, .sequence_parallel = true,
                              .recompute = Recompute::selective, .schedule = Schedule::interleaved});
  // Two nodes where a node has at most 8 GPUs: data parallel with ZeRO 3 over the NICs.
  const int dp = cluster.gpus_per_node >= 1 && cluster.gpus_per_node <= 8 ? 2 * cluster.gpus_per_node : 16;
  estimate_one(model, cluster, training, ParallelConfig{.dp = dp, .micro_batch = 1, .zero_stage = 3});
}

ClusterSpec with_gpu(ClusterSpec cluster, const GpuSpec& gpu) {
  cluster.gpu = gpu;
  return cluster;
}

void check_finite(const GpuSpec& g, const std::string& what) {
  bool ok = std::isfinite(g.hbm_bytes) && std::isfinite(g.hbm_bandwidth_bytes_per_s) &&
            std::isfinite(g.framework_reserve_bytes) && std::isfinite(g.kernel_overhead_s);
  for (const auto& [precision, flops] : g.peak_flops_per_s) ok = ok && std::isfinite(flops);
  for (const MeasuredGemm& x : g.matmul_measured) ok = ok && std::isfinite(x.time_s);
  check(ok, what + ": a GPU figure read as finite is not finite after conversion");
}

void check_finite(const ClusterSpec& c, const std::string& what) {
  check_finite(c.gpu, what);
  bool ok = std::isfinite(c.intra_node.bandwidth_bytes_per_s) && std::isfinite(c.intra_node.latency_s) &&
            std::isfinite(c.intra_node.half_bandwidth_bytes) && std::isfinite(c.nvls_half_bandwidth_bytes) &&
            std::isfinite(c.nic_bandwidth_bytes_per_s) && std::isfinite(c.inter_node_latency_s) &&
            std::isfinite(c.inter_node_half_bandwidth_bytes) && std::isfinite(c.host_memory_bytes);
  for (const MeasuredCollective& x : c.intra_node.measured) ok = ok && std::isfinite(x.time_s);
  check(ok, what + ": a cluster figure read as finite is not finite after conversion");
}

void expect_reads_back(const std::string& what, const std::function<void()>& read_back) {
  try {
    read_back();
  } catch (const InputError& e) {
    finding(what + ": what dplan writes, its reader refuses: " + e.what());
  }
}

}  // namespace dplan::fuzz
