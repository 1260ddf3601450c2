// torchtitan: torchtitan.toml (the job config of v0.2.2, the last TOML release:
// torchtitan/config/job_config.py), torchtitan.overrides (the same settings as `--section.key
// value` command-line overrides, which HEAD still accepts after its move to Python configs:
// torchtitan/config/README.md) and launch-torchtitan.sh. One list of settings feeds both files.
#include <cmath>
#include <sstream>

#include "dplan/costmodel/memory.h"
#include "dplan/planner/quoting.h"
#include "export_engines.h"

namespace dplan::planner::detail {
using namespace costmodel;

namespace {

// The PyPI release of a version tag: "v0.2.2" -> "0.2.2".
std::string release(const std::string& tag) { return tag.rfind('v', 0) == 0 ? tag.substr(1) : tag; }

// The Float8 linear converter's registered name (v0.2.2 torchtitan/components/quantization/float8.py).
constexpr const char* kFloat8 = "quantize.linear.float8";

struct Setting {
  std::string section, key;
  std::string value;   // as the command line gives it
  bool quoted = false; // a TOML string (toml_string), else a number or a boolean as written
};

// torchtitan v0.2.2's llama3 flavors (torchtitan/models/llama3/__init__.py llama3_args), matched
// by shape (dim, layers, heads, kv heads and the FFN width their multiplier and multiple_of give).
struct Flavor {
  const char* name;
  int dim, layers, heads, kv_heads, ffn;
};
constexpr Flavor kLlama3Flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 768},  // multiple_of 256 rounds int(2 * 4 * 256 / 3) = 682 up to 768
    {"8B", 4096, 32, 32, 8, 14336},
    {"70B", 8192, 80, 64, 8, 28672},
    {"405B", 16384, 126, 128, 8, 53248},
};

std::string llama3_flavor(const ModelSpec& m) {
  for (const Flavor& f : kLlama3Flavors)
    if (m.hidden_size == f.dim && m.num_layers == f.layers && m.num_heads == f.heads && m.num_kv_heads == f.kv_heads &&
        m.ffn_hidden_size == f.ffn && m.head_dim * m.num_heads == m.hidden_size)
      return f.name;
  return "";
}

// torchtitan 0.3.0's config function (torchtitan/models/llama3/config_registry.py) for a v0.2.2
// flavor, "" when it ships none (fp8: only the debug model has a Float8 one).
std::string llama3_config_function(const std::string& flavor, bool fp8) {
  if (flavor == "debugmodel") return fp8 ? "llama3_debugmodel_float8" : "llama3_debugmodel";
  if (fp8) return "";
  if (flavor == "8B") return "llama3_8b";
  if (flavor == "70B") return "llama3_70b";
  if (flavor == "405B") return "llama3_405b";
  return "";
}

// The llama3 TransformerModelArgs that give this shape, for a flavor the user registers:
// torchtitan's FeedForward takes hidden = int(2 * 4 * dim / 3), int(multiplier * hidden), rounded
// up to multiple_of; multiple_of = the FFN width and a multiplier at most 1 land on it exactly.
std::string llama3_model_args(const ModelSpec& m) {
  const long long base = static_cast<long long>(2.0 * 4 * m.hidden_size / 3);
  std::ostringstream o;
  o << "TransformerModelArgs(dim=" << m.hidden_size << ", n_layers=" << m.num_layers << ", n_heads=" << m.num_heads
    << ", n_kv_heads=" << m.num_kv_heads << ", vocab_size=" << m.vocab_size << ", multiple_of=" << m.ffn_hidden_size;
  if (base > m.ffn_hidden_size) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", double(m.ffn_hidden_size) / double(base));
    o << ", ffn_dim_multiplier=" << buf;
  }
  o << ", max_seq_len=" << m.max_seq_len << ")";
  return o.str();
}

std::vector<Setting> torchtitan_settings(const Plan& plan, const std::string& flavor) {
  const TrainingSpec& t = plan.training;
  const ParallelConfig& p = plan.parallel;
  std::vector<Setting> s;
  auto add = [&s](const char* section, const char* key, const std::string& value, bool quoted = false) {
    s.push_back({section, key, value, quoted});
  };
  auto num = [](long long x) { return std::to_string(x); };
  add("job", "description", "dplan plan for " + plan.model.name, true);
  add("model", "name", "llama3", true);
  add("model", "flavor", flavor, true);
  // Batch: with pp the whole per-rank batch goes through the pipeline as micro-batches of
  // pipeline_parallel_microbatch_size; without it torchtitan accumulates gradients over
  // global / (local x dp) steps of local_batch_size (torchtitan/train.py).
  const int dp = p.dp;
  add("training", "local_batch_size", num(p.pp > 1 ? t.global_batch / dp : p.micro_batch));
  add("training", "global_batch_size", num(t.global_batch));
  add("training", "seq_len", num(t.seq_len));
  add("training", "max_norm", "1.0");
  const bool fp32 = t.precision == Precision::fp32;
  add("training", "mixed_precision_param", fp32 ? "float32" : "bfloat16", true);
  // v0.2.2 job_config.py: mixed_precision_reduce: Literal["float32"]; FSDP2 reduces (and keeps
  // the sharded gradients) in fp32 whatever the plan's gradient dtype (README.export says so).
  add("training", "mixed_precision_reduce", "float32", true);
  // Data parallel: FSDP (dp_shard) for ZeRO-2/3, DDP (dp_replicate) otherwise.
  const bool sharded = p.zero_stage >= 2;
  add("parallelism", "data_parallel_replicate_degree", num(sharded ? 1 : p.dp));
  add("parallelism", "data_parallel_shard_degree", num(sharded ? p.dp : 1));
  if (sharded) add("parallelism", "fsdp_reshard_after_forward", p.zero_stage == 3 ? "always" : "never", true);
  add("parallelism", "tensor_parallel_degree", num(p.tp));
  add("parallelism", "context_parallel_degree", num(p.cp));
  add("parallelism", "pipeline_parallel_degree", num(p.pp));
  if (p.pp > 1) {
    const char* schedule = p.vpp > 1 ? "Interleaved1F1B" : p.schedule == Schedule::gpipe ? "GPipe" : "1F1B";
    add("parallelism", "pipeline_parallel_schedule", schedule, true);
    add("parallelism", "pipeline_parallel_microbatch_size", num(p.micro_batch));
    // ceil((layers + first_less + last_less) / layers_per_stage) virtual stages: the embedding and
    // the loss count as a layer each exactly where the plan accounts them.
    const int slots = plan.model.num_layers + p.account_for_embedding + p.account_for_loss;
    add("parallelism", "pipeline_parallel_layers_per_stage", num(slots / (p.pp * p.vpp)));
    add("parallelism", "pipeline_parallel_first_stage_less_layers", num(p.account_for_embedding ? 1 : 0));
    add("parallelism", "pipeline_parallel_last_stage_less_layers", num(p.account_for_loss ? 1 : 0));
  }
  if (plan.model.is_moe()) {
    add("parallelism", "expert_parallel_degree", num(p.ep));
    add("parallelism", "expert_tensor_parallel_degree", num(p.expert_tp()));
  }
  switch (p.recompute) {
    case Recompute::none: add("activation_checkpoint", "mode", "none", true); break;
    case Recompute::selective:
      add("activation_checkpoint", "mode", "selective", true);
      add("activation_checkpoint", "selective_ac_option", "op", true);
      break;
    case Recompute::full: add("activation_checkpoint", "mode", "full", true); break;
  }
  return s;
}

}  // namespace

Exported export_torchtitan(const ExportInput& in) {
  const EngineDescriptor& engine = descriptor(in.engine);
  const Plan& plan = in.plan;
  const LaunchShape shape = launch_shape(plan);
  const std::string known = llama3_flavor(plan.model);
  const std::string flavor = known.empty() ? "dplan" : known;
  const std::vector<Setting> settings = torchtitan_settings(plan, flavor);

  std::ostringstream toml;
  toml << header(in, "# ");
  if (known.empty())
    toml << "# The model is no llama3 flavor torchtitan ships: register it as \"dplan\" in\n"
            "# torchtitan/models/llama3/__init__.py llama3_args:\n#   "
         << llama3_model_args(plan.model) << "\n";
  if (plan.training.precision == Precision::fp8) toml << "# fp8: the float8 converter (torchtitan's Float8 training).\n";
  std::string section;
  for (const Setting& s : settings) {
    if (s.section != section) {
      toml << (section.empty() ? "" : "\n") << "[" << s.section << "]\n";
      section = s.section;
      if (section == "model" && plan.training.precision == Precision::fp8) toml << "converters = [" << toml_string(kFloat8) << "]\n";
    }
    toml << s.key << " = " << (s.quoted ? toml_string(s.value) : s.value) << "\n";
  }

  // torchtitan.overrides: torchtitan 0.3.0 (HEAD) spellings. torchtitan/config/manager.py
  // ConfigManager.parse_args: --module and --config pick a config function of the model's
  // config_registry.py (the model and its converters are in it: Trainer.Config.model_spec is not a
  // command-line option); tyro then reads `--section.key value` overrides. The activation
  // checkpointing kind is a tyro subcommand (distributed/activation_checkpoint.py), which must
  // come last: tyro refuses options after it. No --model.* and no selective_ac_option (0.3.0 has
  // neither); mixed_precision_reduce is float32 (the one choice, config/configs.py).
  const std::string config_function = llama3_config_function(known, plan.training.precision == Precision::fp8);
  std::ostringstream overrides;
  overrides << header(in, "# ");
  overrides << "# spellings of this file: torchtitan " << engine.head_version
            << " (HEAD; torchtitan/config/manager.py), command-line overrides:\n"
               "#   torchrun ... -m torchtitan.train $(grep -v '^#' torchtitan.overrides)\n"
               "# The last line (the activation-checkpoint subcommand) must stay last: put other overrides before it.\n";
  if (config_function.empty()) {
    overrides << "# No config function torchtitan " << engine.head_version << " ships gives this model"
              << (plan.training.precision == Precision::fp8 ? " with the Float8 converter" : "")
              << ": register one in torchtitan/models/llama3/config_registry.py\n"
              << "# (a llama3 flavor of this shape; " << engine.version << " spelling: "
              << llama3_model_args(plan.model) << ")\n"
              << "# and give it here as --module llama3 --config <its name>.\n";
  } else {
    overrides << "--module llama3\n--config " << config_function << "\n";
  }
  for (const Setting& s : settings) {
    if (s.section == "job" || s.section == "model" || s.section == "activation_checkpoint") continue;
    // 0.3.0 has no expert tensor parallel degree (ParallelismConfig); the model rules refuse MoE
    // models for torchtitan altogether, so no plan reaches here with experts.
    if (s.key == "expert_tensor_parallel_degree") continue;
    overrides << "--" << s.section << "." << s.key << " " << s.value << "\n";
  }
  // trainer.py _validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet. Set
  // --training.disable_cuda_graphs." (a bare flag, config/configs.py).
  if (plan.parallel.pp > 1) overrides << "--training.disable_cuda_graphs\n";
  overrides << "activation-checkpoint:" << to_string(plan.parallel.recompute) << "\n";

  std::ostringstream sh;
  sh << script_preamble(in);
  sh << "# torchtitan installed in this python (pip install torchtitan==" << release(engine.version)
     << "); its train entry point reads the TOML.\n";
  sh << "exec " << torchrun_command(shape) << " -m torchtitan.train --job.config_file \"$here/torchtitan.toml\" \"$@\"\n";

  Exported e;
  e.files.push_back({"torchtitan.toml", toml.str(), false});
  e.files.push_back({"torchtitan.overrides", overrides.str(), false});
  e.files.push_back({engine.launch_file, sh.str(), true});
  e.launch_line = std::string(shape.nodes > 1 ? "MASTER_ADDR=<first node> " : "") + "./" + engine.launch_file +
                  " [--training.steps N --training.dataset ... --model.hf_assets_path ...]";
  std::vector<std::string> notes = {
      "dataset, tokenizer (model.hf_assets_path) and steps are not in the plan: pass them as overrides",
      "torchtitan " + std::string(engine.head_version) + " (HEAD): torchrun ... -m torchtitan.train $(grep -v '^#' torchtitan.overrides), its "
      "--module/--config lines picking the model" + std::string(config_function.empty() ? " (register one: see its header)" : ""),
      "torchtitan's llama3 has no rotary-base key in the TOML: the flavor's rope_theta applies"};
  if (!gradients_in_fp32(plan.training))
    notes.push_back("gradients: torchtitan " + std::string(engine.version) +
                    " reduces them in float32 (mixed_precision_reduce accepts only "
                    "\"float32\"), where the plan counted 16-bit gradients");
  if (known.empty()) notes.push_back("register the flavor \"dplan\": " + llama3_model_args(plan.model));
  e.files.push_back(readme(in, e.files, e.launch_line, notes));
  return e;
}

}  // namespace dplan::planner::detail
