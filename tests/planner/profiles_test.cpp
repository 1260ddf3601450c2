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

TEST_CASE("mixtral-8x22b is the 141 B model its card names, and 8x22B reaches it", "[profiles]") {
  const costmodel::ModelSpec m = store().load_model("8x22B");
  CHECK(m.name == "mixtral-8x22b");
  CHECK(costmodel::num_params(m) / 1e9 == Approx(140.6).epsilon(0.002));
  CHECK(m.num_experts == 8);
  CHECK(m.experts_per_token == 2);
}

TEST_CASE("the shipped model presets, clusters and GPUs all load", "[profiles]") {
  for (const char* m : {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "llama-3.2-1b",
                        "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "gpt3-175b", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b",
                        "gpt-39.1b", "gpt-76.1b", "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1t", "gpt-tiny",
                        "gpt-small"})
    CHECK_NOTHROW(store().load_model(m));
  for (const char* c : {"dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "hgx-h200", "dgx-b200", "pcie-h100", "local-cpu",
                        "hgx-h800", "h100-nvl-pairs", "grand-teton-h100", "mi300x-8"})
    CHECK_NOTHROW(store().load_cluster(c));
  for (const char* g : {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie-80gb", "h200-sxm-141gb",
                        "b200", "mi300x", "h100-nvl-94gb", "h800-sxm5-80gb", "h100-sxm5-96gb-hbm2e"})
    CHECK_NOTHROW(store().load_gpu(g));
}

TEST_CASE("the Hopper variants carry the figures of profiles/gpus/SOURCES.md sections 2 and 6", "[profiles]") {
  SECTION("H100 NVL: 94 GB at 3.9 TB/s, 835 dense bf16 at 400 W, the tensor ratios 1 : 2 : 4, 132 SMs") {
    const GpuSpec g = store().load_gpu("h100-nvl-94gb");
    CHECK(g.hbm_bytes == 94e9);
    CHECK(g.hbm_bandwidth_bytes_per_s == 3900e9);
    CHECK(g.peak_flops_per_s.at("bf16") == 835e12);
    CHECK(g.peak_flops_per_s.at("tf32") == 835e12 / 2);
    CHECK(g.peak_flops_per_s.at("fp8") == 835e12 * 2);
    CHECK(g.peak_flops_per_s.at("fp32") == 60.3e12);  // 132 SMs x 128 lanes x 2 FLOP x 1.785 GHz
    CHECK(g.sm_count == 132);
    CHECK(g.tdp_w == 400);
    CHECK(g.min_power_limit_w == 200);
  }
  SECTION("H800 SXM5: the H100 SXM5's compute, memory and power; only its NVLink differs (the cluster's)") {
    const GpuSpec h800 = store().load_gpu("h800-sxm5-80gb");
    const GpuSpec h100 = store().load_gpu("h100-sxm5-80gb");
    CHECK(h800.peak_flops_per_s == h100.peak_flops_per_s);
    CHECK(h800.hbm_bytes == h100.hbm_bytes);
    CHECK(h800.hbm_bandwidth_bytes_per_s == h100.hbm_bandwidth_bytes_per_s);
    CHECK(h800.sm_count == 132);
    CHECK(h800.tdp_w == 700);
    const ClusterSpec node = store().load_cluster("hgx-h800");
    CHECK(node.intra_node.bandwidth_bytes_per_s == 200e9);  // 400 GB/s bidirectional
    CHECK(node.intra_node.efficiency_fraction == 0.80);      // 160 GB/s measured by DeepSeek
    CHECK(node.nics_per_node == 8);
    CHECK(node.nic_bandwidth_bytes_per_s == 50e9);
    CHECK(store().load_cluster("dgx-h100").intra_node.bandwidth_bytes_per_s == 450e9);
  }
  SECTION("H100 SXM5 HBM2e: 96 GB at 2.4 TB/s, 700 W TDP; Grand Teton runs it at 500 W") {
    const GpuSpec g = store().load_gpu("h100-sxm5-96gb-hbm2e");
    CHECK(g.hbm_bytes == 96e9);
    CHECK(g.hbm_bandwidth_bytes_per_s == 2400e9);
    CHECK(g.tdp_w == 700);
    const ClusterSpec teton = store().load_cluster("grand-teton-h100");
    CHECK(teton.gpu.name == "h100-sxm5-96gb-hbm2e@500w");
    CHECK(teton.gpu.power_limit_w == 500);
    // 989 x (500 / 700)^0.56 = 989 x 0.82826 = 819.1 TFLOP/s
    CHECK_THAT(teton.gpu.peak_flops_per_s.at("bf16"), Catch::Matchers::WithinRel(819.15e12, 1e-4));
    CHECK(teton.gpu.hbm_bandwidth_bytes_per_s == 2400e9);
  }
  SECTION("H100 NVL pairs: a node is one bridged pair of 300 GB/s each way") {
    const ClusterSpec pairs = store().load_cluster("h100-nvl-pairs");
    CHECK(pairs.intra_node_kind == IntraNodeKind::nvlink_bridge);
    CHECK(pairs.gpus_per_node == 2);
    CHECK(pairs.intra_node.bandwidth_bytes_per_s == 300e9);
    CHECK_FALSE(pairs.nvls);
  }
  SECTION("figures fitted on the H100 SXM are carried over as assumptions, and say so") {
    const GpuSpec h100 = store().load_gpu("h100-sxm5-80gb");
    for (const char* name : {"h100-nvl-94gb", "h800-sxm5-80gb", "h100-sxm5-96gb-hbm2e"}) {
      INFO(name);
      const GpuSpec g = store().load_gpu(name);
      CHECK(g.sustained_fraction == h100.sustained_fraction);
      CHECK(g.memory_efficiency == h100.memory_efficiency);
      CHECK(g.attention_backward_efficiency == h100.attention_backward_efficiency);
      for (const char* figure : {"sustained_fraction", "memory_efficiency", "attention"})
        CHECK_THAT(g.sources.at(figure).get<std::string>(), Contains("an assumption for this part"));
    }
  }
  SECTION("every GPU with a power figure names its source") {
    for (const auto& name : store().gpu_names()) {
      INFO(name);
      const GpuSpec g = store().load_gpu(name);
      if (name != "cpu-core") CHECK(g.tdp_w > 0);
      if (g.tdp_w > 0) CHECK_FALSE(g.sources.at("power").get<std::string>().empty());
    }
  }
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
