#include "dplan/costmodel/mesh.h"

#include <algorithm>

namespace dplan::costmodel {

Mesh::Mesh(const ParallelConfig& p, int gpus_per_node)
    : tp_(std::max(1, p.tp)),
      cp_(std::max(1, p.cp)),
      dp_(std::max(1, p.dp)),
      pp_(std::max(1, p.pp)),
      ep_(std::max(1, p.ep)),
      etp_(std::max(1, p.expert_tp())),
      edp_(std::max(1, p.expert_dp())),
      gpus_per_node_(std::max(1, gpus_per_node)) {}

GroupShape Mesh::shape(Dim dim) const {
  switch (dim) {
    case Dim::tp: return {tp_, 1};
    case Dim::cp: return {cp_, tp_};
    case Dim::dp: return {dp_, tp_ * cp_};
    case Dim::pp: return {pp_, tp_ * cp_ * dp_};
    case Dim::etp: return {etp_, 1};
    case Dim::ep: return {ep_, etp_};
    case Dim::edp: return {edp_, etp_ * ep_};
  }
  return {};
}

int Mesh::coordinate(Dim dim, int rank) const {
  const GroupShape s = shape(dim);
  return rank / s.stride % s.size;
}

RankCoordinates Mesh::coordinates(int rank) const {
  RankCoordinates c;
  c.rank = rank;
  c.node = rank / gpus_per_node_;
  c.local_rank = rank % gpus_per_node_;
  c.tp = coordinate(Dim::tp, rank);
  c.cp = coordinate(Dim::cp, rank);
  c.dp = coordinate(Dim::dp, rank);
  c.pp = coordinate(Dim::pp, rank);
  c.etp = coordinate(Dim::etp, rank);
  c.ep = coordinate(Dim::ep, rank);
  c.edp = coordinate(Dim::edp, rank);
  return c;
}

int Mesh::rank_at(int tp, int cp, int dp, int pp) const { return tp + tp_ * (cp + cp_ * (dp + dp_ * pp)); }

std::vector<int> Mesh::members(GroupShape shape, int rank, int coordinate) {
  std::vector<int> out(shape.size);
  const int first = rank - coordinate * shape.stride;
  for (int i = 0; i < shape.size; ++i) out[i] = first + i * shape.stride;
  return out;
}

std::vector<int> Mesh::group(Dim dim, int rank) const { return members(shape(dim), rank, coordinate(dim, rank)); }

std::vector<int> Mesh::data_parallel_group(int rank) const {
  const RankCoordinates c = coordinates(rank);
  return members(data_parallel_shape(), rank, c.cp + cp_ * c.dp);
}

std::vector<int> Mesh::embedding_group(int rank) const {
  if (pp_ == 1) return {};
  const RankCoordinates c = coordinates(rank);
  return {rank_at(c.tp, c.cp, c.dp, 0), rank_at(c.tp, c.cp, c.dp, pp_ - 1)};
}

}  // namespace dplan::costmodel
