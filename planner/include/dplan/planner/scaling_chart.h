// The chart `dplan scale` writes: throughput and scaling efficiency against the number of GPUs,
// predicted (dashed) and measured (solid), as a standalone SVG a browser opens.
#pragma once

#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"

namespace dplan::planner {

struct ScalingPoint {
  int gpus = 0;
  double predicted_tokens_per_s = 0, measured_tokens_per_s = 0;
  double predicted_efficiency = 0, measured_efficiency = 0;  // (throughput / first's) / (gpus / first's)
};

// Scaling efficiencies of `points` (sorted by gpus) against the first point.
void fill_efficiencies(std::vector<ScalingPoint>& points);

std::string scaling_svg(const std::vector<ScalingPoint>& points, const std::string& title);

// -o's rules for the chart (json_io.h check_output_path): an earlier chart is replaced without --force.
const OutputKind& scaling_svg_output();

}  // namespace dplan::planner
