// The phases of one training step: the one vocabulary of the prediction (TimeBreakdown,
// plan.json's prediction.time), the measurement (the executor's phase clock, run.json's
// phases_s) and their comparison (dplan compare). Each phase is exclusive time on a rank's
// critical path; per step they add up to the step time.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace dplan::costmodel {

enum class Phase {
  forward,       // forward compute
  backward,      // backward compute (recomputation apart)
  recompute,     // forward recomputed during backward (activation recompute)
  tp_comm,       // tensor/sequence-parallel collectives not hidden under compute
  cp_comm,       // context-parallel ring exchanges of K/V (and their gradients) not hidden
  ep_comm,       // expert-parallel token all-to-alls and expert-tensor-parallel collectives
  pp_p2p,        // pipeline transfers: a receive from the moment its sender posted the data
  pp_bubble,     // pipeline waiting: a receive until its sender posted the data (fill, drain, imbalance)
  dp_comm,       // data-parallel gradient reduction not hidden under backward
  param_gather,  // ZeRO-3 / distributed-optimizer parameter all-gathers not hidden
  optimizer,     // gradient clipping and the optimizer step
  offload,       // optimizer offload's device <-> host copies not hidden
  overhead,      // the rest of the step: host work, data loading, launches
};
inline constexpr int kNumPhases = static_cast<int>(Phase::overhead) + 1;

struct PhaseInfo {
  Phase phase;
  const char* name;   // in JSON (plan.json's prediction.time, run.json's phases_s)
  const char* label;  // in tables (dplan compare, dplan explain)
};
// In step order, one per Phase.
const std::array<PhaseInfo, kNumPhases>& phase_table();

const char* to_string(Phase p);
std::string_view label(Phase p);
std::optional<Phase> phase_from_name(std::string_view name);
// "forward, backward, ..., overhead": the valid names, for one-line errors.
std::string phase_names();

}  // namespace dplan::costmodel
