// The engine table (planner/include/dplan/planner/engines.h) as laws over every descriptor, so an
// engine added to the table is reached everywhere an engine is: by its name, its rules, its
// exporter (its launch file, its version line), the CLI's help and, when dplan reads its logs, the
// --format names, the log-format detection and a sample log in tests/data/logs.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/engine_logs.h"
#include "dplan/planner/engine_rules.h"
#include "dplan/planner/engines.h"
#include "dplan/planner/export.h"
#include "process.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::string kLogs = std::string(DPLAN_VALIDATION_DIR) + "/logs/";

// llama-3-8b on 8 GPUs with ZeRO-2: every engine expresses it (export_test.cpp).
Plan plan_every_engine_runs() {
  return make_plan(testing::store().load_model("llama-3-8b"), testing::store().load_cluster("dgx-h100"),
                   TrainingSpec{.seq_len = 8192, .global_batch = 64}, ParallelConfig{.dp = 8, .zero_stage = 2},
                   OverlapOptions{}, MemoryEstimate{}, TimeBreakdown{});
}

// The files in tests/data/logs whose names start with "<engine name>-" and end with ".log".
std::vector<std::string> sample_logs(const std::string& engine) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(kLogs)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(engine + "-") && name.ends_with(".log")) out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string help_of(const std::vector<std::string>& args) {
  const testing::Result r = testing::run_program(DPLAN_BINARY, args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return r.out;
}

}  // namespace

TEST_CASE("engines: each descriptor is its id's, found by its name, with its versions filled in", "[engines]") {
  std::set<std::string> names;
  for (size_t i = 0; i < engines().size(); ++i) {
    const EngineDescriptor& d = engines()[i];
    CAPTURE(to_string(d.id));
    CHECK(static_cast<size_t>(d.id) == i);
    CHECK(&descriptor(d.id) == &d);
    CHECK(names.insert(to_string(d.id)).second);
    CHECK(engine_from_string(to_string(d.id)) == d.id);
    CHECK(std::string(to_string(d.id)) == costmodel::engine_names().at(i));
    CHECK(engine_names().at(i) == to_string(d.id));
    CHECK(!std::string(d.display_name).empty());
    CHECK(!std::string(d.version).empty());
    // The version line names the version and has no placeholder left.
    CHECK_THAT(engine_version(d.id), Contains(d.version));
    CHECK(engine_version(d.id).find('{') == std::string::npos);
    if (d.head_version) CHECK_THAT(engine_version(d.id), Contains(d.head_version));
  }
  CHECK(engine_names().size() == engines().size());
}

TEST_CASE("engines: each engine's rules and exporter run, its files name it and its launch file launches it",
          "[engines][export]") {
  const Plan plan = plan_every_engine_runs();
  for (const EngineDescriptor& d : engines()) {
    CAPTURE(to_string(d.id));
    const RuleReport report = check_engine_rules(plan, d.id);
    CHECK(report.ok());
    CHECK(report.rules_checked >= 2);  // the launch rule and at least one of the engine's own
    CHECK_THAT(rules_ok_line(plan, d.id, report), StartsWith(std::string(to_string(d.id)) + ": ok: "));
    const Exported e = export_plan(plan, d.id, to_json(plan).dump(1), "plan.json");
    const auto launch = std::find_if(e.files.begin(), e.files.end(), [&](const ExportFile& f) { return f.name == d.launch_file; });
    REQUIRE(launch != e.files.end());
    CHECK(launch->executable);
    CHECK_THAT(e.launch_line, Contains(d.launch_file));
    const auto readme = std::find_if(e.files.begin(), e.files.end(), [](const ExportFile& f) { return f.name == "README.export"; });
    REQUIRE(readme != e.files.end());
    CHECK_THAT(readme->content, StartsWith(std::string("dplan export --to ") + to_string(d.id) + " of plan.json"));
    CHECK_THAT(readme->content, Contains("spellings: " + engine_version(d.id) + "\n"));
    CHECK(default_export_dir("runs/plan.json", d.id) == std::string("runs/plan-") + std::string(to_string(d.id)));
  }
  // A plan no engine launches (12 ranks on nodes of 8): each failure line starts with the engine's name.
  const Plan ragged = make_plan(testing::store().load_model("llama-3-8b"), testing::store().load_cluster("dgx-h100"),
                                TrainingSpec{.seq_len = 8192, .global_batch = 96}, ParallelConfig{.dp = 12, .zero_stage = 2},
                                OverlapOptions{}, MemoryEstimate{}, TimeBreakdown{});
  for (const EngineDescriptor& d : engines()) {
    CAPTURE(to_string(d.id));
    const RuleReport report = check_engine_rules(ragged, d.id);
    REQUIRE(!report.ok());
    for (const std::string& failure : report.failures) CHECK_THAT(failure, StartsWith(std::string(std::string(to_string(d.id))) + ": "));
    CHECK_THROWS_AS(export_plan(ragged, d.id, "{}", "plan.json"), InputError);
  }
}

TEST_CASE("engines: each engine with a log reader has a --format name and a sample log it tells and reads",
          "[engines][engine_logs]") {
  std::vector<std::string> expected_formats;
  for (const EngineDescriptor& d : engines()) {
    CAPTURE(to_string(d.id));
    if (!d.log) {
      CHECK_THROWS_AS(log_format_from_string(std::string(to_string(d.id))), InputError);
      continue;
    }
    expected_formats.push_back(std::string(to_string(d.id)));
    const LogFormat format{d.id};
    CHECK(log_format_from_string(std::string(to_string(d.id))) == format);
    CHECK(std::string(to_string(format)) == std::string(to_string(d.id)));
    CHECK(std::string(engine_name(format)) == d.display_name);
    const std::vector<std::string> samples = sample_logs(std::string(to_string(d.id)));
    CHECK(!samples.empty());
    for (const std::string& path : samples) {
      CAPTURE(path);
      const std::string text = testing::read_file(path);
      CHECK(detect_log_format(text) == format);
      const EngineLog log = parse_engine_log(text, path);
      CHECK(log.format == format);
      CHECK(log.steps.size() > static_cast<size_t>(kWarmupLogLines));
      CHECK_THAT(log.lines_read, StartsWith(std::string(d.log->step_line) + "s (" + d.log->log_file));
      CHECK(log.lines_read.find('{') == std::string::npos);
    }
  }
  expected_formats.push_back("run");
  CHECK(log_format_names() == expected_formats);
  CHECK(std::string(to_string(LogFormat::run)) == "run");
  CHECK(log_format_from_string("run") == LogFormat::run);
}

TEST_CASE("engines: the CLI's help lists the engines of the table", "[engines][cli]") {
  const std::string choices = "engine: " + join_choices(engine_names());
  CHECK_THAT(help_of({"export", "--help"}), Contains(choices));
  CHECK_THAT(help_of({"check", "--help"}), Contains(choices));
  const std::string top = help_of({"--help"});
  std::string files, launches;
  for (const EngineDescriptor& d : engines()) {
    std::string& list = d.runs_dplan_worker ? launches : files;
    list += (list.empty() ? "" : d.runs_dplan_worker ? " / " : ", ") + std::string(std::string(to_string(d.id)));
  }
  CHECK_THAT(top, Contains("own files (" + files + ") or a " + launches + " launch of dplan-worker"));
  // The measurement readers: every --format name and every engine whose log dplan reads.
  const std::string formats = join_choices(log_format_names());
  const std::string compare = help_of({"compare", "--help"});
  CHECK_THAT(compare, Contains("what the measurement file is: " + formats));
  for (const EngineDescriptor& d : engines())
    if (d.log) CHECK_THAT(compare, Contains(d.display_name));
  CHECK_THAT(help_of({"calibrate", "--help"}), Contains(formats));
}
