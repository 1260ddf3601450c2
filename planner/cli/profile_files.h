// Writing fitted profiles (dplan probe, dplan calibrate): a cluster file, and when the GPU's
// figures changed too, the GPU file beside it as <cluster>-gpu.json, which the cluster then names
// by that relative path. Both are loaded back before anything is written, and written atomically.
#pragma once

#include <string>

#include "dplan/costmodel/json_io.h"
#include "dplan/planner/profiles.h"

namespace dplan::cli {

// The GPU file a cluster file names: a GPU under profiles/gpus/, or a path relative to the
// cluster file's folder.
std::string gpu_file_of(const std::string& cluster_path, const planner::ProfileStore& store);

// `gpu_file` null: the cluster keeps its GPU. Both paths pass -o's checks (check_output_path)
// before either is written. Prints a "wrote" line per file.
void write_profiles(json cluster_file, const json& gpu_file, const std::string& output, bool force,
                    const planner::ProfileStore& store);

}  // namespace dplan::cli
