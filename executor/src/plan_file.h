// What the executor takes from plan.json (the format is costmodel's: dplan/costmodel/plan_file.h,
// read by its strict reader): the model, the training spec, the parallel config, each rank's
// coordinates and each stage's layers. It reads the file, never the planner's code.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/model.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/training.h"
#include "gpt.h"

namespace dplan::executor {

struct ExecPlan {
  std::string path;
  costmodel::ModelSpec model;
  costmodel::TrainingSpec training;
  costmodel::ParallelConfig parallel;
  int num_microbatches = 1;
  std::vector<costmodel::RankCoordinates> ranks;  // indexed by global rank
  std::vector<StageSpec> stages;  // indexed by pipeline stage

  int world_size() const { return static_cast<int>(ranks.size()); }
  // The layout's groups (the plan's rank_layout is this mesh's: costmodel::read_plan checks it).
  costmodel::Mesh mesh() const { return costmodel::Mesh(parallel); }
};

// Throws InputError naming the file and key on anything malformed, and on what the executor does
// not run (costmodel::executor_refusal, listing what it does run).
ExecPlan read_plan(const std::string& path);

}  // namespace dplan::executor
