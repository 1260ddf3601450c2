// dplan export and dplan check, in process: each engine rule fires on a plan that breaks it and
// not on one that keeps it; the exported files carry the plan's layout in each engine's spellings
// (tp, pp, vpp, cp, ep, ZeRO 1/2/3, recompute, offload); what an engine cannot express is refused.
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engine_rules.h"
#include "dplan/planner/export.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;
using dplan::testing::store;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;

namespace {

Plan plan_of(const std::string& model, TrainingSpec t, ParallelConfig p, const std::string& cluster = "dgx-h100") {
  return make_plan(store().load_model(model), store().load_cluster(cluster), t, p, OverlapOptions{}, MemoryEstimate{},
                   TimeBreakdown{});
}

std::vector<std::string> failures(const Plan& plan, Engine engine) { return check_engine_rules(plan, engine).failures; }

// The failures that contain `text`.
std::vector<std::string> matching(const Plan& plan, Engine engine, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& f : failures(plan, engine))
    if (f.find(text) != std::string::npos) out.push_back(f);
  return out;
}

// The rule named by `text` fails on `bad` (once, as a line that starts with the engine's name)
// and not on `good`.
void require_rule(Engine engine, const Plan& good, const Plan& bad, const std::string& text) {
  CAPTURE(to_string(engine), text, failures(good, engine), failures(bad, engine));
  CHECK(matching(good, engine, text).empty());
  const std::vector<std::string> hit = matching(bad, engine, text);
  REQUIRE(hit.size() == 1);
  CHECK(hit.front().rfind(std::string(to_string(engine)) + ": ", 0) == 0);
  CHECK(hit.front().find('\n') == std::string::npos);
}

const ExportFile& file(const Exported& e, const std::string& name) {
  for (const ExportFile& f : e.files)
    if (f.name == name) return f;
  FAIL("no file " << name);
  return e.files.front();
}

Exported exported(const Plan& plan, Engine engine) {
  return export_plan(plan, engine, to_json(plan).dump(1), "plan.json");
}

// megatron.args as flag -> value ("" for a switch); each flag once.
std::map<std::string, std::string> megatron_args(const Exported& e) {
  std::map<std::string, std::string> args;
  std::istringstream in(file(e, "megatron.args").content);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    const std::string flag = line.substr(0, space);
    CHECK(args.count(flag) == 0);
    args[flag] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return args;
}

// The `key = value` lines of a TOML (section-qualified) or YAML (indentation ignored) file.
std::map<std::string, std::string> keyed_lines(const std::string& text, const std::string& separator) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2) + ".";
      continue;
    }
    const size_t at = line.find(separator);
    if (at == std::string::npos) continue;
    std::string key = line.substr(0, at);
    key.erase(0, key.find_first_not_of(' '));
    out[section + key] = line.substr(at + separator.size());
  }
  return out;
}

const TrainingSpec k8k64{.seq_len = 8192, .global_batch = 64};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Engines by name

TEST_CASE("engine names read back and an unknown one is no engine", "[export]") {
  for (const std::string& name : engine_names()) {
    REQUIRE(engine_from_string(name));
    CHECK(to_string(*engine_from_string(name)) == name);
    CHECK(!engine_version(*engine_from_string(name)).empty());
  }
  CHECK(engine_names().size() == 6);
  CHECK(!engine_from_string("megatron-lm"));
  CHECK(!engine_from_string(""));
}

// ---------------------------------------------------------------------------------------------
// Megatron-LM core_v0.15.0 (validate_args and the configs it builds)

TEST_CASE("megatron rules: the global batch is a multiple of micro-batch x data parallel", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 96}, {.dp = 8, .micro_batch = 2});
  const Plan bad = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 100}, {.dp = 8, .micro_batch = 2});
  require_rule(Engine::megatron, good, bad, "global batch");
  CHECK(matching(bad, Engine::megatron, "global batch").front() ==
        "megatron: num_microbatches_calculator.py: global batch 100 is not a multiple of micro-batch 2 x data "
        "parallel 8 (= 16); use --global-batch 96 or 112");
  CHECK(failures(good, Engine::megatron).empty());
}

TEST_CASE("megatron rules: world = tp x pp x cp x dp and the expert world", "[export][rules]") {
  const Plan good =
      plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.tp = 2, .dp = 4, .ep = 4, .etp = 1, .sequence_parallel = true});
  Plan bad = good;
  bad.parallel.dp = 3;  // 8 ranks listed, 2 x 3 in the layout
  require_rule(Engine::megatron, good, bad, "world size 8 is not tp 2");
  Plan bad_experts = good;
  bad_experts.parallel.ep = 3;
  require_rule(Engine::megatron, good, bad_experts, "expert data parallel = world / (etp x ep x pp)");
  require_rule(Engine::megatron, good, bad_experts, "experts 8 are not divisible by ep 3");
}

TEST_CASE("megatron rules: layers per pipeline stage as the flags say them", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", k8k64, {.pp = 4, .dp = 2});
  const Plan bad = plan_of("llama-3-8b", k8k64, {.pp = 3, .dp = 2, .micro_batch = 1});  // 32 layers: 10, 11, 11
  require_rule(Engine::megatron, good, bad, "cannot express the pipeline split [10,11,11]");
  // An uneven split Megatron has flags for: first and last stage counts.
  const Plan uneven = plan_of("llama-3-8b", k8k64, {.pp = 4, .dp = 2, .first_stage_layers = 5, .last_stage_layers = 5});
  CHECK(failures(uneven, Engine::megatron).empty());
  const auto args = megatron_args(exported(uneven, Engine::megatron));
  CHECK(args.at("--decoder-first-pipeline-num-layers") == "5");
  CHECK(args.at("--decoder-last-pipeline-num-layers") == "5");
  // An explicit list with equal middle stages reads as first/last counts.
  Plan listed = uneven;
  listed.parallel.first_stage_layers = listed.parallel.last_stage_layers = 0;
  listed.parallel.layers_per_stage = {5, 11, 11, 5};
  const MegatronSplit split = megatron_split_flags(listed);
  CHECK(split.problem.empty());
  CHECK(split.first_stage_layers == 5);
  CHECK(split.last_stage_layers == 5);
  listed.parallel.layers_per_stage = {5, 10, 12, 5};
  for (auto& s : listed.stages) s.num_layers = 0;
  listed.stages[0].num_layers = 5, listed.stages[1].num_layers = 10, listed.stages[2].num_layers = 12,
  listed.stages[3].num_layers = 5;
  CHECK_THAT(megatron_split_flags(listed).problem, Contains("[5,10,12,5]"));
  // Accounting for the embedding and the loss: the flags carry over.
  const Plan accounted =
      plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .account_for_embedding = true, .account_for_loss = true});
  CHECK(failures(accounted, Engine::megatron).empty());
  const auto acc = megatron_args(exported(accounted, Engine::megatron));
  CHECK(acc.count("--account-for-embedding-in-pipeline-split") == 1);
  CHECK(acc.count("--account-for-loss-in-pipeline-split") == 1);
}

TEST_CASE("megatron rules: the interleaved schedule's layers and micro-batches and pp / no gpipe", "[export][rules]") {
  const ParallelConfig interleaved{.tp = 2, .pp = 2, .dp = 2, .vpp = 2, .sequence_parallel = true,
                                   .schedule = Schedule::interleaved};
  const Plan good = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16}, interleaved);
  Plan odd_microbatches = good;  // (make_plan itself requires whole groups of pp micro-batches)
  odd_microbatches.training.global_batch = 6;
  odd_microbatches.num_microbatches = 3;
  require_rule(Engine::megatron, good, odd_microbatches, "to be a multiple of pp 2");
  Plan vpp3 = good;
  vpp3.parallel.vpp = 3;  // 16 layers per stage
  require_rule(Engine::megatron, good, vpp3, "not a multiple of vpp 3");
  Plan pp1 = good;
  pp1.parallel.pp = 1;
  require_rule(Engine::megatron, good, pp1, "needs pp > 1");
  const Plan gpipe = plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .schedule = Schedule::gpipe});
  require_rule(Engine::megatron, plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4}), gpipe, "cannot express the gpipe schedule");
}

TEST_CASE("megatron rules: sequence against 2 x cp / heads and query groups against tp", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 8}, {.dp = 4, .cp = 2});
  const Plan bad = plan_of("llama-3-8b", {.seq_len = 8194, .global_batch = 8}, {.dp = 4, .cp = 2});
  require_rule(Engine::megatron, good, bad, "is not a multiple of 2 x cp 2");
  const Plan tp8 = plan_of("llama-3-8b", k8k64, {.tp = 8});
  const Plan tp3 = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 63}, {.tp = 3, .dp = 3});
  require_rule(Engine::megatron, tp8, tp3, "attention heads 32 are not divisible by tp 3");
  const Plan tp16 = plan_of("llama-3-8b", k8k64, {.tp = 16});  // 32 heads, 8 query groups
  require_rule(Engine::megatron, tp8, tp16, "key/value heads 8 are not divisible by tp 16");
}

TEST_CASE("megatron rules: expert parallel with fp16 or tp without sp / optimizer offload without the distributed optimizer", "[export][rules]") {
  const TrainingSpec fp16{.seq_len = 4096, .global_batch = 64, .precision = Precision::fp16};
  const Plan good = plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.dp = 8, .ep = 2});
  const Plan bad = plan_of("mixtral-8x7b", fp16, {.dp = 8, .ep = 2});
  require_rule(Engine::megatron, good, bad, "does not run with fp16");
  require_rule(Engine::megatron, plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.tp = 2, .dp = 4, .ep = 2, .sequence_parallel = true}),
               plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.tp = 2, .dp = 4, .ep = 2}),
               "expert parallel (ep 2) with tp 2 needs sequence parallel");
  const Plan offload_zero1 = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 1, .offload_optimizer = true});
  const Plan offload_zero0 = plan_of("llama-3-8b", k8k64, {.dp = 8, .offload_optimizer = true});
  require_rule(Engine::megatron, offload_zero1, offload_zero0, "--optimizer-cpu-offload needs the distributed optimizer");
}

TEST_CASE("megatron refuses model features its flags cannot say", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", k8k64, {.dp = 8});
  Plan geglu = good;
  geglu.model.activation = "gelu";  // gated GELU: no core_v0.15.0 flag
  require_rule(Engine::megatron, good, geglu, "cannot express a gated MLP with the gelu activation");
  Plan some_bias = good;
  some_bias.model.out_bias = true;
  require_rule(Engine::megatron, good, some_bias, "biases on some linear layers only");
  const Plan mla = plan_of("deepseek-v3", {.seq_len = 4096, .global_batch = 1024}, {.dp = 1024, .ep = 8});
  CHECK(!matching(mla, Engine::megatron, "multi-head latent attention").empty());
  CHECK_THROWS_AS(exported(mla, Engine::megatron), InputError);
}

TEST_CASE("every engine: the ranks fill whole nodes", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 48}, {.dp = 16});
  const Plan bad = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 48}, {.dp = 12});  // 8 per node
  for (const std::string& name : engine_names()) require_rule(*engine_from_string(name), good, bad, "do not fill whole nodes of 8");
  const LaunchShape s = launch_shape(good);
  CHECK(s.nodes == 2);
  CHECK(s.per_node == 8);
  CHECK(s.gpus);
  const LaunchShape small = launch_shape(plan_of("gpt-tiny", {.seq_len = 128, .global_batch = 8}, {.dp = 2}, "local-cpu"));
  CHECK(small.nodes == 1);
  CHECK(small.per_node == 2);
  CHECK(!small.gpus);
}

// ---------------------------------------------------------------------------------------------
// torchtitan v0.2.2

TEST_CASE("torchtitan rules: its llama3 model / the sharding it can say / sequence parallel with tp", "[export][rules]") {
  const ParallelConfig fsdp{.tp = 2, .dp = 4, .zero_stage = 3, .sequence_parallel = true};
  const Plan good = plan_of("llama-3-8b", k8k64, fsdp);
  CHECK(failures(good, Engine::torchtitan).empty());
  const Plan gpt = plan_of("gpt-tiny", {.seq_len = 128, .global_batch = 8}, {.dp = 8});
  CHECK(!matching(gpt, Engine::torchtitan, "cannot express the model gpt-tiny").empty());
  require_rule(Engine::torchtitan, good, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 1, .sequence_parallel = true}),
               "cannot express ZeRO-1");
  require_rule(Engine::torchtitan, good, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .sequence_parallel = true}),
               "cannot express plain data parallel (DDP) beside tp");
  require_rule(Engine::torchtitan, plan_of("llama-3-8b", k8k64, {.dp = 4, .cp = 2, .zero_stage = 2}),
               plan_of("llama-3-8b", k8k64, {.cp = 8}), "shards parameters over the context-parallel ranks");
  require_rule(Engine::torchtitan, good,
               plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3, .sequence_parallel = true, .offload_optimizer = true}),
               "optimizer-only offload");
  require_rule(Engine::torchtitan, good, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3}),
               "always shards activations along the sequence");
  require_rule(Engine::torchtitan, good,
               plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64, .precision = Precision::fp16}, fsdp),
               "cannot express fp16 training");
}

TEST_CASE("torchtitan rules: sequence divisors / heads / expert degrees / the pipeline split", "[export][rules]") {
  const ParallelConfig fsdp{.tp = 2, .dp = 4, .zero_stage = 3, .sequence_parallel = true};
  const Plan good = plan_of("llama-3-8b", k8k64, fsdp);
  require_rule(Engine::torchtitan, good, plan_of("llama-3-8b", {.seq_len = 8191, .global_batch = 64}, fsdp),
               "is not a multiple of tp 2");
  const ParallelConfig cp{.tp = 2, .dp = 2, .cp = 2, .zero_stage = 3, .sequence_parallel = true};
  require_rule(Engine::torchtitan, plan_of("llama-3-8b", k8k64, cp),
               plan_of("llama-3-8b", {.seq_len = 8196, .global_batch = 64}, cp), "tp x 2 x cp = 8");
  require_rule(Engine::torchtitan, good,
               plan_of("llama-3-8b", {.seq_len = 8190, .global_batch = 64}, {.tp = 16, .zero_stage = 3, .sequence_parallel = true}),
               "key/value heads 8 are not divisible by tp 16");
  // Expert degrees (parallel_dims.py), on an MoE plan (the model itself is refused separately).
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const Plan etp_tp = plan_of("mixtral-8x7b", t, {.tp = 2, .dp = 4, .ep = 4, .zero_stage = 3, .sequence_parallel = true});
  const Plan etp_other = plan_of("mixtral-8x7b", t, {.tp = 4, .dp = 2, .ep = 2, .etp = 2, .zero_stage = 3, .sequence_parallel = true});
  require_rule(Engine::torchtitan, etp_tp, etp_other, "is neither 1 nor tp 4");
  const Plan ep_over_cp = plan_of("mixtral-8x7b", t, {.tp = 2, .dp = 2, .cp = 2, .ep = 2, .zero_stage = 3, .sequence_parallel = true});
  const Plan ep_not_cp = plan_of("mixtral-8x7b", t, {.tp = 1, .dp = 2, .cp = 4, .ep = 2, .zero_stage = 3});
  require_rule(Engine::torchtitan, ep_over_cp, ep_not_cp, "must be a multiple of cp 4");
  // One layer count for every virtual stage.
  const ParallelConfig pp3{.tp = 2, .pp = 3, .dp = 2, .zero_stage = 3, .sequence_parallel = true};
  require_rule(Engine::torchtitan, plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 48}, {.tp = 2, .pp = 2, .dp = 2, .zero_stage = 3, .sequence_parallel = true}),
               plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 48}, pp3), "cannot express this pipeline split");
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed and Accelerate

TEST_CASE("deepspeed rules: the batch assertion / what its config cannot say / ZeRO with pipeline or AutoTP", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 2});
  CHECK(failures(good, Engine::deepspeed).empty());
  require_rule(Engine::deepspeed, good, plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 60}, {.dp = 8, .zero_stage = 2}),
               "_batch_assertion: global batch 60");
  require_rule(Engine::deepspeed, good, plan_of("llama-3-8b", k8k64, {.dp = 4, .cp = 2, .zero_stage = 2}),
               "cannot express context parallel (cp 2)");
  require_rule(Engine::deepspeed, good,
               plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64, .precision = Precision::fp8}, {.dp = 8, .zero_stage = 2}),
               "cannot express fp8 training");
  require_rule(Engine::deepspeed, plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 1, .offload_optimizer = true}),
               plan_of("llama-3-8b", k8k64, {.dp = 8, .offload_optimizer = true}), "offload_optimizer needs ZeRO stage 1, 2 or 3");
  require_rule(Engine::deepspeed, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 1}),
               plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 1, .sequence_parallel = true}),
               "Megatron-style sequence parallel");
  require_rule(Engine::deepspeed, plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.dp = 8, .zero_stage = 1}),
               plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.dp = 8, .ep = 2, .zero_stage = 1}),
               "cannot express expert parallel (ep 2)");
  const Plan pipe = plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .zero_stage = 1});
  CHECK(failures(pipe, Engine::deepspeed).empty());
  require_rule(Engine::deepspeed, pipe, plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .zero_stage = 2}),
               "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
  require_rule(Engine::deepspeed, pipe,
               plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64},
                       {.pp = 2, .dp = 4, .vpp = 2, .zero_stage = 1, .schedule = Schedule::interleaved}),
               "cannot express the interleaved schedule");
  require_rule(Engine::deepspeed, pipe, plan_of("llama-3-8b", k8k64, {.tp = 2, .pp = 2, .dp = 2, .zero_stage = 1}),
               "cannot express tp with pp");
  require_rule(Engine::deepspeed, pipe, plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 60}, {.pp = 3, .dp = 2, .zero_stage = 1}),
               "uneven pipeline split");
  require_rule(Engine::deepspeed, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 2}),
               plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3}), "AutoTP");
}

TEST_CASE("accelerate rules: no pipeline or experts / DeepSpeed without tp / cp and selective recompute with FSDP2", "[export][rules]") {
  const Plan good = plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3});
  CHECK(failures(good, Engine::accelerate).empty());
  require_rule(Engine::accelerate, good, plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .zero_stage = 3}),
               "cannot express pipeline parallel (pp 2)");
  require_rule(Engine::accelerate, plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.dp = 8, .zero_stage = 3}),
               plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64}, {.dp = 8, .ep = 2, .zero_stage = 3}),
               "cannot express expert parallel (ep 2)");
  require_rule(Engine::accelerate, good, plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3, .sequence_parallel = true}),
               "Megatron-style sequence parallel");
  require_rule(Engine::accelerate, good,
               plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64, .precision = Precision::fp8}, {.tp = 2, .dp = 4, .zero_stage = 3}),
               "fp8 backend");
  require_rule(Engine::accelerate, plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 1}),
               plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 1}), "cannot express tp 2 with DeepSpeed");
  require_rule(Engine::accelerate, plan_of("llama-3-8b", k8k64, {.dp = 4, .cp = 2, .zero_stage = 2}),
               plan_of("llama-3-8b", k8k64, {.dp = 4, .cp = 2}), "context parallel with FSDP2 only");
  require_rule(Engine::accelerate, plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 3, .recompute = Recompute::full}),
               plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 3, .recompute = Recompute::selective}),
               "selective recompute with FSDP2");
  require_rule(Engine::accelerate, good, plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 66}, {.tp = 2, .dp = 4, .zero_stage = 3}),
               "global batch 66");
}

TEST_CASE("torchrun and slurm rules: dplan-worker's own support", "[export][rules]") {
  const Plan good = plan_of("gpt-tiny", {.seq_len = 128, .global_batch = 8}, {.tp = 2, .dp = 2}, "local-cpu");
  // DeepSeek-V3 with its MTP module runs; MTP modules beside learned positions do not.
  const Plan v3 = plan_of("deepseek-v3", {.seq_len = 4096, .global_batch = 1024}, {.dp = 1024, .ep = 8});
  REQUIRE(v3.model.mtp_layers > 0);
  Plan learned = good;
  learned.model.mtp_layers = 1;
  for (Engine e : {Engine::torchrun, Engine::slurm}) {
    CHECK(failures(good, e).empty());
    CHECK(failures(v3, e).empty());
    require_rule(e, good, learned, "dplan-worker: the executor does not run multi-token prediction with learned positions");
  }
}

// ---------------------------------------------------------------------------------------------
// The files

TEST_CASE("megatron export: tp x pp x vpp with ZeRO-1 and full recompute in core_v0.15.0 flags", "[export][files]") {
  const Plan plan = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16},
                            {.tp = 2, .pp = 2, .dp = 2, .vpp = 2, .zero_stage = 1, .sequence_parallel = true,
                             .recompute = Recompute::full, .schedule = Schedule::interleaved});
  const Exported e = exported(plan, Engine::megatron);
  const auto a = megatron_args(e);
  CHECK(a.at("--num-layers") == "32");
  CHECK(a.at("--hidden-size") == "4096");
  CHECK(a.at("--ffn-hidden-size") == "14336");
  CHECK(a.at("--num-attention-heads") == "32");
  CHECK(a.count("--group-query-attention") == 1);
  CHECK(a.at("--num-query-groups") == "8");
  CHECK(a.at("--kv-channels") == "128");
  CHECK(a.at("--seq-length") == "8192");
  CHECK(a.at("--position-embedding-type") == "rope");
  CHECK(a.at("--normalization") == "RMSNorm");
  CHECK(a.count("--swiglu") == 1);
  CHECK(a.count("--untie-embeddings-and-output-weights") == 1);
  CHECK(a.count("--disable-bias-linear") == 1);
  CHECK(a.at("--vocab-size") == "128256");
  CHECK(a.at("--tensor-model-parallel-size") == "2");
  CHECK(a.at("--pipeline-model-parallel-size") == "2");
  CHECK(a.at("--num-layers-per-virtual-pipeline-stage") == "8");
  CHECK(a.count("--sequence-parallel") == 1);
  CHECK(a.count("--context-parallel-size") == 0);
  CHECK(a.at("--micro-batch-size") == "1");
  CHECK(a.at("--global-batch-size") == "16");
  CHECK(a.count("--bf16") == 1);
  CHECK(a.count("--use-distributed-optimizer") == 1);
  CHECK(a.count("--use-megatron-fsdp") == 0);
  CHECK(a.count("--overlap-grad-reduce") == 1);
  CHECK(a.count("--overlap-param-gather") == 1);
  CHECK(a.at("--recompute-granularity") == "full");
  CHECK(a.at("--recompute-method") == "uniform");
  CHECK(a.at("--recompute-num-layers") == "1");
  CHECK(a.count("--num-experts") == 0);
  CHECK(a.count("--no-gradient-accumulation-fusion") == 0);
  Plan unfused = plan;
  unfused.training.gradient_accumulation_fusion = false;
  CHECK(megatron_args(exported(unfused, Engine::megatron)).count("--no-gradient-accumulation-fusion") == 1);
  // Megatron's own fp32 gradients, as the plan's memory counted them, unless the plan says bf16.
  CHECK(a.count("--grad-reduce-in-bf16") == 0);
  Plan bf16_grads = plan;
  bf16_grads.training.grad_reduce_in_bf16 = true;
  CHECK(megatron_args(exported(bf16_grads, Engine::megatron)).count("--grad-reduce-in-bf16") == 1);
  // bf16 Adam moments: Megatron's precision-aware optimizer, which needs the distributed optimizer.
  Plan moments = plan;
  moments.training.bf16_adam_moments = true;
  const auto m = megatron_args(exported(moments, Engine::megatron));
  CHECK(m.count("--use-precision-aware-optimizer") == 1);
  CHECK(m.at("--exp-avg-dtype") == "bf16");
  CHECK(m.at("--exp-avg-sq-dtype") == "bf16");
  CHECK(a.count("--use-precision-aware-optimizer") == 0);
  Plan plain = moments;
  plain.parallel.zero_stage = 0;
  plain.parallel.distributed_optimizer = false;
  Plan plain_fp32 = plain;
  plain_fp32.training.bf16_adam_moments = false;
  require_rule(Engine::megatron, plain_fp32, plain, "need the distributed optimizer");
  for (const Engine other : {Engine::torchtitan, Engine::deepspeed, Engine::accelerate, Engine::torchrun})
    CHECK_FALSE(matching(moments, other, "--bf16-adam-moments").empty());
  // Selective recompute's modules: Megatron's default (core_attn) goes unsaid; others are listed.
  Plan selective = plan;
  selective.parallel.recompute = Recompute::selective;
  CHECK(megatron_args(exported(selective, Engine::megatron)).count("--recompute-modules") == 0);
  Plan modules = selective;
  modules.training.recompute_modules = recompute_modules_from_string("mlp,layernorm,mla_up_proj,moe_act");
  const auto r = megatron_args(exported(modules, Engine::megatron));
  CHECK(r.at("--recompute-granularity") == "selective");
  CHECK(r.at("--recompute-modules") == "moe_act layernorm mla_up_proj mlp");
  CHECK(r.count("--recompute-method") == 0);
  for (const Engine other : {Engine::torchtitan, Engine::deepspeed, Engine::accelerate})
    CHECK_FALSE(matching(modules, other, "--recompute-modules").empty());
  // The fused cross-entropy and deferred embedding weight gradients: Megatron's flags, its rules.
  CHECK(a.count("--cross-entropy-loss-fusion") == 0);
  CHECK(a.count("--defer-embedding-wgrad-compute") == 0);
  Plan loss = plan;
  loss.training.cross_entropy_fusion = true;
  loss.training.embedding_wgrad_deferral = 3;
  REQUIRE(loss.parallel.pp > 1);
  const auto l = megatron_args(exported(loss, Engine::megatron));
  CHECK(l.count("--cross-entropy-loss-fusion") == 1);
  CHECK(l.count("--defer-embedding-wgrad-compute") == 1);
  CHECK(l.at("--wgrad-deferral-limit") == "3");
  Plan unfused_deferral = loss;
  unfused_deferral.training.gradient_accumulation_fusion = false;
  require_rule(Engine::megatron, loss, unfused_deferral, "without gradient-accumulation fusion");
  for (const Engine other : {Engine::torchtitan, Engine::deepspeed, Engine::accelerate})
    CHECK_FALSE(matching(loss, other, "--cross-entropy-fusion").empty());
  CHECK_FALSE(matching(loss, Engine::torchrun, "fused cross-entropy").empty());
  // Multi-token prediction: Megatron's --mtp-num-layers and --mtp-loss-scaling-factor; dplan-worker
  // trains it too, the other engines cannot.
  CHECK(a.count("--mtp-num-layers") == 0);
  CHECK(a.count("--mtp-loss-scaling-factor") == 0);
  Plan mtp = plan;
  mtp.model.mtp_layers = 2;
  mtp.model.mtp_loss_scale = 0.3;
  const auto mtp_args = megatron_args(exported(mtp, Engine::megatron));
  CHECK(mtp_args.at("--mtp-num-layers") == "2");
  CHECK(mtp_args.at("--mtp-loss-scaling-factor") == "0.3");
  for (const Engine other : {Engine::torchtitan, Engine::deepspeed, Engine::accelerate})
    CHECK_FALSE(matching(mtp, other, "--mtp-layers 0").empty());
  CHECK(matching(mtp, Engine::torchrun, "multi-token prediction").empty());
  const std::string& args_text = file(e, "megatron.args").content;
  CHECK(args_text.rfind("# dplan export --to megatron of plan.json", 0) == 0);
  CHECK_THAT(args_text, Contains("core_v0.15.0"));
  const ExportFile& sh = file(e, "launch-megatron.sh");
  CHECK(sh.executable);
  CHECK(sh.content.rfind("#!/usr/bin/env bash\n", 0) == 0);
  CHECK_THAT(sh.content, Contains("set -euo pipefail"));
  CHECK_THAT(sh.content, Contains("export CUDA_DEVICE_MAX_CONNECTIONS=1"));
  CHECK_THAT(sh.content, Contains("--nnodes 1 --nproc_per_node 8"));
  CHECK_THAT(sh.content, Contains("\"$MEGATRON_LM/pretrain_gpt.py\" \"${args[@]}\" \"$@\""));
  CHECK_THAT(sh.content, Contains("\"$here/megatron.args\""));
  CHECK_THAT(file(e, "README.export").content, Contains("core_v0.15.0"));
}

TEST_CASE("megatron export: cp with ZeRO-3 and selective recompute / ep with ZeRO-2 and offload", "[export][files]") {
  const Plan cp = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16},
                          {.dp = 4, .cp = 2, .zero_stage = 3, .recompute = Recompute::selective});
  const Exported e = exported(cp, Engine::megatron);
  const auto a = megatron_args(e);
  CHECK(a.at("--context-parallel-size") == "2");
  CHECK(a.count("--use-megatron-fsdp") == 1);
  CHECK(a.at("--data-parallel-sharding-strategy") == "optim_grads_params");
  CHECK(a.at("--ckpt-format") == "fsdp_dtensor");
  CHECK(a.at("--recompute-granularity") == "selective");
  CHECK(a.count("--recompute-method") == 0);  // validate_args: no method with selective
  CHECK(a.count("--sequence-parallel") == 0);  // tp 1: validate_args turns it off
  // Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1, whatever cp says.
  CHECK_THAT(file(e, "launch-megatron.sh").content, Contains("unset CUDA_DEVICE_MAX_CONNECTIONS"));
  CHECK(file(e, "launch-megatron.sh").content.find("CUDA_DEVICE_MAX_CONNECTIONS=1") == std::string::npos);
  const Plan cp_dist_opt = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16}, {.dp = 4, .cp = 2, .zero_stage = 1});
  CHECK_THAT(file(exported(cp_dist_opt, Engine::megatron), "launch-megatron.sh").content,
             Contains("export CUDA_DEVICE_MAX_CONNECTIONS=1"));

  const Plan moe = plan_of("mixtral-8x7b", {.seq_len = 4096, .global_batch = 64},
                           {.tp = 2, .dp = 4, .ep = 4, .etp = 1, .zero_stage = 2, .sequence_parallel = true,
                            .offload_optimizer = true});
  REQUIRE(failures(moe, Engine::megatron).empty());
  const auto m = megatron_args(exported(moe, Engine::megatron));
  CHECK(m.at("--num-experts") == "8");
  CHECK(m.at("--moe-router-topk") == "2");
  CHECK(m.at("--moe-ffn-hidden-size") == "14336");
  CHECK(m.at("--moe-token-dispatcher-type") == "alltoall");
  CHECK(m.at("--expert-model-parallel-size") == "4");
  CHECK(m.at("--expert-tensor-parallel-size") == "1");
  CHECK(m.at("--data-parallel-sharding-strategy") == "optim_grads");
  CHECK(m.count("--optimizer-cpu-offload") == 1);
  CHECK(m.count("--use-precision-aware-optimizer") == 1);
  CHECK(m.count("--use-distributed-optimizer") == 1);

  const Plan plain = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64}, {.dp = 8});
  const Exported pe = exported(plain, Engine::megatron);
  const auto p = megatron_args(pe);
  CHECK(p.count("--use-distributed-optimizer") == 0);
  CHECK(p.count("--overlap-param-gather") == 0);  // validate_args: no sharded optimizer to gather
  CHECK(p.count("--overlap-grad-reduce") == 1);
  CHECK(p.count("--recompute-granularity") == 0);
  CHECK(file(pe, "launch-megatron.sh").content.find("CUDA_DEVICE_MAX_CONNECTIONS") == std::string::npos);
}

TEST_CASE("megatron export: the DeepEP dispatcher and the EP overlap as core_v0.15.0 flags; the others refuse them",
          "[export][files][rules][moe]") {
  const TrainingSpec t{.seq_len = 4096, .global_batch = 64};
  const ParallelConfig layout{.dp = 8, .ep = 8, .etp = 1};
  ParallelConfig both = layout;
  both.moe_dispatcher = MoeDispatcher::deepep;
  both.overlap_ep_comm = true;
  const Plan plain = plan_of("mixtral-8x7b", t, layout), asked = plan_of("mixtral-8x7b", t, both);
  REQUIRE(failures(asked, Engine::megatron).empty());
  const auto a = megatron_args(exported(asked, Engine::megatron));
  CHECK(a.at("--moe-token-dispatcher-type") == "flex");
  CHECK(a.count("--moe-enable-deepep") == 1);
  CHECK(a.at("--moe-deepep-num-sms") == "20");  // the SMs the time model charges (kDeepepSms)
  CHECK(a.count("--overlap-moe-expert-parallel-comm") == 1);
  const auto p = megatron_args(exported(plain, Engine::megatron));
  CHECK(p.at("--moe-token-dispatcher-type") == "alltoall");
  CHECK(p.count("--moe-enable-deepep") == 0);
  CHECK(p.count("--moe-deepep-num-sms") == 0);
  CHECK(p.count("--overlap-moe-expert-parallel-comm") == 0);
  // The overlap alone keeps the alltoall dispatcher.
  ParallelConfig overlap_only = layout;
  overlap_only.overlap_ep_comm = true;
  const auto o = megatron_args(exported(plan_of("mixtral-8x7b", t, overlap_only), Engine::megatron));
  CHECK(o.at("--moe-token-dispatcher-type") == "alltoall");
  CHECK(o.count("--overlap-moe-expert-parallel-comm") == 1);
  // The other engines' files cannot say them; dplan-worker does not run them.
  for (Engine e : {Engine::torchtitan, Engine::deepspeed, Engine::accelerate}) {
    require_rule(e, plain, asked, "cannot express the DeepEP dispatcher");
    require_rule(e, plain, asked, "cannot express the EP overlap");
  }
  require_rule(Engine::torchrun, plain, asked, "drop --overlap-ep-comm and use --moe-dispatcher alltoall");
  CHECK_THROWS_WITH(exported(asked, Engine::torchtitan), Contains("cannot express the DeepEP dispatcher"));
}

TEST_CASE("torchtitan export: degrees and schedule and batch and checkpointing in the TOML and the overrides", "[export][files]") {
  const Plan plan = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16},
                            {.tp = 2, .pp = 2, .dp = 2, .vpp = 2, .zero_stage = 3, .sequence_parallel = true,
                             .recompute = Recompute::full, .schedule = Schedule::interleaved});
  REQUIRE(failures(plan, Engine::torchtitan).empty());
  const Exported e = exported(plan, Engine::torchtitan);
  const auto t = keyed_lines(file(e, "torchtitan.toml").content, " = ");
  CHECK(t.at("model.name") == "\"llama3\"");
  CHECK(t.at("model.flavor") == "\"8B\"");
  CHECK(t.at("parallelism.tensor_parallel_degree") == "2");
  CHECK(t.at("parallelism.pipeline_parallel_degree") == "2");
  CHECK(t.at("parallelism.data_parallel_shard_degree") == "2");
  CHECK(t.at("parallelism.data_parallel_replicate_degree") == "1");
  CHECK(t.at("parallelism.context_parallel_degree") == "1");
  CHECK(t.at("parallelism.fsdp_reshard_after_forward") == "\"always\"");
  CHECK(t.at("parallelism.pipeline_parallel_schedule") == "\"Interleaved1F1B\"");
  CHECK(t.at("parallelism.pipeline_parallel_layers_per_stage") == "8");
  CHECK(t.at("parallelism.pipeline_parallel_first_stage_less_layers") == "0");
  CHECK(t.at("parallelism.pipeline_parallel_microbatch_size") == "1");
  CHECK(t.at("training.local_batch_size") == "8");  // global 16 / dp 2, in micro-batches of 1
  CHECK(t.at("training.global_batch_size") == "16");
  CHECK(t.at("training.seq_len") == "8192");
  CHECK(t.at("activation_checkpoint.mode") == "\"full\"");
  const auto o = keyed_lines(file(e, "torchtitan.overrides").content, " ");
  CHECK(o.at("--parallelism.tensor_parallel_degree") == "2");
  CHECK(o.at("--parallelism.pipeline_parallel_schedule") == "Interleaved1F1B");
  CHECK(o.at("--training.local_batch_size") == "8");
  // torchtitan 0.3.0 spellings: the model from --module/--config, no --model.* keys, the AC kind
  // as the last word, CUDA graphs off with pp, no selective_ac_option / expert tp, reduce float32.
  const std::string& ov = file(e, "torchtitan.overrides").content;
  CHECK_THAT(ov, Contains("torchtitan 0.3.0"));
  CHECK(o.at("--module") == "llama3");
  CHECK(o.at("--config") == "llama3_8b");
  CHECK(ov.find("--model.") == std::string::npos);
  CHECK(ov.find("--activation_checkpoint") == std::string::npos);
  CHECK(ov.find("selective_ac_option") == std::string::npos);
  CHECK(ov.find("expert_tensor_parallel_degree") == std::string::npos);
  CHECK(o.at("--training.mixed_precision_reduce") == "float32");
  CHECK_THAT(ov, Contains("\n--training.disable_cuda_graphs\n"));
  CHECK_THAT(ov, EndsWith("\nactivation-checkpoint:full\n"));
  CHECK_THAT(file(e, "torchtitan.toml").content, Contains("v0.2.2"));
  CHECK_THAT(file(e, "launch-torchtitan.sh").content, Contains("-m torchtitan.train --job.config_file \"$here/torchtitan.toml\""));

  const Plan cp = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 16},
                          {.dp = 2, .cp = 4, .zero_stage = 2, .recompute = Recompute::selective});
  REQUIRE(failures(cp, Engine::torchtitan).empty());
  const auto c = keyed_lines(file(exported(cp, Engine::torchtitan), "torchtitan.toml").content, " = ");
  CHECK(c.at("parallelism.context_parallel_degree") == "4");
  CHECK(c.at("parallelism.fsdp_reshard_after_forward") == "\"never\"");
  CHECK(c.at("training.local_batch_size") == "1");  // no pp: gradient accumulation over 8 steps
  CHECK(c.at("activation_checkpoint.mode") == "\"selective\"");
  CHECK(c.at("activation_checkpoint.selective_ac_option") == "\"op\"");
  CHECK(c.count("parallelism.pipeline_parallel_schedule") == 0);
  const Exported ce = exported(cp, Engine::torchtitan);
  const std::string& cov = file(ce, "torchtitan.overrides").content;
  CHECK(cov.find("disable_cuda_graphs") == std::string::npos);  // no pp
  CHECK_THAT(cov, EndsWith("\nactivation-checkpoint:selective\n"));
  CHECK(cov.find("selective_ac_option") == std::string::npos);

  // A shape torchtitan ships no config function for: the --module/--config line is the user's.
  const Plan tiny = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 3});
  Plan odd = tiny;
  odd.model.num_layers = 30;
  odd.model.name = "llama-30-layers";
  const auto oo = keyed_lines(file(exported(odd, Engine::torchtitan), "torchtitan.overrides").content, " ");
  CHECK(oo.count("--config") == 0);
  CHECK_THAT(file(exported(odd, Engine::torchtitan), "torchtitan.overrides").content,
             Contains("# and give it here as --module llama3 --config <its name>."));
  CHECK_THAT(file(exported(tiny, Engine::torchtitan), "torchtitan.overrides").content, EndsWith("\nactivation-checkpoint:none\n"));
}

TEST_CASE("deepspeed export: batch keys and ZeRO stage and offload and AutoTP", "[export][files]") {
  const Plan offload = plan_of("llama-3-8b", k8k64, {.dp = 8, .micro_batch = 2, .zero_stage = 2, .offload_optimizer = true});
  const Exported e = exported(offload, Engine::deepspeed);
  const nlohmann::json c = nlohmann::json::parse(file(e, "ds_config.json").content);
  CHECK(c.at("train_batch_size") == 64);
  CHECK(c.at("train_micro_batch_size_per_gpu") == 2);
  CHECK(c.at("gradient_accumulation_steps") == 4);
  CHECK(c.at("train_batch_size").get<int>() ==
        c.at("train_micro_batch_size_per_gpu").get<int>() * c.at("gradient_accumulation_steps").get<int>() * 8);
  CHECK(c.at("gradient_clipping") == 1.0);
  CHECK(c.at("bf16").at("enabled") == true);
  CHECK(c.at("zero_optimization").at("stage") == 2);
  CHECK(c.at("zero_optimization").at("offload_optimizer").at("device") == "cpu");
  CHECK(c.count("tensor_parallel") == 0);
  CHECK(c.count("_dplan") == 0);
  const std::string& sh = file(e, "launch-deepspeed.sh").content;
  CHECK_THAT(sh, Contains("--num_nodes 1 --num_gpus 8"));
  CHECK_THAT(sh, Contains("--deepspeed_config \"$here/ds_config.json\""));
  CHECK_THAT(file(e, "README.export").content, Contains("DeepSpeed config JSON"));

  const Plan tp = plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 2, .recompute = Recompute::full});
  const nlohmann::json t = nlohmann::json::parse(file(exported(tp, Engine::deepspeed), "ds_config.json").content);
  CHECK(t.at("zero_optimization").at("stage") == 2);
  CHECK(t.at("tensor_parallel").at("autotp_size") == 2);
  CHECK(t.at("gradient_accumulation_steps") == 16);  // 64 / (1 x dp 4)
  CHECK(t.count("activation_checkpointing") == 1);
  const Plan pipe = plan_of("llama-3-8b", k8k64, {.pp = 2, .dp = 4, .zero_stage = 1});
  const Exported pe = exported(pipe, Engine::deepspeed);
  CHECK(nlohmann::json::parse(file(pe, "ds_config.json").content).at("zero_optimization").at("stage") == 1);
  CHECK_THAT(file(pe, "README.export").content, Contains("num_stages=2"));
}

TEST_CASE("accelerate export: FSDP2 for ZeRO-3 and ZeRO-2 / DeepSpeed for ZeRO-1 / DDP for ZeRO-0", "[export][files]") {
  const Plan z3 = plan_of("llama-3-8b", k8k64, {.tp = 2, .dp = 4, .zero_stage = 3, .recompute = Recompute::full});
  const auto y3 = keyed_lines(file(exported(z3, Engine::accelerate), "accelerate.yaml").content, ": ");
  CHECK(y3.at("distributed_type") == "FSDP");
  CHECK(y3.at("fsdp_version") == "2");
  CHECK(y3.at("fsdp_reshard_after_forward") == "true");
  CHECK(y3.at("fsdp_activation_checkpointing") == "true");
  CHECK(y3.at("num_processes") == "8");
  CHECK(y3.at("num_machines") == "1");
  CHECK(y3.at("mixed_precision") == "'bf16'");
  CHECK(y3.at("parallelism_config_tp_size") == "2");
  CHECK(y3.at("parallelism_config_dp_shard_size") == "4");
  CHECK(y3.at("parallelism_config_dp_replicate_size") == "1");
  CHECK(y3.at("parallelism_config_cp_size") == "1");
  const Plan z2 = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 2});
  const Exported e2 = exported(z2, Engine::accelerate);
  const auto y2 = keyed_lines(file(e2, "accelerate.yaml").content, ": ");
  CHECK(y2.at("fsdp_reshard_after_forward") == "false");
  CHECK(y2.count("parallelism_config_tp_size") == 0);
  CHECK_THAT(file(e2, "launch-accelerate.sh").content, Contains("ACCELERATE_GRADIENT_ACCUMULATION_STEPS=8"));

  const Plan z1 = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 1, .offload_optimizer = true});
  const Exported e1 = exported(z1, Engine::accelerate);
  const auto y1 = keyed_lines(file(e1, "accelerate.yaml").content, ": ");
  CHECK(y1.at("distributed_type") == "DEEPSPEED");
  // accelerate refuses mixed_precision from the YAML beside a deepspeed_config_file: the JSON says it.
  CHECK(y1.count("mixed_precision") == 0);
  const nlohmann::json ds = nlohmann::json::parse(file(e1, "ds_config.json").content);
  CHECK(ds.at("zero_optimization").at("stage") == 1);
  CHECK(ds.at("zero_optimization").at("offload_optimizer").at("device") == "cpu");
  CHECK(ds.at("bf16").at("enabled") == true);
  CHECK(ds.count("fp16") == 0);
  for (const Precision precision : {Precision::fp16, Precision::fp32}) {
    CAPTURE(to_string(precision));
    const Plan other = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64, .precision = precision}, {.dp = 8, .zero_stage = 1});
    const Exported eo = exported(other, Engine::accelerate);
    CHECK(keyed_lines(file(eo, "accelerate.yaml").content, ": ").count("mixed_precision") == 0);
    const nlohmann::json dso = nlohmann::json::parse(file(eo, "ds_config.json").content);
    CHECK(dso.count("bf16") == 0);
    if (precision == Precision::fp16) CHECK(dso.at("fp16").at("enabled") == true);
    if (precision == Precision::fp32) CHECK(dso.count("fp16") == 0);
  }
  CHECK_THAT(file(e1, "launch-accelerate.sh").content, Contains("--deepspeed_config_file \"$here/ds_config.json\""));

  const Plan z0 = plan_of("gpt-tiny", {.seq_len = 128, .global_batch = 8}, {.dp = 4}, "local-cpu");
  const auto y0 = keyed_lines(file(exported(z0, Engine::accelerate), "accelerate.yaml").content, ": ");
  CHECK(y0.at("distributed_type") == "MULTI_CPU");
  CHECK(y0.at("use_cpu") == "true");
}

TEST_CASE("accelerate export: fp32 is mixed_precision 'no' quoted as YAML 1.1 needs", "[export][files]") {
  // PyYAML (accelerate's config loader) reads a bare no as False; accelerate launch then fails.
  const TrainingSpec fp32 = {.seq_len = 8192, .global_batch = 64, .precision = Precision::fp32};
  for (const Plan& plan : {plan_of("llama-3-8b", fp32, {.dp = 8}), plan_of("llama-3-8b", fp32, {.dp = 8, .zero_stage = 3})}) {
    const std::string yaml = file(exported(plan, Engine::accelerate), "accelerate.yaml").content;
    CAPTURE(yaml);
    CHECK(keyed_lines(yaml, ": ").at("mixed_precision") == "'no'");
    CHECK(yaml.find("mixed_precision: no") == std::string::npos);
  }
}

TEST_CASE("torchrun and slurm exports: a copy of the plan and the launch of dplan-worker", "[export][files]") {
  const Plan plan = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 64}, {.tp = 2, .pp = 2, .dp = 4});
  const std::string text = to_json(plan).dump(1);
  const Exported t = export_plan(plan, Engine::torchrun, text, "plan.json");
  CHECK(file(t, "plan.json").content == text);
  const ExportFile& sh = file(t, "launch-torchrun.sh");
  CHECK(sh.executable);
  CHECK_THAT(sh.content, Contains("torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "
                                  "\"${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}:${MASTER_PORT:-29400}\" "
                                  "--rdzv_id \"${RUN_ID:-dplan}\""));
  CHECK_THAT(sh.content, Contains("--no_python \"${DPLAN_WORKER:-dplan-worker}\" \"$here/plan.json\" -o \"${RUN_JSON:-run.json}\" \"$@\""));
  const Exported s = export_plan(plan, Engine::slurm, text, "plan.json");
  const std::string& sb = file(s, "dplan.sbatch").content;
  CHECK_THAT(sb, Contains("#SBATCH --nodes=2\n"));
  CHECK_THAT(sb, Contains("#SBATCH --ntasks-per-node=8\n"));
  CHECK_THAT(sb, Contains("#SBATCH --gpus-per-node=8\n"));
  CHECK_THAT(sb, Contains("scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1"));
  CHECK_THAT(sb, Contains("srun \"${DPLAN_WORKER:-dplan-worker}\" \"$here/plan.json\" -o \"${RUN_JSON:-run.json}\""));
  // CPU ranks: no GPUs asked for; one node of as many ranks as the plan has.
  const Plan cpu = plan_of("gpt-tiny", {.seq_len = 128, .global_batch = 8}, {.dp = 2}, "local-cpu");
  const std::string cb = file(export_plan(cpu, Engine::slurm, "{}", "plan.json"), "dplan.sbatch").content;
  CHECK_THAT(cb, Contains("#SBATCH --ntasks-per-node=2\n"));
  CHECK(cb.find("--gpus-per-node") == std::string::npos);
  CHECK_THAT(file(export_plan(cpu, Engine::torchrun, "{}", "plan.json"), "launch-torchrun.sh").content,
             Contains("\"${MASTER_ADDR:-127.0.0.1}:${MASTER_PORT:-29400}\""));
}

TEST_CASE("every file names the engine and version it speaks / every script is strict bash", "[export][files]") {
  const Plan plan = plan_of("llama-3-8b", k8k64, {.dp = 8, .zero_stage = 2});
  for (const std::string& name : engine_names()) {
    const Engine engine = *engine_from_string(name);
    CAPTURE(name);
    const Exported e = exported(plan, engine);
    CHECK(!e.launch_line.empty());
    bool has_readme = false;
    for (const ExportFile& f : e.files) {
      CAPTURE(f.name);
      has_readme = has_readme || f.name == "README.export";
      if (f.name == "plan.json" || f.name == "ds_config.json") continue;  // JSON: no comments
      CHECK_THAT(f.content, Contains(engine_version(engine)));
      if (f.executable) {
        CHECK(f.content.rfind("#!/usr/bin/env bash\n", 0) == 0);
        CHECK_THAT(f.content, Contains("set -euo pipefail"));
      }
    }
    CHECK(has_readme);
  }
}

TEST_CASE("export refuses a plan that breaks a rule and names each failure", "[export]") {
  const Plan bad = plan_of("llama-3-8b", {.seq_len = 8192, .global_batch = 100}, {.pp = 2, .dp = 4, .micro_batch = 2});
  try {
    exported(bad, Engine::accelerate);
    FAIL("no refusal");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("accelerate: cannot express pipeline parallel (pp 2)"));
    CHECK_THAT(what, Contains("accelerate: gradient accumulation steps: global batch 100"));
  }
}
