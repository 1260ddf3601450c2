// The one table of engines (engines.h): everything dplan knows of each engine, or the function
// that knows it. The versions are those docs/export.md and engine_logs.h cite; each engine's
// spellings and rules cite its code at that version where they are written.
#include "dplan/planner/engines.h"

#include <cstring>
#include <utility>

#include "dplan/costmodel/errors.h"
#include "engine_parts.h"
#include "export_engines.h"

namespace dplan::planner {
namespace {

using namespace detail;

// Megatron-LM megatron/training/training.py training_log (tag core_v0.15.0; the same fields at
// HEAD d98e8a64dd), memory from megatron/training/utils.py report_memory.
constexpr LogReader kMegatronLog{
    .step_line = "iteration line",
    .step_line_source = "megatron/training/training.py training_log",
    .log_file = "megatron/training/training.py",
    .format_as_of = "{version}",
    .step_time = StepTime::logged,
    .peak_memory_what = "max allocated",
    .cpu_memory_not_comparable = nullptr,
    .signature = megatron_signature,
    .read = read_megatron_log,
};

// torchtitan/components/metrics.py MetricsProcessor.log (tags v0.2.2 and HEAD b5bcd76c66).
constexpr LogReader kTorchtitanLog{
    .step_line = "step line",
    .step_line_source = "torchtitan/components/metrics.py",
    .log_file = "torchtitan/components/metrics.py",
    .format_as_of = "{version} and HEAD",
    .step_time = StepTime::from_tokens_per_s_per_gpu,
    .peak_memory_what = "max reserved",
    .cpu_memory_not_comparable = nullptr,
    .signature = torchtitan_signature,
    .read = read_torchtitan_log,
};

// deepspeed/utils/timer.py ThroughputTimer.stop (tag v0.19.5; unchanged at HEAD edaa722126). On
// CPU its memory is the process's resident memory (deepspeed/accelerator/cpu_accelerator.py, psutil).
constexpr LogReader kDeepSpeedLog{
    .step_line = "ThroughputTimer line",
    .step_line_source = "deepspeed/utils/timer.py",
    .log_file = "deepspeed/utils/timer.py",
    .format_as_of = "v0.19.5",
    .step_time = StepTime::from_global_samples_per_s,
    .peak_memory_what = "max allocated",
    .cpu_memory_not_comparable =
        "DeepSpeed's MaxMemAllocated on CPU is the process's resident memory, not the tensors the plan predicts",
    .signature = deepspeed_signature,
    .read = read_deepspeed_log,
};

constexpr EngineDescriptor kEngines[] = {
    {.id = Engine::megatron,
     .display_name = "Megatron-LM",
     .version = "core_v0.15.0",
     .head_version = nullptr,
     .spellings = "Megatron-LM {version} (megatron/training/arguments.py)",
     .launch_file = "launch-megatron.sh",
     .runs_dplan_worker = false,
     .export_files = export_megatron,
     .rules = megatron_rules,
     .log = &kMegatronLog},
    {.id = Engine::torchtitan,
     .display_name = "torchtitan",
     .version = "v0.2.2",
     .head_version = "0.3.0",
     .spellings = "torchtitan {version} (torchtitan/config/job_config.py; torchtitan {head} (HEAD) CLI overrides in "
                  "torchtitan.overrides)",
     .launch_file = "launch-torchtitan.sh",
     .runs_dplan_worker = false,
     .export_files = export_torchtitan,
     .rules = torchtitan_rules,
     .log = &kTorchtitanLog},
    {.id = Engine::deepspeed,
     .display_name = "DeepSpeed",
     .version = "38327e07f6",
     .head_version = nullptr,
     .spellings = "DeepSpeed config JSON as of DeepSpeed {version} (docs/_pages/config-json.md)",
     .launch_file = "launch-deepspeed.sh",
     .runs_dplan_worker = false,
     .export_files = export_deepspeed,
     .rules = deepspeed_rules,
     .log = &kDeepSpeedLog},
    {.id = Engine::accelerate,
     .display_name = "Accelerate",
     .version = "16cb6eb80d",
     .head_version = nullptr,
     .spellings = "Accelerate config YAML as of accelerate {version} (accelerate launch --config_file)",
     .launch_file = "launch-accelerate.sh",
     .runs_dplan_worker = false,
     .export_files = export_accelerate,
     .rules = accelerate_rules,
     .log = nullptr},
    {.id = Engine::torchrun,
     .display_name = "torchrun",
     .version = "1.13 and 2.x",
     .head_version = nullptr,
     .spellings = "torchrun of PyTorch {version} (torch/distributed/run.py; underscore spellings, accepted by both)",
     .launch_file = "launch-torchrun.sh",
     .runs_dplan_worker = true,
     .export_files = export_torchrun,
     .rules = dplan_worker_rules,
     .log = nullptr},
    {.id = Engine::slurm,
     .display_name = "Slurm",
     .version = "sbatch/srun",
     .head_version = nullptr,
     .spellings = "Slurm {version} (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)",
     .launch_file = "dplan.sbatch",
     .runs_dplan_worker = true,
     .export_files = export_slurm,
     .rules = dplan_worker_rules,
     .log = nullptr},
};

constexpr bool ids_are_indices() {
  for (size_t i = 0; i < std::size(kEngines); ++i)
    if (static_cast<size_t>(kEngines[i].id) != i) return false;
  return true;
}
static_assert(ids_are_indices(), "kEngines lists the engines in the order of enum Engine");

}  // namespace

std::span<const EngineDescriptor> engines() { return kEngines; }

const EngineDescriptor& descriptor(Engine engine) {
  const size_t i = static_cast<size_t>(engine);
  DPLAN_CHECK(i < std::size(kEngines));
  return kEngines[i];
}


std::string with_versions(const std::string& text, const EngineDescriptor& d) {
  std::string out = text;
  for (const auto& [key, value] : {std::pair<std::string, const char*>{"{version}", d.version}, {"{head}", d.head_version}}) {
    if (!value) continue;
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + std::strlen(value)))
      out.replace(at, key.size(), value);
  }
  return out;
}

std::string engine_version(Engine engine) {
  const EngineDescriptor& d = descriptor(engine);
  return with_versions(d.spellings, d);
}

}  // namespace dplan::planner
