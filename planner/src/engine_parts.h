// Internal to the planner: the per-engine functions the engine table (engines.cpp) names, beside
// the exporters of export_engines.h: each engine's rules (engine_rules.cpp) and its log reader
// (engine_logs.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dplan/planner/engine_logs.h"
#include "dplan/planner/engine_rules.h"

namespace dplan::planner::detail {

// The rules of one engine on one plan, into a RuleReport: each failure a line prefixed by the
// engine's name.
class Rules {
 public:
  Rules(Engine engine, RuleReport& report);
  // One rule: `holds`, or the line `why()` gives (without the engine prefix).
  void rule(bool holds, const std::function<std::string()>& why);

 private:
  std::string prefix_;
  RuleReport& report_;
};

void megatron_rules(const costmodel::Plan& plan, Rules& r);
void torchtitan_rules(const costmodel::Plan& plan, Rules& r);
void deepspeed_rules(const costmodel::Plan& plan, Rules& r);
void accelerate_rules(const costmodel::Plan& plan, Rules& r);
void dplan_worker_rules(const costmodel::Plan& plan, Rules& r);  // torchrun and Slurm

// Each engine's log lines: whether a line is one of them, and the reader of a whole log.
bool megatron_signature(const std::string& line);
bool torchtitan_signature(const std::string& line);
bool deepspeed_signature(const std::string& line);
void read_megatron_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps);
void read_torchtitan_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps);
void read_deepspeed_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps);

}  // namespace dplan::planner::detail
