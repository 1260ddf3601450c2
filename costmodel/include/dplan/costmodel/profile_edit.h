// Editing profile files (profiles/ JSON) with fitted figures: `dplan probe` and `dplan calibrate`
// write a measured or fitted GpuSpec / ClusterSpec back into a copy of the file they started from,
// keeping its sources, descriptions and everything nobody fitted as written. The figures are taken
// from to_json(GpuSpec) / to_json(ClusterSpec) (hardware.h), the one writer of profile figures, so
// the unit conversions (GB = 1e9 and GiB = 2^30 bytes, us, MiB) live beside the one reader,
// gpu_from_json / cluster_from_json, and nowhere else.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/hardware.h"

namespace dplan::costmodel {

// {path: value} for each path ("latency_us", "matmul.max_efficiency": keys joined by dots) of
// `figures`, an object in a profile's units (to_json of a spec, or a part of it).
json pick_figures(const json& figures, const std::vector<std::string>& paths);

// Sets each path of `picked` (as pick_figures returns) in `profile_object` (a profile file's
// "gpu" or "cluster" object, or a part of it), creating objects on the way.
void put_figures(json& profile_object, const json& picked);

}  // namespace dplan::costmodel
