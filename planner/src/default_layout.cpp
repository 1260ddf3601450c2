#include "dplan/planner/default_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dplan/costmodel/errors.h"

namespace dplan::planner {
using namespace costmodel;

int global_batch_for_tokens(double tokens, int seq_len, int multiple) {
  double sequences = tokens / seq_len;
  long long k = std::max(1LL, std::llround(sequences / multiple));
  return static_cast<int>(k * multiple);
}

DefaultLayout default_layout(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
                             int gpus, double tokens_per_batch) {
  if (gpus < 1) throw InputError("--gpus must be a positive integer, got " + std::to_string(gpus));
  int heads = std::gcd(model.num_heads, model.num_kv_heads);
  int tp = 1;
  for (int t = 1; t <= std::min({cluster.gpus_per_node, 8, gpus}); ++t)
    if (heads % t == 0 && gpus % t == 0 && model.ffn_hidden_size % t == 0) tp = t;
  DefaultLayout best;
  bool found = false;
  for (int pp = 1; pp <= gpus / tp; ++pp) {
    if ((gpus / tp) % pp != 0 || pp > model.num_layers) continue;
    ParallelConfig p;
    p.tp = tp;
    p.pp = pp;
    p.dp = gpus / (tp * pp);
    p.micro_batch = 1;
    p.sequence_parallel = tp > 1;
    p.recompute = Recompute::selective;
    p.schedule = Schedule::one_f_one_b;
    TrainingSpec t = training;
    t.global_batch = global_batch_for_tokens(tokens_per_batch, t.seq_len, p.micro_batch * p.dp);
    validate(model, cluster, t, p, gpus);
    best = {p, t, estimate_memory(model, cluster, t, p)};
    found = true;
    if (best.memory.fits) break;
  }
  if (!found)
    throw InputError("no tensor x pipeline x data layout of " + std::to_string(gpus) + " GPUs suits " + model.name);
  return best;
}

}  // namespace dplan::planner
