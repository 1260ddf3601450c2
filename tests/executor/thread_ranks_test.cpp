// Ranks as threads of one process over real Gloo groups (one c10d::HashStore, 127.0.0.1), as
// c10d's own tests run them: each rank built exactly as dplan-worker builds it (rank_setup.h), in
// process, beside the process-level parity of executor_test.cpp.
//  - groups: for every layout `dplan estimate` accepts for gpt-tiny on 4 and 8 ranks (tp, cp, dp,
//    pp) and for mixtral-tiny with ep and etp, every process group a rank builds has the mesh's
//    members (costmodel/mesh.h) in the mesh's order, and an all-reduce over it sums exactly those
//    ranks: the executor's groups are the mesh's, connected;
//  - training: three steps of the plan's Trainer (the GPT stage, gradient sync and ZeRO, the
//    tensor-parallel operators, the pipeline order of costmodel/pipeline.h) on tp 2, pp 2 under
//    1F1B, dp 2 with ZeRO-1 and ZeRO-3 (with tp 2 and sequence parallel), cp 2, mixtral-tiny's
//    ep 2 and an 8-layer Llama's pp 2 interleaved give the losses of the one-rank run of the same
//    model, seed and data within 1e-4, and the data-parallel replicas hold the same parameters
//    after them under ZeRO 0 to 3.
#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

// LibTorch first: its glog defines CHECK, which must give way to Catch's.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include "data.h"
#include "dplan/costmodel/mesh.h"
#include "harness.h"
#include "memory_meter.h"
#include "phase_clock.h"
#include "rank_setup.h"

namespace {
using namespace dplan::executor;
using dplan::testing::TempDir;
using dplan::testing::executor::kParityTolerance;
using dplan::testing::executor::Layout;
using dplan::testing::executor::write_plan;

const std::string kMixtralTiny = std::string(DPLAN_VALIDATION_DIR) + "/executor/mixtral-tiny/config.json";
const std::string kLlamaTiny8 = std::string(DPLAN_VALIDATION_DIR) + "/executor/llama-tiny-8l/config.json";

// One meter for the process: LibTorch's CPU allocator hook is process-wide (memory_meter.h).
MemoryMeter& meter() {
  static MemoryMeter m(-1);
  return m;
}

// Runs fn(rank, store, options) on `world` threads, one store; rethrows the first failure.
void run_ranks(int world, const std::function<void(int, const StorePtr&, const GroupOptions&)>& fn) {
  meter();
  torch::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  GroupOptions options;
  options.gloo_address = "127.0.0.1";
  options.timeout = std::chrono::milliseconds(60000);
  std::vector<std::exception_ptr> failure(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        torch::set_num_threads(1);
        fn(rank, store, options);
      } catch (...) {
        failure[rank] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& f : failure)
    if (f) std::rethrow_exception(f);
}

// The plan file for `l`, or empty when dplan estimate refuses the layout (not every factorisation
// of the ranks suits the model).
std::string plan_or_empty(const TempDir& dir, const std::string& model, const Layout& l,
                          const std::vector<std::string>& extra) {
  std::string name = "plan-" + std::to_string(l.tp) + std::to_string(l.cp) + std::to_string(l.dp) +
                     std::to_string(l.pp);
  for (const std::string& e : extra) name += e;
  const std::string path = (dir.path() / (name + ".json")).string();
  std::vector<std::string> args = {"estimate", "--model", model, "--cluster", "local-cpu", "--gpus",
                                   std::to_string(l.world()), "--tp", std::to_string(l.tp), "--pp",
                                   std::to_string(l.pp), "--dp", std::to_string(l.dp), "--cp", std::to_string(l.cp),
                                   "--global-batch", "8", "--precision", "fp32", "-o", path};
  args.insert(args.end(), extra.begin(), extra.end());
  return dplan::testing::run_program(DPLAN_BINARY, args).status == 0 ? path : "";
}

// Sum over the group of 2^rank: which ranks an all-reduce over it reached.
double reached(Group& g, int rank) {
  at::Tensor t = at::full({1}, std::ldexp(1.0, rank), at::kDouble);
  g.all_reduce(t);
  return t.item<double>();
}

double expected(const std::vector<int>& members) {
  double sum = 0;
  for (int r : members) sum += std::ldexp(1.0, r);
  return sum;
}

// Every group of every rank: the mesh's members, in its order, and connected to exactly them.
void check_groups(const std::string& plan_path) {
  INFO(plan_path);
  const ExecPlan plan = read_plan(plan_path);
  const dplan::costmodel::Mesh mesh = plan.mesh();
  using dplan::costmodel::Dim;
  run_ranks(plan.world_size(), [&](int rank, const StorePtr& store, const GroupOptions& go) {
    PhaseClock clock;
    ParallelContext ctx = build_parallel_context(plan, rank, at::kCPU, at::kFloat, store, go, clock, meter());
    std::vector<std::pair<Group*, std::vector<int>>> groups = {
        {&ctx.tp, mesh.group(Dim::tp, rank)},
        {&ctx.cp, mesh.group(Dim::cp, rank)},
        {&ctx.dp, mesh.group(Dim::dp, rank)},
        {&ctx.pp, mesh.group(Dim::pp, rank)},
        {&ctx.dp_cp, mesh.data_parallel_group(rank)}};
    if (plan.model.is_moe())
      for (auto [g, d] : {std::pair{&ctx.etp, Dim::etp}, {&ctx.ep, Dim::ep}, {&ctx.edp, Dim::edp}})
        groups.push_back({g, mesh.group(d, rank)});
    const int stage = mesh.coordinates(rank).pp;
    const bool ends = plan.parallel.pp > 1 && (stage == 0 || stage == plan.parallel.pp - 1);
    CHECK(ctx.has_embedding_group == (plan.model.tied_embeddings && ends));
    if (ctx.has_embedding_group) groups.push_back({&ctx.embedding, mesh.embedding_group(rank)});
    for (auto& [group, members] : groups) {
      CHECK(group->ranks() == members);
      CHECK(reached(*group, rank) == expected(members));
    }
    CHECK(ctx.stage == stage);
  });
}

// Three steps of the plan's Trainer on every rank: the losses (the same on every rank) and a hash
// of each rank's parameters with its dp coordinate.
struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> parameter_sums_by_rank;  // per rank: each parameter's sum
};

Trained train(const std::string& plan_path, int steps = 3) {
  const ExecPlan plan = read_plan(plan_path);
  Trained out;
  out.parameter_sums_by_rank.resize(plan.world_size());
  std::vector<std::vector<double>> losses(plan.world_size());
  run_ranks(plan.world_size(), [&](int rank, const StorePtr& store, const GroupOptions& go) {
    PhaseClock clock;
    ParallelContext ctx = build_parallel_context(plan, rank, at::kCPU, at::kFloat, store, go, clock, meter());
    GptStage stage = build_model(plan, ctx, /*seed=*/1234, rank);
    GradSync grads(stage, ctx, static_cast<int64_t>(plan.training.bucket_bytes), plan.parallel.zero_stage,
                   plan.parallel.distributed_optimizer, at::kFloat);
    auto optimizer = build_optimizer(grads, 1e-3, plan.parallel.offload_optimizer);
    Trainer trainer(stage, ctx, grads, *optimizer, step_options(plan, 1.0));
    DataSource data("", plan.training.seq_len, plan.model.vocab_size, plan.training.global_batch, plan.parallel.dp,
                    plan.mesh().coordinates(rank).dp, 1234);
    for (int s = 0; s < steps; ++s) losses[rank].push_back(trainer.step(data.next_step(plan.parallel.micro_batch)).loss);
    grads.gather_all_units();  // ZeRO-3: the whole stage, to compare replicas
    for (const Parameter& p : stage.parameters()) out.parameter_sums_by_rank[rank].push_back(p.tensor.sum().item<double>());
  });
  for (int r = 1; r < plan.world_size(); ++r) CHECK(losses[r] == losses[0]);  // shared along the pipeline and dp
  out.losses = losses[0];
  return out;
}

void expect_same_losses(const Trained& t, const Trained& reference) {
  REQUIRE(t.losses.size() == reference.losses.size());
  for (size_t s = 0; s < t.losses.size(); ++s) {
    INFO("step " << s << ": " << t.losses[s] << " vs one rank " << reference.losses[s]);
    CHECK(std::abs(t.losses[s] - reference.losses[s]) <= kParityTolerance * std::abs(reference.losses[s]));
  }
}

}  // namespace

TEST_CASE("thread ranks: every group the executor builds is the mesh's, connected to exactly its members",
          "[executor][threads]") {
  TempDir dir;
  int layouts = 0;
  for (int world : {4, 8})
    for (int tp = 1; tp <= world; tp *= 2)
      for (int cp = 1; tp * cp <= world; cp *= 2)
        for (int pp = 1; tp * cp * pp <= world; pp *= 2) {
          Layout l;
          l.tp = tp;
          l.cp = cp;
          l.pp = pp;
          l.dp = world / (tp * cp * pp);
          const std::string plan = plan_or_empty(dir, "gpt-tiny", l, {});
          if (plan.empty()) continue;
          check_groups(plan);
          ++layouts;
        }
  // Expert parallel folded over tp x cp x dp, with and without expert tensor parallel.
  for (auto [tp, dp, pp, ep, etp] : std::vector<std::tuple<int, int, int, int, int>>{
           {1, 4, 1, 2, 1}, {1, 4, 1, 4, 1}, {2, 2, 1, 2, 1}, {2, 2, 1, 2, 2}, {2, 2, 2, 4, 1}, {1, 4, 2, 2, 2}}) {
    Layout l;
    l.tp = tp;
    l.dp = dp;
    l.pp = pp;
    const std::string plan =
        plan_or_empty(dir, kMixtralTiny, l, {"--ep", std::to_string(ep), "--etp", std::to_string(etp)});
    INFO("mixtral-tiny tp " << tp << " dp " << dp << " pp " << pp << " ep " << ep << " etp " << etp);
    REQUIRE_FALSE(plan.empty());
    check_groups(plan);
    ++layouts;
  }
  std::printf("thread ranks: the groups of %d layouts are the mesh's\n", layouts);
  CHECK(layouts >= 20);
}

TEST_CASE("thread ranks: the plan's trainer on tp, pp, dp with ZeRO, cp and ep gives the one-rank losses",
          "[executor][threads]") {
  TempDir dir;
  const Trained single = train(write_plan(dir, "gpt-tiny", {1, 1, 1}, 8));
  REQUIRE(single.losses.size() == 3);
  CHECK(single.losses.back() < single.losses.front());  // it learns, or parity would prove little
  struct Case {
    std::string model;
    Layout layout;
    std::vector<std::string> extra;
  };
  Layout cp2;
  cp2.cp = 2;
  const std::vector<Case> cases = {
      {"gpt-tiny", {2, 1, 1}, {}},
      {"gpt-tiny", {1, 2, 1}, {}},
      {"gpt-tiny", {1, 1, 2}, {"--zero", "1"}},
      {"gpt-tiny", {2, 1, 2, "1f1b", true}, {"--zero", "3"}},
      {"gpt-tiny", cp2, {}},
  };
  for (const Case& c : cases) {
    INFO(c.model << " " << c.layout.describe());
    expect_same_losses(train(write_plan(dir, c.model, c.layout, 8, c.extra)), single);
  }
  SECTION("mixtral-tiny: ep 2 over dp 2 against its own one-rank run") {
    const Trained one = train(write_plan(dir, kMixtralTiny, {1, 1, 1}, 8));
    expect_same_losses(train(write_plan(dir, kMixtralTiny, {1, 1, 2}, 8, {"--ep", "2"})), one);
  }
  SECTION("llama-tiny-8l: pp 2 interleaved with vpp 2 against its own one-rank run") {
    const Trained one = train(write_plan(dir, kLlamaTiny8, {1, 1, 1}, 8));
    expect_same_losses(train(write_plan(dir, kLlamaTiny8, {1, 2, 1, "interleaved"}, 8, {"--vpp", "2"})), one);
  }
}

TEST_CASE("thread ranks: data-parallel replicas hold the same parameters after the steps", "[executor][threads]") {
  TempDir dir;
  for (const std::string zero : {"0", "1", "2", "3"}) {
    INFO("ZeRO-" << zero);
    const Trained t = train(write_plan(dir, "gpt-tiny", {1, 1, 2}, 8, {"--zero", zero}));
    CHECK(t.parameter_sums_by_rank[0] == t.parameter_sums_by_rank[1]);
  }
}
