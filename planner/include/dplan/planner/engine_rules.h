// Each engine's own invariants on a plan (`dplan check --engine`, and `dplan export` first): the
// rules an engine asserts at start-up (Megatron-LM's validate_args, torchtitan's ParallelDims,
// DeepSpeed's batch assertion, ...) and the plan features an engine cannot express at all. The
// engines and their rule functions are in engines.h's table; the rules follow docs/export.md,
// which cites the engine sources (file and version) for each one.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engines.h"
#include "dplan/planner/search.h"

namespace dplan::planner {

// Where the plan runs: nodes x processes per node. A plan of fewer ranks than one node holds runs
// on one node with as many processes as ranks; otherwise on world / gpus_per_node full nodes
// (homogeneous is false when that does not divide: launchers start the same count on each node).
struct LaunchShape {
  int world = 1;
  int nodes = 1;
  int per_node = 1;
  bool homogeneous = true;
  bool gpus = true;  // the cluster's devices are GPUs (a cluster profile with cores_per_node is CPU ranks)
};
LaunchShape launch_shape(const costmodel::Plan& plan);

// How Megatron-LM's flags say the plan's pipeline split (core_v0.15.0,
// megatron/core/transformer/transformer_block.py get_num_layers_to_build): an even split, or
// --decoder-first/last-pipeline-num-layers, or --account-for-embedding/loss-in-pipeline-split.
// `problem` is set when no combination of those flags gives the plan's layers per stage.
struct MegatronSplit {
  int first_stage_layers = 0, last_stage_layers = 0;  // 0: flag not given
  bool account_for_embedding = false, account_for_loss = false;
  std::string problem;
};
MegatronSplit megatron_split_flags(const costmodel::Plan& plan);

// The outcome of an engine's rules on a plan: each failure one actionable line that starts with
// the engine's name ("megatron: global batch 100 is not a multiple of ..."); a plan feature the
// engine cannot express reads "<engine> cannot express <feature> ...".
struct RuleReport {
  std::vector<std::string> failures;
  int rules_checked = 0;
  bool ok() const { return failures.empty(); }
};
RuleReport check_engine_rules(const costmodel::Plan& plan, Engine engine);

// The search's ranking (best first) less the layouts `engine` cannot run: each candidate's plan goes
// through check_engine_rules, from the best down, until `top_k` pass; those that fail are dropped
// from `ranked`, `pareto` and `feasible` and counted in `rejected` under "<engine>'s rules refuse
// it". So a search priced for an engine picks a layout that engine runs and its export takes.
void keep_engine_runnable(SearchResult& result, const costmodel::ModelSpec& model,
                          const costmodel::ClusterSpec& cluster, const costmodel::TrainingSpec& training,
                          const costmodel::OverlapOptions& overlap, Engine engine, int top_k);

// "ok" summary line of `dplan check`: "megatron: ok: 21 rules pass (tp 2 x pp 2 x dp 4, 16
// ranks = 2 nodes x 8)".
std::string rules_ok_line(const costmodel::Plan& plan, Engine engine, const RuleReport& report);

}  // namespace dplan::planner
