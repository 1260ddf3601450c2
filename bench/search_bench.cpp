// Search speed benchmark (a benchmark, not a test): for each case, enumerate every layout, run the
// full search with the dplan cost model on one thread, and print the wall time, layouts evaluated
// per second and the time one layout's evaluation takes on average (microseconds). Each case runs
// `repeats` times; the median wall time is reported.
//   taskset -c 0 build/bench/search_bench [repeats]
// The whole `dplan` process (profiles read, search, the winner explained) is timed apart:
//   for i in 1 2 3 4 5; do /usr/bin/time -f %e taskset -c 0 build/dplan --model 70B --gpus 64 >/dev/null; done
// (docs/cost-model.md, "Search speed").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dplan/planner/profiles.h"
#include "dplan/planner/search.h"

using namespace dplan;
using namespace dplan::costmodel;
using namespace dplan::planner;

int main(int argc, char** argv) {
  int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  ProfileStore store(DPLAN_PROFILES_DIR);
  struct Case {
    const char* model;
    const char* cluster;
    int gpus;
    int seq;
  };
  const Case cases[] = {{"llama-3-70b", "dgx-h100", 64, 8192},
                        {"llama-3.1-405b", "dgx-h100", 16384, 8192},
                        {"gpt-1t", "dgx-a100-80g", 3072, 2048}};
  std::printf("%-16s %-13s %6s | %9s %9s | %12s %14s %14s %12s\n", "model", "cluster", "gpus", "layouts", "feasible",
              "search (s)", "layouts/s", "per layout (us)", "best step (s)");
  for (const Case& c : cases) {
    ModelSpec m = store.load_model(c.model);
    ClusterSpec cluster = store.load_cluster(c.cluster);
    TrainingSpec t{.seq_len = c.seq, .global_batch = global_batch_for_tokens(4194304, c.seq)};
    std::vector<double> wall;
    SearchResult r;
    long layouts = 0;
    for (int i = 0; i < repeats; ++i) {
      auto start = std::chrono::steady_clock::now();
      Network net(cluster, c.gpus);  // built per search: part of the cost
      std::vector<ParallelConfig> space = enumerate_layouts(m, t, SearchSpace{.gpus = c.gpus});
      r = search(space, dplan_cost_function(m, net, t, OverlapOptions{}), 10);
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      layouts = static_cast<long>(space.size());
    }
    std::sort(wall.begin(), wall.end());
    double median = wall[wall.size() / 2];
    std::printf("%-16s %-13s %6d | %9ld %9ld | %12.3f %14.0f %15.2f %12.3f\n", c.model, c.cluster, c.gpus, layouts,
                r.feasible, median, layouts / median, 1e6 * median / layouts,
                r.ranked.empty() ? 0.0 : r.ranked[0].evaluation.step_time_s);
  }
  return 0;
}
