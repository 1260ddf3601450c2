// The cost model against one recorded session of this project's 2-core CPU machine
// (tests/data/accuracy/, whose README says how it was recorded): the profile `dplan probe` wrote,
// and three interleaved rounds of `dplan run` over the nine layouts of gpt-small that the
// benchmark bench/machine_bench.cpp ("[accuracy]") measures live. That benchmark measures the
// machine afresh each time and, the machine's pace being as unsteady as it is, asserts the bounds
// only when the machine held still. This one holds the measurements fixed, so it always asserts: the probe alone
// predicts at least six of the nine layouts within 20 %, and the profile calibrated on dp 2, tp 2
// and pp 2 x dp 2 ZeRO-3 predicts tp 2 x dp 2, dp 4 ZeRO-2 and tp 2 x pp 2 SP within 10 %. A change
// to the time model that moves its predictions away from what this machine did fails here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "dplan/planner/calibrate.h"
#include "process.h"
#include "test_profiles.h"

namespace {
using namespace dplan;
using dplan::testing::read_file;
using nlohmann::json;

const std::string kSession = std::string(DPLAN_VALIDATION_DIR) + "/accuracy";
constexpr int kRounds = 3;

struct Layout {
  std::string name;
  std::vector<planner::CalibrationRun> runs;  // one per round
  double measured_s = 0;                       // the median of all rounds' measured steps
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Layout read_layout(const std::string& name) {
  Layout l{name};
  std::vector<double> steps;
  for (int round = 1; round <= kRounds; ++round) {
    const std::string file = kSession + "/run-" + name + "-" + std::to_string(round) + ".json";
    l.runs.push_back(planner::read_calibration_run(file));
    const json run = json::parse(read_file(file));
    for (const json& s : run.at("steps"))
      if (!s.at("warmup").get<bool>()) steps.push_back(s.at("time_s").get<double>());
  }
  REQUIRE(steps.size() >= size_t(kRounds));
  l.measured_s = median(steps);
  return l;
}

double error(double predicted_s, double measured_s) { return predicted_s / measured_s - 1; }

}  // namespace

TEST_CASE("the cost model against a recorded session of this machine: probe alone, then calibrated",
          "[calibrate][accuracy]") {
  const costmodel::ClusterSpec probed = dplan::testing::store().load_cluster(kSession + "/machine.json");
  std::vector<Layout> layouts;
  for (const char* name : {"single", "dp2", "tp2", "pp2", "dp4-zero2", "tp2-dp2", "pp2-dp2-zero3", "tp2-pp2-sp",
                           "dp2-zero3"})
    layouts.push_back(read_layout(name));
  auto by_name = [&](const std::string& name) -> const Layout& {
    return *std::find_if(layouts.begin(), layouts.end(), [&](const Layout& l) { return l.name == name; });
  };

  int within_20 = 0;
  std::printf("%-16s %10s %10s %8s   (recorded session, probe alone)\n", "layout", "pred (ms)", "meas (ms)", "error");
  for (const Layout& l : layouts) {
    const double predicted_s = planner::predicted_step_s(probed, l.runs.front());
    const double e = error(predicted_s, l.measured_s);
    within_20 += std::abs(e) <= 0.20;
    std::printf("%-16s %10.1f %10.1f %+7.1f%%\n", l.name.c_str(), 1e3 * predicted_s, 1e3 * l.measured_s, 100 * e);
    INFO(l.name << ": predicted " << predicted_s << " s, measured " << l.measured_s << " s");
    CHECK(std::abs(std::log(predicted_s / l.measured_s)) <= std::log(2.5));
  }
  CHECK(within_20 >= 6);

  std::vector<planner::CalibrationRun> fit_on;
  for (const char* name : {"dp2", "tp2", "pp2-dp2-zero3"})
    fit_on.insert(fit_on.end(), by_name(name).runs.begin(), by_name(name).runs.end());
  const planner::Calibration cal = planner::calibrate(probed, fit_on);
  std::printf("%-16s %10s %10s %8s   (calibrated on dp2, tp2, pp2-dp2-zero3)\n", "layout", "pred (ms)", "meas (ms)",
              "error");
  for (const char* name : {"tp2-dp2", "dp4-zero2", "tp2-pp2-sp"}) {
    const Layout& l = by_name(name);
    const double predicted_s = planner::predicted_step_s(cal.cluster, l.runs.front());
    const double e = error(predicted_s, l.measured_s);
    std::printf("%-16s %10.1f %10.1f %+7.1f%%\n", name, 1e3 * predicted_s, 1e3 * l.measured_s, 100 * e);
    INFO(name << ": calibrated prediction " << predicted_s << " s, measured " << l.measured_s << " s");
    CHECK(std::abs(e) <= 0.10);
  }
  std::fflush(stdout);
}
