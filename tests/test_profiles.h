// The shipped profiles, loaded once per test binary (tests reach data through DPLAN_PROFILES_DIR,
// a CMake-defined absolute path).
#pragma once

#include <functional>
#include <string>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/profiles.h"

namespace dplan::testing {

inline const planner::ProfileStore& store() {
  static const planner::ProfileStore s(DPLAN_PROFILES_DIR);
  return s;
}

// The plan of a shipped model preset on local-cpu with this layout, without a prediction.
inline costmodel::Plan local_plan(const std::string& model, const costmodel::ParallelConfig& p, int seq_len,
                                  int global_batch) {
  costmodel::TrainingSpec training;
  training.seq_len = seq_len;
  training.global_batch = global_batch;
  return costmodel::make_plan(store().load_model(model), store().load_cluster("local-cpu"), training, p, {},
                              costmodel::MemoryEstimate{}, costmodel::TimeBreakdown{});
}

// What `f` throws as InputError (its one line), or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// What validate() says of the layout on its own world size (its one line), or "" when it accepts it.
inline std::string validate_error(const costmodel::ModelSpec& m, const costmodel::ClusterSpec& c,
                                  const costmodel::TrainingSpec& t, const costmodel::ParallelConfig& p) {
  try {
    costmodel::validate(m, c, t, p, p.world_size());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Mixtral 8x7B with 64 experts, so that ep can reach across nodes of 8 GPUs.
inline costmodel::ModelSpec many_experts() {
  costmodel::ModelSpec m = store().load_model("mixtral-8x7b");
  m.num_experts = 64;
  return m;
}

}  // namespace dplan::testing
