// Hostile input at the readers and writers (costmodel/json_io.h and every format's strict reader):
// no input loops, overflows, blocks, wraps an integer or echoes a raw control character, and no
// output lands on an input, through a link or on a file dplan did not write. Each case is one of
// the failures found by trying dplan as a hostile user would, kept so it does not come back.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/pipeline.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"
#include "dplan/costmodel/time.h"
#include "dplan/costmodel/training.h"
#include "input_errors.h"
#include "process.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using dplan::testing::TempDir;
namespace fs = std::filesystem;

namespace {

using dplan::testing::one_line_error;

json load(const std::string& path) { return json::parse(testing::read_file(path)); }

const std::string kPlan = std::string(DPLAN_VALIDATION_DIR) + "/compare/plan.json";
const std::string kRun = std::string(DPLAN_VALIDATION_DIR) + "/compare/run.json";
const std::string kCluster = std::string(DPLAN_PROFILES_DIR) + "/clusters/local-cpu.json";

std::vector<std::string> temporaries_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) names.push_back(e.path().string());
  return names;
}

}  // namespace

TEST_CASE("JSON: a key given twice in one object is an error naming it and where", "[limits]") {
  CHECK(one_line_error([] { parse_json_text(R"({"a": 1, "a": 2})", "x.json"); }) ==
        "x.json: /: key \"a\" appears twice in one object");
  CHECK(one_line_error([] { parse_json_text(R"({"gpu": {"m": {"k": 1, "k": 1}}})", "x.json"); }) ==
        "x.json: /gpu/m: key \"k\" appears twice in one object");
  // The same key in two different objects is fine.
  CHECK_NOTHROW(parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})", "x.json"));
}

TEST_CASE("JSON: a number beyond double's range is an input error naming the file, not an internal one", "[limits]") {
  for (const char* text : {R"({"x": 1e400})", R"({"x": -1e400})", R"([1e99999])"}) {
    INFO(text);
    CHECK_THAT(one_line_error([&] { parse_json_text(text, "big.json"); }),
               StartsWith("big.json: malformed JSON: number overflow"));
  }
}

TEST_CASE("JSON: nesting deeper than the bound is refused before it is built", "[limits]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(one_line_error([&] { parse_json_text(deep, "deep.json"); }), Contains("nested deeper than 64 levels"));
  const std::string fine = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  CHECK_NOTHROW(parse_json_text(fine, "ok.json"));
}

TEST_CASE("Error text: values are escaped and shortened, lines bounded", "[limits]") {
  CHECK(quote_for_message("a\nb\x1b[31mc\td") == "a\\nb\\x1b[31mc\\td");
  CHECK(quote_for_message(std::string(500, 'x')).size() == 83);  // 80 and "..."
  CHECK(quote_for_message("caf\xc3\xa9") == "caf\\xc3\\xa9");
  const std::string line = error_line("file: " + std::string(200000, 'y') + "\n\x1b[2J");
  CHECK(line.size() <= kMaxErrorLineChars + 3);
  CHECK(line.find('\n') == std::string::npos);
  CHECK(line.find('\x1b') == std::string::npos);
  // A string value read from a file: echoed escaped and short.
  const json j = {{"format_version", 1}, {"gpu", {{"name", "evil\n\x1b[31m" + std::string(1000, 'z')}}}};
  const std::string msg = one_line_error([&] { gpu_from_json(j, "g.json"); });
  CHECK_THAT(msg, Contains("g.json: /gpu/name: expected a string of at most 4096 bytes without control characters"));
  CHECK_THAT(msg, Contains("\\n\\x1b[31m"));
  CHECK(msg.size() < 300);
}

TEST_CASE("Inputs: a FIFO, a folder and a device are refused without blocking; a missing file is named", "[limits]") {
  TempDir dir;
  const std::string fifo = (dir.path() / "pipe.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever opens the FIFO: reading it would block forever.
  CHECK(one_line_error([&] { read_json_file(fifo); }) == fifo + ": is a FIFO (named pipe), expected a regular file");
  CHECK(one_line_error([&] { read_json_file(dir.path().string()); }) == dir.path().string() + ": is a folder, expected a file");
  CHECK(one_line_error([] { read_text_file("/dev/zero"); }) == "/dev/zero: is a character device, expected a regular file");
  CHECK(one_line_error([&] { read_text_file((dir.path() / "none.json").string()); }) ==
        (dir.path() / "none.json").string() + ": no such file");
}

TEST_CASE("Numbers: subnormal, infinite and out-of-range figures in a profile are refused with the range", "[limits]") {
  for (const auto& [key, value] : std::vector<std::pair<std::string, double>>{
           {"gbytes_per_s", 5e-324}, {"gbytes_per_s", 1e-320}, {"efficiency", 1e-320}, {"latency_us", 1e300}}) {
    json j = load(kCluster);
    j["cluster"]["intra_node"][key] = value;
    INFO(key << " = " << value);
    const std::string msg = one_line_error([&] { cluster_from_json(j, "c.json", [](const std::string&) { return GpuSpec{}; }); });
    CHECK_THAT(msg, StartsWith("c.json: /cluster/intra_node/" + key + ": expected a number from "));
  }
}

TEST_CASE("Numbers: the smallest figures a profile accepts still give a finite step time, played out", "[limits]") {
  // The denormal bandwidth that used to send the pipeline play-out into an endless loop is refused
  // above; what is left at the bottom of every range must still make finite, ordered times.
  json j = load(kCluster);
  for (const char* tier : {"intra_node", "inter_node"}) j["cluster"][tier]["efficiency"] = 0.001;
  j["cluster"]["intra_node"]["gbytes_per_s"] = 0.001;
  j["cluster"]["inter_node"]["nic_gbits_per_s"] = 0.001;
  j["cluster"]["intra_node"].erase("measured");  // the fitted link, not a measured table
  j["cluster"]["intra_node"].erase("measured_scale");
  const ClusterSpec cluster = cluster_from_json(j, "c.json", [](const std::string& g) { return testing::store().load_gpu(g); });
  const ModelSpec model = testing::store().load_model("gpt-tiny");
  TrainingSpec t;
  t.seq_len = 128;
  t.global_batch = 16;
  ParallelConfig p;
  p.tp = 2, p.pp = 2, p.dp = 2;
  validate(model, cluster, t, p, 8);
  const Network net(cluster, 8);
  const MemoryEstimate mem = estimate_memory(model, cluster, t, p);
  const TimeBreakdown time = estimate_time(model, net, t, p, mem, OverlapOptions{});
  CHECK(std::isfinite(time.step_time_s));
  CHECK(time.step_time_s > 1.0);  // a 1 MB/s link: seconds, not microseconds
}

TEST_CASE("Integers: sizes beyond int are refused, never narrowed", "[limits]") {
  for (long long dp : {2147483648LL, 4294967298LL, 1LL << 40}) {
    json j = load(kPlan);
    j["parallel"]["dp"] = dp;
    INFO("dp " << dp);
    CHECK(one_line_error([&] { plan_from_json(j, "plan.json"); }) ==
          "plan.json: /parallel/dp: expected an integer from 1 to 1048576, got " + std::to_string(dp));
  }
  json j = load(kPlan);
  j["parallel"]["dp"] = 18446744073709551615ULL;
  CHECK_THAT(one_line_error([&] { plan_from_json(j, "plan.json"); }), Contains("/parallel/dp: expected an integer from 1"));
  // Each size within its bound, their product not: refused, not overflowed.
  j = load(kPlan);
  for (const char* key : {"tp", "pp", "dp", "cp"}) j["parallel"][key] = 1 << 20;
  CHECK_THAT(one_line_error([&] { plan_from_json(j, "plan.json"); }),
             Contains("sizes whose product tp*pp*dp*cp is at most 1048576"));
  // A plan whose GPU count disagrees with its layout.
  j = load(kPlan);
  j["gpus"] = 4;
  CHECK(one_line_error([&] { plan_from_json(j, "plan.json"); }) == "plan.json: /gpus: expected 8 (tp*cp*dp*pp), got 4");
  // Memory figures are bytes: above 2^31 is fine, above 2^53 is not.
  j = load(kRun);
  j["memory"]["0"]["peak"] = 80LL << 30;
  CHECK_NOTHROW(run_record_from_json(j, "run.json"));
  j["memory"]["0"]["peak"] = 1LL << 60;
  CHECK_THAT(one_line_error([&] { run_record_from_json(j, "run.json"); }), Contains("/memory/0/peak: expected an integer from 0 to"));
}

TEST_CASE("Layout rules: sizes beyond the bounds are one rule, and products never overflow", "[limits]") {
  const ModelSpec model = testing::store().load_model("gpt-tiny");
  TrainingSpec t;
  t.seq_len = 128;
  t.global_batch = 16;
  ParallelConfig p;
  CHECK(check_layout(model, t, p, kMaxGpus + 1) == LayoutRule::size_limit);
  p.tp = p.pp = p.dp = p.cp = kMaxGpus;  // product 2^80
  CHECK(check_layout(model, t, p, kMaxGpus) == LayoutRule::world_size);
  CHECK(bounded_world_size(kMaxGpus, kMaxGpus, kMaxGpus, kMaxGpus) == kMaxGpus + 1LL);
  CHECK(bounded_world_size(8, 4, 2, 1) == 64);
  p = ParallelConfig{};
  p.micro_batch = kMaxGlobalBatch + 1;
  CHECK(check_layout(model, t, p, 1) == LayoutRule::size_limit);
  // micro-batch x dp above 2^31: reported as indivisible, not wrapped into a divisor.
  t.global_batch = kMaxGlobalBatch;
  CHECK(check_batch(t, kMaxGlobalBatch, 1 << 20) == LayoutRule::batch_divisible);
}

TEST_CASE("Pipeline play-out: a schedule beyond the bound is refused, not allocated", "[limits]") {
  const std::vector<PipelineStage> stages(64, PipelineStage{1e-3, 2e-3});
  auto speed = [](int) { return 1.0; };
  CHECK_THAT(one_line_error([&] { play_pipeline(stages, 1 << 20, Schedule::gpipe, 1, speed); }),
             Contains("operations to play out, more than 16777216"));
  CHECK_NOTHROW(play_pipeline(stages, 256, Schedule::one_f_one_b, 1, speed));
}

TEST_CASE("Outputs: the rules of -o, each case", "[limits][output]") {
  TempDir dir;
  const OutputKind& plan = plan_output();
  const std::string plan_text = testing::read_file(kPlan);
  const fs::path d = dir.path();

  // Nothing there: written.
  CHECK_NOTHROW(write_output_file((d / "new.json").string(), plan_text, plan, false));
  // An earlier plan: replaced without --force.
  CHECK_NOTHROW(write_output_file((d / "new.json").string(), plan_text, plan, false));
  // Another file: refused, and left as it was; --force replaces it.
  const std::string notes = dir.write("notes.txt", "my notes\n");
  CHECK(one_line_error([&] { write_output_file(notes, plan_text, plan, false); }) ==
        notes + ": exists and is not a plan dplan wrote; give --force to replace it, or another path");
  CHECK(testing::read_file(notes) == "my notes\n");
  CHECK_NOTHROW(write_output_file(notes, plan_text, plan, true));
  CHECK(testing::read_file(notes) == plan_text);
  // A run record is not a plan.
  const std::string run = dir.write("run.json", testing::read_file(kRun));
  CHECK_THAT(one_line_error([&] { check_output_path(run, plan, false); }), Contains("is not a plan dplan wrote"));
  CHECK_NOTHROW(check_output_path(run, run_record_output(), false));
  // A link, a FIFO, a device, a folder: refused, --force or not.
  fs::create_symlink(d / "new.json", d / "link.json");
  CHECK(one_line_error([&] { check_output_path((d / "link.json").string(), plan, true); }) ==
        (d / "link.json").string() + ": is a symbolic link; dplan does not write through links: give the file's own path");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK_THAT(one_line_error([&] { check_output_path((d / "fifo").string(), plan, true); }), Contains("is a FIFO (named pipe)"));
  CHECK_THAT(one_line_error([] { check_output_path("/dev/null", plan_output(), true); }), Contains("is a character device"));
  CHECK_THAT(one_line_error([&] { check_output_path(d.string(), plan, true); }), Contains("is a folder"));
  // A missing folder.
  CHECK_THAT(one_line_error([&] { check_output_path((d / "no" / "plan.json").string(), plan, false); }),
             Contains("does not exist"));
  // One of the command's own inputs: refused even with --force, and left as it was.
  const std::string input = dir.write("input.json", plan_text);
  read_plan(input);
  CHECK(one_line_error([&] { write_output_file(input, "{}", plan, true); }) ==
        input + ": is one of this command's inputs; write the plan to another path");
  CHECK(testing::read_file(input) == plan_text);
  CHECK(temporaries_in(d).empty());
}

TEST_CASE("Outputs: a write killed at any moment leaves the old file or the new one, and no temporary", "[limits][output]") {
  TempDir dir;
  const std::string target = dir.write("big.json", "old\n");
  const std::string text(64 << 20, 'x');  // long enough that the signal lands mid-write
  for (int sig : {SIGKILL, SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::signal(SIGTERM, SIG_DFL);  // not the test framework's report-and-reraise handlers
      ::signal(SIGINT, SIG_DFL);
      for (;;) write_file_atomically(target, text);
    }
    ::usleep(200 * 1000);
    ::kill(child, sig);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(temporaries_in(dir.path()).empty());
    const auto size = fs::file_size(target);
    CHECK((size == 4 || size == text.size()));
  }
}
