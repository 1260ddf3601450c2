// The network model: group placement, bandwidth sharing on the graph,
// NCCL-style times, laws, and the measured all-reduce tables of
// profiles/clusters/SOURCES.md sections 4 and 5.
#include "dplan/costmodel/network.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "dplan/costmodel/errors.h"
#include "dplan/planner/profiles.h"
#include "dplan/costmodel/units.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::WithinRel;

namespace {

constexpr double kRingBase_s = 8.4e-6;  // NCCL baseLat Ring/Simple (profiles/clusters/SOURCES.md section 3)

// A cluster with round numbers: 8 GPUs per node on an NVSwitch at 300 GB/s, 8 NICs of 50 GB/s,
// efficiencies 1, no size penalty, 1 us per NVLink hop and 10 us per network hop.
ClusterSpec round_cluster() {
  ClusterSpec c;
  c.name = "round";
  c.gpus_per_node = 8;
  c.intra_node_kind = IntraNodeKind::nvswitch;
  c.intra_node = {.bandwidth_bytes_per_s = 300e9, .latency_s = 1e-6, .efficiency_fraction = 1.0,
                  .half_bandwidth_bytes = 0};
  c.nics_per_node = 8;
  c.nic_bandwidth_bytes_per_s = 50e9;
  c.inter_node_latency_s = 10e-6;
  c.nic_efficiency_fraction = 1.0;
  c.nodes_per_leaf = 32;
  c.oversubscription = 1.0;
  return c;
}
}  // namespace

TEST_CASE("group_shape places each dimension in Megatron's rank order", "[network]") {
  // rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)), tp=4 cp=2 dp=8 pp=3; the MoE
  // groups fold over each stage's 64 ranks, etp (= tp 4) fastest, then ep 2, then edp 8.
  ParallelConfig p{.tp = 4, .pp = 3, .dp = 8, .cp = 2, .ep = 2};
  std::vector<GroupShape> result;
  for (Dim d : {Dim::tp, Dim::cp, Dim::ep, Dim::dp, Dim::pp, Dim::etp, Dim::edp}) result.push_back(Mesh(p).shape(d));
  std::vector<GroupShape> expected = {{4, 1}, {2, 4}, {2, 4}, {8, 8}, {3, 64}, {4, 1}, {8, 8}};
  CHECK(result == expected);
}

TEST_CASE("a ring all-reduce inside one NVSwitch node equals the hand formula", "[network]") {
  ClusterSpec c = round_cluster();
  c.intra_node.efficiency_fraction = 0.5;  // 150 GB/s achieved
  SECTION("without a size penalty") {
    Network net(c, 8);
    // latency 8.4 us + 2(n-1) = 14 hops x 1 us; bytes 2(n-1)/n = 1.75 x 1 GB at 150 GB/s
    double expected = kRingBase_s + 14 * 1e-6 + 1.75 * 1e9 / 150e9;
    CollectiveCost result = net.cost(Collective::all_reduce, 1e9, {8, 1});
    CHECK_THAT(result.time_s, WithinRel(expected, 1e-12));
    CHECK_THAT(result.bus_bandwidth_bytes_per_s, WithinRel(1.75e9 / expected, 1e-12));
    CHECK_FALSE(result.crosses_nodes);
  }
  SECTION("with half_bandwidth 100 MB the 1 GB message moves as if it were 1.1 GB") {
    c.intra_node.half_bandwidth_bytes = 1e8;
    Network net(c, 8);
    double expected = kRingBase_s + 14 * 1e-6 + 1.75 * 1.1e9 / 150e9;
    CHECK_THAT(net.cost(Collective::all_reduce, 1e9, {8, 1}).time_s, WithinRel(expected, 1e-12));
  }
  SECTION("two tp groups of 4 share the node without slowing each other") {
    Network net(c, 8);
    // each GPU has its own 150 GB/s link to the switch; 2(n-1) = 6 hops, factor 1.5
    double expected = kRingBase_s + 6 * 1e-6 + 1.5 * 1e9 / 150e9;
    CHECK_THAT(net.cost(Collective::all_reduce, 1e9, {4, 1}).time_s, WithinRel(expected, 1e-12));
  }
}

TEST_CASE("a tp group of 16 on 8-GPU nodes is markedly slower than tp 8", "[network]") {
  for (const char* name : {"dgx-h100", "dgx-a100-80g"}) {
    INFO(name);
    ClusterSpec c = store().load_cluster(name);
    Network net(c, 16);
    // tp 16 leaves NVLink: its ring crosses the two nodes through all 8 NICs, 1/8 of the traffic
    // each, so its bus bandwidth is 8 NICs x NIC rate x efficiency (H100: 8 x 50 x 0.94 = 376 GB/s).
    CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {16, 1}).inter_node_bytes_per_s,
               WithinRel(8 * c.nic_bandwidth_bytes_per_s * c.nic_efficiency_fraction, 1e-12));
    CHECK(net.crosses_nodes({16, 1}));
    CHECK_FALSE(net.crosses_nodes({8, 1}));
    // A 64 MiB activation all-reduce (b=1, s=4096, h=8192, bf16). H100 by hand: tp 8 uses NVLS,
    // 25 us + (64 + 13.4) MiB / (0.61 x 450 GB/s) = 321 us; tp 16 rings over the NICs,
    // 8.4 + 28 x 3.4 + 2 x 14 = 131.6 us latency + 1.875 x (64 + 45) MiB / 376 GB/s = 702 us:
    // ratio 2.2. A100 (ring both): 56 + 1.75 x (64 + 3.8) MiB / 234 GB/s = 588 us vs
    // 131.6 + 1.875 x (64 + 23) MiB / 192 GB/s = 1022 us, ratio 1.74. At 1 GiB: 1.44 and 1.34.
    double ratio = net.cost(Collective::all_reduce, 64 * kMiB, {16, 1}).time_s /
                   net.cost(Collective::all_reduce, 64 * kMiB, {8, 1}).time_s;
    CHECK(ratio > 1.6);
    double ratio_1gib = net.cost(Collective::all_reduce, kGiB, {16, 1}).time_s /
                        net.cost(Collective::all_reduce, kGiB, {8, 1}).time_s;
    CHECK(ratio_1gib > 1.3);
  }
}

TEST_CASE("dp groups spanning nodes are limited by their share of the NICs", "[network]") {
  // 4 nodes, tp 8, dp 4: dp groups {r, r+8, r+16, r+24}, one member per node, 8 groups at once.
  ClusterSpec c = round_cluster();
  GroupShape dp{4, 8};
  SECTION("8 NICs for 8 GPUs: each group has a NIC of its own") {
    Network net(c, 32);
    CHECK(net.path_bandwidth(Collective::all_reduce, dp).inter_node_bytes_per_s == 50e9);
    // ring: 8.4 us + 2(n-1) = 6 hops, all between nodes (2(N-1) = 6) at 10 us; 1.5 x 1 GB / 50 GB/s
    // (the tree, 8.4 + 2 x 2 x 10 us + 2 x 1 GB / (0.92 x 50 GB/s), is slower)
    double expected = kRingBase_s + 6 * 10e-6 + 1.5 * 1e9 / 50e9;
    CHECK_THAT(net.cost(Collective::all_reduce, 1e9, dp).time_s, WithinRel(expected, 1e-12));
  }
  SECTION("4 NICs for 8 GPUs: two groups share each NIC, half the bandwidth") {
    c.nics_per_node = 4;
    Network net(c, 32);
    CHECK(net.path_bandwidth(Collective::all_reduce, dp).inter_node_bytes_per_s == 25e9);
  }
  SECTION("tp 4: two members per node use two NICs") {
    // dp {r, r+4, ..., r+28}: 8 members on 4 nodes, 2 per node; 4 groups; each NIC carries 1/2.
    Network net(c, 32);
    CHECK(net.path_bandwidth(Collective::all_reduce, {8, 4}).inter_node_bytes_per_s == 100e9);
  }
}

TEST_CASE("oversubscription 2 slows groups that cross leaves but not groups within a leaf", "[network]") {
  // 4 nodes, 2 per leaf. {2,16}: ranks r and r+16 sit under different leaves; 16 such pairs send
  // through each leaf's uplink of 2 nodes x 8 NICs x 50 GB/s / oversubscription.
  // {2,8}: r and r+8 are nodes 0-1 or 2-3, under one leaf.
  ClusterSpec c = round_cluster();
  c.nodes_per_leaf = 2;
  Network flat(c, 32);
  c.oversubscription = 2.0;
  Network oversubscribed(c, 32);
  // 800 GB/s / 16 flows = 50 GB/s (no worse than the NIC); 400 / 16 = 25 GB/s.
  CHECK(flat.path_bandwidth(Collective::all_reduce, {2, 16}).inter_node_bytes_per_s == 50e9);
  CHECK(oversubscribed.path_bandwidth(Collective::all_reduce, {2, 16}).inter_node_bytes_per_s == 25e9);
  CHECK(oversubscribed.cost(Collective::all_reduce, 1e9, {2, 16}).time_s >
        1.9 * flat.cost(Collective::all_reduce, 1e9, {2, 16}).time_s);
  CHECK(oversubscribed.cost(Collective::all_reduce, 1e9, {2, 8}) == flat.cost(Collective::all_reduce, 1e9, {2, 8}));
}

TEST_CASE("faster links never slow any collective", "[network][law]") {
  const Collective op = GENERATE(Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                                 Collective::all_to_all, Collective::send_recv);
  const double bytes = GENERATE(4096.0, 1 * kMiB, 64 * kMiB, kGiB);
  const GroupShape shape = GENERATE(GroupShape{8, 1}, GroupShape{16, 1}, GroupShape{4, 1}, GroupShape{4, 8},
                                    GroupShape{2, 32}, GroupShape{8, 8}, GroupShape{64, 1});
  ClusterSpec base = store().load_cluster("dgx-h100");
  base.nodes_per_leaf = 2;
  base.oversubscription = 2.0;
  ClusterSpec faster_intra = base, faster_nic = base, less_oversubscribed = base, no_nvls = base;
  faster_intra.intra_node.bandwidth_bytes_per_s *= 2;
  faster_nic.nic_bandwidth_bytes_per_s *= 2;
  less_oversubscribed.oversubscription = 1.0;
  no_nvls.nvls = false;  // taking NVLS away never helps either
  const double result = Network(base, 64).cost(op, bytes, shape).time_s;
  INFO(to_string(op) << " " << bytes << " B, group " << shape.size << " stride " << shape.stride);
  CHECK(Network(faster_intra, 64).cost(op, bytes, shape).time_s <= result);
  CHECK(Network(faster_nic, 64).cost(op, bytes, shape).time_s <= result);
  CHECK(Network(less_oversubscribed, 64).cost(op, bytes, shape).time_s <= result);
  CHECK(Network(no_nvls, 64).cost(op, bytes, shape).time_s >= result);
}

TEST_CASE("bigger messages never take less time", "[network][law]") {
  const Collective op = GENERATE(Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                                 Collective::all_to_all, Collective::send_recv);
  const char* name = GENERATE("dgx-h100", "dgx-a100-80g", "mi300x-8", "pcie-h100", "h100-nvl-pairs");
  Network net(store().load_cluster(name), 64);
  for (GroupShape shape : {GroupShape{8, 1}, GroupShape{2, 1}, GroupShape{16, 1}, GroupShape{8, 8}, GroupShape{4, 16}}) {
    double previous = 0;
    for (double bytes = 0; bytes <= 16 * kGiB; bytes = bytes == 0 ? 1 : bytes * 2) {
      double t = net.cost(op, bytes, shape).time_s;
      INFO(name << " " << to_string(op) << " " << bytes << " B, group " << shape.size << " stride " << shape.stride);
      CHECK(t >= previous);
      previous = t;
    }
  }
}

TEST_CASE("all-to-all and send_recv follow their traffic", "[network]") {
  ClusterSpec c = round_cluster();
  SECTION("all-to-all inside a node: 7/8 of the buffer leaves each GPU over its 300 GB/s link") {
    Network net(c, 8);
    double expected = kRingBase_s + 7 * 1e-6 + 0.875 * 1e9 / 300e9;
    CHECK_THAT(net.cost(Collective::all_to_all, 1e9, {8, 1}).time_s, WithinRel(expected, 1e-12));
  }
  SECTION("all-to-all over two nodes: 8 of 15 peers are remote, so each NIC carries 8/15") {
    Network net(c, 16);
    PathBandwidth bw = net.path_bandwidth(Collective::all_to_all, {16, 1});
    CHECK_THAT(bw.inter_node_bytes_per_s, WithinRel(50e9 * 15 / 8, 1e-12));
    CHECK_THAT(bw.intra_node_bytes_per_s, WithinRel(300e9 * 15 / 7, 1e-12));
    // and it is slower than the all-to-all of 8 inside one node
    CHECK(net.cost(Collective::all_to_all, 1e9, {16, 1}).time_s > net.cost(Collective::all_to_all, 1e9, {8, 1}).time_s);
  }
  SECTION("send_recv between pipeline stages on two nodes: one NIC per GPU pair") {
    Network net(c, 16);  // tp 8, pp 2: stage 0 rank r sends to rank r+8
    double expected = kRingBase_s + 10e-6 + 1e9 / 50e9;
    CollectiveCost result = net.cost(Collective::send_recv, 1e9, {2, 8});
    CHECK_THAT(result.time_s, WithinRel(expected, 1e-12));
    CHECK(result.crosses_nodes);
    c.nics_per_node = 4;  // two GPUs per NIC: half
    CHECK(Network(c, 16).path_bandwidth(Collective::send_recv, {2, 8}).inter_node_bytes_per_s == 25e9);
  }
  SECTION("send_recv inside a node runs at NVLink speed") {
    Network net(c, 8);  // tp 4, pp 2
    double expected = kRingBase_s + 1e-6 + 1e9 / 300e9;
    CHECK_THAT(net.cost(Collective::send_recv, 1e9, {2, 4}).time_s, WithinRel(expected, 1e-12));
  }
  SECTION("a group of one rank and an empty buffer cost nothing") {
    Network net(c, 8);
    CHECK(net.cost(Collective::all_reduce, 1e9, {1, 1}) == CollectiveCost{});
    CHECK(net.cost(Collective::all_to_all, 0, {8, 1}).time_s == 0);
  }
}

TEST_CASE("an XGMI mesh gives a group of k GPUs k-1 links", "[network]") {
  ClusterSpec c = round_cluster();
  c.intra_node_kind = IntraNodeKind::xgmi;
  c.intra_node.bandwidth_bytes_per_s = 448e9;  // 7 links x 64 GB/s (MI300X)
  Network net(c, 8);
  CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {2, 1}).intra_node_bytes_per_s, WithinRel(64e9, 1e-12));
  CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {8, 1}).intra_node_bytes_per_s, WithinRel(448e9, 1e-12));
  CHECK_THAT(net.path_bandwidth(Collective::send_recv, {2, 4}).intra_node_bytes_per_s, WithinRel(64e9, 1e-12));
}

TEST_CASE("an NVLink-bridged pair is one direct link, and pairs reach each other through their NICs", "[network]") {
  // h100-nvl-pairs: a node is one bridged pair, 300 GB/s x 0.39 = 117 GB/s; two 400 Gb/s NICs per
  // pair at 50 GB/s x 0.94 = 47 GB/s each.
  Network net(store().load_cluster("h100-nvl-pairs"), 8);
  CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {2, 1}).intra_node_bytes_per_s, WithinRel(117e9, 1e-12));
  CHECK(net.path_bandwidth(Collective::all_reduce, {2, 1}).inter_node_bytes_per_s == 0);
  // tp 4 over two pairs: the ring leaves each pair through both its NICs, half a unit each: 2 x 47.
  CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {4, 1}).inter_node_bytes_per_s, WithinRel(94e9, 1e-12));
  // send/recv inside a pair takes the bridge; from one pair to the next, one NIC.
  CHECK_THAT(net.path_bandwidth(Collective::send_recv, {2, 1}).intra_node_bytes_per_s, WithinRel(117e9, 1e-12));
  CHECK_THAT(net.path_bandwidth(Collective::send_recv, {2, 2}).inter_node_bytes_per_s, WithinRel(47e9, 1e-12));
}

TEST_CASE("on a PCIe node a GPU's NIC traffic shares its PCIe link", "[network]") {
  // 2 nodes, tp 8 over PCIe at 63 GB/s, ring across nodes: every GPU forwards 7/8 over PCIe and
  // sends 1/8 to its NIC, both through its one 63 GB/s link: 63 GB/s for one unit in total.
  ClusterSpec c = round_cluster();
  c.intra_node_kind = IntraNodeKind::pcie;
  c.intra_node.bandwidth_bytes_per_s = 63e9;
  Network net(c, 16);
  CHECK_THAT(net.path_bandwidth(Collective::all_reduce, {16, 1}).intra_node_bytes_per_s, WithinRel(63e9, 1e-12));
}

TEST_CASE("cost() on the same shape twice returns identical results", "[network]") {
  Network net(store().load_cluster("dgx-h100"), 128);
  Network copy = net;
  for (GroupShape shape : {GroupShape{8, 1}, GroupShape{16, 8}, GroupShape{4, 32}}) {
    CollectiveCost expected = Network(store().load_cluster("dgx-h100"), 128).cost(Collective::all_reduce, 3e8, shape);
    CollectiveCost first = net.cost(Collective::all_reduce, 3e8, shape);
    CollectiveCost second = net.cost(Collective::all_reduce, 3e8, shape);
    CHECK(first == expected);
    CHECK(second == expected);
    CHECK(copy.cost(Collective::all_reduce, 3e8, shape) == expected);
  }
}

TEST_CASE("bad shapes, sizes and world sizes are input errors", "[network]") {
  Network net(round_cluster(), 16);
  CHECK_THROWS_AS(net.cost(Collective::all_reduce, 1e6, {3, 1}), InputError);   // 3 does not divide 16
  CHECK_THROWS_AS(net.cost(Collective::all_reduce, 1e6, {4, 8}), InputError);   // 32 ranks > 16
  CHECK_THROWS_AS(net.cost(Collective::all_reduce, 1e6, {0, 1}), InputError);
  CHECK_THROWS_AS(net.cost(Collective::all_reduce, -1, {2, 1}), InputError);
  CHECK_THROWS_AS(net.cost(Collective::all_reduce, NAN, {2, 1}), InputError);
  CHECK_THROWS_AS(Network(round_cluster(), 0), InputError);
  CHECK_NOTHROW(Network(round_cluster(), 4).cost(Collective::all_reduce, 1e6, {4, 1}));  // half a node
}

TEST_CASE("the cluster profile's link efficiencies and half-bandwidth sizes are read strictly", "[network][json]") {
  const std::string file = std::string(DPLAN_PROFILES_DIR) + "/clusters/dgx-h100.json";
  const json original = read_json_file(file);
  auto load_gpu = [](const std::string& name) { return store().load_gpu(name); };
  auto error_of = [&](const json& j) -> std::string {
    try {
      cluster_from_json(j, "x.json", load_gpu);
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  SECTION("values arrive in SI units and survive to_json") {
    ClusterSpec c = cluster_from_json(original, file, load_gpu);
    CHECK(c.intra_node.efficiency_fraction == 0.82);
    CHECK(c.intra_node.half_bandwidth_bytes == 6.0 * kMiB);
    CHECK(c.nvls_efficiency_fraction == 0.61);
    CHECK(c.nvls_half_bandwidth_bytes == 13.4 * kMiB);
    CHECK(c.nic_efficiency_fraction == 0.94);
    CHECK(c.inter_node_half_bandwidth_bytes == 45 * kMiB);
    json result = to_json(c);
    CHECK(result["intra_node"]["half_bandwidth_mib"] == 6.0);
    CHECK(result["intra_node"]["nvls_efficiency"] == 0.61);
    CHECK(result["inter_node"]["efficiency"] == 0.94);
  }
  SECTION("an efficiency outside (0, 1] is rejected") {
    json j = original;
    j["cluster"]["inter_node"]["efficiency"] = 0;
    CHECK_THAT(error_of(j), Catch::Matchers::Contains("/cluster/inter_node/efficiency"));
    j["cluster"]["inter_node"]["efficiency"] = 1.5;
    CHECK_THAT(error_of(j), Catch::Matchers::Contains("/cluster/inter_node/efficiency"));
  }
  SECTION("NVLS figures only come with nvls true") {
    json j = original;
    j["cluster"]["intra_node"]["nvls"] = false;
    CHECK_THAT(error_of(j), Catch::Matchers::Contains("nvls_efficiency"));
    j["cluster"]["intra_node"].erase("nvls_efficiency");
    j["cluster"]["intra_node"].erase("nvls_half_bandwidth_mib");
    CHECK_NOTHROW(cluster_from_json(j, "x.json", load_gpu));
  }
  SECTION("a missing half-bandwidth size is named") {
    json j = original;
    j["cluster"]["intra_node"].erase("half_bandwidth_mib");
    CHECK_THAT(error_of(j), Catch::Matchers::Contains("missing key \"half_bandwidth_mib\""));
  }
}

TEST_CASE("the measured all-reduce tables of profiles/clusters/SOURCES.md are reproduced within 25%", "[network][published]") {
  struct Row {
    const char* cluster;
    int gpus;
    double bytes;
    double busbw_bytes_per_s;  // measured
  };
  // 8x A100 all_reduce_perf (ml-eng); 8x H200 NVLS sweep (ml-eng); 8x H100 NVLS ~480 GB/s at large
  // sizes (nccl-tests#212); P6-B200 1 node and 4 nodes x 8 over EFA (ml-eng); 2 DGX A100 nodes
  // 192 GB/s (NVIDIA/nccl#812); MI300X 8 GPUs and a 2-GPU group (ml-eng); 2 H100 over an NVLink
  // bridge (NVIDIA/nccl#1161).
  const std::vector<Row> rows = {
      {"dgx-a100-80g", 8, 1 * kMiB, 18.0e9},    {"dgx-a100-80g", 8, 64 * kMiB, 171.5e9},
      {"dgx-a100-80g", 8, kGiB, 229.0e9},       {"dgx-a100-80g", 8, 16 * kGiB, 234.9e9},
      {"hgx-h200", 8, 64 * kMiB, 346.5e9},      {"hgx-h200", 8, 256 * kMiB, 436.2e9},
      {"hgx-h200", 8, kGiB, 463.6e9},           {"hgx-h200", 8, 16 * kGiB, 482.26e9},
      {"dgx-h100", 8, 16 * kGiB, 480e9},        {"dgx-b200", 8, 64 * kMiB, 400.60e9},
      {"dgx-b200", 8, kGiB, 723.34e9},          {"dgx-b200", 8, 16 * kGiB, 845.67e9},
      {"dgx-a100-80g", 16, 16 * kGiB, 192e9},   {"mi300x-8", 8, 4 * kGiB, 312.9e9},
      {"mi300x-8", 2, 4 * kGiB, 47.7e9},        {"h100-nvl-pairs", 2, kGiB, 115.37e9},
      {"h100-nvl-pairs", 2, 4 * kGiB, 116.26e9},
      {"dgx-b200", 32, 1 * kMiB, 5.37e9},       {"dgx-b200", 32, 64 * kMiB, 156.74e9},
      {"dgx-b200", 32, kGiB, 361.99e9},         {"dgx-b200", 32, 16 * kGiB, 381.80e9},
  };
  for (const Row& row : rows) {
    Network net(store().load_cluster(row.cluster), row.gpus);
    double result = net.cost(Collective::all_reduce, row.bytes, {row.gpus, 1}).bus_bandwidth_bytes_per_s;
    INFO(row.cluster << " x" << row.gpus << " " << row.bytes / kMiB << " MiB: model " << result / 1e9
                     << " GB/s, measured " << row.busbw_bytes_per_s / 1e9);
    CHECK_THAT(result, WithinRel(row.busbw_bytes_per_s, 0.25));
  }
}

TEST_CASE("a 16384-GPU network costs shapes quickly (timing printed, not asserted)", "[network][timing]") {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  Network net(store().load_cluster("dgx-h100"), 16384);
  auto t1 = Clock::now();
  // ~50 distinct shapes: the tp, cp, ep, dp and pp groups of power-of-two layouts of 16384 GPUs.
  std::vector<GroupShape> distinct;
  for (int tp : {1, 2, 4, 8, 16})
    for (int cp : {1, 2, 4})
      for (int pp : {1, 4, 16, 64}) {
        ParallelConfig p{.tp = tp, .pp = pp, .dp = 16384 / (tp * cp * pp), .cp = cp, .ep = 8};
        for (Dim d : {Dim::tp, Dim::cp, Dim::ep, Dim::dp, Dim::pp}) {
          GroupShape s = Mesh(p).shape(d);
          if (distinct.size() < 50 && std::find(distinct.begin(), distinct.end(), s) == distinct.end())
            distinct.push_back(s);
        }
      }
  double sum = 0;
  for (GroupShape s : distinct) {
    sum += net.cost(Collective::all_reduce, 64 * kMiB, s).time_s;
    sum += net.cost(Collective::send_recv, 64 * kMiB, s).time_s;
  }
  auto t2 = Clock::now();
  const int kCachedCalls = 1000000;
  for (int i = 0; i < kCachedCalls; ++i)
    sum += net.cost(Collective::all_reduce, 1e6 + i, distinct[i % distinct.size()]).time_s;
  auto t3 = Clock::now();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  WARN("16384 x dgx-h100: build " << ms(t1 - t0) << " ms; first cost of " << distinct.size()
                                   << " distinct shapes x 2 patterns " << ms(t2 - t1) << " ms; " << kCachedCalls
                                   << " cached cost() calls " << ms(t3 - t2) << " ms");
  CHECK(sum > 0);
}

TEST_CASE(
    "measured collectives inside a node replace the model for their "
    "collective and group size",
    "[network]") {
  ClusterSpec c = store().load_cluster("local-cpu");
  c.cores_per_node = 0;  // a rank per core for now
  const Network model(c, 4);
  // Gloo-like: 2 ms at small sizes, then 0.5 GB/s.
  for (double bytes : {4096.0, 65536.0, 1048576.0, 16777216.0})
    c.intra_node.measured.push_back({Collective::all_reduce, 2, bytes, 2e-3 + bytes / 0.5e9});
  const Network measured(c, 4);
  // Exactly the measurement at a measured size, log-log between sizes, flat
  // below, linear above.
  CHECK_THAT(measured.cost(Collective::all_reduce, 65536, {2, 1}).time_s, WithinRel(2e-3 + 65536 / 0.5e9, 1e-12));
  const double between = measured.cost(Collective::all_reduce, 262144, {2, 1}).time_s;
  CHECK(between > 2e-3 + 65536 / 0.5e9);
  CHECK(between < 2e-3 + 1048576 / 0.5e9);
  CHECK_THAT(measured.cost(Collective::all_reduce, 1024, {2, 1}).time_s, WithinRel(2e-3 + 4096 / 0.5e9, 1e-12));
  CHECK_THAT(measured.cost(Collective::all_reduce, 2 * 16777216.0, {2, 1}).time_s,
             WithinRel(2 * (2e-3 + 16777216 / 0.5e9), 1e-12));
  // Another group size or collective: the model, unchanged.
  CHECK(measured.cost(Collective::all_reduce, 65536, {4, 1}) == model.cost(Collective::all_reduce, 65536, {4, 1}));
  CHECK(measured.cost(Collective::all_gather, 65536, {2, 1}) == model.cost(Collective::all_gather, 65536, {2, 1}));
  // Gloo's reduce-scatter is an all-reduce and its slice on the shared-memory
  // tier.
  CHECK(measured.cost(Collective::reduce_scatter, 65536, {2, 1}).time_s ==
        measured.cost(Collective::all_reduce, 65536, {2, 1}).time_s);
  // Ranks time-sharing the cores run their collectives at that share: 4 ranks
  // on 2 cores take twice as long.
  ClusterSpec shared = c;
  shared.cores_per_node = 2;
  CHECK_THAT(Network(shared, 4).cost(Collective::all_reduce, 65536, {2, 1}).time_s,
             WithinRel(2 * measured.cost(Collective::all_reduce, 65536, {2, 1}).time_s, 1e-12));
  CHECK(Network(shared, 2).cost(Collective::all_reduce, 65536, {2, 1}) ==
        measured.cost(Collective::all_reduce, 65536, {2, 1}));
  // A calibrated scale on the measured times; time-shared ranks take the larger of it and 1 / share.
  shared.intra_node.measured_scale = 1.5;
  const double one = measured.cost(Collective::all_reduce, 65536, {2, 1}).time_s;
  CHECK_THAT(Network(shared, 2).cost(Collective::all_reduce, 65536, {2, 1}).time_s, WithinRel(1.5 * one, 1e-12));
  CHECK_THAT(Network(shared, 4).cost(Collective::all_reduce, 65536, {2, 1}).time_s, WithinRel(2 * one, 1e-12));
  shared.intra_node.measured_scale = 3;
  CHECK_THAT(Network(shared, 4).cost(Collective::all_reduce, 65536, {2, 1}).time_s, WithinRel(3 * one, 1e-12));
  // The table survives the profile's JSON.
  json file = {{"format_version", 1}, {"cluster", to_json(c)}};
  file["cluster"]["gpu"] = "cpu-core";
  file["cluster"]["intra_node"]["source"] = file["cluster"]["inter_node"]["source"] =
      file["cluster"]["fabric"]["source"] = file["cluster"]["source"] = "test";
  const ClusterSpec back = cluster_from_json(file, "c.json", [&](const std::string&) { return c.gpu; });
  REQUIRE(back.intra_node.measured.size() == 4);
  CHECK_THAT(back.intra_node.measured[2].time_s, WithinRel(c.intra_node.measured[2].time_s, 1e-12));
  CHECK(back.comm_overlap_fraction == 1.0);
}
