#include "dplan/planner/compare.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "dplan/costmodel/errors.h"

namespace dplan::planner {
namespace {

// Measured phase <- the predicted phases it covers. The executor's phases are defined in
// docs/run-json.md ("phases_s"); the predicted ones are the keys of plan.json's prediction.time
// (costmodel TimeBreakdown):
//   forward   <- forward
//   backward  <- backward + recompute         run-json: "backward (compute only)"; the executor
//                                             times recomputed forwards inside backward
//   tp_comm   <- tp_comm + cp_comm + ep_comm  run-json: "tensor/sequence-parallel collectives"; the
//                                             other intra-layer collectives land there too
//   pp_wait   <- pp_p2p + pp_bubble           run-json: "pipeline send/recv and waiting: transfer
//                                             plus bubble"
//   dp_comm   <- dp_comm + param_gather       run-json: "data-parallel gradient reduction not
//                                             hidden under backward"; ZeRO-3/dist-opt gathers are
//                                             data-parallel traffic as well
//   optimizer <- optimizer + offload          the step, including moving offloaded states
//   other     <- (nothing predicted)          run-json: "the rest of the step"
struct PhaseMapping {
  const char* measured;
  std::vector<const char*> predicted;
};
const std::vector<PhaseMapping> kPhaseMappings = {
    {"forward", {"forward"}},
    {"backward", {"backward", "recompute"}},
    {"tp_comm", {"tp_comm", "cp_comm", "ep_comm"}},
    {"pp_wait", {"pp_p2p", "pp_bubble"}},
    {"dp_comm", {"dp_comm", "param_gather"}},
    {"optimizer", {"optimizer", "offload"}},
    {"other", {}},
};

// Measured memory component <- the predicted stage components it covers. run-json.md ("memory"):
// weights, gradients, optimizer are exact tensor bytes; activations is the peak of everything
// else allocated during a step (saved activations, temporaries, received tensors), so the
// predicted logits (the loss's temporaries) belong to it; buffers are communication buffers;
// peak is the allocator's high-water mark. The predicted peak is total_bytes - reserve_bytes: the
// reserve models framework overhead (CUDA context, allocator fragmentation) that the executor's
// counting allocator never sees.
struct MemoryMapping {
  const char* measured;
  std::vector<const char*> predicted;
};
const std::vector<MemoryMapping> kMemoryMappings = {
    {"weights", {"weights_bytes"}},
    {"gradients", {"grads_bytes"}},
    {"optimizer", {"optimizer_bytes"}},
    {"activations", {"activations_bytes", "logits_bytes"}},
    {"buffers", {"buffers_bytes"}},
    {"peak", {"total_bytes"}},  // minus reserve_bytes, below
};

struct Layout {
  long long tp = 1, pp = 1, dp = 1, cp = 1;
  bool operator==(const Layout&) const = default;
  std::string describe() const {
    return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " cp " +
           std::to_string(cp);
  }
};

Layout read_layout(ObjectReader layout) {
  Layout l;
  l.tp = layout.positive_int("tp");
  l.pp = layout.positive_int("pp");
  l.dp = layout.positive_int("dp");
  l.cp = layout.has("cp") ? layout.positive_int("cp") : 1;
  return l;
}

void check_format_version(ObjectReader& reader) {
  long long version = reader.positive_int("format_version");
  if (version != 1)
    throw InputError(reader.where("format_version") + ": expected 1 (this dplan reads format 1), got " +
                     std::to_string(version));
}

// stage_of_rank as ints, checked against the layout: world size entries, each in [0, pp), and
// every stage holding at least one rank.
std::vector<int> read_stage_of_rank(ObjectReader& run, const Layout& layout) {
  const json& list = run.raw("stage_of_rank");
  const std::string where = run.where("stage_of_rank");
  if (!list.is_array()) throw InputError(where + ": expected a list of stages, got " + describe_json_value(list));
  const long long world = layout.tp * layout.cp * layout.dp * layout.pp;
  if (static_cast<long long>(list.size()) != world)
    throw InputError(where + ": expected " + std::to_string(world) + " entries (tp*cp*dp*pp), got " +
                     std::to_string(list.size()));
  std::vector<int> stages;
  for (size_t r = 0; r < list.size(); ++r) {
    const json& s = list[r];
    if (!s.is_number_integer() || s.get<long long>() < 0 || s.get<long long>() >= layout.pp)
      throw InputError(where + "/" + std::to_string(r) + ": expected a stage in 0.." + std::to_string(layout.pp - 1) +
                       ", got " + describe_json_value(s));
    stages.push_back(s.get<int>());
  }
  for (int stage = 0; stage < layout.pp; ++stage)
    if (std::find(stages.begin(), stages.end(), stage) == stages.end())
      throw InputError(where + ": no rank runs stage " + std::to_string(stage));
  return stages;
}

}  // namespace

std::optional<double> relative_error(double predicted, double measured) {
  if (measured == 0) return std::nullopt;
  return (predicted - measured) / measured;
}

Comparison compare_plan_and_run(const json& plan_json, const std::string& plan_file, const json& run_json,
                                const std::string& run_file) {
  // Neither reader calls finish(): both files carry much more than compare needs.
  ObjectReader plan(plan_json, plan_file);
  ObjectReader run(run_json, run_file);
  check_format_version(plan);
  check_format_version(run);

  const Layout planned = read_layout(plan.object("parallel"));
  const Layout measured_layout = read_layout(run.object("layout"));
  if (!(planned == measured_layout))
    throw InputError(plan_file + " and " + run_file + " do not belong together: " + plan_file + " plans " +
                     planned.describe() + ", " + run_file + " ran " + measured_layout.describe() +
                     "; compare a run with the plan it ran");

  Comparison c;
  c.tp = static_cast<int>(planned.tp);
  c.pp = static_cast<int>(planned.pp);
  c.dp = static_cast<int>(planned.dp);
  c.cp = static_cast<int>(planned.cp);

  ObjectReader prediction = plan.object("prediction");
  ObjectReader measured_step = run.object("step_time_s");
  // run-json.md: step_time_s.median over the steps that are not warm-up; tokens_per_s is global
  // tokens per step / that median.
  c.step_time_s = {prediction.positive_number("step_time_s"), measured_step.positive_number("median")};
  if (measured_step.has("count")) c.measured_steps = measured_step.non_negative_int("count");
  c.tokens_per_s = {prediction.positive_number("tokens_per_s"), run.non_negative_number("tokens_per_s")};

  ObjectReader predicted_time = prediction.object("time");
  ObjectReader measured_phases = run.object("phases_s");
  for (const auto& m : kPhaseMappings) {
    double predicted = 0;
    for (const char* p : m.predicted) predicted += predicted_time.non_negative_number(p);
    c.phases.push_back({m.measured, {predicted, measured_phases.non_negative_number(m.measured)}});
  }

  // Memory per stage: run-json.md keys "memory" by rank (as a string) and maps ranks to stages
  // with "stage_of_rank"; a stage's measurement is its worst rank, as the plan's stage figure is
  // what each of its GPUs must hold.
  const std::vector<int> stage_of_rank = read_stage_of_rank(run, measured_layout);
  const json& predicted_stages = prediction.object("memory").raw("stages");
  if (!predicted_stages.is_array() || static_cast<long long>(predicted_stages.size()) != planned.pp)
    throw InputError(plan_file + ": /prediction/memory/stages: expected a list of " + std::to_string(planned.pp) +
                     " stages (pp), got " + describe_json_value(predicted_stages));
  ObjectReader measured_memory = run.object("memory");
  // Looked up by hand: the reader's "a misspelling?" hint would point at another rank's number.
  auto rank_memory = [&](int rank, int stage) {
    const std::string key = std::to_string(rank);
    if (!measured_memory.has(key))
      throw InputError(run_file + ": /memory: missing key \"" + key + "\" (rank " + key + ", which runs stage " +
                       std::to_string(stage) + ")");
    return measured_memory.object(key);
  };
  for (int stage = 0; stage < planned.pp; ++stage) {
    ObjectReader predicted(predicted_stages[stage], plan_file, "/prediction/memory/stages/" + std::to_string(stage));
    StageMemoryComparison s;
    s.stage = stage;
    s.predicted_reserve_bytes = predicted.non_negative_number("reserve_bytes");
    for (size_t r = 0; r < stage_of_rank.size(); ++r)
      if (stage_of_rank[r] == stage) s.ranks.push_back(static_cast<int>(r));
    for (const auto& m : kMemoryMappings) {
      double predicted_bytes = 0;
      for (const char* p : m.predicted) predicted_bytes += predicted.non_negative_number(p);
      if (std::string(m.measured) == "peak") predicted_bytes -= s.predicted_reserve_bytes;
      double measured_bytes = 0;
      for (int rank : s.ranks)
        measured_bytes =
            std::max(measured_bytes, rank_memory(rank, stage).non_negative_number(m.measured));
      s.components.push_back({m.measured, {predicted_bytes, measured_bytes}});
    }
    c.memory.push_back(std::move(s));
  }
  return c;
}

Comparison compare_files(const std::string& plan_path, const std::string& run_path) {
  json plan = read_json_file(plan_path);
  json run = read_json_file(run_path);
  return compare_plan_and_run(plan, plan_path, run, run_path);
}

namespace {
json value_json(const ComparedValue& v) {
  std::optional<double> e = v.rel_error();
  return {{"predicted", v.predicted}, {"measured", v.measured}, {"rel_error", e ? json(*e) : json(nullptr)}};
}
}  // namespace

json to_json(const Comparison& c) {
  json phases = json::object();
  for (const auto& p : c.phases) phases[p.name] = value_json(p.value);
  json memory = json::array();
  for (const auto& s : c.memory) {
    json stage = {{"stage", s.stage}};
    for (const auto& m : s.components) stage[m.name] = value_json(m.value);
    memory.push_back(stage);
  }
  return {{"step_time_s", value_json(c.step_time_s)},
          {"tokens_per_s", value_json(c.tokens_per_s)},
          {"phases", phases},
          {"memory", memory}};
}

}  // namespace dplan::planner
