// The local launcher's watch over its ranks (run_command.cpp), as a small state machine: its
// events are a rank exiting, a stop signal to the launcher, a second signal, and time passing;
// its actions are signals to the ranks' processes, through RankProcesses, so that a test can
// drive it without processes. When every rank has exited it says how the run ended.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dplan/executor/run_dir.h"

namespace dplan::cli {

// What the watch does to the ranks' processes and reads about them.
class RankProcesses {
 public:
  virtual ~RankProcesses() = default;
  // Sends signal `sig` to process `pid`.
  virtual void send(pid_t pid, int sig) = 0;
  // The state letter of the process ('T': stopped by a signal; see process_state), 0 if unknown.
  virtual char state(pid_t pid) = 0;
  // The ranks that `rank` found silent (no heartbeat) before it exited, other than itself.
  virtual std::set<int> silent_peers(int rank) = 0;
  // The input `rank` refused before it exited 2 (run_dir.h's error file), if it left one.
  virtual std::optional<executor::RankError> refused_input(int rank) = 0;
};

class RankWatch {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State {
    running,   // no rank has failed and no stop signal came
    failing,   // a rank failed: the others get timeout_s + 10 s to stop on their own, then are killed
    stopping,  // a stop signal: the ranks got SIGTERM (SIGCONT too) and are killed 5 s later
    saving,    // a stop signal with graceful_stop: the ranks finish their step, save and exit 0,
               // within 2 timeout_s + 30 s; a second signal kills them (then stopping)
  };

  // pid_of_rank[r]: the process of rank r. graceful_stop: a run that saves checkpoints (see
  // launch_local_ranks).
  RankWatch(const std::vector<pid_t>& pid_of_rank, double timeout_s, bool graceful_stop, RankProcesses& processes);

  // SIGINT, SIGTERM or SIGHUP to the launcher (0: none yet); only the first one counts.
  void stop_signal(int sig, Clock::time_point now);
  // A signal after the first (0: none): ends a graceful stop's wait, killing the ranks.
  void second_signal(int sig);
  // Process `pid` exited with `wstatus` (waitpid's). pending_signal: a stop signal that came while
  // it was reaped (0: none), which it is taken to have gone with.
  void rank_exited(pid_t pid, int wstatus, int pending_signal, Clock::time_point now);
  // Time passes: past the deadline the ranks left are killed.
  void tick(Clock::time_point now);

  State state() const { return state_; }
  bool done() const { return rank_of_.empty(); }
  // Once done(): the launcher's exit status (0; 2 when a rank refused its input; 128 + the signal
  // that stopped the run; else 1), and what went wrong for "dplan: error: ..." ("" when nothing is
  // to be said). Input a rank refused is the cause whatever else failed after it: the line of the
  // rank that refused first, named when it is not rank 0.
  int exit_status() const;
  std::string error_message() const;

 private:
  bool stopped() const { return state_ == State::stopping || state_ == State::saving; }
  void begin_stop(int sig, Clock::time_point now);
  void kill_all();
  void first_failure(pid_t pid, int rank, int wstatus, Clock::time_point now);

  RankProcesses& processes_;
  const double timeout_s_;
  const bool graceful_stop_;
  std::vector<pid_t> pid_of_;
  std::map<pid_t, int> rank_of_;  // the ranks still running
  State state_ = State::running;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool failed_ = false;             // a rank failed before any stop signal
  int failed_status_ = 0;           // its exit status, or 128 + its signal
  std::string failure_, also_crashed_;
  std::optional<executor::RankError> refused_;  // the first input a rank refused
  int refused_rank_ = -1;
  int stop_signal_ = 0;
  bool graceful_failed_ = false;    // a rank did not exit 0 after a graceful stop
  std::set<int> stopped_ranks_;     // the ranks still running when the launcher got its signal
  std::set<pid_t> killed_by_us_;    // not named as having crashed when they are reaped
};

}  // namespace dplan::cli
