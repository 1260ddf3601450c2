// A rank's start-up in parts, from its launch to the start of its first training step (run.json
// "startup_s", docs/run-json.md). dplan run exports the moment it started the rank
// (kLaunchTimeEnv, run_dir.h; CLOCK_MONOTONIC, which every process of the machine shares), so
// the first part, "launch_to_main", holds the process's start: fork and exec, the dynamic loader
// mapping and relocating LibTorch and its dependencies, and their static initializers (LibTorch
// registers its operators there). Under another launcher (torchrun, srun) that part is unknown
// and left out. The rank marks the end of each later part.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dplan/executor/run_dir.h"

namespace dplan::executor {

class StartupClock {
 public:
  // Construct it first thing in main.
  StartupClock() : last_ns_(steady_now_ns()) {
    if (const char* launched = std::getenv(kLaunchTimeEnv)) {
      char* end = nullptr;
      const long long ns = std::strtoll(launched, &end, 10);
      if (end && *end == '\0' && ns > 0 && ns <= last_ns_) parts_.emplace_back("launch_to_main", (last_ns_ - ns) * 1e-9);
    }
  }
  // The part that ends now (it began at the previous mark, or at main).
  void mark(const char* part) {
    const long long now = steady_now_ns();
    parts_.emplace_back(part, (now - last_ns_) * 1e-9);
    last_ns_ = now;
  }
  // {"launch_to_main"?, part: seconds, ..., "total": their sum}, in order.
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    double total = 0;
    for (const auto& [part, s] : parts_) {
      j[part] = s;
      total += s;
    }
    j["total"] = total;
    return j;
  }

 private:
  long long last_ns_;
  std::vector<std::pair<std::string, double>> parts_;
};

}  // namespace dplan::executor
