// One timed GEMM as both probes write it (probe/gpu_probe.cpp on a GPU node, `dplan-worker
// --probe` on a CPU machine) and `dplan probe --import-gpu-probe` reads it
// (planner/src/gpu_probe.cpp): (m x k) * (k x n), `batch` of them, as training's `op` (forward,
// dgrad, wgrad, batched, attention_forward, attention_backward), in `time_s`; FLOPs 2mnk x batch.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace dplan::probe {

inline nlohmann::json gemm_row(const char* precision, const char* op, int64_t m, int64_t n, int64_t k, int64_t batch,
                               double time_s) {
  return {{"precision", precision}, {"op", op},         {"m", m},           {"n", n},
          {"k", k},                 {"batch", batch},   {"time_s", time_s}, {"flops_per_s", 2.0 * m * n * k * batch / time_s}};
}

}  // namespace dplan::probe
