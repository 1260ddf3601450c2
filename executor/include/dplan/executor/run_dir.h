// The run folder dplan run makes for its ranks (DPLAN_RUN_DIR, removed when the run ends) and the
// files a rank that stops leaves there for the launcher to read once it has reaped the rank:
//   diagnosis.<rank>  the ranks this rank found silent (no heartbeat) when its collective failed
//   error.<rank>      the input this rank refused (it exits 2): when, and its one error line
// dplan (the launcher) and dplan-worker (the ranks) both include this header; it uses the
// standard library only.
#pragma once

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <string>

namespace dplan::executor {

inline std::string diagnosis_file(const std::string& run_dir, int rank) {
  return run_dir + "/diagnosis." + std::to_string(rank);
}

inline std::string error_file(const std::string& run_dir, int rank) {
  return run_dir + "/error." + std::to_string(rank);
}

// What a rank refused: the steady clock's reading when it did (CLOCK_MONOTONIC, one clock for
// every process of the machine, so the launcher can tell which rank refused first) and the line.
struct RankError {
  long long at_ns = 0;
  std::string message;
};

inline long long steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The moment dplan run started a rank (steady_now_ns() just before its fork, in decimal), in the
// rank's environment: the rank's start-up is timed from there (run.json "startup_s").
inline constexpr const char* kLaunchTimeEnv = "DPLAN_LAUNCH_NS";

// Written whole or not at all (a temporary file renamed into place): the launcher may look while
// the rank is still writing. Best effort: a rank that cannot write it still exits 2.
inline void write_rank_error(const std::string& run_dir, int rank, const std::string& message) {
  const std::string path = error_file(run_dir, rank);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << steady_now_ns() << "\n" << message << "\n";
    if (!out.flush()) return;
  }
  std::rename(tmp.c_str(), path.c_str());
}

// The rank's error file, or nothing when it left none (or none that reads as one).
inline std::optional<RankError> read_rank_error(const std::string& run_dir, int rank) {
  std::ifstream in(error_file(run_dir, rank));
  RankError e;
  if (!(in >> e.at_ns)) return std::nullopt;
  in.ignore(1);
  if (!std::getline(in, e.message) || e.message.empty()) return std::nullopt;
  return e;
}

}  // namespace dplan::executor
