#include "profile_files.h"

#include <cstdio>
#include <filesystem>

#include "dplan/costmodel/hardware.h"

namespace dplan::cli {
namespace fs = std::filesystem;

std::string gpu_file_of(const std::string& cluster_path, const planner::ProfileStore& store) {
  const json file = read_json_file(cluster_path);
  ObjectReader top(file, cluster_path);
  const std::string gpu = top.object("cluster").string("gpu");
  if (gpu.find('/') != std::string::npos || (gpu.size() > 5 && gpu.ends_with(".json")))
    return fs::path(gpu).is_relative() ? (fs::path(cluster_path).parent_path() / gpu).string() : gpu;
  return store.gpu_path(gpu);
}

void write_profiles(json cluster_file, const json& gpu_file, const std::string& output, bool force,
                    const planner::ProfileStore& store) {
  std::string gpu_path;
  if (!gpu_file.is_null()) {
    gpu_path = (fs::path(output).parent_path() / (fs::path(output).stem().string() + "-gpu.json")).string();
    cluster_file.at("cluster")["gpu"] = fs::path(gpu_path).filename().string();  // beside the cluster file
    costmodel::gpu_from_json(gpu_file, gpu_path);  // refuse to write what would not load
  }
  costmodel::cluster_from_json(cluster_file, output, [&](const std::string& gpu) {
    return gpu_path.empty() ? store.load_gpu(gpu) : costmodel::gpu_from_json(gpu_file, gpu_path);
  });
  if (!gpu_path.empty()) check_output_path(gpu_path, costmodel::gpu_profile_output(), force);
  check_output_path(output, costmodel::cluster_profile_output(), force);
  if (!gpu_path.empty()) {
    write_file_atomically(gpu_path, gpu_file.dump(2) + "\n");
    std::printf("wrote %s (GPU \"%s\")\n", gpu_path.c_str(), gpu_file["gpu"]["name"].get<std::string>().c_str());
  }
  write_file_atomically(output, cluster_file.dump(2) + "\n");  // checked above
  const std::string name = cluster_file["cluster"]["name"].get<std::string>();
  std::printf("wrote %s (cluster \"%s\"; use --cluster %s)\n", output.c_str(), name.c_str(), output.c_str());
}

}  // namespace dplan::cli
