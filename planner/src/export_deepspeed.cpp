// DeepSpeed (ds_config.json, launch-deepspeed.sh) and Accelerate (accelerate.yaml, a
// ds_config.json when it runs DeepSpeed, launch-accelerate.sh).
// DeepSpeed keys: docs/_pages/config-json.md and deepspeed/runtime/constants.py at 38327e07f6.
// Accelerate keys: examples/config_yaml_templates/*.yaml, tests/test_configs/
// latest_fsdp.yaml and examples/torch_native_parallelism/configs at 16cb6eb80d.
#include <sstream>

#include "dplan/costmodel/memory.h"
#include "dplan/planner/quoting.h"
#include "export_engines.h"

namespace dplan::planner::detail {
using namespace costmodel;

nlohmann::ordered_json deepspeed_config(const Plan& plan) {
  const TrainingSpec& t = plan.training;
  const ParallelConfig& p = plan.parallel;
  nlohmann::ordered_json c;
  // train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x data
  // parallel size (_batch_assertion; with AutoTP or a PipelineModule the data-parallel size is the
  // world over tp x pp).
  c["train_batch_size"] = t.global_batch;
  c["train_micro_batch_size_per_gpu"] = p.micro_batch;
  c["gradient_accumulation_steps"] = plan.num_microbatches;
  // Code default 0 (no clipping), docs 1.0: written (dplan-worker clips at 1.0 too).
  c["gradient_clipping"] = 1.0;
  if (t.precision == Precision::bf16) c["bf16"] = {{"enabled", true}};
  if (t.precision == Precision::fp16) c["fp16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  const int stage = std::max(p.zero_stage, p.distributed_optimizer ? 1 : 0);
  nlohmann::ordered_json zero = {{"stage", stage}};
  if (stage > 0) {
    zero["overlap_comm"] = plan.overlap.grad_reduce;
    // Bucket sizes count elements: the plan's bucket bytes over the gradient's element size.
    const double grad_bytes = gradients_in_fp32(t) ? 4 : 2;
    zero["reduce_bucket_size"] = static_cast<long long>(t.bucket_bytes / grad_bytes);
    if (stage >= 2) zero["contiguous_gradients"] = true;
    if (p.offload_optimizer) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  }
  c["zero_optimization"] = zero;
  // AutoTP training (TPTrainingConfig): the tensor-parallel degree.
  if (p.tp > 1) c["tensor_parallel"] = {{"autotp_size", p.tp}};
  // Recompute itself is the model code's (deepspeed.checkpointing.checkpoint around each layer,
  // or the attention core for selective); these keys configure it.
  if (p.recompute != Recompute::none)
    c["activation_checkpointing"] = {{"partition_activations", false},
                                     {"contiguous_memory_optimization", false},
                                     {"cpu_checkpointing", false}};
  return c;
}

namespace {

std::vector<std::string> deepspeed_notes(const Plan& plan) {
  const ParallelConfig& p = plan.parallel;
  std::vector<std::string> notes = {
      "the model, data and optimizer are the training script's: it calls deepspeed.initialize(args=..., model=..., "
      "config=args.deepspeed_config)"};
  if (p.pp > 1)
    notes.push_back("pipeline parallel is set in the model code: deepspeed.pipe.PipelineModule(layers=..., num_stages=" +
                    std::to_string(p.pp) + ", partition_method=\"uniform\")");
  if (p.recompute == Recompute::full)
    notes.push_back("recompute full: wrap each transformer layer in deepspeed.checkpointing.checkpoint");
  if (p.recompute == Recompute::selective)
    notes.push_back("recompute selective: wrap the attention core (softmax(QK^T)V) in deepspeed.checkpointing.checkpoint");
  if (plan.training.fp32_grads)
    notes.push_back("fp32 gradients: DeepSpeed's bf16 optimizer accumulates gradients in fp32 by default");
  return notes;
}

}  // namespace

Exported export_deepspeed(const ExportInput& in) {
  const LaunchShape s = launch_shape(in.plan);
  std::ostringstream sh;
  sh << script_preamble(in);
  sh << ": \"${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training script (it calls deepspeed.initialize)}\"\n";
  sh << "# The deepspeed launcher starts --num_gpus processes per node; several nodes need a hostfile.\n"
        "launcher=(--num_nodes " << s.nodes << " --num_gpus " << s.per_node << " --master_port \"${MASTER_PORT:-29500}\")\n"
        "if [[ -n ${HOSTFILE:-} ]]; then launcher+=(--hostfile \"$HOSTFILE\"); fi\n"
        "if [[ -n ${MASTER_ADDR:-} ]]; then launcher+=(--master_addr \"$MASTER_ADDR\"); fi\n";
  sh << "exec deepspeed \"${launcher[@]}\" \"$TRAIN_SCRIPT\" --deepspeed --deepspeed_config \"$here/ds_config.json\" \"$@\"\n";

  Exported e;
  e.files.push_back({"ds_config.json", deepspeed_config(in.plan).dump(2) + "\n", false});
  const std::string launch = descriptor(in.engine).launch_file;
  e.files.push_back({launch, sh.str(), true});
  e.launch_line = std::string(s.nodes > 1 ? "HOSTFILE=<hostfile> " : "") + "TRAIN_SCRIPT=train.py ./" + launch + " [script args]";
  e.files.push_back(readme(in, e.files, e.launch_line, deepspeed_notes(in.plan),
                           s.nodes > 1 ? "run (on the first node; the deepspeed launcher starts the others from the hostfile):"
                                       : ""));
  return e;
}

namespace {

// Which backend says the plan (docs/export.md): DeepSpeed for ZeRO-1 / the distributed optimizer
// and for optimizer offload (FSDP2 offloads parameters too), FSDP2 for ZeRO-2/3, DDP otherwise.
struct AccelerateBackend {
  bool deepspeed = false;
  bool fsdp = false;
};

AccelerateBackend accelerate_backend(const ParallelConfig& p) {
  AccelerateBackend b;
  b.deepspeed = p.offload_optimizer || p.zero_stage == 1 || p.distributed_optimizer;
  b.fsdp = !b.deepspeed && p.zero_stage >= 2;
  return b;
}

// accelerate.yaml's mixed_precision, a YAML scalar.
std::string accelerate_precision(const TrainingSpec& t) {
  // Quoted by yaml_string: YAML 1.1 (PyYAML, which accelerate's config loader uses) reads a bare
  // no as False, and accelerate launch then fails on False.lower() (accelerate/utils/launch.py
  // prepare_multi_gpu_env); accelerate's own templates and `accelerate config` write 'no'.
  std::string precision = "no";
  if (t.precision == Precision::bf16) precision = "bf16";
  if (t.precision == Precision::fp16) precision = "fp16";
  return yaml_string(precision);
}

std::string accelerate_yaml(const ExportInput& in, AccelerateBackend backend) {
  const ParallelConfig& p = in.plan.parallel;
  const LaunchShape s = launch_shape(in.plan);
  const bool deepspeed = backend.deepspeed, fsdp = backend.fsdp;
  std::ostringstream y;
  y << header(in, "# ");
  y << "compute_environment: LOCAL_MACHINE\n";
  std::string type = s.world == 1 ? "NO" : s.gpus ? "MULTI_GPU" : "MULTI_CPU";
  if (deepspeed) type = "DEEPSPEED";
  if (fsdp) type = "FSDP";
  y << "distributed_type: " << type << "\n";
  // With DeepSpeed the precision is ds_config.json's alone: accelerate refuses mixed_precision
  // from the config file beside a deepspeed_config_file (accelerate 1.15.0
  // accelerate/utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks; launch_command adds it
  // to the DeepSpeed fields whenever the YAML sets it).
  if (!deepspeed) y << "mixed_precision: " << accelerate_precision(in.plan.training) << "\n";
  y << "num_machines: " << s.nodes << "\n";
  y << "num_processes: " << s.world << "\n";
  y << "machine_rank: 0\n";
  y << "rdzv_backend: static\n";
  y << "same_network: true\n";
  y << "main_training_function: main\n";
  y << "use_cpu: " << (s.gpus ? "false" : "true") << "\n";
  if (deepspeed) {
    y << "deepspeed_config:\n"
         "  deepspeed_config_file: ds_config.json\n"
         "  deepspeed_multinode_launcher: standard\n"
         "  zero3_init_flag: false\n";
  }
  if (fsdp) {
    y << "fsdp_config:\n"
         "  fsdp_version: 2\n"
      << "  fsdp_reshard_after_forward: " << (p.zero_stage == 3 ? "true" : "false") << "\n"
      << "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
         "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
         "  fsdp_offload_params: false\n"
      << "  fsdp_activation_checkpointing: " << (p.recompute == Recompute::full ? "true" : "false") << "\n";
  }
  if (!deepspeed && (p.tp > 1 || p.cp > 1)) {
    // ND parallel (examples/torch_native_parallelism/configs): the sizes multiply to num_processes.
    y << "parallelism_config:\n"
      << "  parallelism_config_dp_replicate_size: " << (fsdp ? 1 : p.dp) << "\n"
      << "  parallelism_config_dp_shard_size: " << (fsdp ? p.dp : 1) << "\n"
      << "  parallelism_config_tp_size: " << p.tp << "\n"
      << "  parallelism_config_cp_size: " << p.cp << "\n";
  }
  return y.str();
}

std::string accelerate_script(const ExportInput& in, AccelerateBackend backend) {
  const LaunchShape s = launch_shape(in.plan);
  const bool deepspeed = backend.deepspeed;
  std::ostringstream sh;
  sh << script_preamble(in);
  sh << ": \"${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training script (it builds an Accelerator)}\"\n";
  if (!deepspeed)
    sh << "# Accelerator() reads its gradient accumulation from here: global batch / (micro-batch x data parallel).\n"
          "export ACCELERATE_GRADIENT_ACCUMULATION_STEPS="
       << in.plan.num_microbatches << "\n";
  sh << "launch=(--config_file \"$here/accelerate.yaml\"";
  if (deepspeed) sh << " --deepspeed_config_file \"$here/ds_config.json\"";
  sh << ")\n";
  if (s.nodes > 1)
    sh << "launch+=(--machine_rank \"${NODE_RANK:?set NODE_RANK to the index of this node}\" --main_process_ip "
          "\"${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}\" --main_process_port \"${MASTER_PORT:-29500}\")\n";
  sh << "exec accelerate launch \"${launch[@]}\" \"$TRAIN_SCRIPT\" \"$@\"\n";
  return sh.str();
}

std::vector<std::string> accelerate_notes(const Plan& plan, AccelerateBackend backend) {
  const ParallelConfig& p = plan.parallel;
  const bool deepspeed = backend.deepspeed, fsdp = backend.fsdp;
  std::vector<std::string> notes = {
      "the model, data and optimizer are the training script's; its micro-batch is " + std::to_string(p.micro_batch) +
      " sequences of " + std::to_string(plan.training.seq_len) + " tokens per process"};
  if (!fsdp && p.recompute != Recompute::none)
    notes.push_back(std::string("recompute ") + to_string(p.recompute) +
                    ": the model code's (e.g. model.gradient_checkpointing_enable() for full)");
  if (p.tp > 1 && !deepspeed) notes.push_back("tensor parallel follows the model's tp_plan (load it with tp_plan=\"auto\")");
  return notes;
}

}  // namespace

Exported export_accelerate(const ExportInput& in) {
  const Plan& plan = in.plan;
  const LaunchShape s = launch_shape(plan);
  const AccelerateBackend backend = accelerate_backend(plan.parallel);
  Exported e;
  e.files.push_back({"accelerate.yaml", accelerate_yaml(in, backend), false});
  if (backend.deepspeed) e.files.push_back({"ds_config.json", deepspeed_config(plan).dump(2) + "\n", false});
  const std::string launch = descriptor(in.engine).launch_file;
  e.files.push_back({launch, accelerate_script(in, backend), true});
  e.launch_line = std::string(s.nodes > 1 ? "NODE_RANK=<i> MASTER_ADDR=<first node> " : "") +
                  "TRAIN_SCRIPT=train.py ./" + launch + " [script args]";
  e.files.push_back(readme(in, e.files, e.launch_line, accelerate_notes(plan, backend)));
  return e;
}

}  // namespace dplan::planner::detail
