// The local launcher's watch (planner/cli/rank_watch.h) driven by hand: ranks exiting, stop
// signals and time, with the signals it sends recorded instead of sent.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "rank_watch.h"

namespace {
using Catch::Matchers::Contains;
using dplan::cli::RankProcesses;
using dplan::cli::RankWatch;
using State = RankWatch::State;
using std::chrono::seconds;

// waitpid's status of a process that exited with `code`, or that `sig` killed.
int exited(int code) { return code << 8; }
int killed_by(int sig) { return sig; }

struct RecordedProcesses : RankProcesses {
  std::vector<std::pair<pid_t, int>> sent;
  std::map<int, std::set<int>> diagnosis;
  std::map<pid_t, char> states;
  void send(pid_t pid, int sig) override { sent.push_back({pid, sig}); }
  char state(pid_t pid) override { return states.count(pid) ? states[pid] : 'S'; }
  std::set<int> silent_peers(int rank) override { return diagnosis[rank]; }
  std::map<int, dplan::executor::RankError> refusals;  // the error files the ranks left
  std::optional<dplan::executor::RankError> refused_input(int rank) override {
    if (!refusals.count(rank)) return std::nullopt;
    return refusals.at(rank);
  }
};

const std::vector<pid_t> kPids = {100, 101, 102};  // ranks 0, 1, 2
const RankWatch::Clock::time_point t0{};

}  // namespace

TEST_CASE("the launcher's watch: ranks that all exit 0 end the run with 0 and nothing said", "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  for (pid_t pid : kPids) {
    CHECK_FALSE(watch.done());
    watch.rank_exited(pid, exited(0), 0, t0);
  }
  CHECK(watch.done());
  CHECK(watch.state() == State::running);
  CHECK(watch.exit_status() == 0);
  CHECK(watch.error_message().empty());
  CHECK(procs.sent.empty());
}

TEST_CASE("the launcher's watch: the first rank to die is named, the rest are killed after the timeout + 10 s",
          "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(101, killed_by(SIGKILL), 0, t0);
  CHECK(watch.state() == State::failing);
  watch.tick(t0 + seconds(70));  // the deadline itself: not past it
  CHECK(procs.sent.empty());
  watch.tick(t0 + seconds(71));
  CHECK(procs.sent == std::vector<std::pair<pid_t, int>>{{100, SIGKILL}, {102, SIGKILL}});
  // Killed by the launcher: not named as crashed.
  watch.rank_exited(100, killed_by(SIGKILL), 0, t0 + seconds(71));
  watch.rank_exited(102, killed_by(SIGKILL), 0, t0 + seconds(71));
  CHECK(watch.done());
  CHECK(watch.exit_status() == 1);
  CHECK(watch.error_message() == "rank 1 (pid 101) was killed by signal 9 (" + std::string(strsignal(SIGKILL)) +
                                     "); ranks still running after the timeout were killed; the run stopped");
}

TEST_CASE("the launcher's watch: a rank crashing after the first failure is named too, one exiting is not", "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(100, exited(1), 0, t0);
  watch.rank_exited(101, exited(1), 0, t0);
  watch.rank_exited(102, killed_by(SIGSEGV), 0, t0);
  CHECK(watch.exit_status() == 1);
  CHECK(watch.error_message() == "rank 0 (pid 100) exited with status 1; rank 2 then was killed by signal 11 (" +
                                     std::string(strsignal(SIGSEGV)) + "); the run stopped");
}

TEST_CASE("the launcher's watch: bad input (a rank exits 2) ends the run with 2, rank 0 having said why", "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  for (pid_t pid : kPids) watch.rank_exited(pid, exited(2), 0, t0);
  CHECK(watch.exit_status() == 2);
  CHECK(watch.error_message().empty());
}

TEST_CASE("the launcher's watch: the rank the heartbeats name as silent is blamed and killed at once", "[cli]") {
  RecordedProcesses procs;
  procs.diagnosis[0] = {2};
  procs.states[102] = 'T';
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(100, exited(1), 0, t0);
  CHECK(procs.sent == std::vector<std::pair<pid_t, int>>{{102, SIGKILL}});
  watch.rank_exited(102, killed_by(SIGKILL), 0, t0);
  watch.rank_exited(101, exited(1), 0, t0);
  CHECK(watch.exit_status() == 1);
  CHECK(watch.error_message() ==
        "rank 2 (pid 102) stopped making progress (no heartbeat: rank 0 found it silent when its collective failed, "
        "and exited with status 1); rank 2 was in state T (stopped by a signal); the launcher killed rank 2; the run "
        "stopped");
}

TEST_CASE("the launcher's watch: a stop signal sends SIGTERM and SIGCONT, kills 5 s later, ends 128 + signal",
          "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(100, exited(0), 0, t0);
  watch.stop_signal(SIGTERM, t0);
  CHECK(watch.state() == State::stopping);
  CHECK(procs.sent ==
        std::vector<std::pair<pid_t, int>>{{101, SIGTERM}, {101, SIGCONT}, {102, SIGTERM}, {102, SIGCONT}});
  watch.stop_signal(SIGTERM, t0);  // the same signal seen again: nothing more
  watch.second_signal(SIGINT);     // a second signal matters only while the ranks save
  CHECK(procs.sent.size() == 4);
  watch.rank_exited(101, killed_by(SIGTERM), 0, t0 + seconds(1));
  watch.tick(t0 + seconds(6));
  CHECK(procs.sent.back() == std::pair<pid_t, int>{102, SIGKILL});
  watch.rank_exited(102, killed_by(SIGKILL), 0, t0 + seconds(6));
  CHECK(watch.exit_status() == 128 + SIGTERM);
  CHECK(watch.error_message() == "stopped by SIGTERM sent to the launcher; ranks 1-2 were stopped");
}

TEST_CASE("the launcher's watch: a signal that comes while a failed rank is reaped counts that rank as stopped",
          "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(102, exited(1), SIGINT, t0);
  CHECK(watch.state() == State::stopping);
  watch.rank_exited(100, killed_by(SIGTERM), 0, t0);
  watch.rank_exited(101, killed_by(SIGTERM), 0, t0);
  CHECK(watch.exit_status() == 128 + SIGINT);
  CHECK(watch.error_message() == "stopped by SIGINT sent to the launcher; ranks 0-2 were stopped");
}

TEST_CASE("the launcher's watch: a failure then a stop signal names both", "[cli]") {
  RecordedProcesses procs;
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(101, exited(3), 0, t0);
  watch.stop_signal(SIGHUP, t0);
  watch.rank_exited(100, killed_by(SIGTERM), 0, t0);
  watch.rank_exited(102, killed_by(SIGTERM), 0, t0);
  CHECK(watch.exit_status() == 128 + SIGHUP);
  CHECK(watch.error_message() ==
        "rank 1 (pid 101) exited with status 3; then stopped by SIGHUP sent to the launcher; ranks 0, 2 were stopped");
}

TEST_CASE("the launcher's watch: with checkpoints a stop lets the ranks save; a second signal kills them", "[cli]") {
  RecordedProcesses procs;
  SECTION("every rank saves and exits 0: the run ends 0") {
    RankWatch watch(kPids, 60, true, procs);
    watch.stop_signal(SIGINT, t0);
    CHECK(watch.state() == State::saving);
    watch.tick(t0 + seconds(150));  // 2 * 60 + 30 s to save
    CHECK(procs.sent.size() == 6);
    for (pid_t pid : kPids) watch.rank_exited(pid, exited(0), 0, t0 + seconds(150));
    CHECK(watch.exit_status() == 0);
    CHECK(watch.error_message().empty());
  }
  SECTION("past 2 timeout + 30 s the ranks are killed") {
    RankWatch watch(kPids, 60, true, procs);
    watch.stop_signal(SIGINT, t0);
    watch.tick(t0 + seconds(151));
    CHECK(procs.sent.back() == std::pair<pid_t, int>{102, SIGKILL});
    for (pid_t pid : kPids) watch.rank_exited(pid, killed_by(SIGKILL), 0, t0 + seconds(151));
    CHECK(watch.exit_status() == 128 + SIGINT);
  }
  SECTION("a second signal kills them at once") {
    RankWatch watch(kPids, 60, true, procs);
    watch.stop_signal(SIGINT, t0);
    watch.rank_exited(100, exited(0), 0, t0);
    watch.second_signal(SIGTERM);
    CHECK(watch.state() == State::stopping);
    CHECK(procs.sent.back() == std::pair<pid_t, int>{102, SIGKILL});
    watch.rank_exited(101, killed_by(SIGKILL), 0, t0);
    watch.rank_exited(102, killed_by(SIGKILL), 0, t0);
    CHECK(watch.exit_status() == 128 + SIGTERM);
    CHECK(watch.error_message() == "stopped by SIGTERM sent to the launcher; ranks 0-2 were stopped");
  }
  SECTION("a rank that fails to save makes the stop an error") {
    RankWatch watch(kPids, 60, true, procs);
    watch.stop_signal(SIGTERM, t0);
    watch.rank_exited(100, exited(0), 0, t0);
    watch.rank_exited(101, exited(1), 0, t0);
    watch.rank_exited(102, exited(0), 0, t0);
    CHECK(watch.exit_status() == 128 + SIGTERM);
    CHECK_THAT(watch.error_message(), Contains("stopped by SIGTERM"));
  }
}

TEST_CASE("the launcher's watch: input a rank other than 0 refused is said, named by rank, exit 2", "[cli]") {
  RecordedProcesses procs;
  procs.refusals[1] = {1000, "ckpt/step-00000002/rank-00001.safetensors: tensor \"w\" has shape [3], the manifest says [4]"};
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(101, exited(2), 0, t0);  // rank 0 is still checking checksums
  CHECK(watch.state() == State::failing);
  watch.rank_exited(100, exited(1), 0, t0 + seconds(60));  // its collective timed out
  watch.rank_exited(102, exited(1), 0, t0 + seconds(60));
  CHECK(watch.exit_status() == 2);
  CHECK(watch.error_message() ==
        "rank 1: ckpt/step-00000002/rank-00001.safetensors: tensor \"w\" has shape [3], the manifest says [4]");
}

TEST_CASE("the launcher's watch: the refusal is the cause even when a survivor blamed the refusing rank's heartbeat",
          "[cli]") {
  RecordedProcesses procs;
  procs.diagnosis[0] = {2};  // rank 0 found rank 2 silent: it had left
  procs.refusals[2] = {500, "plan.json: /parallel/tp: expected 2"};
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(100, exited(1), 0, t0);
  watch.rank_exited(102, exited(2), 0, t0);
  watch.rank_exited(101, exited(1), 0, t0);
  CHECK(watch.exit_status() == 2);
  CHECK(watch.error_message() == "rank 2: plan.json: /parallel/tp: expected 2");
}

TEST_CASE("the launcher's watch: of several refusals the earliest is said once, rank 0's without a rank", "[cli]") {
  RecordedProcesses procs;
  procs.refusals[0] = {100, "plan.json: bad"};
  procs.refusals[1] = {200, "plan.json: bad"};
  procs.refusals[2] = {300, "plan.json: bad"};
  RankWatch watch(kPids, 60, false, procs);
  watch.rank_exited(102, exited(2), 0, t0);  // reaped first, refused last
  watch.rank_exited(101, exited(2), 0, t0);
  watch.rank_exited(100, exited(2), 0, t0);
  CHECK(watch.exit_status() == 2);
  CHECK(watch.error_message() == "plan.json: bad");
}

TEST_CASE("the run folder's error file: written whole, read back, absent or garbled reads as none", "[cli]") {
  const std::string dir = std::filesystem::temp_directory_path() / ("dplan-run-dir-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  CHECK_FALSE(dplan::executor::read_rank_error(dir, 3));
  const long long before = dplan::executor::steady_now_ns();
  dplan::executor::write_rank_error(dir, 3, "plan.json: /gpus: expected 8");
  const std::optional<dplan::executor::RankError> e = dplan::executor::read_rank_error(dir, 3);
  REQUIRE(e);
  CHECK(e->message == "plan.json: /gpus: expected 8");
  CHECK(e->at_ns >= before);
  CHECK_FALSE(std::filesystem::exists(dplan::executor::error_file(dir, 3) + ".tmp"));
  std::ofstream(dplan::executor::error_file(dir, 4)) << "not a time\n";
  CHECK_FALSE(dplan::executor::read_rank_error(dir, 4));
  std::filesystem::remove_all(dir);
}
