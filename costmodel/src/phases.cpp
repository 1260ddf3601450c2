#include "dplan/costmodel/phases.h"

namespace dplan::costmodel {

const std::array<PhaseInfo, kNumPhases>& phase_table() {
  static const std::array<PhaseInfo, kNumPhases> table = {{
      {Phase::forward, "forward", "forward"},
      {Phase::backward, "backward", "backward"},
      {Phase::recompute, "recompute", "recompute"},
      {Phase::tp_comm, "tp_comm", "tp comm"},
      {Phase::cp_comm, "cp_comm", "cp comm"},
      {Phase::ep_comm, "ep_comm", "ep comm"},
      {Phase::pp_p2p, "pp_p2p", "pp p2p"},
      {Phase::pp_bubble, "pp_bubble", "pp bubble"},
      {Phase::dp_comm, "dp_comm", "dp comm"},
      {Phase::param_gather, "param_gather", "param gather"},
      {Phase::optimizer, "optimizer", "optimizer"},
      {Phase::offload, "offload", "offload"},
      {Phase::overhead, "overhead", "overhead"},
  }};
  return table;
}

const char* to_string(Phase p) { return phase_table()[static_cast<int>(p)].name; }

std::string_view label(Phase p) { return phase_table()[static_cast<int>(p)].label; }

std::optional<Phase> phase_from_name(std::string_view name) {
  for (const PhaseInfo& info : phase_table())
    if (name == info.name) return info.phase;
  return std::nullopt;
}

std::string phase_names() {
  std::string out;
  for (const PhaseInfo& info : phase_table()) out += (out.empty() ? "" : ", ") + std::string(info.name);
  return out;
}

}  // namespace dplan::costmodel
