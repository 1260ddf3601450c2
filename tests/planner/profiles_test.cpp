// Every shipped profile loads under the strict readers, carries its sources, and resolves by name.
#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using namespace dplan::planner;
using Catch::Matchers::Contains;

TEST_CASE("every shipped profile loads and names its sources", "[profiles]") {
  for (const auto& name : store().gpu_names()) {
    INFO(name);
    GpuSpec g = store().load_gpu(name);
    CHECK(g.name == name);
    CHECK(g.sources.contains("peak_tflops"));
    CHECK(g.sources.contains("hbm"));
    CHECK(g.peak_flops_per_s.count("bf16") + g.peak_flops_per_s.count("fp32") > 0);
  }
  for (const auto& name : store().cluster_names()) {
    INFO(name);
    ClusterSpec c = store().load_cluster(name);
    CHECK(c.name == name);
    CHECK(c.gpus_per_node >= 1);
    CHECK_FALSE(c.sources["intra_node"].get<std::string>().empty());
    CHECK_FALSE(c.sources["inter_node"].get<std::string>().empty());
  }
  for (const auto& name : store().model_names()) {
    INFO(name);
    CHECK(store().load_model(name).name == name);
  }
}

TEST_CASE("the shipped model presets, clusters and GPUs all load", "[profiles]") {
  for (const char* m : {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "llama-3.2-1b",
                        "mistral-7b", "mixtral-8x7b", "gpt3-175b", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b",
                        "gpt-39.1b", "gpt-76.1b", "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1t", "gpt-tiny",
                        "gpt-small"})
    CHECK_NOTHROW(store().load_model(m));
  for (const char* c : {"dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "hgx-h200", "dgx-b200", "pcie-h100", "local-cpu"})
    CHECK_NOTHROW(store().load_cluster(c));
  for (const char* g : {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie-80gb", "h200-sxm-141gb",
                        "b200", "mi300x"})
    CHECK_NOTHROW(store().load_gpu(g));
}

TEST_CASE("datasheet figures arrive in SI units", "[profiles]") {
  ClusterSpec c = store().load_cluster("dgx-h100");
  CHECK(c.gpu.peak_flops_per_s.at("bf16") == 989e12);  // dense (profiles/gpus/SOURCES.md section 2)
  CHECK(c.gpu.hbm_bytes == 80e9);
  CHECK(c.intra_node.bandwidth_bytes_per_s == 450e9);  // NVLink 4, per direction
  CHECK(c.nics_per_node == 8);
  CHECK(c.nic_bandwidth_bytes_per_s == 50e9);          // NDR 400 Gb/s
  CHECK(c.nvls);
  CHECK_FALSE(store().load_cluster("dgx-a100-80g").nvls);
}

TEST_CASE("an unknown model or cluster lists what exists", "[profiles]") {
  try {
    store().load_model("llama-9");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains("unknown model \"llama-9\""));
    CHECK_THAT(e.what(), Contains("llama-3-70b"));
    CHECK_THAT(e.what(), Contains("70B"));
  }
  CHECK_THROWS_WITH(store().load_cluster("dgx-z"), Contains("dgx-h100"));
}


TEST_CASE("only a CPU profile no probe has measured is named as never probed, with the probe command", "[profiles]") {
  const std::string note = unprobed_profile_note(store().load_cluster("local-cpu"));
  CHECK_THAT(note, Contains("local-cpu has never been probed"));
  CHECK_THAT(note, Contains("`dplan probe --cluster local-cpu -o my-machine.json`"));
  CHECK(note.find('\n') == std::string::npos);  // one line
  // A plan file holds the cluster as to_json writes it: the same answer from there.
  CHECK(unprobed_profile_note(to_json(store().load_cluster("local-cpu"))) == note);
  // The profile dplan probe wrote for this machine (tests/data/accuracy, with its measured GEMMs).
  const ClusterSpec probed = store().load_cluster(std::string(DPLAN_VALIDATION_DIR) + "/accuracy/machine.json");
  REQUIRE(probed.cores_per_node > 0);
  CHECK(unprobed_profile_note(probed).empty());
  CHECK(unprobed_profile_note(to_json(probed)).empty());
  // The same machine without its measured GEMMs is a guess again.
  ClusterSpec unmeasured = probed;
  unmeasured.gpu.matmul_measured.clear();
  CHECK_THAT(unprobed_profile_note(unmeasured), Contains("local-cpu-measured has never been probed"));
  for (const auto& name : store().cluster_names()) {
    const ClusterSpec c = store().load_cluster(name);
    INFO(name);
    if (c.cores_per_node == 0) CHECK(unprobed_profile_note(c).empty());  // every GPU cluster
  }
}
