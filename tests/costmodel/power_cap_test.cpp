// A GPU under a power limit: the derived profile (costmodel/power_cap.h) and the cluster
// profile's power_limit_w.
#include "dplan/costmodel/power_cap.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/time.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::error_of;
using dplan::testing::store;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

namespace {


// The dgx-h100 cluster file with its GPUs' power limit set to `limit_w`.
json dgx_h100_at(double limit_w) {
  json file = read_json_file(std::string(DPLAN_PROFILES_DIR) + "/clusters/dgx-h100.json");
  file["cluster"]["power_limit_w"] = limit_w;
  return file;
}

ClusterSpec load(const json& file) {
  return cluster_from_json(file, "capped.json", [](const std::string& gpu) { return store().load_gpu(gpu); });
}

}  // namespace

TEST_CASE("the throughput fraction is (limit / TDP)^0.56", "[power]") {
  // Half the TDP: 0.5^0.56 = exp(0.56 ln 0.5) = exp(-0.38816) = 0.67830.
  CHECK_THAT(power_cap_throughput_fraction(350, 700), WithinRel(0.67830, 1e-4));
  // 500 of 700 W: exp(0.56 ln(5/7)) = exp(0.56 x -0.33647) = exp(-0.18843) = 0.82826.
  CHECK_THAT(power_cap_throughput_fraction(500, 700), WithinRel(0.82826, 1e-4));
  CHECK(power_cap_throughput_fraction(700, 700) == 1.0);
}

TEST_CASE("a power limit at the TDP leaves the datasheet profile as it is", "[power]") {
  for (const char* name : {"h100-sxm5-80gb", "a100-sxm4-80gb", "h100-nvl-94gb", "h800-sxm5-80gb"}) {
    INFO(name);
    const GpuSpec g = store().load_gpu(name);
    REQUIRE(g.tdp_w > 0);
    CHECK(power_capped(g, g.tdp_w) == g);
  }
}

TEST_CASE("a lower power limit is never faster, and leaves memory as it was", "[power][law]") {
  const std::string name = GENERATE(as<std::string>{}, "h100-sxm5-80gb", "h100-pcie-80gb", "h100-nvl-94gb",
                                    "h800-sxm5-80gb", "h100-sxm5-96gb-hbm2e", "h200-sxm-141gb", "a100-sxm4-40gb",
                                    "a100-sxm4-80gb");
  INFO(name);
  const GpuSpec g = store().load_gpu(name);
  REQUIRE(g.min_power_limit_w > 0);
  double previous = 0;
  for (double w = g.min_power_limit_w; w <= g.tdp_w; w += 10) {
    const GpuSpec capped = power_capped(g, w);
    const double bf16 = capped.peak_flops_per_s.at("bf16");
    CHECK(bf16 > previous);
    CHECK(bf16 <= g.peak_flops_per_s.at("bf16"));
    CHECK(capped.hbm_bandwidth_bytes_per_s == g.hbm_bandwidth_bytes_per_s);
    CHECK(capped.hbm_bytes == g.hbm_bytes);
    CHECK(capped.memory_efficiency == g.memory_efficiency);
    previous = bf16;
  }
  CHECK(previous == g.peak_flops_per_s.at("bf16"));  // the last step reached the TDP (limits are multiples of 10 W)
}

TEST_CASE("H100 SXM at 500 W: every peak x 0.828, named and sourced as derived", "[power]") {
  const GpuSpec g = store().load_gpu("h100-sxm5-80gb");
  const GpuSpec capped = power_capped(g, 500);
  const double f = power_cap_throughput_fraction(500, 700);  // 0.82826, worked above
  for (const auto& [precision, flops] : g.peak_flops_per_s) {
    INFO(precision);
    CHECK_THAT(capped.peak_flops_per_s.at(precision), WithinRel(flops * f, 1e-12));
  }
  CHECK_THAT(capped.peak_flops_per_s.at("bf16"), WithinRel(819.15e12, 1e-4));  // 989 x 0.82826
  CHECK(capped.name == "h100-sxm5-80gb@500w");
  CHECK(capped.power_limit_w == 500);
  CHECK_THAT(capped.description, Contains("power limit 500 W"));
  CHECK_THAT(capped.sources.at("power_limit").get<std::string>(), Contains("SOURCES.md section 6"));
  // The derived profile reads back as itself (plan.json and written profiles carry it).
  CHECK(gpu_from_json(json{{"format_version", 1}, {"gpu", to_json(capped)}}, "x.json") == capped);
}

TEST_CASE("deriving from a derived profile is deriving from the datasheet", "[power]") {
  const GpuSpec g = store().load_gpu("h100-sxm5-80gb");
  const GpuSpec via_500 = power_capped(power_capped(g, 500), 400);
  const GpuSpec direct = power_capped(g, 400);
  CHECK(via_500.name == direct.name);
  CHECK(via_500.description == direct.description);
  CHECK_THAT(via_500.peak_flops_per_s.at("bf16"), WithinRel(direct.peak_flops_per_s.at("bf16"), 1e-12));
  const GpuSpec back = power_capped(direct, 700);
  CHECK(back.name == g.name);
  CHECK(back.description == g.description);
  CHECK(back.power_limit_w == 0);
  CHECK_FALSE(back.sources.contains("power_limit"));
  CHECK_THAT(back.peak_flops_per_s.at("fp8"), WithinRel(g.peak_flops_per_s.at("fp8"), 1e-12));
}

TEST_CASE("a power limit outside the part's range is refused in one line naming the range", "[power][error]") {
  const GpuSpec h100 = store().load_gpu("h100-sxm5-80gb");
  for (double w : {800.0, 199.0, 0.5}) {
    INFO(w);
    const std::string e = error_of([&] { power_capped(h100, w); });
    CHECK_THAT(e, Contains("h100-sxm5-80gb's range, 200-700 W"));
    CHECK(e.find('\n') == std::string::npos);
  }
  // A part whose lowest limit no source gives: no range, so no derived profile.
  const std::string e = error_of([&] { power_capped(store().load_gpu("b200"), 800); });
  CHECK_THAT(e, Contains("b200 gives no power range"));
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("a cluster's power_limit_w derives its GPU, and a limit out of range names file, key and range",
          "[power]") {
  const ClusterSpec datasheet = store().load_cluster("dgx-h100");
  const ClusterSpec capped = load(dgx_h100_at(500));
  CHECK(capped.gpu == power_capped(datasheet.gpu, 500));
  CHECK(capped.intra_node == datasheet.intra_node);  // links do not change with the GPUs' limit
  CHECK(load(dgx_h100_at(700)).gpu == datasheet.gpu);
  const std::string e = error_of([] { load(dgx_h100_at(900)); });
  CHECK_THAT(e, Contains("capped.json: /cluster/power_limit_w: a power limit of 900 W is outside "
                         "h100-sxm5-80gb's range, 200-700 W"));
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("a lower power limit never shortens the predicted step", "[power][law]") {
  const ModelSpec m = store().load_model("llama-3-70b");
  const TrainingSpec t{.seq_len = 8192, .global_batch = 512};
  const ParallelConfig p{.tp = 8, .pp = 4, .dp = 2, .sequence_parallel = true, .recompute = Recompute::selective};
  double previous = 0;
  for (double w : {700.0, 600.0, 500.0, 400.0, 300.0, 200.0}) {
    INFO(w << " W");
    const double step_s = estimate_time(m, Network(load(dgx_h100_at(w)), 64), t, p).step_time_s;
    CHECK(step_s > previous);
    previous = step_s;
  }
}

TEST_CASE("the power block is read strictly", "[power][json]") {
  const json file = read_json_file(std::string(DPLAN_PROFILES_DIR) + "/gpus/h100-sxm5-80gb.json");
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = file;
    edit(j["gpu"]);
    return error_of([&] { gpu_from_json(j, "x.json"); });
  };
  CHECK_THAT(with([](json& g) { g["sources"].erase("power"); }), Contains("x.json: /gpu/sources"));
  CHECK_THAT(with([](json& g) { g["power"]["tdp_watts"] = 700; }), Contains("tdp_watts"));
  CHECK_THAT(with([](json& g) { g["power"]["min_limit_w"] = 800; }), Contains("/gpu/power/min_limit_w"));
  CHECK_THAT(with([](json& g) { g["power"]["limit_w"] = 100; }), Contains("/gpu/power/limit_w"));
  CHECK_THAT(with([](json& g) { g["power"].erase("tdp_w"); }), Contains("/gpu/power: missing key \"tdp_w\""));
  // A limit at the TDP is the datasheet profile.
  json at_tdp = file;
  at_tdp["gpu"]["power"]["limit_w"] = 700;
  CHECK(gpu_from_json(at_tdp, "x.json") == gpu_from_json(file, "x.json"));
}
