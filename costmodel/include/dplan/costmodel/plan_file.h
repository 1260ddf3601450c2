// plan.json: the hand-off from planner to executor (the `dplan ... -o plan.json` file that
// `dplan run`, `dplan compare` and `dplan calibrate` read). One type, one writer, one strict reader.
// Versioned ("format_version": 1). Holds the model, cluster, training spec, parallel config,
// overlap switches, the rank layout (each global rank's tp/cp/ep/dp/pp coordinates, node and local
// rank, in Megatron's order: tp fastest, then cp, dp, pp; the MoE layers' etp, ep, edp folded over
// each stage's tp*cp*dp ranks, etp fastest), the layer -> stage
// (and model chunk) assignment, and the prediction: memory per stage by component, step time by
// phase, throughput, MFU, and the checkpoint (bytes per rank, save and load times; optional, since
// plans written before it lack it).
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/mesh.h"
#include "dplan/costmodel/time.h"

namespace dplan::costmodel {

constexpr int kPlanFormatVersion = 1;


// Consecutive layers [first_layer, first_layer + num_layers) of one model chunk.
struct PlanChunk {
  int first_layer = 0, num_layers = 0;
  bool operator==(const PlanChunk&) const = default;
};

struct PlanStage {
  int num_layers = 0;
  bool embedding = false, lm_head = false;
  std::vector<PlanChunk> chunks;  // one, or vpp with the interleaved schedule
  bool operator==(const PlanStage&) const = default;
};

struct Plan {
  ModelSpec model;
  json cluster;  // the cluster predicted for, as to_json(ClusterSpec) writes it (no reader needs more)
  TrainingSpec training;
  ParallelConfig parallel;
  OverlapOptions overlap;
  int num_microbatches = 1;
  std::vector<RankCoordinates> ranks;  // indexed by global rank
  std::vector<PlanStage> stages;       // indexed by pipeline stage
  // The prediction as the cost model wrote it: to_json(TimeBreakdown) plus "fits" and "memory"
  // (to_json(MemoryEstimate)). dplan compare reads it strictly, key by key.
  json prediction;
  bool operator==(const Plan&) const = default;
};

// The plan for these inputs: rank layout and stage assignment computed, prediction attached.
Plan make_plan(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
               const ParallelConfig& parallel, const OverlapOptions& overlap, const MemoryEstimate& memory,
               const TimeBreakdown& time);

json to_json(const Plan& plan);

// Strict: a format_version other than 1, a missing or unknown key, a value of the wrong type or
// range, or a rank layout / stage list that does not fit the parallel config throws InputError
// naming `file` and the JSON pointer, e.g. "plan.json: /parallel/tp: expected a positive integer,
// got \"x\"".
Plan plan_from_json(const json& j, const std::string& file);
// read_json_file, then plan_from_json.
Plan read_plan(const std::string& path);

// -o's rules for a plan (json_io.h check_output_path): an earlier plan is replaced without --force.
const OutputKind& plan_output();

}  // namespace dplan::costmodel
