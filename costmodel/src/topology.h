// Private to costmodel: the cluster graph and the routing of communication groups over it
// (topology.cpp), shared with the collective cost formulas (collectives.cpp).
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "dplan/costmodel/network.h"

namespace dplan::costmodel {

// Which links a bandwidth belongs to: NVLink / PCIe / XGMI / shared memory inside a node, or the
// network (GPU-NIC attachment, NIC-leaf, leaf-spine). Each tier has its own size-efficiency curve.
enum class Tier { intra_node, inter_node };

// How the ranks of a group exchange data.
//   ring:       rank j -> j+1 (cyclic): all-reduce, all-gather, reduce-scatter (NCCL rings)
//   all_to_all: every rank -> every other rank, evenly
//   chain:      rank j -> j+1 for j < n-1 (pipeline stages)
enum class Pattern { ring, all_to_all, chain };

struct VertexInfo {
  enum class Kind { gpu, node_switch, nic, leaf, spine } kind = Kind::gpu;
  int index = 0;  // rank, node, NIC, leaf number
};

struct EdgeInfo {
  double capacity_bytes_per_s = 0;  // one direction, line rate x efficiency
  Tier tier = Tier::intra_node;
  int index = 0;                    // position in the per-edge load vector
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, VertexInfo, EdgeInfo>;

// The result of routing every group of one shape with one pattern: the busbw each tier allows
// (min over its links of capacity / flows crossing it; 0 if no flow uses the tier).
struct Route {
  PathBandwidth bandwidth;
  bool crosses_nodes = false;
};

struct Network::Impl {
  Impl(const ClusterSpec& cluster, int world_size);

  Route route(Pattern pattern, GroupShape shape) const;  // uncached; O(world_size)
  Route cached_route(Pattern pattern, GroupShape shape) const;

  ClusterSpec cluster;
  int world_size = 0;
  int num_nodes = 0;
  int num_leaves = 0;
  Graph graph;
  int num_edges = 0;
  // Edge handles by role (indices into the load vector), so routing walks no adjacency lists.
  std::vector<int> gpu_up, gpu_down;        // GPU -> node switch, node switch -> GPU (star kinds)
  std::vector<int> gpu_to_nic, nic_to_gpu;  // direct GPU <-> NIC (nvswitch, xgmi); -1 otherwise
  std::vector<int> switch_to_nic, nic_to_switch;  // NIC on the node switch (pcie, shared memory)
  std::vector<int> nic_up, nic_down;        // NIC <-> leaf
  std::vector<int> leaf_up, leaf_down;      // leaf <-> spine
  std::vector<int> mesh;                    // xgmi: node*g*g + i*g + j -> edge GPU i -> GPU j
  std::vector<double> capacity;             // by edge index
  std::vector<Tier> tier;                   // by edge index

  mutable std::mutex mutex;
  mutable std::unordered_map<std::uint64_t, Route> cache;
};

}  // namespace dplan::costmodel
