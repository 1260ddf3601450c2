// A pipeline step played out: dedicated devices reproduce the closed forms, ranks that share cores
// fill each other's waits, checked against timelines worked out by hand.
#include "dplan/costmodel/pipeline.h"

#include <catch2/catch.hpp>

using namespace dplan::costmodel;
using Catch::Matchers::WithinRel;

namespace {
double dedicated(int) { return 1.0; }
}  // namespace

TEST_CASE("on dedicated devices a balanced pipeline takes (m + p - 1) micro-batch slots", "[pipeline]") {
  // Narayanan et al. 2021, Sec. 2.2: the bubble is p - 1 slots of forward + backward, for GPipe and 1F1B.
  for (Schedule schedule : {Schedule::gpipe, Schedule::one_f_one_b})
    for (int p : {1, 2, 4, 8})
      for (int m : {1, 3, 8, 32}) {
        std::vector<PipelineStage> stages(p, PipelineStage{1.0, 2.0});
        PipelineTimeline t = play_pipeline(stages, m, schedule, 1, dedicated);
        INFO("p " << p << " m " << m << (schedule == Schedule::gpipe ? " gpipe" : " 1f1b"));
        CHECK_THAT(t.makespan_s, WithinRel(3.0 * (m + p - 1), 1e-12));
        for (double busy : t.busy_s) CHECK_THAT(busy, WithinRel(3.0 * m, 1e-12));
      }
}

TEST_CASE("on dedicated devices the interleaved schedule's bubble is (p - 1) / v slots", "[pipeline]") {
  // Narayanan et al. 2021, Sec. 2.2: v model chunks per stage cut the bubble to (p - 1) / v slots,
  // for micro-batches in whole groups of p.
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        std::vector<PipelineStage> stages(p, PipelineStage{1.0, 2.0});
        PipelineTimeline t = play_pipeline(stages, m, Schedule::interleaved, v, dedicated);
        INFO("p " << p << " v " << v << " m " << m);
        CHECK_THAT(t.makespan_s, WithinRel(3.0 * (m + double(p - 1) / v), 1e-12));
        for (double busy : t.busy_s) CHECK_THAT(busy, WithinRel(3.0 * m, 1e-12));
      }
  // A last group short of p micro-batches plays out too (no deadlock), never below the whole
  // groups' figure.
  std::vector<PipelineStage> stages(4, PipelineStage{1.0, 2.0});
  PipelineTimeline t = play_pipeline(stages, 6, Schedule::interleaved, 2, dedicated);
  CHECK(t.makespan_s >= 3.0 * (6 + 3.0 / 2) * (1 - 1e-12));
  for (double busy : t.busy_s) CHECK_THAT(busy, WithinRel(3.0 * 6, 1e-12));
}

TEST_CASE("an unbalanced 1F1B pipeline, timed by hand", "[pipeline]") {
  // Stage 0: forward 1, backward 2; stage 1: forward 2, backward 4; two micro-batches.
  std::vector<PipelineStage> stages{{1, 2}, {2, 4}};
  // Dedicated: s0 F0 [0,1] F1 [1,2]; s1 F0 [1,3] B0 [3,7]; s0 B0 [7,9]; s1 F1 [7,9] B1 [9,13];
  // s0 B1 [13,15]. The closed form's (m + p - 1) slots of the slowest stage would say 18.
  PipelineTimeline t = play_pipeline(stages, 2, Schedule::one_f_one_b, 1, dedicated);
  CHECK_THAT(t.makespan_s, WithinRel(15.0, 1e-12));
  CHECK_THAT(t.busy_s[0], WithinRel(6.0, 1e-12));
  CHECK_THAT(t.busy_s[1], WithinRel(12.0, 1e-12));
  // Two stages on cores enough for one at full pace (a stage alone runs twice as fast):
  // s0 F0 alone [0,0.5]; s0 F1 and s1 F0 together, s0 done at 1.5 with 1 of s1's 2 left; s1 alone
  // finishes F0 at 2 and B0 at 4; s0 B0 and s1 F1 together [4,6]; s1 B1 alone [6,8]; s0 B1 alone
  // [8,9]. 9 = all 18 s of work on the two stages' worth of cores: no core ever idle.
  t = play_pipeline(stages, 2, Schedule::one_f_one_b, 1, [](int running) { return running == 1 ? 2.0 : 1.0; });
  CHECK_THAT(t.makespan_s, WithinRel(9.0, 1e-12));
  CHECK_THAT(t.busy_s[0], WithinRel(0.5 + 1 + 2 + 1, 1e-12));
  CHECK_THAT(t.busy_s[1], WithinRel(1.5 + 2 + 2 + 2, 1e-12));
}

TEST_CASE("stages that share cores fill each other's waits, never below the work over the cores", "[pipeline]") {
  // p stages whose ranks together have cores for p / 2 stages at full pace: a stage running with
  // fewer than half the stages busy runs twice as fast as with all of them.
  for (int p : {2, 4})
    for (int m : {1, 4, 16}) {
      std::vector<PipelineStage> stages(p, PipelineStage{1.0, 2.0});
      auto shared = [p](int running) { return std::min(2.0, double(p) / running); };
      PipelineTimeline t = play_pipeline(stages, m, Schedule::one_f_one_b, 1, shared);
      const double work_over_cores_s = 3.0 * m;  // p stages' 3 m each, at 2x pace on p / 2 stages' cores
      const double closed_form_s = 3.0 * (m + p - 1);
      INFO("p " << p << " m " << m << ": " << t.makespan_s);
      CHECK(t.makespan_s >= work_over_cores_s * (1 - 1e-12));
      CHECK(t.makespan_s < closed_form_s);
      if (p == 2) CHECK_THAT(t.makespan_s, WithinRel(work_over_cores_s, 1e-12));  // pp 2: fully packed
    }
}

TEST_CASE("a long step's steady state extended from a shorter one matches playing it all", "[pipeline]") {
  // Unbalanced stages on shared cores, where no closed form holds; a last group short of p.
  std::vector<PipelineStage> stages{{1, 2}, {1.5, 3}, {0.7, 1.6}, {1.2, 2.5}};
  auto shared = [](int running) { return std::min(2.0, 4.0 / running); };
  for (Schedule schedule : {Schedule::one_f_one_b, Schedule::interleaved})
    for (int m : {24, 27, 64}) {
      PipelineTimeline all = play_pipeline(stages, m, schedule, 2, shared, false);
      PipelineTimeline fast = play_pipeline(stages, m, schedule, 2, shared);
      INFO("m " << m << " schedule " << int(schedule));
      CHECK_THAT(fast.makespan_s, WithinRel(all.makespan_s, 1e-3));
      for (int i = 0; i < 4; ++i) CHECK_THAT(fast.busy_s[i], WithinRel(all.busy_s[i], 1e-3));
    }
}

TEST_CASE("a stage with no work passes its micro-batches straight on", "[pipeline]") {
  std::vector<PipelineStage> stages{{0, 0}, {1, 2}};
  PipelineTimeline t = play_pipeline(stages, 4, Schedule::one_f_one_b, 1, dedicated);
  CHECK_THAT(t.makespan_s, WithinRel(12.0, 1e-12));
  CHECK(t.busy_s[0] == 0);
}
