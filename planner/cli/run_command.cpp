#include "run_command.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/costmodel/training.h"
#include "dplan/planner/profiles.h"
#include "dplan/planner/report.h"

extern char** environ;

namespace dplan::cli {
namespace fs = std::filesystem;

void add_run_options(CLI::App& command, RunOptions& a) {
  command.add_option("plan", a.plan_path, "plan.json written by dplan -o")->required();
  executor::add_run_flags(command, a);
}

// dplan-worker beside this binary, or $DPLAN_WORKER.
std::string find_worker() {
  if (const char* w = std::getenv("DPLAN_WORKER"); w && *w) return w;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  fs::path worker = self.parent_path() / "dplan-worker";
  if (!ec && fs::exists(worker)) return worker.string();
  throw InputError("this needs the executor (dplan-worker), which is not built yet: ./setup.sh --all installs "
                   "LibTorch (libtorch-dev, libgloo-dev) and builds it beside dplan");
}

namespace {

using Clock = std::chrono::steady_clock;

// The private folder of one local run (mode 0700, from mkdtemp), removed with what is in it at
// scope exit: the ranks' rendezvous store (a c10d FileStore, so that no port is opened) and their
// diagnoses. It outlives the ranks: the launcher leaves this scope only after reaping them all.
class RunDir {
 public:
  RunDir() {
    std::string pattern = (fs::temp_directory_path() / "dplan-run-XXXXXX").string();
    if (!::mkdtemp(pattern.data()))
      throw std::runtime_error("cannot create a private folder for the run's rendezvous in " +
                               fs::temp_directory_path().string() + ": " + std::strerror(errno));
    path_ = pattern;
  }
  ~RunDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string describe_exit(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
}

// The signals that stop a run when the launcher receives them. The ranks share the launcher's
// process group (so that job control, Ctrl-Z and fg, moves the whole run) and start with SIGINT
// and SIGHUP ignored: a Ctrl-C or a hangup from the terminal reaches only the launcher, which
// stops the ranks itself and says why.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_second_signal = 0;  // a signal after the first
void on_stop_signal(int sig) {
  if (!g_stop_signal)
    g_stop_signal = sig;
  else
    g_second_signal = sig;
}

// Installs on_stop_signal for kStopSignals, except those this process was started ignoring (nohup,
// a background job of a non-interactive shell), and puts the previous handlers back at scope exit.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    g_second_signal = 0;
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      sigaction(kStopSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler == SIG_IGN) continue;
      struct sigaction sa {};
      sa.sa_handler = on_stop_signal;
      sigemptyset(&sa.sa_mask);
      sigaction(kStopSignals[i], &sa, nullptr);
    }
  }
  ~StopSignals() {
    for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_[std::size(kStopSignals)];
};

// "rank 2", "ranks 0-3", "ranks 0, 2-3".
std::string name_ranks(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int first = *it, last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    out += (out.empty() ? "" : ", ") + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "");
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

// The state letter of a process in /proc/<pid>/stat: 'R' running, 'S' sleeping, 'T' stopped by a
// signal, 'Z' exited but not reaped...; 0 when it cannot be read.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

// The ranks that rank `rank` found silent before it exited (DPLAN_RUN_DIR/diagnosis.<rank>, from
// the worker's stop_after_failure), other than itself; empty when it named none.
std::set<int> read_diagnosis(const fs::path& dir, int rank, int world) {
  std::ifstream in(dir / ("diagnosis." + std::to_string(rank)));
  std::set<int> stopped;
  for (int r; in >> r;)
    if (r >= 0 && r < world && r != rank) stopped.insert(r);
  return stopped;
}

}  // namespace

int run_run(const RunOptions& a) {
  // Check what can be checked before starting anything: the plan's shape and the output folder.
  const costmodel::Plan plan = costmodel::read_plan(a.plan_path);
  const int world = plan.parallel.world_size();
  if (!a.output.empty()) check_output_path(a.output, costmodel::run_record_output(), a.force);
  if (const std::string problem = executor::run_options_problem(a); !problem.empty()) throw InputError(problem);
  const std::string worker = find_worker();
  // Before the ranks start (dplan scale says it for all its runs). On stdout: stderr is the ranks'
  // progress and, for input a rank refuses, its one error line.
  if (!a.quiet) {
    std::cout << planner::expected_run_time(plan.prediction.value("step_time_s", 0.0), a.steps) << "\n";
    if (const std::string note = planner::unprobed_profile_note(plan.cluster); !note.empty())
      std::cout << "! " << note << "\n";
    std::cout << std::flush;
  }

  std::vector<std::string> args = {worker, a.plan_path};
  const std::vector<std::string> flags = executor::run_flags_argv(a);
  args.insert(args.end(), flags.begin(), flags.end());
  return launch_local_ranks(args, world, a.timeout_s, !a.checkpoint_dir.empty());
}

int launch_local_ranks(std::vector<std::string> args, int world, double timeout_s, bool graceful_stop) {
  const std::string worker = args.at(0);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const RunDir run_dir;
  std::map<std::string, std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) base_env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  base_env["WORLD_SIZE"] = std::to_string(world);
  base_env["LOCAL_WORLD_SIZE"] = std::to_string(world);
  base_env["MASTER_ADDR"] = "127.0.0.1";  // Gloo listens there (one machine); the store is a file
  base_env.erase("MASTER_PORT");
  base_env["DPLAN_RUN_DIR"] = run_dir.path().string();
  base_env["DPLAN_LAUNCHER"] = "dplan";
  base_env["DPLAN_ERROR_PREFIX"] = "dplan";

  const StopSignals stop_signals;
  const pid_t launcher = ::getpid();
  std::map<pid_t, int> rank_of;
  std::vector<pid_t> pid_of(world, 0);
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = base_env;
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (const auto& [p, rank] : rank_of) ::kill(p, SIGKILL);
      for (const auto& [p, rank] : rank_of) ::waitpid(p, nullptr, 0);
      throw std::runtime_error("fork(): " + why);
    }
    if (pid == 0) {
      // The rank dies with the launcher, however the launcher ends (SIGKILL included): the kernel
      // sends it SIGKILL when the thread that forked it exits. If the launcher died before this
      // line, getppid() already names another process: go now.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(128 + SIGKILL);
      ::signal(SIGINT, SIG_IGN);  // the terminal's Ctrl-C and hangup are the launcher's to handle
      ::signal(SIGHUP, SIG_IGN);
      ::execve(worker.c_str(), argv.data(), envp.data());
      std::fprintf(stderr, "dplan: error: cannot start %s: %s\n", worker.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    rank_of[pid] = r;
    pid_of[r] = pid;
  }

  // Watch the ranks until all have exited.
  //  - A SIGINT, SIGTERM or SIGHUP to the launcher stops them (SIGTERM, then SIGKILL 5 s later);
  //    whatever they do after that is the stop's doing, not theirs, and the run ends 128 + signal.
  //  - Otherwise the first rank that fails is the cause, with one exception below; the others get
  //    the collective timeout (plus a margin) to notice and stop on their own, then are killed.
  //  - Who is to blame when the first rank to fail merely exited non-zero: a rank that stalls (is
  //    stopped, or hangs with its heartbeat thread) makes its peers' next collective time out, and
  //    the first of them to exit is not the culprit. A survivor names the peers that stopped
  //    beating in the store (heartbeat.h: six of its own beats without a beat of theirs, the same
  //    finding for every survivor) and leaves their numbers in DPLAN_RUN_DIR/diagnosis.<rank>
  //    before it exits; the launcher reads that file of the first rank it reaps, so it names what
  //    the ranks' heartbeats say rather than who happened to exit first. A rank so named is not
  //    beating and its peers are leaving, so it cannot finish: the launcher kills it now instead of
  //    after the timeout. Its /proc state only adds detail ('T': stopped by a signal).
  std::string failure, also_crashed;
  int failed_status = 0;
  bool failed = false;
  int stop_signal = 0;
  std::set<int> stopped_ranks;   // the ranks still running when the launcher got its signal
  std::set<pid_t> killed_by_us;  // not named as having crashed when they are reaped
  auto deadline = Clock::time_point::max();
  // Graceful: the ranks finish their step, save and exit 0 on their own; the launcher waits for
  // that (at most the collective timeout and a margin for the save) unless a second signal comes.
  bool graceful = false;
  auto begin_stop = [&] {
    stop_signal = g_stop_signal;
    graceful = graceful_stop;
    for (const auto& [p, r] : rank_of) {
      ::kill(p, SIGTERM);
      ::kill(p, SIGCONT);  // a stopped rank acts on its SIGTERM only once it runs
      stopped_ranks.insert(r);
      if (!graceful) killed_by_us.insert(p);
    }
    const auto grace = graceful ? std::chrono::milliseconds(static_cast<int64_t>((2 * timeout_s + 30) * 1000))
                                : std::chrono::milliseconds(5000);
    deadline = std::min(deadline, Clock::now() + grace);
  };
  bool graceful_failed = false;  // a rank did not exit 0 after a graceful stop
  while (!rank_of.empty()) {
    if (g_stop_signal && !stop_signal) begin_stop();
    if (graceful && g_second_signal) {  // a second signal: no more waiting
      for (const auto& [p, r] : rank_of) {
        ::kill(p, SIGKILL);
        killed_by_us.insert(p);
      }
      graceful = false;
      stop_signal = g_second_signal;
    }
    int wstatus = 0;
    pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
    if (pid > 0) {
      const int r = rank_of.at(pid);
      rank_of.erase(pid);
      const bool ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
      if (g_stop_signal && !stop_signal) {  // it came while waitpid returned: this rank went with it
        begin_stop();
        if (!ok) stopped_ranks.insert(r);
      }
      if (graceful && !ok) graceful_failed = true;
      if (stop_signal || ok) continue;
      const bool ours = killed_by_us.count(pid) > 0;
      if (!failed) {
        failed = true;
        failed_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>((timeout_s + 10) * 1000));
        const std::set<int> silent = WIFEXITED(wstatus) ? read_diagnosis(run_dir.path(), r, world) : std::set<int>{};
        if (silent.empty()) {
          failure = "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") " + describe_exit(wstatus);
          continue;
        }
        std::string names, detail;
        std::set<int> killed;
        for (int s : silent) {
          names += (names.empty() ? "" : ", ") + std::to_string(s) + " (pid " + std::to_string(pid_of[s]) + ")";
          if (!rank_of.count(pid_of[s])) continue;  // already gone
          if (process_state(pid_of[s]) == 'T')
            detail += "; rank " + std::to_string(s) + " was in state T (stopped by a signal)";
          ::kill(pid_of[s], SIGKILL);
          killed_by_us.insert(pid_of[s]);
          killed.insert(s);
        }
        failure = (silent.size() == 1 ? "rank " : "ranks ") + names + " stopped making progress (no heartbeat: rank " +
                  std::to_string(r) + " found " + (silent.size() == 1 ? "it" : "them") +
                  " silent when its collective failed, and " + describe_exit(wstatus) + ")" + detail +
                  (killed.empty() ? "" : "; the launcher killed " + name_ranks(killed));
      } else if (WIFSIGNALED(wstatus) && !ours) {
        // A survivor that crashed in the cascade (rather than stopping with its own error line) is
        // named too: its peers will have seen its heartbeat stop as well.
        also_crashed += "; rank " + std::to_string(r) + " then " + describe_exit(wstatus);
      }
      continue;
    }
    if (Clock::now() > deadline) {
      for (const auto& [p, r] : rank_of) {
        ::kill(p, SIGKILL);
        killed_by_us.insert(p);
      }
      deadline = Clock::time_point::max();
      if (!stop_signal) failure += "; ranks still running after the timeout were killed";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (stop_signal && graceful && !graceful_failed) return 0;  // the ranks saved; rank 0 said where
  if (stop_signal) {
    std::cerr << "dplan: error: " << (failed ? failure + also_crashed + "; then " : "") << "stopped by "
              << signal_name(stop_signal) << " sent to the launcher; "
              << (stopped_ranks.empty() ? "no rank was running"
                                        : name_ranks(stopped_ranks) +
                                              (stopped_ranks.size() == 1 ? " was stopped" : " were stopped"))
              << "\n";
    return 128 + stop_signal;
  }
  if (!failed) return 0;
  if (failed_status == 2) return 2;  // bad input: rank 0 has said what, as dplan's own error
  std::cerr << "dplan: error: " << failure << also_crashed << "; the run stopped\n";
  return 1;
}

}  // namespace dplan::cli
