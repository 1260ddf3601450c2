#include "rank_watch.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <cstdint>

namespace dplan::cli {
namespace {

std::string describe_exit(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

// "rank 2", "ranks 0-3", "ranks 0, 2-3".
std::string name_ranks(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int first = *it, last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    if (!out.empty()) out += ", ";
    out += std::to_string(first);
    if (last > first) out.append(1, '-').append(std::to_string(last));
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

std::chrono::milliseconds seconds(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

}  // namespace

RankWatch::RankWatch(const std::vector<pid_t>& pid_of_rank, double timeout_s, bool graceful_stop,
                     RankProcesses& processes)
    : processes_(processes), timeout_s_(timeout_s), graceful_stop_(graceful_stop), pid_of_(pid_of_rank) {
  for (size_t r = 0; r < pid_of_.size(); ++r) rank_of_[pid_of_[r]] = static_cast<int>(r);
}

// Whatever the ranks do after a stop signal is the stop's doing, not theirs.
void RankWatch::begin_stop(int sig, Clock::time_point now) {
  stop_signal_ = sig;
  state_ = graceful_stop_ ? State::saving : State::stopping;
  for (const auto& [p, r] : rank_of_) {
    processes_.send(p, SIGTERM);
    processes_.send(p, SIGCONT);  // a stopped rank acts on its SIGTERM only once it runs
    stopped_ranks_.insert(r);
    if (state_ != State::saving) killed_by_us_.insert(p);
  }
  const auto grace = state_ == State::saving ? seconds(2 * timeout_s_ + 30) : std::chrono::milliseconds(5000);
  deadline_ = std::min(deadline_, now + grace);
}

void RankWatch::kill_all() {
  for (const auto& [p, r] : rank_of_) {
    processes_.send(p, SIGKILL);
    killed_by_us_.insert(p);
  }
}

void RankWatch::stop_signal(int sig, Clock::time_point now) {
  if (sig && !stopped()) begin_stop(sig, now);
}

void RankWatch::second_signal(int sig) {
  if (state_ != State::saving || !sig) return;  // a second signal: no more waiting
  kill_all();
  state_ = State::stopping;
  stop_signal_ = sig;
}

void RankWatch::rank_exited(pid_t pid, int wstatus, int pending_signal, Clock::time_point now) {
  const int r = rank_of_.at(pid);
  rank_of_.erase(pid);
  const bool ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  if (pending_signal && !stopped()) {  // it came while waitpid returned: this rank went with it
    begin_stop(pending_signal, now);
    if (!ok) stopped_ranks_.insert(r);
  }
  if (state_ == State::saving && !ok) graceful_failed_ = true;
  if (stopped() || ok) return;
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 2)
    if (std::optional<executor::RankError> e = processes_.refused_input(r); e && (!refused_ || e->at_ns < refused_->at_ns)) {
      refused_ = e;
      refused_rank_ = r;
    }
  if (!failed_) {
    first_failure(pid, r, wstatus, now);
  } else if (WIFSIGNALED(wstatus) && !killed_by_us_.count(pid)) {
    // A survivor that crashed in the cascade (rather than stopping with its own error line) is
    // named too: its peers will have seen its heartbeat stop as well.
    also_crashed_ += "; rank " + std::to_string(r) + " then " + describe_exit(wstatus);
  }
}

// The first rank that fails is the cause, with one exception: when it merely exited non-zero, a
// rank that stalls (is stopped, or hangs with its heartbeat thread) makes its peers' next
// collective time out, and the first of them to exit is not the culprit. A survivor names the
// peers that stopped beating in the store (heartbeat.h: six of its own beats without a beat of
// theirs, the same finding for every survivor) and leaves their numbers in
// DPLAN_RUN_DIR/diagnosis.<rank> before it exits; the launcher reads that file of the first rank
// it reaps, so it names what the ranks' heartbeats say rather than who happened to exit first. A
// rank so named is not beating and its peers are leaving, so it cannot finish: the launcher kills
// it now instead of after the timeout. Its /proc state only adds detail ('T': stopped by a signal).
void RankWatch::first_failure(pid_t pid, int r, int wstatus, Clock::time_point now) {
  failed_ = true;
  state_ = State::failing;
  failed_status_ = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  deadline_ = now + seconds(timeout_s_ + 10);
  const std::set<int> silent = WIFEXITED(wstatus) ? processes_.silent_peers(r) : std::set<int>{};
  if (silent.empty()) {
    failure_ = "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") " + describe_exit(wstatus);
    return;
  }
  std::string names, detail;
  std::set<int> killed;
  for (int s : silent) {
    names += (names.empty() ? "" : ", ") + std::to_string(s) + " (pid " + std::to_string(pid_of_[s]) + ")";
    if (!rank_of_.count(pid_of_[s])) continue;  // already gone
    if (processes_.state(pid_of_[s]) == 'T')
      detail += "; rank " + std::to_string(s) + " was in state T (stopped by a signal)";
    processes_.send(pid_of_[s], SIGKILL);
    killed_by_us_.insert(pid_of_[s]);
    killed.insert(s);
  }
  failure_ = (silent.size() == 1 ? "rank " : "ranks ") + names + " stopped making progress (no heartbeat: rank " +
             std::to_string(r) + " found " + (silent.size() == 1 ? "it" : "them") +
             " silent when its collective failed, and " + describe_exit(wstatus) + ")" + detail +
             (killed.empty() ? "" : "; the launcher killed " + name_ranks(killed));
}

void RankWatch::tick(Clock::time_point now) {
  if (!(now > deadline_)) return;
  kill_all();
  deadline_ = Clock::time_point::max();
  if (!stopped()) failure_ += "; ranks still running after the timeout were killed";
}

int RankWatch::exit_status() const {
  if (state_ == State::saving && !graceful_failed_) return 0;  // the ranks saved; rank 0 said where
  if (stopped()) return 128 + stop_signal_;
  if (!failed_) return 0;
  if (refused_ || failed_status_ == 2) return 2;  // bad input
  return 1;
}

std::string RankWatch::error_message() const {
  if (state_ == State::saving && !graceful_failed_) return "";
  if (stopped())
    return (failed_ ? failure_ + also_crashed_ + "; then " : "") + "stopped by " + signal_name(stop_signal_) +
           " sent to the launcher; " +
           (stopped_ranks_.empty()
                ? "no rank was running"
                : name_ranks(stopped_ranks_) + (stopped_ranks_.size() == 1 ? " was stopped" : " were stopped"));
  if (!failed_) return "";
  if (refused_) return (refused_rank_ == 0 ? "" : "rank " + std::to_string(refused_rank_) + ": ") + refused_->message;
  if (failed_status_ == 2) return "";  // a rank that had no run folder (a run of one rank) said it
  return failure_ + also_crashed_ + "; the run stopped";
}

}  // namespace dplan::cli
