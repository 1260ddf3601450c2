// Finding models and hardware by name: presets under profiles/models (Hugging Face config.json
// form), size shorthands ("70B"), paths to a user's config.json, and GPU / cluster profiles.
// A ProfileStore is a plain value holding the profiles folder; nothing is global.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"

namespace dplan::planner {

// Size shorthands accepted by --model, each naming a preset. "70B" -> llama-3-70b, etc.
const std::vector<std::pair<std::string, std::string>>& model_shorthands();

class ProfileStore {
 public:
  explicit ProfileStore(std::string root);  // the profiles/ folder

  // `spec` is a preset name (case-insensitive), a size shorthand, or a path to a config.json.
  // Throws InputError naming the valid presets and shorthands when nothing matches.
  costmodel::ModelSpec load_model(const std::string& spec) const;
  // `spec` is a cluster name under clusters/ or a path to a cluster JSON file; the cluster's
  // "gpu" is a GPU name or a path (relative paths from the cluster file's folder).
  costmodel::ClusterSpec load_cluster(const std::string& spec) const;
  // The file `spec` names (a cluster name under clusters/ or the path itself).
  std::string cluster_path(const std::string& spec) const;
  // `spec` is a GPU name under gpus/ or a path to a GPU JSON file.
  costmodel::GpuSpec load_gpu(const std::string& spec) const;
  std::string gpu_path(const std::string& spec) const;

  std::vector<std::string> model_names() const;
  std::vector<std::string> cluster_names() const;
  std::vector<std::string> gpu_names() const;
  const std::string& root() const { return root_; }

 private:
  std::vector<std::string> names_in(const std::string& folder) const;
  std::string root_;
};

// One line saying that a prediction comes from a CPU profile no `dplan probe` has measured, naming
// the command that measures this machine; empty for any other profile. The one test of "never
// probed": the devices are a shared machine's cores (cores_per_node > 0) and the GPU holds no
// measured GEMMs (matmul.measured), which every probe of a CPU machine writes (dplan probe keeps
// them all) and no shipped profile has. GPU clusters' datasheet profiles are not named: their
// figures are published measurements (profiles/clusters/SOURCES.md), not guesses.
// `cluster` is to_json(ClusterSpec)'s form, as plan.json holds it.
std::string unprobed_profile_note(const dplan::json& cluster);
std::string unprobed_profile_note(const costmodel::ClusterSpec& cluster);

// The profiles folder: --profiles if given, else $DPLAN_PROFILES, else share/dplan/profiles next
// to an installed binary, else `compiled_default` (the source tree's profiles/).
std::string find_profiles_dir(const std::string& flag, const std::string& exe_path,
                              const std::string& compiled_default);

}  // namespace dplan::planner
