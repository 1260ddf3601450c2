#include "run_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/costmodel/training.h"

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

// A free TCP port on loopback for the rendezvous store (the kernel picks one; we let it go and
// rank 0 binds it a moment later).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket(): " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free loopback port: " + std::string(std::strerror(errno)));
  }
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string describe_exit(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
}

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int sig) { g_interrupted = sig; }

}  // namespace

int run_run(const RunOptions& a) {
  // Check what can be checked before starting anything: the plan's shape and the output folder.
  const int world = costmodel::read_plan(a.plan_path).parallel.world_size();
  if (!a.output.empty()) check_output_path(a.output, costmodel::run_record_output(), a.force);
  if (const std::string problem = executor::run_options_problem(a); !problem.empty()) throw InputError(problem);
  const std::string worker = find_worker();

  std::vector<std::string> args = {worker, a.plan_path};
  const std::vector<std::string> flags = executor::run_flags_argv(a);
  args.insert(args.end(), flags.begin(), flags.end());
  return launch_local_ranks(args, world, a.timeout_s);
}

int launch_local_ranks(std::vector<std::string> args, int world, double timeout_s) {
  const std::string worker = args.at(0);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const int port = free_port();
  std::map<std::string, std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) base_env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  base_env["WORLD_SIZE"] = std::to_string(world);
  base_env["LOCAL_WORLD_SIZE"] = std::to_string(world);
  base_env["MASTER_ADDR"] = "127.0.0.1";
  base_env["MASTER_PORT"] = std::to_string(port);
  base_env["DPLAN_LAUNCHER"] = "dplan";
  base_env["DPLAN_ERROR_PREFIX"] = "dplan";

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::map<pid_t, int> rank_of;
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
    if (pid < 0) throw std::runtime_error("fork(): " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::execve(worker.c_str(), argv.data(), envp.data());
      std::fprintf(stderr, "dplan: error: cannot start %s: %s\n", worker.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    rank_of[pid] = r;
  }

  // Watch the ranks. The first that fails is the cause; the others get the collective timeout
  // (plus a margin) to notice and stop on their own, then they are killed.
  int failed_rank = -1, failed_status = 0;
  std::string failure, also_crashed;
  bool we_killed_them = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!rank_of.empty()) {
    int wstatus = 0;
    pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
    if (pid > 0) {
      int r = rank_of[pid];
      rank_of.erase(pid);
      bool ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
      if (!ok && failed_rank < 0) {
        failed_rank = r;
        failed_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        failure = "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") " + describe_exit(wstatus);
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>((timeout_s + 10) * 1000));
      } else if (WIFSIGNALED(wstatus) && !we_killed_them) {
        // A survivor that crashed in the cascade (rather than stopping with its own error line) is
        // named too: its peers will have seen its heartbeat stop as well.
        also_crashed += "; rank " + std::to_string(r) + " then " + describe_exit(wstatus);
      }
      continue;
    }
    if (g_interrupted && failed_rank < 0) {
      failed_rank = -2;
      failure = std::string("interrupted by ") + strsignal(g_interrupted);
      for (const auto& [p, r] : rank_of) ::kill(p, SIGTERM);
      we_killed_them = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (const auto& [p, r] : rank_of) ::kill(p, SIGKILL);
      we_killed_them = true;
      deadline = std::chrono::steady_clock::time_point::max();
      failure += "; ranks still running after the timeout were killed";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (failed_rank == -1) return 0;
  if (failed_status == 2) return 2;  // bad input: rank 0 has said what, as dplan's own error
  std::cerr << "dplan: error: " << failure << also_crashed << "; the run stopped\n";
  return 1;
}

}  // namespace dplan::cli
