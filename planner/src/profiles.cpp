#include "dplan/planner/profiles.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "dplan/costmodel/errors.h"

namespace dplan::planner {
namespace fs = std::filesystem;
using costmodel::ClusterSpec;
using costmodel::GpuSpec;
using costmodel::ModelSpec;

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json");
}
}  // namespace

const std::vector<std::pair<std::string, std::string>>& model_shorthands() {
  static const std::vector<std::pair<std::string, std::string>> kShorthands = {
      {"7b", "llama-2-7b"},         {"8b", "llama-3-8b"},           {"13b", "llama-2-13b"},
      {"70b", "llama-3-70b"},       {"405b", "llama-3.1-405b"},     {"8x7b", "mixtral-8x7b"},    {"8x22b", "mixtral-8x22b"},
      {"175b", "gpt3-175b"},        {"1.7b", "gpt-1.7b"},           {"3.6b", "gpt-3.6b"},
      {"7.5b", "gpt-7.5b"},         {"18.4b", "gpt-18.4b"},         {"39.1b", "gpt-39.1b"},
      {"76.1b", "gpt-76.1b"},       {"145.6b", "gpt-145.6b"},       {"310.1b", "gpt-310.1b"},
      {"529.6b", "gpt-529.6b"},     {"1t", "gpt-1t"}};
  return kShorthands;
}

ProfileStore::ProfileStore(std::string root) : root_(std::move(root)) {
  std::error_code ec;
  if (!fs::is_directory(root_ + "/models", ec) || !fs::is_directory(root_ + "/clusters", ec))
    throw InputError("profiles folder " + root_ +
                     " has no models/ and clusters/; pass --profiles DIR or set DPLAN_PROFILES");
}

std::vector<std::string> ProfileStore::names_in(const std::string& folder) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_ + "/" + folder, ec))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> ProfileStore::model_names() const { return names_in("models"); }
std::vector<std::string> ProfileStore::cluster_names() const { return names_in("clusters"); }
std::vector<std::string> ProfileStore::gpu_names() const { return names_in("gpus"); }

ModelSpec ProfileStore::load_model(const std::string& spec) const {
  if (looks_like_path(spec)) {
    std::string name = fs::path(spec).parent_path().filename().string();
    if (name.empty() || fs::path(spec).filename() != "config.json") name = fs::path(spec).stem().string();
    return costmodel::model_from_hf_config(read_json_file(spec), spec, name);
  }
  std::string key = lower(spec);
  for (const auto& [shorthand, preset] : model_shorthands())
    if (key == shorthand) key = preset;
  for (const auto& name : model_names())
    if (lower(name) == key) {
      std::string path = root_ + "/models/" + name + ".json";
      return costmodel::model_from_hf_config(read_json_file(path), path, name);
    }
  std::vector<std::string> shorthands;
  for (const auto& [s, p] : model_shorthands()) shorthands.push_back(s == "1t" ? "1T" : lower(s).substr(0, s.size() - 1) + "B");
  std::vector<std::string> known = model_names();
  known.insert(known.end(), shorthands.begin(), shorthands.end());
  throw InputError("unknown model \"" + quote_for_message(spec) + "\"" + did_you_mean(spec, known) + "; choose a preset (" +
                   join_choices(model_names()) +
                   "), a size (" + join_choices(shorthands) + ") or a path to a config.json");
}

std::string ProfileStore::gpu_path(const std::string& spec) const {
  if (looks_like_path(spec)) return spec;
  // Matched against the folder's names, never probed on the filesystem: a name of any length or
  // content is one error line.
  for (const auto& name : gpu_names())
    if (name == spec) return root_ + "/gpus/" + name + ".json";
  throw InputError("unknown GPU \"" + quote_for_message(spec) + "\"" + did_you_mean(spec, gpu_names()) + "; choose " +
                   join_choices(gpu_names()) +
                   " or a path to a GPU JSON file");
}

GpuSpec ProfileStore::load_gpu(const std::string& spec) const {
  const std::string path = gpu_path(spec);
  return costmodel::gpu_from_json(read_json_file(path), path);
}

std::string ProfileStore::cluster_path(const std::string& spec) const {
  if (looks_like_path(spec)) return spec;
  for (const auto& name : cluster_names())
    if (lower(name) == lower(spec)) return root_ + "/clusters/" + name + ".json";
  throw InputError("unknown cluster \"" + quote_for_message(spec) + "\"" + did_you_mean(spec, cluster_names()) +
                   "; choose " + join_choices(cluster_names()) +
                   " or a path to a cluster JSON file");
}

ClusterSpec ProfileStore::load_cluster(const std::string& spec) const {
  const std::string path = cluster_path(spec);
  // A cluster file may name its GPU by a path, relative to the cluster file's folder (what
  // dplan probe writes: a measured cluster beside its measured GPU).
  return costmodel::cluster_from_json(read_json_file(path), path, [&](const std::string& gpu) {
    if (looks_like_path(gpu) && fs::path(gpu).is_relative())
      return load_gpu((fs::path(path).parent_path() / gpu).string());
    return load_gpu(gpu);
  });
}

std::string unprobed_profile_note(const dplan::json& cluster) {
  if (!cluster.is_object() || cluster.value("cores_per_node", 0) <= 0) return "";
  const dplan::json* gpu = cluster.contains("gpu") ? &cluster.at("gpu") : nullptr;
  if (gpu && gpu->is_object() && gpu->contains("matmul") && gpu->at("matmul").is_object() &&
      !gpu->at("matmul").value("measured", dplan::json::array()).empty())
    return "";
  const std::string name = cluster.value("name", std::string("the cluster"));
  // 5-13x: gpt-tiny's predicted over measured throughput on a 2-core machine with the shipped
  // local-cpu (docs/profiles.md's dplan scale table, docs/compare.md; issue 20).
  return name + " has never been probed: its compute and network figures are guesses (predicted steps 5-13x "
         "shorter than measured for gpt-tiny on a 2-core machine); measure this machine with `dplan probe --cluster " + name +
         " -o my-machine.json` and plan with --cluster my-machine.json";
}

std::string unprobed_profile_note(const ClusterSpec& cluster) { return unprobed_profile_note(costmodel::to_json(cluster)); }

std::string find_profiles_dir(const std::string& flag, const std::string& exe_path,
                              const std::string& compiled_default) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("DPLAN_PROFILES"); env && *env) return env;
  std::error_code ec;
  fs::path exe = fs::canonical(exe_path, ec);
  if (!ec) {
    fs::path installed = exe.parent_path().parent_path() / "share" / "dplan" / "profiles";
    if (fs::is_directory(installed, ec)) return installed.string();
  }
  return compiled_default;
}

}  // namespace dplan::planner
