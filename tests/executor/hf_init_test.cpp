// dplan run --init-from, without transformers: a checkpoint in Hugging Face's names and layouts made
// from the executor's own initial weights (--save-reference, mapped back by to_hf_tensors: the
// fused QKV split into q, k and v, GPT-2's Conv1D transposed) starts a run whose losses are the
// seeded run's, on one rank and across tp and pp; a checkpoint that does not fit the plan's model
// is one line naming the tensor, before any rank starts. tests/reference/hf_parity.py holds the
// same runs against transformers' own models.
#include <fstream>

#include <torch/torch.h>

#include "dplan/costmodel/plan_file.h"
#include "harness.h"
#include "hf_checkpoint.h"
#include "hf_load.h"
#include "safetensors.h"

namespace dplan::testing::executor {
namespace {
using dplan::executor::NamedTensors;

// The executor's parameters (a --save-reference file) under the checkpoint names of `model`'s
// family, by the inverse of the loader's mapping (hf_load.h to_hf_tensors).
NamedTensors as_hf_checkpoint(const std::string& reference, const costmodel::ModelSpec& model, const std::string& prefix) {
  NamedTensors own = dplan::executor::parse_safetensors(read_file(reference));
  const std::map<std::string, at::Tensor> by_name(own.begin(), own.end());
  const dplan::executor::HfCheckpoint mapping{dplan::executor::hf_parameters(model, prefix), {}};
  NamedTensors out;
  for (auto& [name, t] : dplan::executor::to_hf_tensors(mapping, by_name, /*gradients=*/false)) out.emplace_back(name, t);
  return out;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string write_checkpoint(const TempDir& dir, const std::string& name, const NamedTensors& tensors) {
  const std::string path = (dir.path() / name).string();
  dplan::executor::write_safetensors(path, tensors);
  return path;
}

// `dplan run plan --init-from ckpt` refused: one line, exit 2, no run.json.
std::string refused(const std::string& plan, const std::string& checkpoint, const TempDir& dir) {
  const std::string out = (dir.path() / "refused.run.json").string();
  Result r = run_program(DPLAN_BINARY, {"run", plan, "--init-from", checkpoint, "--steps", "1", "--quiet", "-o", out});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(!fs::exists(out));
  const std::string line = require_one_error_line(r);
  CHECK(line.find("rank") == std::string::npos);  // dplan's own check, before any rank started
  return line;
}
}  // namespace

TEST_CASE("init from a checkpoint of the run's own initial weights in Hugging Face's names gives the seeded run's losses",
          "[executor][init-from]") {
  // Each family's mapping back and forth: Nemotron's scale minus one, GPT-NeoX's per-head QKV,
  // gpt-oss's stacked and interleaved experts, Qwen2-MoE's dense layer and shared expert, DeepSeek's
  // latent attention with its interleaved rotary rows, and DeepSeek-V3's MTP module numbered after
  // the layers (with the copies of the embedding and the head DeepSeek's checkpoints hold, left).
  std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {kLlamaTiny, {}}, {std::string(DPLAN_PROFILES_DIR) + "/models/gpt-tiny.json", {}}};
  for (const char* tiny : {"nemotron-tiny", "gpt-neox-tiny", "gpt-oss-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny",
                           "deepseek-v2-tiny"})
    models.push_back({std::string(DPLAN_VALIDATION_DIR) + "/executor/" + tiny + "/config.json", {}});
  models.push_back({models[6].first, {"--mtp-layers", "1"}});
  for (const auto& [model, flags] : models) {
    INFO(model);
    TempDir dir;
    const std::string plan = write_plan(dir, model, Layout{}, 8, flags);
    const std::string reference = (dir.path() / "reference.safetensors").string();
    const json seeded = run_plan(plan, {"--save-reference", reference}, 3);
    const costmodel::ModelSpec spec = costmodel::read_plan(plan).model;
    const std::string prefix = spec.family == "gpt2" ? "transformer." : spec.family == "gpt_neox" ? "gpt_neox." : "model.";
    NamedTensors hf = as_hf_checkpoint(reference, spec, prefix);
    if (spec.mtp_layers > 0) {
      const std::map<std::string, at::Tensor> by_name(hf.begin(), hf.end());
      const std::string mtp = prefix + "layers." + std::to_string(spec.num_layers) + ".";
      hf.emplace_back(mtp + "embed_tokens.weight", by_name.at(prefix + "embed_tokens.weight"));
      hf.emplace_back(mtp + "shared_head.head.weight", by_name.at("lm_head.weight"));
    }
    const std::string ckpt = write_checkpoint(dir, "model.safetensors", hf);

    // The same weights, so the same run: one rank exactly, tp 2 x pp 2 within the parity tolerance.
    const json one = run_plan_to(plan, (dir.path() / "one.run.json").string(), 3, {"--init-from", ckpt});
    CHECK(losses(one) == losses(seeded));
    Layout split;
    split.tp = split.pp = 2;
    require_parity(run_plan(write_plan(dir, model, split, 8, flags), {"--init-from", dir.path().string()}, 3), losses(seeded),
                   spec.family + " --init-from at " + split.describe());
  }
}

TEST_CASE("init from a checkpoint: one that does not fit the plan's model is one line naming the tensor, before any rank starts",
          "[executor][init-from][error]") {
  TempDir dir;
  const std::string plan = write_plan(dir, kLlamaTiny, Layout{}, 8);
  const std::string reference = (dir.path() / "reference.safetensors").string();
  run_plan(plan, {"--save-reference", reference}, 1);
  const costmodel::ModelSpec spec = costmodel::read_plan(plan).model;
  const NamedTensors good = as_hf_checkpoint(reference, spec, "model.");
  auto edited = [&](const std::string& name, auto&& edit) {
    NamedTensors t = good;
    edit(t);
    return write_checkpoint(dir, name, t);
  };
  const std::string k_proj = "model.layers.1.self_attn.k_proj.weight";
  auto find = [](NamedTensors& t, const std::string& name) {
    return std::find_if(t.begin(), t.end(), [&](const auto& x) { return x.first == name; });
  };

  const std::string missing = edited("missing.safetensors", [&](NamedTensors& t) { t.erase(find(t, k_proj)); });
  CHECK(refused(plan, missing, dir) == "dplan: error: " + missing + ": no tensor " + k_proj +
                                           ", which the plan's llama model needs for layers.1.attn.qkv.weight");
  const std::string reshaped =
      edited("reshaped.safetensors", [&](NamedTensors& t) { find(t, k_proj)->second = at::zeros({64, 32}); });
  CHECK(refused(plan, reshaped, dir) ==
        "dplan: error: " + reshaped + ": " + k_proj + " is [64, 32], the plan's model has [32, 64]");
  const std::string extra = edited("extra.safetensors", [&](NamedTensors& t) {
    t.emplace_back("model.layers.4.mlp.up_proj.weight", at::zeros({160, 64}));
  });
  CHECK(refused(plan, extra, dir) == "dplan: error: " + extra +
                                         ": model.layers.4.mlp.up_proj.weight [160, 64] has no place in the plan's model "
                                         "(4 layers of llama); a checkpoint of another model?");
  const std::string ints = edited("ints.safetensors", [&](NamedTensors& t) {
    find(t, k_proj)->second = find(t, k_proj)->second.to(at::kInt);
  });
  CHECK(refused(plan, ints, dir) == "dplan: error: " + ints + ": " + k_proj + " is I32; valid: F32, BF16, F16, F64");
  const std::string nowhere = (dir.path() / "absent").string();
  CHECK(refused(plan, nowhere, dir) == "dplan: error: " + nowhere + ": no such file or folder");
  CHECK(refused(plan, dir.path().string(), dir) ==
        "dplan: error: " + dir.path().string() + ": holds neither model.safetensors nor model.safetensors.index.json");
  const std::string junk = (dir.path() / "junk.safetensors").string();
  write_file(junk, "not a checkpoint");
  CHECK_THAT(refused(plan, junk, dir), Catch::Matchers::StartsWith("dplan: error: " + junk + ": not a safetensors checkpoint ("));

  // A sharded checkpoint: the index's shards are read from its own folder only.
  TempDir sharded;
  NamedTensors first(good.begin(), good.begin() + good.size() / 2), second(good.begin() + good.size() / 2, good.end());
  write_checkpoint(sharded, "model-00001-of-00002.safetensors", first);
  write_checkpoint(sharded, "model-00002-of-00002.safetensors", second);
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [name, _] : first) index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (const auto& [name, _] : second) index["weight_map"][name] = "model-00002-of-00002.safetensors";
  write_file((sharded.path() / "model.safetensors.index.json").string(), index.dump());
  run_plan_to(plan, (dir.path() / "sharded.run.json").string(), 1, {"--init-from", sharded.path().string()});
  index["weight_map"][k_proj] = "../model.safetensors";
  const std::string outside = (sharded.path() / "outside.index.json").string();
  write_file(outside, index.dump());
  CHECK(refused(plan, outside, dir) ==
        "dplan: error: " + outside + ": /weight_map/" + k_proj + ": expected a file name in the index's folder");
}

}  // namespace dplan::testing::executor
