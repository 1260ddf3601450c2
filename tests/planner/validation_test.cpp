// The cost model against the published runs of the validation set (tests/data: copies of the
// project's published.json, public2.json and public3.json), each run with its published layout and
// the engine its source ran (planner/validation.h), printing predicted against published:
//  - published.json (Narayanan et al. 2021, Table 1, A100): within 5 % on average, 10 % each;
//  - public2.json (21 H100 runs) and public3.json (42 A100/H100 runs), every run expressed: within
//    8 % on average and 20 % each;
//  - every pair of published layouts of one workload whose times differ by 3 % or more, ordered as
//    published;
//  - leave-one-source-out: each source predicted within 10 % on average by the figures fitted
//    without it, and the shipped figures where the routine puts them on all of the runs.
// Nothing else is fitted or tested here.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <catch2/catch.hpp>

#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/memory.h"
#include "dplan/planner/validation.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::planner;
using dplan::testing::store;

namespace {

const std::vector<PublishedRun>& runs_of(const std::string& name) {
  static std::map<std::string, std::vector<PublishedRun>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string data = DPLAN_VALIDATION_DIR;
    const std::string extra = name == "public2.json" ? data + "/public2-models.json" : "";
    it = cache.emplace(name, read_published_runs(data + "/" + name, store(), extra)).first;
  }
  return it->second;
}

std::vector<PublishedRun> all_runs() {
  std::vector<PublishedRun> all;
  for (const char* file : {"published.json", "public2.json", "public3.json"})
    for (const PublishedRun& r : runs_of(file)) all.push_back(r);
  return all;
}

std::string layout(const PublishedRun& r) {
  const costmodel::ParallelConfig& p = r.inputs.parallel;
  std::ostringstream o;
  o << "tp" << p.tp << " pp" << p.pp << " dp" << p.dp;
  if (p.cp > 1) o << " cp" << p.cp;
  if (p.vpp > 1) o << " vpp" << p.vpp;
  o << " mbs" << p.micro_batch;
  if (p.zero_stage) o << " z" << p.zero_stage;
  if (p.sequence_parallel) o << " sp";
  o << " rc-" << costmodel::to_string(p.recompute);
  return o.str();
}

// Prints the file's table; checks each run within `worst` and the mean within `mean`.
void check_file(const std::string& name, double mean, double worst, size_t expected_runs) {
  const std::vector<PublishedRun>& runs = runs_of(name);
  std::printf("\n%s\n%-44s %-16s %-38s | %9s %9s %7s\n", name.c_str(), "run", "engine", "layout", "paper (s)",
              "dplan (s)", "error");
  double sum = 0, most = 0;
  for (const PublishedRun& r : runs) {
    const double predicted = predicted_step_s(r), error = predicted / r.target_step_s - 1;
    std::printf("%-44s %-16s %-38s | %9.3f %9.3f %+6.1f%%\n", r.id.c_str(),
                costmodel::engine_label(r.inputs.training.engine).c_str(), layout(r).c_str(), r.target_step_s,
                predicted, 100 * error);
    CAPTURE(r.id, predicted, r.target_step_s);
    CHECK(std::abs(error) <= worst);
    sum += std::abs(error);
    most = std::max(most, std::abs(error));
  }
  std::printf("mean absolute error %.1f %%, worst %.1f %% over %zu runs\n", 100 * sum / runs.size(), 100 * most,
              runs.size());
  CHECK(runs.size() == expected_runs);
  CHECK(sum / runs.size() <= mean);
}

}  // namespace

TEST_CASE("the ten published Megatron runs are predicted within 5 % on average, 10 % each", "[validation]") {
  check_file("published.json", 0.05, 0.10, 10);
}

TEST_CASE("the 21 H100 runs of public2.json are predicted within 8 % on average, 20 % each", "[validation]") {
  check_file("public2.json", 0.08, 0.20, 21);
}

TEST_CASE("the 42 runs of public3.json, every one expressed, are predicted within 8 % on average, 20 % each",
          "[validation]") {
  check_file("public3.json", 0.08, 0.20, 42);
}

TEST_CASE("every pair of published layouts of one workload is ordered as published", "[validation][ranking]") {
  const std::vector<PublishedRun> runs = all_runs();
  const std::vector<LayoutPair> pairs = same_workload_pairs(runs, 0.03);
  std::printf("\n%-40s %-40s | %9s %9s | %9s %9s | %s\n", "faster (published)", "slower (published)", "paper (s)",
              "paper (s)", "dplan (s)", "dplan (s)", "order");
  int kept = 0;
  for (const LayoutPair& p : pairs) {
    const PublishedRun &a = runs[p.faster], &b = runs[p.slower];
    const double pa = predicted_step_s(a), pb = predicted_step_s(b);
    std::printf("%-40s %-40s | %9.2f %9.2f | %9.2f %9.2f | %s\n", a.id.c_str(), b.id.c_str(), a.target_step_s,
                b.target_step_s, pa, pb, pa < pb ? "kept" : "REVERSED");
    CAPTURE(a.id, b.id, pa, pb);
    CHECK(pa < pb);
    kept += pa < pb;
  }
  std::printf("%d of %zu pairs in the published order\n", kept, pairs.size());
  // Narayanan et al. 2021's Table 2 alone gives five ZeRO-3 / PTD-P pairs at equal GPU counts; with
  // Korthikanti et al.'s recompute pairs and llm-foundry's there are more.
  CHECK(pairs.size() >= 10);
}

TEST_CASE("a pair's order needs the engine: ZeRO-3 priced as Megatron-FSDP would beat PTD-P", "[validation][ranking]") {
  // The same Table 2 runs with DeepSpeed's 2021 ZeRO-3 replaced by a prefetching per-layer one:
  // ZeRO-3 then looks faster than PTD-P at 1,536 GPUs, the paper's measurement reversed.
  const std::vector<PublishedRun>& runs = runs_of("public3.json");
  auto find = [&](const std::string& id) {
    for (const PublishedRun& r : runs)
      if (r.id == id) return r;
    FAIL("no run " << id);
    return runs.front();
  };
  PublishedRun zero3 = find("megatron2021-t2-zero3-174.6b-1536gpu");
  const PublishedRun ptd = find("megatron2021-t2-ptd-174.6b-1536gpu");
  CHECK(predicted_step_s(zero3) > predicted_step_s(ptd));
  zero3.inputs.training.engine = costmodel::engine_mechanics(costmodel::Engine::megatron);
  CHECK(predicted_step_s(zero3) < predicted_step_s(ptd));
}

TEST_CASE("leave one source out: each source within 10 % from the figures fitted without it; the shipped figures "
          "are the routine's",
          "[validation][fit]") {
  const std::vector<PublishedRun> runs = all_runs();
  const std::vector<FittedParameter> params = shipped_fitted_parameters();
  // Few sweeps keep the suite quick; the figures move less than 0.1 point of error after them.
  constexpr int kSweeps = 3;
  const std::vector<SourceFold> folds = leave_one_source_out(runs, params, kSweeps);
  std::printf("\n%-24s %5s | %10s %14s |", "source held out", "runs", "in-sample", "out-of-sample");
  for (const FittedParameter& p : params) std::printf(" %s |", p.name().c_str());
  std::printf("\n");
  for (const SourceFold& f : folds) {
    std::printf("%-24s %5d | %9.1f%% %13.1f%% |", f.source.c_str(), f.runs, 100 * f.in_sample_error,
                100 * f.out_of_sample_error);
    for (double v : f.out_of_sample_values) std::printf(" %.3g |", v);
    std::printf("\n");
    CAPTURE(f.source);
    CHECK(f.out_of_sample_error <= 0.10);
  }
  CHECK(folds.size() == 8);
  // The shipped profiles and engine table hold what the routine fits on every run: refitting them
  // lowers the mean error by less than 0.2 point.
  std::vector<double> shipped;
  for (const FittedParameter& p : params) {
    double value = std::nan("");
    for (const PublishedRun& r : runs)
      if (p.applies_to(r)) value = p.value(r);
    shipped.push_back(value);
  }
  const double shipped_error = mean_abs_error(runs);
  const FitResult refit = fit_parameters(runs, params, kSweeps);
  std::printf("all %zu runs: shipped figures %.2f %%, refitted %.2f %%\n", runs.size(), 100 * shipped_error,
              100 * refit.mean_abs_error);
  for (size_t i = 0; i < params.size(); ++i) std::printf("  %s: shipped %.3g, refitted %.3g\n", params[i].name().c_str(), shipped[i], refit.values[i]);
  CHECK(shipped_error - refit.mean_abs_error < 0.002);
}

// Every published run trained on the hardware it names, so each must fit under the default
// headroom. The runs that do not yet are listed with the reason, and must still miss (a run that
// starts to fit is taken off the list); every other run must fit. Issue-level target: no list.
TEST_CASE("every published run fits under the default headroom (the runs that do not yet are listed)",
          "[validation][memory][law]") {
  const std::map<std::string, std::string> known_misses = {
      {"nemo2407-nemotron-340b-128gpu",
       "tp 8 pp 8 dp 2: the first stage's bf16 weights with their FP8 copy, bf16 gradients and the fp32 master "
       "weights and Adam moments sharded over only 2 ranks are 59 GiB before 103 layers' activations in flight. "
       "The launcher's optim.dtype bf16 does not reach Megatron (NeMo 24.07 setup_megatron_optimization builds "
       "OptimizerConfig without it), and FP8 parameters without the bf16 copy would still leave 75.3 GiB of 75.2 usable; what "
       "the published run did otherwise (a recompute, another layout) is not in the source"},
  };

  int fit = 0, listed = 0;
  for (const char* file : {"published.json", "public2.json", "public3.json"})
    for (const PublishedRun& r : runs_of(file)) {
      const PlanInputs& in = r.inputs;
      const costmodel::MemoryEstimate mem = costmodel::estimate_memory(in.model, in.cluster, in.training, in.parallel);
      INFO(r.id << ": worst stage " << mem.peak_bytes / kGiB << " GiB of "
                << mem.usable_bytes() / kGiB << " usable");
      const auto miss = known_misses.find(r.id);
      if (miss == known_misses.end()) {
        CHECK(mem.fits);
        fit += mem.fits;
      } else {
        std::printf("does not fit yet: %s (%.1f GiB of %.1f usable): %s\n", r.id.c_str(), mem.peak_bytes / kGiB,
                    mem.usable_bytes() / kGiB, miss->second.c_str());
        CHECK_FALSE(mem.fits);
        ++listed;
      }
    }
  std::printf("%d published runs fit under the default headroom; %d listed do not yet\n", fit, listed);
  CHECK(listed == int(known_misses.size()));
}

TEST_CASE("dplan estimate --engine prices what the library prices", "[validation][cli]") {
  // One run through the command line: the ZeRO-3 174.6B run on 768 GPUs with DeepSpeed's 2021
  // mechanics, its model written where the test can reach it.
  const PublishedRun* run = nullptr;
  for (const PublishedRun& r : runs_of("public3.json"))
    if (r.id == "megatron2021-t2-zero3-174.6b-768gpu") run = &r;
  REQUIRE(run);
  const json model = [] {
    for (const json& r : dplan::read_json_file(std::string(DPLAN_VALIDATION_DIR) + "/public3.json"))
      if (r["id"] == "megatron2021-t2-zero3-174.6b-768gpu") return r["model"];
    return json();
  }();
  const std::string model_file =
      std::filesystem::temp_directory_path() / ("dplan-validation-" + std::to_string(getpid()) + ".json");
  std::ofstream(model_file) << model.dump();
  const std::string command = std::string("DPLAN_PROFILES='") + DPLAN_PROFILES_DIR + "' '" + DPLAN_BINARY +
                              "' estimate --json --cluster dgx-a100-80g --model '" + model_file +
                              "' --gpus 768 --dp 768 --mbs 2 --global-batch 1536 --seq 2048 --precision fp16 "
                              "--attention standard --recompute full --zero 3 --engine deepspeed@v0.3";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  REQUIRE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  std::filesystem::remove(model_file);
  INFO(out);
  REQUIRE(json::accept(out));
  CHECK_THAT(json::parse(out)["step_time_s"].get<double>(), Catch::WithinRel(predicted_step_s(*run), 1e-12));
}

TEST_CASE("an unknown engine or engine version is refused in one line naming the choices", "[validation][cli]") {
  for (const auto& [engine, expected] :
       {std::pair<std::string, std::string>{"bogus", "unknown engine \"bogus\"; valid: megatron, torchtitan, deepspeed, "
                                                     "accelerate, torchrun, slurm"},
        {"deepspeed@v9", "engine deepspeed has no version \"v9\" dplan prices; valid: v0.3, "}}) {
    const std::string command = std::string("DPLAN_PROFILES='") + DPLAN_PROFILES_DIR + "' '" + DPLAN_BINARY +
                                "' estimate --model 8b --gpus 8 --engine '" + engine + "' 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    REQUIRE(pipe);
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    const int status = pclose(pipe);
    CAPTURE(out);
    CHECK(WEXITSTATUS(status) == 2);
    CHECK(out.find(expected) != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
}
