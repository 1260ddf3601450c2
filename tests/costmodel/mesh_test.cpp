// The mesh (costmodel/mesh.h): one owner of the rank order and the groups. Laws over every layout
// the search enumerates for the test models on 1 to 8 GPUs, and the plan reader's refusal of a
// rank layout that is not the mesh's.
#include <cstdio>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/mesh.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/planner/search.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;

namespace {

constexpr Dim kDims[] = {Dim::tp, Dim::cp, Dim::dp, Dim::pp, Dim::etp, Dim::ep, Dim::edp};

int coordinate(const RankCoordinates& c, Dim d) {
  switch (d) {
    case Dim::tp: return c.tp;
    case Dim::cp: return c.cp;
    case Dim::dp: return c.dp;
    case Dim::pp: return c.pp;
    case Dim::etp: return c.etp;
    case Dim::ep: return c.ep;
    case Dim::edp: return c.edp;
  }
  return -1;
}

// The coordinates a rank's group of `d` shares: the other dense ones for a dense dimension; the
// stage and the other expert ones for an expert dimension.
std::vector<int> shared(const RankCoordinates& c, Dim d) {
  const bool expert = d == Dim::etp || d == Dim::ep || d == Dim::edp;
  std::vector<int> out;
  for (Dim o : kDims) {
    const bool o_expert = o == Dim::etp || o == Dim::ep || o == Dim::edp;
    if (o != d && (expert ? (o_expert || o == Dim::pp) : !o_expert)) out.push_back(coordinate(c, o));
  }
  return out;
}

// Every layout the search enumerates for these models on 1..8 GPUs (the ones the executor's tests
// train), deduplicated by what the mesh reads.
std::vector<ParallelConfig> layouts() {
  std::vector<ParallelConfig> out;
  std::set<std::vector<int>> seen;
  TrainingSpec training;
  training.seq_len = 64;
  training.global_batch = 16;
  for (const char* name : {"gpt-tiny", "gpt-small"}) {
    const ModelSpec model = dplan::testing::store().load_model(name);
    for (int gpus = 1; gpus <= 8; ++gpus) {
      planner::SearchSpace space;
      space.gpus = gpus;
      for (const ParallelConfig& p : planner::enumerate_layouts(model, training, space))
        if (seen.insert({p.tp, p.cp, p.dp, p.pp, p.ep, p.expert_tp()}).second) out.push_back(p);
    }
  }
  const ModelSpec moe = dplan::testing::store().load_model(std::string(DPLAN_VALIDATION_DIR) +
                                                          "/executor/mixtral-tiny/config.json");
  for (int gpus = 1; gpus <= 8; ++gpus) {
    planner::SearchSpace space;
    space.gpus = gpus;
    for (const ParallelConfig& p : planner::enumerate_layouts(moe, training, space))
      if (seen.insert({p.tp, p.cp, p.dp, p.pp, p.ep, p.expert_tp()}).second) out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_CASE("mesh: rank and coordinates round-trip, and every group is its shape's, in coordinate order", "[mesh]") {
  const std::vector<ParallelConfig> all = layouts();
  std::printf("mesh laws over %zu distinct layouts of gpt-tiny, gpt-small and mixtral-tiny on 1-8 GPUs\n", all.size());
  CHECK(all.size() >= 40);  // the law is checked on many layouts, MoE folding among them
  bool saw_folded_experts = false;
  for (const ParallelConfig& p : all) {
    const Mesh mesh(p, 4);
    INFO("tp " << p.tp << " cp " << p.cp << " dp " << p.dp << " pp " << p.pp << " ep " << p.ep << " etp "
               << p.expert_tp());
    REQUIRE(mesh.world_size() == p.world_size());
    saw_folded_experts = saw_folded_experts || (p.ep > 1 && p.expert_tp() != p.tp);
    for (int r = 0; r < mesh.world_size(); ++r) {
      const RankCoordinates c = mesh.coordinates(r);
      CHECK(c.rank == r);
      CHECK(mesh.rank_at(c.tp, c.cp, c.dp, c.pp) == r);
      CHECK(c.node == r / 4);
      CHECK(c.local_rank == r % 4);
      for (Dim d : kDims) {
        const std::vector<int> members = mesh.group(d, r);
        const GroupShape s = mesh.shape(d);
        REQUIRE(int(members.size()) == s.size);
        CHECK(members[coordinate(c, d)] == r);  // a member's index is its coordinate
        for (int i = 0; i < s.size; ++i) {
          CHECK(members[i] == members[0] + i * s.stride);
          const RankCoordinates m = mesh.coordinates(members[i]);
          CHECK(coordinate(m, d) == i);
          CHECK(shared(m, d) == shared(c, d));
        }
      }
      // The dense gradients' dp x cp group: tp and pp shared, cp fastest.
      const std::vector<int> dpcp = mesh.data_parallel_group(r);
      REQUIRE(int(dpcp.size()) == p.dp * p.cp);
      for (int i = 0; i < int(dpcp.size()); ++i) {
        const RankCoordinates m = mesh.coordinates(dpcp[i]);
        CHECK((m.tp == c.tp && m.pp == c.pp && m.cp + p.cp * m.dp == i));
        CHECK(dpcp[i] == dpcp[0] + i * mesh.data_parallel_shape().stride);
      }
      const std::vector<int> embedding = mesh.embedding_group(r);
      if (p.pp == 1) {
        CHECK(embedding.empty());
      } else {
        REQUIRE(embedding.size() == 2);
        CHECK(mesh.coordinates(embedding[0]).pp == 0);
        CHECK(mesh.coordinates(embedding[1]).pp == p.pp - 1);
        for (int e : embedding) CHECK(shared(mesh.coordinates(e), Dim::pp) == shared(c, Dim::pp));
      }
    }
    // The groups of one dimension tile the world: each rank in exactly one.
    for (Dim d : kDims) {
      std::vector<int> count(mesh.world_size(), 0);
      for (int r = 0; r < mesh.world_size(); ++r)
        if (mesh.group(d, r).front() == r)
          for (int m : mesh.group(d, r)) ++count[m];
      for (int n : count) CHECK(n == 1);
    }
  }
  CHECK(saw_folded_experts);
}

TEST_CASE("mesh: Megatron-Core's fold of the expert groups over a stage", "[mesh]") {
  // tp 2 x dp 4 x pp 2 with ep 4 and etp 1: within a stage's 8 ranks etp is 1, ep the fastest
  // (stride 1) and edp 2 (stride 4); rank 13 is stage 1's local rank 5: ep 1, edp 1.
  ParallelConfig p{.tp = 2, .pp = 2, .dp = 4, .ep = 4, .etp = 1, .layers_per_stage = {}};
  const Mesh mesh(p, 8);
  CHECK(mesh.shape(Dim::ep) == GroupShape{4, 1});
  CHECK(mesh.shape(Dim::edp) == GroupShape{2, 4});
  const RankCoordinates c = mesh.coordinates(13);
  CHECK((c.pp == 1 && c.ep == 1 && c.edp == 1 && c.etp == 0 && c.node == 1 && c.local_rank == 5));
  CHECK(mesh.group(Dim::ep, 13) == std::vector<int>{12, 13, 14, 15});
  CHECK(mesh.group(Dim::edp, 13) == std::vector<int>{9, 13});
  CHECK(mesh.group(Dim::tp, 13) == std::vector<int>{12, 13});
  CHECK(mesh.group(Dim::dp, 13) == std::vector<int>{9, 11, 13, 15});
  CHECK(mesh.group(Dim::pp, 13) == std::vector<int>{5, 13});
}

TEST_CASE("mesh: a plan whose rank layout is not the mesh's is refused in one line naming the rank", "[mesh]") {
  const Plan plan = dplan::testing::local_plan("gpt-tiny", {.tp = 2, .pp = 2, .dp = 2, .layers_per_stage = {}}, 64, 8);
  json j = to_json(plan);
  CHECK_NOTHROW(plan_from_json(j, "plan.json"));
  // Ranks 1 and 2 swapped (tp and cp, dp would say another order): both still valid coordinates.
  std::swap(j["rank_layout"]["ranks"][1]["tp"], j["rank_layout"]["ranks"][2]["tp"]);
  std::swap(j["rank_layout"]["ranks"][1]["dp"], j["rank_layout"]["ranks"][2]["dp"]);
  try {
    plan_from_json(j, "plan.json");
    FAIL("read a plan whose ranks are not in the order tp-cp-dp-pp");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    CHECK(what == "plan.json: /rank_layout/ranks/1/tp: expected rank 1 at tp 1, cp 0, dp 0, pp 0 (the order "
                  "tp-cp-dp-pp; it is at tp 0, cp 0, dp 1, pp 0), got 0");
  }
}
