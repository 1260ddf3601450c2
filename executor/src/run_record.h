// run.json (docs/run-json.md): what each rank reports when training is over, and rank 0's
// assembly of every rank's report into the run record (costmodel/run_record.h owns the format and
// writes it).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/run_record.h"
#include "gpt.h"
#include "grad_sync.h"
#include "phase_clock.h"
#include "plan_file.h"

namespace dplan::executor {

// One optimizer step as this rank measured it.
struct StepRecord {
  double time_s = 0;     // this rank's wall time for the step: its phases' sum
  double loss = 0;       // the global batch's mean loss, the same on every rank
  double grad_norm = 0;  // the global gradient norm before clipping
  std::array<double, kNumPhases> phases_s{};
};

// High-water marks of this rank's tensor memory (docs/run-json.md, "memory").
struct MemoryPeaks {
  int64_t activations_bytes = 0;  // above what a step started with, buffers excluded; steps after the first
  int64_t buffers_bytes = 0;      // communication buffers; steps after the first
  int64_t peak_bytes = 0;         // everything, over the run
  int64_t host_peak_bytes = -1;   // offload: host memory under a HostScope, over the run (-1: not metered, CUDA)
  int64_t outside_allocator_bytes = -1;  // CUDA: device memory in use beyond the allocator's (MemoryMeter), at most over the steps
  int64_t reserved_peak_bytes = -1;  // CUDA: what the caching allocator reserved from the device, over the run (-1: CPU)
};

// What one rank reports to rank 0 when training is over: its steps (the phases as their median
// over the steps from `warmup_steps` on), the hash of its weights, and its memory by component.
// Under ZeRO-3 gather every unit first (GradSync::gather_all_units), so the hash covers them all.
json rank_report(int rank, int stage_index, const std::vector<StepRecord>& steps, int warmup_steps,
                 const MemoryPeaks& peaks, GptStage& stage, const GradSync& grads, torch::optim::Optimizer& optimizer);

// Rank 0: every rank's report (indexed by rank) into run.json, through costmodel's RunRecord and
// its writer; `config` becomes its "config".
// `first_step`: the optimizer steps done before this run's first (a resumed run's checkpoint step).
// `checkpoints`: the run's checkpoint settings, whose saves are filled in from each report's
// "checkpoint_saves" (the same saves, in order, on every rank).
json assemble_run(const ExecPlan& plan, int world_size, int num_steps, int warmup_steps, const std::vector<json>& reports,
                  const json& config, const std::string& memory_source, int first_step = 0,
                  std::optional<costmodel::RunCheckpoints> checkpoints = std::nullopt);

}  // namespace dplan::executor
