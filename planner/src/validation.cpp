// The published runs (validation.h): reading the validation files, the same-workload pairs, and
// the one fitting routine with its leave-one-source-out check.
#include "dplan/planner/validation.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/time.h"
#include "fit.h"

namespace dplan::planner {
namespace {

using costmodel::Engine;
using costmodel::EngineMechanics;
using dplan::InputError;

// Which engine each source ran, and which of its sources a run belongs to (one fold each).
// Narayanan et al. 2021 (arXiv 2104.04473): Tables 1 and 2's PTD-P rows are Megatron-LM; Table 2's
// ZeRO-3 rows are "ZeRO-3 ... using DeepSpeed" (Sec. 5.2), the ZeRO-3 of its first releases
// (March 2021). Korthikanti et al. 2022 and the Megatron-Core CI and README runs: Megatron. NeMo
// runs Megatron-Core. BLOOM: Megatron-DeepSpeed (bigscience tr11 README: DeepSpeed's pipeline
// engine and BF16Optimizer, ZeRO-1). MT-NLG 530B: "Using DeepSpeed and Megatron" (arXiv
// 2201.11990, 2021: DeepSpeed's pipeline and ZeRO-1). llm-foundry: Composer over PyTorch FSDP,
// FULL_SHARD (its benchmarking README), the mechanism Accelerate's FSDP plugin runs.
struct SourceOf {
  const char* group;   // the run's "group" in public2/public3 ("" for published.json)
  const char* source;  // the fold
  const char* engine;  // engine_mechanics_from_label
  bool zero3_only;     // the engine applies to the group's ZeRO-3 runs only (the rest: megatron)
  // Megatron's gradient-accumulation fusion was off: the Megatron-LM CI's 7B speed tests run
  // --no-gradient-accumulation-fusion (tests/functional_tests/test_cases/gpt/
  // gpt3_7b_tp{1_pp4,4_pp1}_memory_speed/model_config.yaml; public3-NOTES.md section 16).
  bool no_gradient_accumulation_fusion = false;
  // Gradients held and reduced in bf16: NeMo 24.07's performance recipes run Apex's
  // distributed_fused_adam with optim.grad_sync_dtype bf16 (NVIDIA/NeMo-Framework-Launcher@1e46ac6c
  // launcher_scripts/conf/training/gpt3/{5b,20b,175b}_fp8_performance.yaml).
  bool grad_reduce_in_bf16 = false;
};
constexpr SourceOf kSources[] = {
    {"", "narayanan2021", "megatron", false},
    {"megatron2021-table2", "narayanan2021", "deepspeed@v0.3", true},
    {"korthikanti", "korthikanti2022", "megatron", false},
    {"bloom", "bloom", "deepspeed", false},
    {"mtnlg", "mt-nlg", "deepspeed@v0.3", false},
    {"mcore", "megatron-core-ci", "megatron", false, true},
    {"llmfoundry", "llm-foundry", "accelerate", false},
    {"nemo-24.07", "nemo-24.07", "megatron", false, false, true},
    {"mcore-readme", "megatron-core-readme", "megatron", false},
};

const SourceOf& source_of(const std::string& group, const std::string& file) {
  for (const SourceOf& s : kSources)
    if (group == s.group) return s;
  throw InputError(file + ": run group \"" + group + "\" is not one dplan knows the engine of (validation.cpp)");
}

// published.json (Narayanan et al. 2021 Table 1): the model by its preset ("GPT 1.7B" ->
// gpt-1.7b), dgx-a100-80g, fp16, standard attention, full recompute (the sc21 scripts'
// --activations-checkpoint-method uniform); "local" DDP reduced gradients after the backward.
PublishedRun table1_run(const json& run, const ProfileStore& store, const std::string& file) {
  const json& m = run.at("model");
  const json& p = run.at("parallel");
  std::string size = m.at("name").get<std::string>().substr(4);  // "1.7B"
  if (size == "1008.0B") size = "1T";
  std::transform(size.begin(), size.end(), size.begin(), [](unsigned char c) { return std::tolower(c); });
  PublishedRun r;
  r.id = run.at("id");
  r.source = "narayanan2021";
  r.file = file;
  r.inputs.model = store.load_model("gpt-" + size);
  r.inputs.cluster = store.load_cluster("dgx-a100-80g");
  r.inputs.training.seq_len = m.at("seq_len");
  r.inputs.training.global_batch = p.at("global_batch");
  r.inputs.training.precision = costmodel::Precision::fp16;
  r.inputs.training.attention = costmodel::Attention::standard;
  r.inputs.training.engine = costmodel::engine_mechanics(Engine::megatron);
  costmodel::ParallelConfig& q = r.inputs.parallel;
  q.tp = p.at("tp");
  q.pp = p.at("pp");
  q.dp = p.at("dp");
  q.micro_batch = p.at("micro_batch");
  q.recompute = costmodel::Recompute::full;
  if (!p.at("vpp").is_null()) {
    q.vpp = p.at("vpp");
    q.schedule = costmodel::Schedule::interleaved;
  }
  r.inputs.overlap.grad_reduce = p.at("ddp_impl") != "local";
  r.gpus = q.tp * q.pp * q.dp;
  r.target_step_s = run.at("derived").at("iteration_time_s_from_eq3");
  return r;
}

// public2/public3: the layout as the file states it. The Megatron-Core README table lists
// --tp-comm-overlap (with sequence parallel); the other sources state no overlap flags, so only
// dplan's defaults (gradient reduce and parameter gather overlapped) apply.
PublishedRun public_run(const json& run, const ProfileStore& store, const std::string& file, const json& extra) {
  PublishedRun r;
  r.id = run.at("id");
  r.file = file;
  const std::string group = run.at("group");
  const SourceOf& source = source_of(group, file);
  r.source = source.source;
  const json& model = run.at("model").is_null() ? extra.at(r.id) : run.at("model");
  r.inputs.model = costmodel::model_from_hf_config(model, file, r.id);
  r.inputs.cluster = store.load_cluster(run.at("cluster"));
  costmodel::TrainingSpec& t = r.inputs.training;
  t.seq_len = run.at("seq");
  t.global_batch = run.at("global_batch");
  t.precision = costmodel::precision_from_string(run.at("precision").get<std::string>());
  t.attention = costmodel::attention_from_string(run.at("attention").get<std::string>());
  const int zero = run.at("zero");
  t.engine = costmodel::engine_mechanics_from_label(!source.zero3_only || zero == 3 ? source.engine : "megatron");
  t.gradient_accumulation_fusion = !source.no_gradient_accumulation_fusion;
  t.grad_reduce_in_bf16 = source.grad_reduce_in_bf16;
  costmodel::ParallelConfig& q = r.inputs.parallel;
  q.tp = run.at("tp");
  q.pp = run.at("pp");
  q.dp = run.at("dp");
  q.cp = run.at("cp");
  q.ep = run.at("ep");
  q.micro_batch = run.at("mbs");
  q.zero_stage = zero;
  q.distributed_optimizer = run.at("dist_opt");
  q.sequence_parallel = run.at("sp");
  q.recompute = costmodel::recompute_from_string(run.at("recompute").get<std::string>());
  if (!run.at("vpp").is_null()) {
    q.vpp = run.at("vpp");
    q.schedule = costmodel::Schedule::interleaved;
  }
  r.inputs.overlap.tp_comm = q.sequence_parallel && group == "mcore-readme";
  r.gpus = run.at("gpus");
  r.target_step_s = run.at("target_iteration_time_s");
  return r;
}

double gpu_field(const costmodel::GpuSpec& g, FittedField f) {
  switch (f) {
    case FittedField::sustained_fraction: return g.sustained_fraction;
    case FittedField::memory_efficiency: return g.memory_efficiency;
    case FittedField::attention_backward_efficiency: return g.attention_backward_efficiency;
    default: DPLAN_CHECK(false);
  }
  return 0;
}

bool engine_field(FittedField f) {
  return f == FittedField::gemm_scale || f == FittedField::elementwise_scale || f == FittedField::per_rank_s ||
         f == FittedField::prefetch_overlap;
}

const char* field_name(FittedField f) {
  switch (f) {
    case FittedField::sustained_fraction: return "sustained_fraction";
    case FittedField::memory_efficiency: return "memory_efficiency";
    case FittedField::attention_backward_efficiency: return "attention.backward_efficiency";
    case FittedField::gemm_scale: return "gemm_scale";
    case FittedField::elementwise_scale: return "elementwise_scale";
    case FittedField::per_rank_s: return "per_rank_s";
    case FittedField::prefetch_overlap: return "prefetch_overlap";
  }
  return "?";
}

// Where a fit starts: an engine's scales at 1 (Megatron's kernels) and its per-rank time at 2 us
// (a copy_ dispatched from the host), a GPU figure at its profile's value; NaN for a GPU none of
// the runs has (with_parameters leaves it alone).
double prior(const FittedParameter& p, const std::vector<PublishedRun>& runs) {
  if (p.field == FittedField::per_rank_s) return 2e-6;
  if (p.field == FittedField::prefetch_overlap) return 1.0;
  if (engine_field(p.field)) return 1.0;
  for (const PublishedRun& r : runs)
    if (p.applies_to(r)) return p.value(r);
  return std::nan("");
}

}  // namespace

std::vector<PublishedRun> read_published_runs(const std::string& path, const ProfileStore& store,
                                              const std::string& extra_models_path) {
  const json data = read_json_file(path);
  const std::string file = std::filesystem::path(path).filename().string();
  std::vector<PublishedRun> runs;
  try {
    if (data.is_object()) {
      for (const json& run : data.at("runs")) runs.push_back(table1_run(run, store, file));
    } else {
      const json extra =
          extra_models_path.empty() ? json::object() : read_json_file(extra_models_path).at("models");
      for (const json& run : data) runs.push_back(public_run(run, store, file, extra));
    }
  } catch (const json::exception& e) {
    throw InputError(path + ": not a validation file dplan reads (" + e.what() + ")");
  }
  return runs;
}

double predicted_step_s(const PublishedRun& run) {
  const PlanInputs& in = run.inputs;
  costmodel::validate(in.model, in.cluster, in.training, in.parallel, run.gpus);
  if (!run.network) run.network = std::make_shared<const costmodel::Network>(in.cluster, run.gpus);
  const costmodel::Network net = run.network->with_gpu(in.cluster.gpu);
  return costmodel::estimate_time(in.model, net, in.training, in.parallel, in.overlap).step_time_s;
}

std::vector<LayoutPair> same_workload_pairs(const std::vector<PublishedRun>& runs, double min_difference) {
  std::vector<LayoutPair> pairs;
  auto same = [](const PublishedRun& a, const PublishedRun& b) {
    const costmodel::ModelSpec &x = a.inputs.model, &y = b.inputs.model;
    return x.num_layers == y.num_layers && x.hidden_size == y.hidden_size && num_params(x) == num_params(y) &&
           a.inputs.cluster.gpu.name == b.inputs.cluster.gpu.name && a.gpus == b.gpus &&
           a.inputs.training.global_batch == b.inputs.training.global_batch &&
           a.inputs.training.seq_len == b.inputs.training.seq_len;
  };
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = i + 1; j < runs.size(); ++j) {
      if (!same(runs[i], runs[j])) continue;
      const bool i_faster = runs[i].target_step_s < runs[j].target_step_s;
      const LayoutPair p{i_faster ? i : j, i_faster ? j : i};
      if (runs[p.slower].target_step_s >= (1 + min_difference) * runs[p.faster].target_step_s) pairs.push_back(p);
    }
  return pairs;
}

bool FittedParameter::applies_to(const PublishedRun& run) const {
  const EngineMechanics& e = run.inputs.training.engine;
  // The per-rank time belongs to the engine versions that have per-rank copies, and only their
  // ZeRO-3 runs pay it.
  if (field == FittedField::per_rank_s)
    return owner == costmodel::to_string(e.engine) && e.sharded.per_rank_s > 0 && run.inputs.parallel.zero_stage == 3;
  if (field == FittedField::prefetch_overlap)
    return owner == costmodel::to_string(e.engine) && run.inputs.parallel.zero_stage == 3;
  return engine_field(field) ? owner == costmodel::to_string(e.engine) : owner == run.inputs.cluster.gpu.name;
}

double FittedParameter::value(const PublishedRun& run) const {
  const EngineMechanics& e = run.inputs.training.engine;
  if (field == FittedField::gemm_scale) return e.gemm_scale;
  if (field == FittedField::elementwise_scale) return e.elementwise_scale;
  if (field == FittedField::per_rank_s) return e.sharded.per_rank_s;
  if (field == FittedField::prefetch_overlap) return e.sharded.prefetch_overlap;
  return gpu_field(run.inputs.cluster.gpu, field);
}

void FittedParameter::set(PublishedRun& run, double v) const {
  if (!applies_to(run)) return;
  EngineMechanics& e = run.inputs.training.engine;
  costmodel::GpuSpec& g = run.inputs.cluster.gpu;
  switch (field) {
    case FittedField::sustained_fraction: g.sustained_fraction = v; break;
    case FittedField::memory_efficiency: g.memory_efficiency = v; break;
    case FittedField::attention_backward_efficiency: g.attention_backward_efficiency = v; break;
    case FittedField::gemm_scale: e.gemm_scale = v; break;
    case FittedField::elementwise_scale: e.elementwise_scale = v; break;
    case FittedField::per_rank_s: e.sharded.per_rank_s = v; break;
    case FittedField::prefetch_overlap: e.sharded.prefetch_overlap = v; break;
  }
}

std::string FittedParameter::name() const { return owner + " " + field_name(field); }

std::vector<FittedParameter> shipped_fitted_parameters() {
  return {
      {FittedField::sustained_fraction, "a100-sxm4-80gb", 0.6, 1.0},
      {FittedField::sustained_fraction, "h100-sxm5-80gb", 0.6, 1.0},
      {FittedField::attention_backward_efficiency, "h100-sxm5-80gb", 0.25, 0.7},
      {FittedField::gemm_scale, "deepspeed", 0.5, 1.5},
      {FittedField::gemm_scale, "accelerate", 0.5, 1.5},
      {FittedField::elementwise_scale, "accelerate", 0.1, 1.5},
      {FittedField::per_rank_s, "deepspeed", 0.1e-6, 20e-6},
      {FittedField::prefetch_overlap, "accelerate", 0.05, 1.0},
  };
}

double mean_abs_error(const std::vector<PublishedRun>& runs) {
  double sum = 0;
  for (const PublishedRun& r : runs) sum += std::abs(predicted_step_s(r) / r.target_step_s - 1);
  return runs.empty() ? 0 : sum / runs.size();
}

std::vector<PublishedRun> with_parameters(std::vector<PublishedRun> runs, const std::vector<FittedParameter>& params,
                                          const std::vector<double>& values) {
  for (PublishedRun& r : runs)
    for (size_t i = 0; i < params.size(); ++i)
      if (!std::isnan(values[i])) params[i].set(r, values[i]);
  return runs;
}

FitResult fit_parameters(std::vector<PublishedRun> runs, const std::vector<FittedParameter>& params, int sweeps) {
  std::vector<size_t> free;  // the parameters some run constrains
  std::vector<double> start;
  std::vector<detail::Bounds> bounds;
  FitResult result;
  for (size_t i = 0; i < params.size(); ++i) {
    result.values.push_back(prior(params[i], runs));
    if (std::none_of(runs.begin(), runs.end(), [&](const PublishedRun& r) { return params[i].applies_to(r); }))
      continue;
    free.push_back(i);
    start.push_back(result.values[i]);
    bounds.push_back({params[i].lo, params[i].hi});
  }
  runs = with_parameters(std::move(runs), params, result.values);
  // Each trial changes one parameter (coordinate descent): only the runs it applies to are priced
  // again; the others keep the error they had at the values last priced.
  std::vector<double> priced = result.values, errors(runs.size());
  auto run_error = [&](size_t k) { return std::abs(predicted_step_s(runs[k]) / runs[k].target_step_s - 1); };
  for (size_t k = 0; k < runs.size(); ++k) errors[k] = run_error(k);
  auto error = [&](const std::vector<double>& v) {
    for (size_t f = 0; f < free.size(); ++f) {
      const size_t i = free[f];
      if (v[f] == priced[i]) continue;
      priced[i] = v[f];
      for (size_t k = 0; k < runs.size(); ++k)
        if (params[i].applies_to(runs[k])) {
          params[i].set(runs[k], v[f]);
          errors[k] = run_error(k);
        }
    }
    double sum = 0;
    for (double e : errors) sum += e;
    return sum / runs.size();
  };
  if (!free.empty()) {
    // A coarse scan of 12 points per figure and Brent's method to 16 bits of its logarithm: the
    // figures are known to a few tenths of a percent, far below what the runs can tell apart.
    const std::vector<double> best = detail::minimize_in_box(
        error, start, bounds, detail::SearchEffort{.sweeps = sweeps, .grid = 12, .brent_bits = 16, .brent_iterations = 30});
    for (size_t f = 0; f < free.size(); ++f) result.values[free[f]] = best[f];
  }
  result.mean_abs_error = mean_abs_error(with_parameters(runs, params, result.values));
  return result;
}

std::vector<SourceFold> leave_one_source_out(const std::vector<PublishedRun>& runs,
                                             const std::vector<FittedParameter>& params, int sweeps) {
  std::vector<std::string> sources;
  for (const PublishedRun& r : runs)
    if (std::find(sources.begin(), sources.end(), r.source) == sources.end()) sources.push_back(r.source);
  const FitResult all = fit_parameters(runs, params, sweeps);
  std::vector<SourceFold> folds;
  for (const std::string& source : sources) {
    std::vector<PublishedRun> in, out;
    for (const PublishedRun& r : runs) (r.source == source ? out : in).push_back(r);
    SourceFold f;
    f.source = source;
    f.runs = static_cast<int>(out.size());
    f.in_sample_error = mean_abs_error(with_parameters(out, params, all.values));
    // The fold fits on the runs it keeps. A figure none of them constrains keeps its prior: an
    // engine scale 1, a GPU figure the held-out runs' own profile value (NaN: left as it is).
    f.out_of_sample_values = fit_parameters(in, params, sweeps).values;
    f.out_of_sample_error = mean_abs_error(with_parameters(out, params, f.out_of_sample_values));
    folds.push_back(std::move(f));
  }
  return folds;
}

}  // namespace dplan::planner
