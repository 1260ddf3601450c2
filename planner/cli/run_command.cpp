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
#include "hf_checkpoint.h"
#include "rank_watch.h"

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

// The signals that stop a run when the launcher receives them. The ranks share the launcher's
// process group (so that job control, Ctrl-Z and fg, moves the whole run) and start with SIGINT
// and SIGHUP ignored: a Ctrl-C or a hangup from the terminal reaches only the launcher, which
// stops the ranks itself and says why.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

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

// The state letter of a process in /proc/<pid>/stat: 'R' running, 'S' sleeping, 'T' stopped by a
// signal, 'Z' exited but not reaped...; 0 when it cannot be read.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

// The ranks that rank `rank` found silent before it exited (run_dir.h's diagnosis file, from the
// worker's stop_after_failure), other than itself; empty when it named none.
std::set<int> read_diagnosis(const fs::path& dir, int rank, int world) {
  std::ifstream in(executor::diagnosis_file(dir.string(), rank));
  std::set<int> stopped;
  for (int r; in >> r;)
    if (r >= 0 && r < world && r != rank) stopped.insert(r);
  return stopped;
}

// The ranks' processes as the system has them.
class SystemRankProcesses : public RankProcesses {
 public:
  SystemRankProcesses(fs::path run_dir, int world) : run_dir_(std::move(run_dir)), world_(world) {}
  void send(pid_t pid, int sig) override { ::kill(pid, sig); }
  char state(pid_t pid) override { return process_state(pid); }
  std::set<int> silent_peers(int rank) override { return read_diagnosis(run_dir_, rank, world_); }
  std::optional<executor::RankError> refused_input(int rank) override {
    return executor::read_rank_error(run_dir_.string(), rank);
  }

 private:
  fs::path run_dir_;
  int world_;
};

// This process's environment with the rendezvous of `world` local ranks (the rank's own RANK and
// LOCAL_RANK are added per rank).
std::map<std::string, std::string> ranks_environment(int world, const fs::path& run_dir) {
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
  base_env["DPLAN_RUN_DIR"] = run_dir.string();
  base_env["DPLAN_LAUNCHER"] = "dplan";
  base_env["DPLAN_ERROR_PREFIX"] = "dplan";
  return base_env;
}

// Forks and executes every rank of `args` (args[0] the worker) with `base_env` and its rank;
// returns the process of each rank. Throws std::runtime_error, having killed and reaped the ranks
// started, when fork() fails.
std::vector<pid_t> start_ranks(std::vector<std::string>& args, int world,
                               const std::map<std::string, std::string>& base_env) {
  const std::string worker = args.at(0);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pid_of(world, 0);
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = base_env;
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    // The launch time last, taken as late as can be (the rank's start-up is timed from it).
    std::string launched = std::string(executor::kLaunchTimeEnv) + "=" + std::to_string(executor::steady_now_ns());
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(launched.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (int started = 0; started < r; ++started) ::kill(pid_of[started], SIGKILL);
      for (int started = 0; started < r; ++started) ::waitpid(pid_of[started], nullptr, 0);
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
    pid_of[r] = pid;
  }
  return pid_of;
}

}  // namespace

int run_run(const RunOptions& a) {
  // Check what can be checked before starting anything: the plan's shape and the output folder.
  const costmodel::Plan plan = costmodel::read_plan(a.plan_path);
  const int world = plan.parallel.world_size();
  if (!a.output.empty()) check_output_path(a.output, costmodel::run_record_output(), a.force);
  if (const std::string problem = executor::run_options_problem(a); !problem.empty()) throw InputError(problem);
  // The checkpoint's names and shapes against the plan's model, from its headers alone.
  if (!a.init_from.empty()) executor::read_hf_checkpoint(a.init_from, plan.model);
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
  const RunDir run_dir;
  const std::map<std::string, std::string> base_env = ranks_environment(world, run_dir.path());
  const StopSignals stop_signals;
  const std::vector<pid_t> pid_of = start_ranks(args, world, base_env);

  // Watch the ranks until all have exited (rank_watch.h): a SIGINT, SIGTERM or SIGHUP to the
  // launcher stops them; otherwise the first rank that fails (or the rank its peers' heartbeats
  // name) is the cause, and the others get the collective timeout to stop on their own.
  SystemRankProcesses processes(run_dir.path(), world);
  RankWatch watch(pid_of, timeout_s, graceful_stop, processes);
  while (!watch.done()) {
    watch.stop_signal(g_stop_signal, Clock::now());
    watch.second_signal(g_second_signal);
    int wstatus = 0;
    pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
    if (pid > 0) {
      watch.rank_exited(pid, wstatus, g_stop_signal, Clock::now());
      continue;
    }
    watch.tick(Clock::now());
    // 10 ms: a rank's exit is noticed within that (the launcher's exit follows its last rank's).
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (const std::string error = watch.error_message(); !error.empty()) std::cerr << "dplan: error: " << error << "\n";
  return watch.exit_status();
}

}  // namespace dplan::cli
