// Collectives on a topology: the cluster as a graph (GPUs, NVSwitch / PCIe switch / XGMI mesh,
// NICs, leaf switches, one logical spine), communication groups placed in Megatron's rank order,
// and the time of one NCCL collective run by every group of a shape at once. A group's bandwidth
// is its bottleneck link, shared among all concurrent flows crossing it; the time follows NCCL's
// own tuning model (latency + bytes / bus bandwidth, ring, tree or NVLS, whichever is faster).
#pragma once

#include <memory>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/mesh.h"
#include "dplan/costmodel/training.h"

namespace dplan::costmodel {

// Groups are Mesh's (mesh.h): Dim names a dimension, GroupShape one dimension's groups in the
// rank order.

// A tier's measured time for `op` over `ranks` ranks at `bytes`: log-log
// interpolation between the measured sizes, the smallest's time below them and
// linear in bytes above them; 0 when the tier has no measurement of that
// collective and group size.
double measured_collective_s(const LinkTier& tier, Collective op, int ranks, double bytes);

struct CollectiveCost {
  double time_s = 0;
  // What nccl-tests would print as busbw for this call: bytes * busbw_factor / time_s, with the
  // factors of nccl-tests doc/PERFORMANCE.md (all-reduce 2(n-1)/n, all-gather, reduce-scatter and
  // all-to-all (n-1)/n, send_recv 1). Includes the latency, so small messages show low busbw.
  double bus_bandwidth_bytes_per_s = 0;
  bool crosses_nodes = false;  // some group of the shape spans more than one node
  bool operator==(const CollectiveCost&) const = default;
};

// The large-message limits of one group shape under one traffic pattern (for explanations).
struct PathBandwidth {
  double intra_node_bytes_per_s = 0;  // bottleneck busbw over NVLink / PCIe / XGMI links (0: unused)
  double inter_node_bytes_per_s = 0;  // bottleneck busbw over NICs, leaf and spine links (0: unused)
  int max_nodes_spanned = 1;          // by the widest group
  bool operator==(const PathBandwidth&) const = default;
};

// Nodes hold consecutive global ranks, gpus_per_node each; the last node may be partly used.
// cost() is a pure function of (op, bytes, shape); only its speed has state: the first call for a
// shape routes all groups of it (O(world_size)), later calls are O(1). Copies share one immutable
// graph and one cache, guarded by a mutex, so cost() may be called from several threads.
class Network {
 public:
  // Builds the graph. Throws InputError if world_size < 1 or the cluster has a non-positive
  // gpus_per_node, nics_per_node, nodes_per_leaf or link bandwidth.
  Network(const ClusterSpec& cluster, int world_size);

  // One collective over EVERY group of this shape at once (all tp groups all-reduce together).
  // `bytes` is the buffer as nccl-tests counts it: all-reduce: the buffer; all-gather: the gathered
  // output; reduce-scatter: the input; all-to-all: what one rank sends in total; send_recv: the
  // message one rank sends to its neighbour (rank j -> j+1 of the group, all pairs concurrently).
  // A group of one rank, or bytes == 0, costs nothing.
  // Throws InputError if bytes is negative or not finite, size or stride < 1, or size*stride does
  // not divide world_size (the groups would not tile the world).
  CollectiveCost cost(Collective op, double bytes, GroupShape shape) const;

  // Large-message bottlenecks of `shape` for `op`'s traffic pattern. Same failures as cost().
  PathBandwidth path_bandwidth(Collective op, GroupShape shape) const;

  // True if some group of the shape spans more than one node. Same failures as cost().
  bool crosses_nodes(GroupShape shape) const;

  const ClusterSpec& cluster() const;
  int world_size() const;
  int num_nodes() const;

  // The same links and routes (its cache shared) with another device in cluster(): what a fit of
  // the GPU's figures prices each trial with, without routing the topology again.
  Network with_gpu(const GpuSpec& gpu) const;

  struct Impl;  // the Boost graph and the cache (src/topology.h)

 private:
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<const ClusterSpec> cluster_;  // impl_'s, or a copy with another gpu (with_gpu)
};

const char* to_string(Collective op);
const char* to_string(Dim dim);

}  // namespace dplan::costmodel
