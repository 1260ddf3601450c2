// Checkpoints end to end, through the real binaries (docs/executor.md, "Checkpoints and resume"):
//  - resume is bit-exact: a run that saves at step 3 and goes on to step 6, and a fresh run
//    resuming from that save to step 6, print the same losses bit for bit (fp32 on CPU), for
//    tp/pp/dp layouts with ZeRO 1, 2, 3 and recompute;
//  - resharding: a checkpoint saved under one layout loads into others (tp, pp, dp, ZeRO differ)
//    and the losses stay within 1e-4 of the uninterrupted run;
//  - SIGTERM to dplan run: the ranks finish the step, save, and dplan run exits 0 naming the
//    checkpoint, from which a resume continues; a second signal aborts at once;
//  - faults: a flipped byte in a shard is named (exit 2); a rank killed during a save leaves the
//    previous checkpoint the one a resume takes; torchrun --max-restarts 1 resumes on its own.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "process.h"

namespace {
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using dplan::testing::read_file;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;
using nlohmann::json;
using namespace dplan::testing::executor;

constexpr int kCheckpointSteps = 6, kSaveAt = 3;


std::string step_folder(const fs::path& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return (dir / name).string();
}

// Whether the save of `step` has begun: its hidden folder .step-N.partial-TOKEN, or (done) step-N.
bool save_started(const fs::path& dir, int step) {
  const std::string partial = "." + fs::path(step_folder(dir, step)).filename().string() + ".partial-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind(partial, 0) == 0) return true;
  return fs::exists(step_folder(dir, step));
}

// The table's rows: the losses after the resume point, uninterrupted against resumed.
double print_table(const std::string& what, const std::vector<double>& full, const std::vector<double>& resumed,
                   int first_step) {
  double largest = 0;
  std::printf("%s\n  step  uninterrupted            resumed                  gap\n", what.c_str());
  for (size_t i = 0; i < resumed.size(); ++i) {
    const double a = full.at(first_step + i), b = resumed[i];
    largest = std::max(largest, std::abs(a - b));
    std::printf("  %4zu  %.17g  %.17g  %.3g\n", first_step + i + 1, a, b, std::abs(a - b));
  }
  std::printf("  largest gap %.3g\n", largest);
  return largest;
}

// The cost model's prediction in the plan (prediction.checkpoint, checkpoint_cost.h) against a
// save's measured state bytes (weights, master, moments): the total within 1 %, and within 1 % the
// bytes of each (pp, tp) group of ranks, the ranks that split one model part over dp and cp.
// Per rank the model spreads a sharded optimizer's elements evenly; the executor shards flat
// buckets, so where a shard boundary falls among the tp-replicated parameters (written by tp rank
// 0 only) moves bytes between the dp ranks of tp rank 1 (up to 14 % on gpt-tiny, whose norms and
// biases are a large share); the tests print both.
void check_size_against_plan(const std::string& plan_file, const json& save) {
  const json plan = json::parse(read_file(plan_file));
  const json& predicted = plan["prediction"]["checkpoint"]["rank_bytes"];
  const json& measured = save["state_bytes_by_rank"];
  REQUIRE(predicted.size() == measured.size());
  const json& ranks = plan["rank_layout"]["ranks"];
  REQUIRE(ranks.size() == measured.size());
  std::printf("checkpoint bytes by rank, predicted %s, measured %s\n", predicted.dump().c_str(), measured.dump().c_str());
  std::map<std::pair<int, int>, std::pair<double, double>> groups;  // (pp, tp) -> (predicted, measured)
  double predicted_total = 0, measured_total = 0;
  for (size_t r = 0; r < measured.size(); ++r) {
    const json& at = ranks[r];
    auto& g = groups[{at["pp"].get<int>(), at["tp"].get<int>()}];
    g.first += predicted[r].get<double>();
    g.second += measured[r].get<double>();
    predicted_total += predicted[r].get<double>();
    measured_total += measured[r].get<double>();
  }
  CHECK(std::abs(measured_total / predicted_total - 1) <= 0.01);
  for (const auto& [coordinates, bytes] : groups) {
    INFO("pp " << coordinates.first << " tp " << coordinates.second << ": predicted " << bytes.first
               << " bytes, measured " << bytes.second);
    if (bytes.first == 0) {
      CHECK(bytes.second == 0);
    } else {
      CHECK(std::abs(bytes.second / bytes.first - 1) <= 0.01);
    }
  }
}

}  // namespace

TEST_CASE("resume from a checkpoint is bit-exact for tp pp dp layouts with ZeRO 1 2 3 and recompute",
          "[executor][checkpoint]") {
  TempDir dir;
  // With dropout (attention probabilities, residuals, embeddings), the same masks after the resume
  // only if every rank's generator state came back.
  const std::string dropout = std::string(DPLAN_VALIDATION_DIR) + "/executor/gpt-tiny-dropout/config.json";
  const std::vector<std::tuple<std::string, Layout, std::vector<std::string>>> cases = {
      // tp and dp; pp and dp; the tp 2 x pp 2 save is the resharding test's.
      {"gpt-tiny", {2, 1, 2, "1f1b", false, 1, "selective"}, {"--zero", "1"}},
      {"gpt-tiny", {1, 2, 2}, {"--zero", "2"}},
      {dropout, {1, 1, 2, "1f1b", false, 1, "full"}, {"--zero", "3"}},
  };
  int index = 0;
  for (const auto& [model, layout, flags] : cases) {
    std::string what = layout.describe();
    for (const auto& f : flags) what += " " + f;
    if (model == dropout) what += " (gpt-tiny with dropout 0.1)";
    INFO(what);
    const std::string plan = write_plan(dir, model, layout, 8, flags);
    const fs::path ckpt = dir.path() / ("ckpt" + std::to_string(index++));
    const json full = run_plan_to(plan, (dir.path() / "full.json").string(), kCheckpointSteps,
                             {"--checkpoint-dir", ckpt.string(), "--save-every", std::to_string(kSaveAt)});
    REQUIRE(fs::exists(fs::path(step_folder(ckpt, kSaveAt)) / "manifest.json"));
    check_size_against_plan(plan, full["checkpoints"]["saves"][0]);
    // The full run saved at steps 3 and 6; the newest complete checkpoint is 6: take it away, so
    // the resume starts from step 3.
    fs::remove_all(step_folder(ckpt, kCheckpointSteps));
    const json resumed = run_plan_to(plan, (dir.path() / "resumed.json").string(), kCheckpointSteps, {"--resume", ckpt.string()});
    CHECK(resumed["checkpoints"]["resumed_from"]["step"] == kSaveAt);
    CHECK(resumed["steps"][0]["step"] == kSaveAt);
    const std::vector<double> a = losses(full), b = losses(resumed);
    REQUIRE(a.size() == size_t(kCheckpointSteps));
    REQUIRE(b.size() == size_t(kCheckpointSteps - kSaveAt));
    print_table("resume parity: " + what + " (saved at step 3)", a, b, kSaveAt);
    for (size_t i = 0; i < b.size(); ++i) {
      INFO("step " << kSaveAt + i + 1);
      CHECK(std::memcmp(&a[kSaveAt + i], &b[i], sizeof(double)) == 0);  // bitwise
    }
  }
}

TEST_CASE("a checkpoint saved under one layout resumes under others within 1e-4 of the uninterrupted run",
          "[executor][checkpoint]") {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string source = write_plan(dir, "gpt-tiny", {2, 2, 1}, 8);
  const json full = run_plan_to(source, (dir.path() / "full.json").string(), kCheckpointSteps,
                           {"--checkpoint-dir", ckpt.string(), "--save-every", std::to_string(kSaveAt)});
  // Each unique element once: P x (4 weight + 8 moment) bytes for the plan's P parameters in fp32.
  const json& save = full["checkpoints"]["saves"][0];
  const double num_params = json::parse(read_file(source))["model"]["num_params"].get<double>();
  std::printf("checkpoint of gpt-tiny under tp 2 pp 2 (fp32): state bytes by rank %s = %s; file bytes %s; "
              "blocking %.4f s, write %.4f s\n", save["state_bytes_by_rank"].dump().c_str(), save["state_bytes"].dump().c_str(),
              save["file_bytes"].dump().c_str(), save["blocking_s"].get<double>(), save["write_s"].get<double>());
  CHECK(save["state_bytes"].get<double>() == num_params * 12);
  check_size_against_plan(source, save);
  fs::remove_all(step_folder(ckpt, kCheckpointSteps));  // resume from step 3
  const std::vector<double> a = losses(full);
  for (const auto& [layout, flags] : std::vector<std::pair<Layout, std::vector<std::string>>>{
           {{2, 2, 1}, {}}, {{1, 1, 2}, {"--zero", "3"}}, {{2, 1, 2}, {"--zero", "1"}}, {{1, 2, 1}, {}}}) {
    const bool same = layout.tp == 2 && layout.pp == 2 && layout.dp == 1 && flags.empty();  // bit-exact then
    std::string what = "tp 2 pp 2 dp 1 -> " + layout.describe();
    for (const auto& f : flags) what += " " + f;
    INFO(what);
    const std::string plan = write_plan(dir, "gpt-tiny", layout, 8, flags);
    const json resumed = run_plan_to(plan, (dir.path() / "resumed.json").string(), kCheckpointSteps, {"--resume", ckpt.string()});
    const std::vector<double> b = losses(resumed);
    REQUIRE(b.size() == size_t(kCheckpointSteps - kSaveAt));
    print_table(std::string(same ? "resume parity: " : "resharding parity: ") + what + " (saved at step 3)", a, b, kSaveAt);
    for (size_t i = 0; i < b.size(); ++i) {
      INFO("step " << kSaveAt + i + 1 << ": " << b[i] << " vs " << a[kSaveAt + i]);
      CHECK(std::abs(b[i] - a[kSaveAt + i]) <= kParityTolerance * std::abs(a[kSaveAt + i]));
      if (same) CHECK(std::memcmp(&b[i], &a[kSaveAt + i], sizeof(double)) == 0);
    }
  }
}

namespace {
// A `dplan run` training for good in a process group of its own, stderr to a file; waits until
// rank 0 printed step `ready`.
struct Live {
  pid_t launcher = 0;
  std::string err_path;
};

Live start_live(const TempDir& dir, const std::string& plan, const std::vector<std::string>& extra, int ready = 2,
                const std::string& timeout_s = "20") {
  Live run;
  run.err_path = (dir.path() / "live.err").string();
  fs::remove(run.err_path);
  std::vector<std::string> args = {DPLAN_BINARY, "run", plan, "--steps", "100000", "--timeout-s", timeout_s};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  run.launcher = ::fork();
  REQUIRE(run.launcher >= 0);
  if (run.launcher == 0) {
    ::setpgid(0, 0);
    int fd = ::open(run.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::setenv("DPLAN_PROFILES", DPLAN_PROFILES_DIR, 1);
    ::execv(DPLAN_BINARY, argv.data());
    ::_exit(127);
  }
  ::setpgid(run.launcher, run.launcher);
  const auto started = std::chrono::steady_clock::now();
  const std::string mark = "step " + std::to_string(ready) + "/";
  while (read_file(run.err_path).find(mark) == std::string::npos) {
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(60)) {
      ::kill(-run.launcher, SIGKILL);
      ::waitpid(run.launcher, nullptr, 0);
      FAIL("dplan run did not reach " << mark << " in 60 s:\n" << read_file(run.err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return run;
}

int wait_exit(const Live& run, std::chrono::seconds limit) {
  const auto since = std::chrono::steady_clock::now();
  int wstatus = 0;
  while (::waitpid(run.launcher, &wstatus, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - since > limit) {
      ::kill(-run.launcher, SIGKILL);
      ::waitpid(run.launcher, &wstatus, 0);
      FAIL("dplan run still running " << limit.count() << " s on:\n" << read_file(run.err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return wstatus;
}
}  // namespace

TEST_CASE("SIGTERM to dplan run: the ranks finish the step and save and it exits 0 naming the checkpoint",
          "[executor][checkpoint][signal]") {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string plan = write_plan(dir, "gpt-tiny", {1, 2, 2}, 8);
  {
    Live run = start_live(dir, plan, {"--checkpoint-dir", ckpt.string()});
    REQUIRE(::kill(run.launcher, SIGTERM) == 0);
    const int wstatus = wait_exit(run, std::chrono::seconds(60));
    const std::string err = read_file(run.err_path);
    std::printf("SIGTERM once: exit %d; its last line: %s", WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
                err.substr(err.rfind('\n', err.size() - 2) + 1).c_str());
    INFO(err);
    REQUIRE(WIFEXITED(wstatus));
    REQUIRE(WEXITSTATUS(wstatus) == 0);
    const size_t at = err.find("stopped by SIGTERM after step ");
    REQUIRE(at != std::string::npos);
    const int step = std::stoi(err.substr(at + std::strlen("stopped by SIGTERM after step ")));
    CHECK_THAT(err, Contains("; saved checkpoint " + step_folder(ckpt, step) + "\n"));
    REQUIRE(fs::exists(fs::path(step_folder(ckpt, step)) / "manifest.json"));
    // It resumes from there.
    const json resumed = run_plan_to(plan, (dir.path() / "resumed.json").string(), step + 2, {"--resume", ckpt.string()});
    CHECK(resumed["checkpoints"]["resumed_from"]["step"] == step);
    CHECK(resumed["steps"].size() == 2);
  }
  {
    // A terminal's Ctrl-C: SIGINT to the whole process group. The ranks ignore it; the launcher
    // passes SIGTERM on once.
    Live run = start_live(dir, plan, {"--checkpoint-dir", ckpt.string()});
    REQUIRE(::kill(-run.launcher, SIGINT) == 0);
    const int wstatus = wait_exit(run, std::chrono::seconds(60));
    const std::string err = read_file(run.err_path);
    std::printf("SIGINT to the group: exit %d; its last line: %s", WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
                err.substr(err.rfind('\n', err.size() - 2) + 1).c_str());
    INFO(err);
    REQUIRE(WIFEXITED(wstatus));
    CHECK(WEXITSTATUS(wstatus) == 0);
    CHECK_THAT(err, Contains("; saved checkpoint " + ckpt.string() + "/step-"));
  }
  {
    Live run = start_live(dir, plan, {"--checkpoint-dir", ckpt.string()});
    REQUIRE(::kill(run.launcher, SIGTERM) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(::kill(run.launcher, SIGTERM) == 0);
    const int wstatus = wait_exit(run, std::chrono::seconds(30));
    const std::string err = read_file(run.err_path);
    std::printf("SIGTERM twice: exit %d; its last line: %s", WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
                err.substr(err.rfind('\n', err.size() - 2) + 1).c_str());
    INFO(err);
    REQUIRE(WIFEXITED(wstatus));
    CHECK(WEXITSTATUS(wstatus) == 128 + SIGTERM);
    CHECK_THAT(err, Contains("dplan: error: stopped by SIGTERM sent to the launcher"));
  }
}

TEST_CASE("a flipped byte in a shard is caught by its checksum and named in one line with exit 2",
          "[executor][checkpoint][fault]") {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  // tp 2 of a vocabulary of 259 (padded to 260): the padding row is not written, so the size is the
  // plan's parameter count x 12 bytes here too.
  const std::string model = std::string(DPLAN_VALIDATION_DIR) + "/executor/gpt-tiny-odd-vocab/config.json";
  const std::string plan = write_plan(dir, model, {2, 1, 1}, 8);
  const json run = run_plan_to(plan, (dir.path() / "run.json").string(), 4,
                          {"--checkpoint-dir", ckpt.string(), "--save-every", "2", "--keep", "1"});
  CHECK(run["checkpoints"]["saves"][1]["state_bytes"].get<double>() ==
        json::parse(read_file(plan))["model"]["num_params"].get<double>() * 12);
  CHECK_FALSE(fs::exists(step_folder(ckpt, 2)));  // --keep 1: gone once step 4 was complete
  const std::string shard = (fs::path(step_folder(ckpt, 4)) / "rank-00001.safetensors").string();
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff middle = f.tellg() / 2;
    f.seekg(middle);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(middle);
    f.write(&c, 1);
  }
  Result r = run_program(DPLAN_BINARY, {"run", plan, "--steps", "6", "--quiet", "--resume", ckpt.string()});
  std::printf("flipped byte: exit %d: %s", r.status, r.err.c_str());
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Contains("shard rank-00001.safetensors is damaged"));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("a rank killed during a save leaves the previous checkpoint which the next resume takes",
          "[executor][checkpoint][fault]") {
  // Rank 1 is killed (SIGKILL) inside a save, before it reported its shard; rank 0 cannot write the
  // manifest without its report, so that save stays incomplete and the one before (kept: --keep 2)
  // is what a resume takes.
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string plan = write_plan(dir, "gpt-tiny", {1, 1, 2}, 8);
  Live run = start_live(dir, plan, {"--checkpoint-dir", ckpt.string(), "--save-every", "2"}, 1, "4");
  pid_t rank1 = 0;
  {
    std::string children = read_file("/proc/" + std::to_string(run.launcher) + "/task/" + std::to_string(run.launcher) + "/children");
    std::istringstream pids(children);
    for (pid_t pid; pids >> pid;) {
      const std::string nul(1, '\0');
      if ((nul + read_file("/proc/" + std::to_string(pid) + "/environ")).find(nul + "RANK=1" + nul) != std::string::npos)
        rank1 = pid;
    }
  }
  REQUIRE(rank1 > 0);
  // Catch rank 1 inside a save: when a save's (hidden, partial) folder appears, stop rank 1 (SIGSTOP) and give rank 0
  // 0.8 s (under the launcher's 1.5 s heartbeat limit, so a let-go rank is not taken for dead); no
  // manifest then means rank 1 had not reported its shard, so it is killed there.
  // A save that was already complete (a tiny model saves in milliseconds) is let go (SIGCONT) and
  // the next one is tried, so the test does not depend on winning a race.
  int killed_at = 0;
  for (int step = 4; step <= 40 && killed_at == 0; step += 2) {
    const auto started = std::chrono::steady_clock::now();
    while (!save_started(ckpt, step) && std::chrono::steady_clock::now() - started < std::chrono::seconds(60))
      std::this_thread::yield();
    REQUIRE(save_started(ckpt, step));
    REQUIRE(::kill(rank1, SIGSTOP) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    if (fs::exists(fs::path(step_folder(ckpt, step)) / "manifest.json")) {
      REQUIRE(::kill(rank1, SIGCONT) == 0);
      continue;
    }
    REQUIRE(::kill(rank1, SIGKILL) == 0);
    killed_at = step;
  }
  REQUIRE(killed_at > 0);
  const int wstatus = wait_exit(run, std::chrono::seconds(60));
  const bool manifest_killed = fs::exists(fs::path(step_folder(ckpt, killed_at)) / "manifest.json");
  const int previous = killed_at - 2;
  const std::string err = read_file(run.err_path);
  std::printf("killed during the step-%d save: dplan run exit %d; step-%d manifest %s; step-%d manifest %s; %s", killed_at,
              WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, killed_at, manifest_killed ? "written" : "absent",
              previous, fs::exists(fs::path(step_folder(ckpt, previous)) / "manifest.json") ? "present" : "absent",
              err.find("dplan: error:") == std::string::npos ? "no error line\n" : err.substr(err.find("dplan: error:")).c_str());
  CHECK(WIFEXITED(wstatus));
  CHECK(WEXITSTATUS(wstatus) == 1);
  CHECK_FALSE(manifest_killed);
  REQUIRE(fs::exists(fs::path(step_folder(ckpt, previous)) / "manifest.json"));
  const json resumed = run_plan_to(plan, (dir.path() / "resumed.json").string(), previous + 2, {"--resume", ckpt.string()});
  CHECK(resumed["checkpoints"]["resumed_from"]["step"] == previous);
}

TEST_CASE("torchrun --max-restarts 1 with a rank killed mid-run restarts and resumes from the newest checkpoint",
          "[executor][checkpoint][fault][launch]") {
  std::string torchrun;
  for (const char* d : {"/usr/bin", "/usr/local/bin"})
    if (fs::exists(fs::path(d) / "torchrun")) torchrun = (fs::path(d) / "torchrun").string();
  INFO("torchrun is not installed in /usr/bin or /usr/local/bin (Debian package python3-torch; ./setup.sh --all)");
  REQUIRE(!torchrun.empty());
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string plan = write_plan(dir, "gpt-tiny", {1, 1, 2}, 8);
  constexpr int steps = 10;
  const std::vector<double> uninterrupted = losses(run_plan_to(plan, (dir.path() / "full.json").string(), steps, {}));
  const std::string out = (dir.path() / "torchrun.run.json").string(), err_path = (dir.path() / "torchrun.err").string();
  std::vector<std::string> args = {torchrun, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
                                   "--redirects", "1", "--tee", "1", "--log_dir", (dir.path() / "logs").string(),
                                   "--no_python", DPLAN_WORKER_BINARY, plan, "--steps", std::to_string(steps),
                                   "--timeout-s", "10", "--checkpoint-dir", ckpt.string(), "--save-every", "2",
                                   "-o", out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    ::setpgid(0, 0);
    int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(torchrun.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(agent, agent);
  // Rank 1 of the first attempt, killed once the first checkpoint is complete.
  const auto started = std::chrono::steady_clock::now();
  while (!fs::exists(fs::path(step_folder(ckpt, 2)) / "manifest.json") &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pid_t rank1 = 0;
  const std::string nul(1, '\0');
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string env = nul + read_file(entry.path() / "environ");
    if (env.find(nul + "RANK=1" + nul) != std::string::npos &&
        env.find(nul + "TORCHELASTIC_RESTART_COUNT=0" + nul) != std::string::npos &&
        env.find(nul + "TORCHELASTIC_RUN_ID=") != std::string::npos)
      rank1 = std::stoi(entry.path().filename().string());
  }
  if (rank1 > 0) ::kill(rank1, SIGKILL);
  int wstatus = 0;
  while (::waitpid(agent, &wstatus, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(150)) {
      ::kill(-agent, SIGKILL);
      ::waitpid(agent, &wstatus, 0);
      FAIL("torchrun still running after 150 s:\n" << read_file(err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(read_file(err_path));
  REQUIRE(rank1 > 0);
  REQUIRE(WIFEXITED(wstatus));
  REQUIRE(WEXITSTATUS(wstatus) == 0);
  const json run = json::parse(read_file(out));
  REQUIRE(run["checkpoints"].contains("resumed_from"));
  const int from = run["checkpoints"]["resumed_from"]["step"].get<int>();
  CHECK(from >= 2);
  const std::vector<double> resumed = losses(run);
  REQUIRE(resumed.size() == size_t(steps - from));
  print_table("torchrun restart: rank 1 killed; resumed from step " + std::to_string(from), uninterrupted, resumed, from);
  for (size_t i = 0; i < resumed.size(); ++i) CHECK(std::memcmp(&resumed[i], &uninterrupted[from + i], sizeof(double)) == 0);
}

namespace {
// The shard's safetensors header edited by `edit` (the shape of its first tensor, say), its
// manifest entry's bytes and CRC-32 made to match: damage that a checksum does not catch.
void damage_with_matching_crc(const fs::path& folder, int rank, const std::function<void(json&)>& edit) {
  const fs::path shard = folder / ("rank-0000" + std::to_string(rank) + ".safetensors");
  const std::string bytes = read_file(shard.string());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t m = text.size();
  std::memcpy(out.data(), &m, 8);
  out += text + bytes.substr(8 + n);
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << out;
  json manifest = json::parse(read_file((folder / "manifest.json").string()));
  json& entry = manifest["shards"][rank];
  manifest["file_bytes"] = manifest["file_bytes"].get<int64_t>() - entry["bytes"].get<int64_t>() + int64_t(out.size());
  entry["bytes"] = out.size();
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08lx", ::crc32(0L, reinterpret_cast<const Bytef*>(out.data()), out.size()));
  entry["crc32"] = crc;
  std::ofstream(folder / "manifest.json", std::ios::trunc) << manifest.dump(1);
}
}  // namespace

TEST_CASE("the checkpoint folder is dplan's own: damage and a file are one line and links and a user's folder are left alone",
          "[executor][checkpoint][fault]") {
  TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string model = std::string(DPLAN_VALIDATION_DIR) + "/executor/gpt-tiny-odd-vocab/config.json";
  const std::string plan = write_plan(dir, model, {1, 1, 2}, 4);
  // A user's folder where --keep 1 would have removed an incomplete save, and a link planted where
  // the step-2 save goes, to a folder outside with a file of the shard's name.
  fs::create_directories(ckpt / "step-00000001");
  std::ofstream(ckpt / "step-00000001" / "notes.txt") << "mine";
  fs::create_directories(dir.path() / "victim");
  std::ofstream(dir.path() / "victim" / "rank-00000.safetensors") << "precious";
  fs::create_symlink(dir.path() / "victim", ckpt / "step-00000002");
  run_plan_to(plan, (dir.path() / "run.json").string(), 3,
              {"--checkpoint-dir", ckpt.string(), "--save-every", "2", "--keep", "1"});
  CHECK(read_file((dir.path() / "victim" / "rank-00000.safetensors").string()) == "precious");
  CHECK(fs::is_directory(fs::symlink_status(ckpt / "step-00000002")));  // a folder now, not the link
  CHECK(fs::exists(ckpt / "step-00000002" / "manifest.json"));
  CHECK(read_file((ckpt / "step-00000001" / "notes.txt").string()) == "mine");

  auto one_line = [](const Result& r, const std::string& expected) {
    std::printf("exit %d: %s", r.status, r.err.c_str());
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Contains(expected));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  };
  // Rank 0's shard holds every weight: a shape that the checksum does not catch, on both ranks.
  damage_with_matching_crc(ckpt / "step-00000002", 0, [](json& header) {
    for (auto& [name, info] : header.items())
      if (name != "__metadata__" && name.rfind("weight/", 0) == 0) {
        info["shape"] = {-info["shape"][0].get<int64_t>()};
        break;
      }
  });
  one_line(run_program(DPLAN_BINARY, {"run", plan, "--steps", "4", "--quiet", "--resume", ckpt.string()}),
           "dplan: error: checkpoint " + (ckpt / "step-00000002").string() + ": shard rank-00000.safetensors: safetensors: ");
  std::ofstream(dir.path() / "file") << "x";
  one_line(run_program(DPLAN_BINARY, {"run", plan, "--steps", "2", "--quiet", "--checkpoint-dir",
                                      (dir.path() / "file").string(), "--save-every", "1"}),
           "dplan: error: --checkpoint-dir " + (dir.path() / "file").string() + " is a regular file, not a folder");
}
