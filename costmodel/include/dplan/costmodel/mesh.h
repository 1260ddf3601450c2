// The parallel layout as one value: which global rank holds which tp/cp/dp/pp coordinate (and,
// in a mixture of experts, which etp/ep/edp), every group of any dimension for any rank, and the
// placement on nodes. The cost model prices its groups (network.h), the plan file records its
// coordinates (plan_file.h), and the executor builds its process groups from it; nobody
// re-derives the rank order.
//
// The order is Megatron-Core's (parallel_state.py, RankGenerator with order "tp-cp-dp-pp"), tp
// fastest:
//     rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
// The MoE layers fold their groups over the same tp*cp*dp consecutive ranks of a stage, etp
// fastest (the expert RankGenerator, order "tp-ep-dp-pp" over etp, ep, edp):
//     local = rank mod (tp*cp*dp) = etp_rank + etp * (ep_rank + ep * edp_rank),
// with etp = parallel.expert_tp() and edp = parallel.expert_dp(). Every group is then `size` ranks
// spaced `stride` apart (its GroupShape), and the groups of one dimension tile the world.
#pragma once

#include <vector>

#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// etp, ep and edp are the MoE layers' groups: expert tensor, expert and expert data parallel.
enum class Dim { tp, cp, ep, dp, pp, etp, edp };

// `size` ranks spaced `stride` apart in the global rank order (group 0 starts at rank 0; the other
// groups of the shape are its translates that tile the world).
struct GroupShape {
  int size = 1;
  int stride = 1;
  bool operator==(const GroupShape&) const = default;
};

// Where one global rank sits.
struct RankCoordinates {
  int rank = 0, node = 0, local_rank = 0;
  int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0;
  int etp = 0, edp = 0;  // expert tensor and expert data parallel coordinates (MoE folding)
  bool operator==(const RankCoordinates&) const = default;
};

class Mesh {
 public:
  // REQUIRES: the sizes of `parallel` are positive (check_layout's rules; ep * expert_tp divides
  // tp * cp * dp for a mixture of experts) and gpus_per_node >= 1.
  explicit Mesh(const ParallelConfig& parallel, int gpus_per_node = 1);

  int world_size() const { return tp_ * cp_ * dp_ * pp_; }
  int gpus_per_node() const { return gpus_per_node_; }
  int size(Dim dim) const { return shape(dim).size; }

  // REQUIRES: 0 <= rank < world_size().
  RankCoordinates coordinates(int rank) const;
  // The global rank at these coordinates. REQUIRES: each below its dimension's size.
  int rank_at(int tp, int cp, int dp, int pp) const;

  // The groups of one dimension, as a shape.
  GroupShape shape(Dim dim) const;
  // The data-parallel reduction group of the dense layers: dp x cp ranks (context-parallel ranks
  // hold different tokens of the same sequences, so their gradients are summed too), cp fastest.
  GroupShape data_parallel_shape() const { return {dp_ * cp_, tp_}; }

  // The members of `rank`'s group of `dim`, in group order (a member's index is its coordinate).
  std::vector<int> group(Dim dim, int rank) const;
  // The members of `rank`'s dp x cp reduction group, in group order (index = cp + cp_size * dp).
  std::vector<int> data_parallel_group(int rank) const;
  // The first and the last pipeline stage's ranks with `rank`'s tp, cp and dp coordinates: the
  // group that sums the gradients of tied input and output embeddings. Empty with pp == 1.
  std::vector<int> embedding_group(int rank) const;

 private:
  // `rank`'s coordinate along `dim`.
  int coordinate(Dim dim, int rank) const;
  static std::vector<int> members(GroupShape shape, int rank, int coordinate);

  int tp_, cp_, dp_, pp_, ep_, etp_, edp_;
  int gpus_per_node_;
};

}  // namespace dplan::costmodel
