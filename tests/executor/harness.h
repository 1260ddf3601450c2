// What the executor's end-to-end tests share: writing a plan with `dplan estimate`, training it
// with `dplan run`, and comparing every step's loss with the single-process run of the same model,
// seed, data and global batch (computed once per test process).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "process.h"

namespace dplan::testing::executor {
namespace fs = std::filesystem;
using nlohmann::json;

// Steps of the parity runs: the losses of every step are compared, warm-up (2) included; each
// run costs about 1.7 s to start and 0.1 s a step here, so six keep the suite within its budget.
inline constexpr int kSteps = 6;
// The later features' parity runs (context and expert parallel, interleaving, offload): fewer
// steps, so the suite stays short; a wrong gradient shows in the second step's loss already.
inline constexpr int kFeatureSteps = 5;
// Relative, per step: fp32 runs of the same model under two layouts differ only in the order of
// their sums (tensor-parallel partial products, data-parallel reductions).
inline constexpr double kParityTolerance = 1e-4;
inline const std::string kLlamaTiny = std::string(DPLAN_VALIDATION_DIR) + "/executor/llama-tiny/config.json";

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  std::string schedule = "1f1b";
  bool sp = false;
  int mbs = 1;
  std::string recompute = "none";
  int cp = 1;
  int world() const { return tp * pp * dp * cp; }
  std::string describe() const {
    return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) +
           (cp > 1 ? " cp " + std::to_string(cp) : "") + " " + schedule + (sp ? " sp" : "") + " mbs " +
           std::to_string(mbs) + " recompute " + recompute;
  }
};

inline Layout with_cp(Layout l, int cp) {
  l.cp = cp;
  return l;
}

inline std::string write_plan(const TempDir& dir, const std::string& model, const Layout& l, int global_batch,
                       const std::vector<std::string>& extra = {}) {
  std::string name = "plan-" + std::to_string(l.tp) + std::to_string(l.pp) + std::to_string(l.dp) +
                     std::to_string(l.cp) + l.schedule +
                     (l.sp ? "-sp" : "") + "-" + l.recompute;
  for (const std::string& e : extra) name += e;  // e.g. "--zero3"
  std::string path = (dir.path() / (name + ".json")).string();
  std::vector<std::string> args = {"estimate", "--model", model, "--cluster", "local-cpu", "--gpus",
                                   std::to_string(l.world()), "--tp", std::to_string(l.tp), "--pp",
                                   std::to_string(l.pp), "--dp", std::to_string(l.dp), "--cp", std::to_string(l.cp),
                                   "--mbs", std::to_string(l.mbs),
                                   "--global-batch", std::to_string(global_batch), "--schedule", l.schedule,
                                   "--recompute", l.recompute, "-o", path};
  if (std::find(extra.begin(), extra.end(), "--precision") == extra.end()) args.insert(args.end(), {"--precision", "fp32"});
  if (l.sp) args.push_back("--sp");
  args.insert(args.end(), extra.begin(), extra.end());
  Result r = run_program(DPLAN_BINARY, args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return path;
}

// `dplan run plan --steps steps --quiet -o out extra...`, expecting exit 0; the run record.
inline json run_plan_to(const std::string& plan, const std::string& out, int steps, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"run", plan, "--steps", std::to_string(steps), "--quiet", "-o", out};
  args.insert(args.end(), extra.begin(), extra.end());
  Result r = run_program(DPLAN_BINARY, args);
  INFO("dplan run " << plan << "\nstderr: " << r.err);
  REQUIRE(r.status == 0);
  return json::parse(read_file(out));
}

inline json run_plan(const std::string& plan, const std::vector<std::string>& extra = {}, int steps = kSteps) {
  return run_plan_to(plan, (fs::path(plan).replace_extension(".run.json")).string(), steps, extra);
}

inline std::vector<double> losses(const json& run) {
  std::vector<double> out;
  for (const auto& s : run.at("steps")) out.push_back(s.at("loss").get<double>());
  return out;
}

inline void require_parity(const json& run, const std::vector<double>& reference, const std::string& what) {
  INFO(what);
  std::vector<double> got = losses(run);
  REQUIRE(got.size() == reference.size());
  REQUIRE(got.size() >= 3);
  double largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs single process " << reference[i]);
    CHECK(std::abs(got[i] - reference[i]) <= kParityTolerance * std::abs(reference[i]));
    largest = std::max(largest, std::abs(got[i] - reference[i]) / std::abs(reference[i]));
  }
  // The parity table's figure: the largest relative gap over the steps.
  std::printf("parity: %s: %zu steps, largest relative loss gap %.2e\n", what.c_str(), got.size(), largest);
  CHECK(run.at("replicas").at("identical").get<bool>());
}

// The single-process reference of a model, computed once per test binary run, over `steps` steps;
// `model_flags`: `dplan estimate` flags that change the model (--mtp-layers 2), not the layout.
inline const std::vector<double>& reference(const std::string& model, int global_batch, int steps = kSteps,
                                            const std::vector<std::string>& model_flags = {}) {
  static std::map<std::string, std::vector<double>> cache;
  std::string key = model + "/" + std::to_string(global_batch) + "/" + std::to_string(steps);
  for (const std::string& f : model_flags) key += "/" + f;
  if (!cache.count(key)) {
    static TempDir dir;
    Layout single;
    single.mbs = 2;  // micro-batching only reorders sums: the parity runs use mbs 1
    cache[key] = losses(run_plan(write_plan(dir, model, single, global_batch, model_flags), {}, steps));
  }
  return cache[key];
}

inline void check_flops(const std::string& plan, const std::string& what);  // below

inline void check_layouts(const std::string& model, const std::vector<Layout>& layouts) {
  const std::vector<double>& ref = reference(model, 8);
  // The loss must move, or parity would prove little.
  CHECK(ref.back() < ref.front());
  TempDir dir;
  for (const Layout& l : layouts) {
    const std::string plan = write_plan(dir, model, l, 8);
    require_parity(run_plan(plan), ref, l.describe());
    check_flops(plan, model + " " + l.describe());
  }
}

inline std::vector<Layout> issue_layouts(const std::string& schedule) {
  std::vector<Layout> out;
  for (auto [tp, pp, dp] : std::vector<std::tuple<int, int, int>>{
           {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}, {2, 2, 2}})
    out.push_back({tp, pp, dp, schedule});
  return out;
}


// dplan compare of `plan` with the run.json run_plan wrote beside it: per stage, measured weights,
// gradients and optimizer states within 1 % of the prediction, activations within 15 %.
inline void check_memory(const std::string& plan, int stages) {
  Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json cmp = json::parse(r.out);
  REQUIRE(cmp["memory"].size() == static_cast<size_t>(stages));
  for (const auto& stage : cmp["memory"]) {
    INFO("stage " << stage["stage"]);
    double predicted = 0, measured = 0;
    for (const char* part : {"weights", "gradients", "optimizer"}) {
      predicted += stage[part]["predicted"].get<double>();
      measured += stage[part]["measured"].get<double>();
    }
    CHECK(std::abs(measured - predicted) <= 0.01 * predicted);
    const double act_predicted = stage["activations"]["predicted"].get<double>();
    const double act_measured = stage["activations"]["measured"].get<double>();
    INFO("activations predicted " << act_predicted << " measured " << act_measured);
    CHECK(std::abs(act_measured - act_predicted) <= 0.15 * act_predicted);
  }
}

// dplan compare's FLOPs (run.json "flops") of `plan` with the run.json run_plan wrote beside it:
// each rank's counted matrix-multiply FLOPs per step against costmodel::rank_step_flops, forward
// and recomputed, every part on every rank to 1e-9, but for two parts compared summed over the
// ranks: the routed experts (a rank's own follow its tokens' choices; the sum, to 1e-9) and the
// attention core (the prediction takes blockwise causal attention at s^2/2 pairs a sequence, the
// executor counts the s(s+1)/2 it attends: within 1/s).
inline void check_flops(const std::string& plan, const std::string& what) {
  INFO("FLOPs of " << what);
  Result r = run_program(DPLAN_BINARY, {"compare", plan, fs::path(plan).replace_extension(".run.json").string(), "--json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json cmp = json::parse(r.out);
  REQUIRE(cmp.contains("flops"));
  const double seq_len = json::parse(read_file(plan)).at("training").at("seq_len").get<double>();
  std::map<std::string, std::pair<double, double>> summed;  // "forward/part" -> (predicted, counted)
  double largest = 0;
  for (const auto& rank : cmp.at("flops")) {
    for (const char* pass : {"forward", "recompute"}) {
      for (const auto& [part, v] : rank.at(pass).items()) {
        const double predicted = v.at("predicted").get<double>(), counted = v.at("measured").get<double>();
        auto& sum = summed[std::string(pass) + "/" + part];
        sum.first += predicted;
        sum.second += counted;
        if (part == "experts" || part == "attention") continue;
        INFO("rank " << rank.at("rank") << " " << pass << " " << part << ": predicted " << predicted << ", counted " << counted);
        CHECK(std::abs(counted - predicted) <= 1e-9 * std::max(1.0, predicted));
        if (predicted > 0) largest = std::max(largest, std::abs(counted - predicted) / predicted);
      }
    }
  }
  REQUIRE(summed.at("forward/qkv").second > 0);  // it counted
  REQUIRE(summed.at("forward/head").second > 0);
  double attention_gap = 0;
  for (const auto& [key, sum] : summed) {
    const auto [predicted, counted] = sum;
    INFO(key << " over the ranks: predicted " << predicted << ", counted " << counted);
    const bool attention = key.find("/attention") != std::string::npos;
    CHECK(std::abs(counted - predicted) <= (attention ? 1 / seq_len : 1e-9) * std::max(1.0, predicted));
    if (attention && predicted > 0) attention_gap = std::max(attention_gap, std::abs(counted - predicted) / predicted);
  }
  std::printf("flops: %s: every part but attention within %.1e of the plan (experts summed), attention %.2e (1/s = %.2e)\n",
              what.c_str(), largest, attention_gap, 1 / seq_len);
}

// A layout of a model with extra `dplan estimate` flags (--zero 1, --attention standard, ...).
struct PlanCase {
  std::string model;
  Layout layout;
  std::vector<std::string> flags;
  std::string describe() const {
    std::string s = model + " " + layout.describe();
    for (const std::string& f : flags) s += " " + f;
    return s;
  }
};

// `c` planned (global batch 8) and trained kFeatureSteps steps, step for step as `ref`, and the
// FLOPs it ran the cost model's (check_flops).
inline void check_parity_case(const TempDir& dir, const PlanCase& c, const std::vector<double>& ref) {
  const std::string plan = write_plan(dir, c.model, c.layout, 8, c.flags);
  require_parity(run_plan(plan, {}, kFeatureSteps), ref, c.describe());
  check_flops(plan, c.describe());
}

// Each case planned (global batch 8), trained 3 steps, and its memory checked (check_memory).
inline void check_memory_cases(const std::vector<PlanCase>& cases) {
  TempDir dir;
  for (const PlanCase& c : cases) {
    const std::string plan = write_plan(dir, c.model, c.layout, 8, c.flags);
    run_plan(plan, {}, 3);
    INFO(c.describe());
    check_memory(plan, c.layout.pp);
    check_flops(plan, c.describe());
  }
}

}  // namespace dplan::testing::executor
