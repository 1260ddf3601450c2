// The cluster as a graph and the routing of communication groups over it.
//
// Vertices: one per GPU; per node one switch vertex (the NVSwitch for kind nvswitch, a PCIe switch
// for pcie, the host for shared-memory; none for xgmi and nvlink-bridge, whose GPUs are a full mesh
// of direct links);
// nics_per_node NICs per node; one leaf switch per nodes_per_leaf nodes; one logical spine.
// Edges come in pairs, one per direction, each with a capacity = line rate x the tier's efficiency:
//   GPU <-> node switch   intra_node bandwidth (per GPU, per direction)
//   GPU <-> GPU (xgmi, nvlink-bridge)  intra_node bandwidth / (gpus_per_node - 1): 448 GB/s = 7 x
//                         64 GB/s links; an NVLink-bridged pair, one link of the whole bandwidth
//   GPU <-> NIC           NIC bandwidth (GPU i uses NIC i*nics/gpus_per_node over PCIe; the PCIe
//                         attachment is assumed never slower than the NIC). For pcie and
//                         shared-memory nodes the NIC hangs off the node switch, so a GPU's NIC
//                         traffic shares its one PCIe link with its peer-to-peer traffic.
//   NIC <-> leaf          NIC bandwidth
//   leaf <-> spine        leaf downlink capacity / oversubscription
//                         = nodes_per_leaf x nics_per_node x NIC bandwidth / oversubscription
// The graph is a tree above the GPUs, so every flow has one path; routing walks it through edge
// handles kept by role (gpu_up, nic_up, leaf_up, ...), adding the flow's weight to each edge.
#include "topology.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "dplan/costmodel/errors.h"

namespace dplan::costmodel {
namespace {

using Kind = VertexInfo::Kind;

void require(bool ok, const ClusterSpec& c, const std::string& what) {
  if (!ok) throw InputError("cluster " + c.name + ": " + what);
}

bool star_kind(IntraNodeKind k) { return k != IntraNodeKind::xgmi && k != IntraNodeKind::nvlink_bridge; }
bool nic_on_switch(IntraNodeKind k) {
  return k == IntraNodeKind::pcie || k == IntraNodeKind::shared_memory;
}

// Accumulates flows (weights per directed edge) for one shape and pattern.
//
// Weights are in units of the traffic one ring edge carries (for a ring collective that is
// bytes x busbw_factor per rank, so the bus bandwidth of the collective is capacity / load on the
// bottleneck edge, nccl-tests' busbw definition). How a group's traffic maps onto flows:
//
// Ring inside one node: rank j -> j+1 with weight 1 (each GPU sends and receives one unit). On an
// XGMI mesh RCCL runs several rings over different links, so each GPU's unit is spread evenly over
// its k-1 links to the other members: a group of k gets (k-1) x 64 GB/s (measured 2 GPUs 47.7,
// 8 GPUs 312.9 GB/s busbw, profiles/clusters/SOURCES.md section 4).
//
// Ring across nodes (hierarchical, as NCCL builds it: one ring per NIC, each entering a node at one
// GPU, crossing the node's k members over NVLink and leaving at another GPU; the channels rotate
// entry and exit so every local member and its NIC carry an equal share). With k members on a
// node: each node-to-node ring edge becomes k flows of weight 1/k from the i-th member of one node
// to the i-th member of the next (rail-aligned), each over the sender's and receiver's NIC; inside
// the node each member forwards (k-1)/k units over NVLink. Per node this gives busbw =
// min(k NICs x NIC rate, NVLink x k/(k-1)): 8 x 47 = 376 GB/s for DGX H100, matching the measured
// 8 x 46-48 GB/s multi-node ring busbw (profiles/clusters/SOURCES.md section 4, nccl-tests#290)
// and 8 x 24 = 192 GB/s for DGX A100 (NVIDIA/nccl#812). A data-parallel group with one member per
// node gets its GPU's NIC, shared with the other groups whose GPUs use the same NIC.
//
// All-to-all: each rank sends 1 unit = (n-1)/n x bytes, 1/(n-1) to every peer. A rank with k-1
// peers on its node and l-1 in its leaf sends (k-1)/(n-1) over NVLink, (n-k)/(n-1) through its NIC
// and (n-l)/(n-1) up its leaf's spine link; it receives the same amounts on the reverse edges
// (the traffic matrix is symmetric), which saves routing n^2 pairs.
//
// Chain (send_recv): rank j -> j+1 with weight 1, one flow over the GPU's own NIC.
class Router {
 public:
  explicit Router(const Network::Impl& net)
      : net_(net),
        load_(static_cast<std::size_t>(net.num_edges), 0.0),
        gpus_per_node_(net.cluster.gpus_per_node),
        nics_per_node_(net.cluster.nics_per_node),
        nodes_per_leaf_(net.cluster.nodes_per_leaf),
        star_(star_kind(net.cluster.intra_node_kind)),
        nic_on_switch_(nic_on_switch(net.cluster.intra_node_kind)) {}

  void add_group(Pattern pattern, const std::vector<int>& members) {
    const int n = static_cast<int>(members.size());
    if (n < 2) return;
    split_into_runs(members);
    num_nodes_spanned_ = std::max(num_nodes_spanned_, static_cast<int>(runs_.size()));
    switch (pattern) {
      case Pattern::ring: add_ring(members); break;
      case Pattern::all_to_all: add_all_to_all(members); break;
      case Pattern::chain:
        for (int j = 0; j + 1 < n; ++j) flow(members[j], members[j + 1], 1.0);
        break;
    }
  }

  Route result() const {
    double best[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    for (int e = 0; e < net_.num_edges; ++e) {
      if (load_[e] <= 0) continue;
      int t = static_cast<int>(net_.tier[e]);
      best[t] = std::min(best[t], net_.capacity[e] / load_[e]);
    }
    Route r;
    r.bandwidth.intra_node_bytes_per_s = std::isinf(best[0]) ? 0 : best[0];
    r.bandwidth.inter_node_bytes_per_s = std::isinf(best[1]) ? 0 : best[1];
    r.bandwidth.max_nodes_spanned = num_nodes_spanned_;
    r.crosses_nodes = num_nodes_spanned_ > 1;
    return r;
  }

 private:
  struct Run {
    int first = 0;  // index into the group's members
    int size = 0;
  };

  int node_of(int rank) const { return rank / gpus_per_node_; }
  int leaf_of(int rank) const { return node_of(rank) / nodes_per_leaf_; }
  int nic_of(int rank) const {
    int local = rank % gpus_per_node_;
    return node_of(rank) * nics_per_node_ + local * nics_per_node_ / gpus_per_node_;
  }
  int mesh_edge(int a, int b) const {
    const int g = gpus_per_node_;
    return net_.mesh[static_cast<std::size_t>(node_of(a)) * g * g + (a % g) * g + (b % g)];
  }

  // Members are in increasing rank order and nodes hold consecutive ranks, so each node's members
  // form one contiguous run.
  void split_into_runs(const std::vector<int>& members) {
    runs_.clear();
    for (int j = 0; j < static_cast<int>(members.size()); ++j) {
      if (runs_.empty() || node_of(members[j]) != node_of(members[runs_.back().first]))
        runs_.push_back({j, 0});
      ++runs_.back().size;
    }
  }

  void intra(int a, int b, double w) {
    if (star_) {
      load_[net_.gpu_up[a]] += w;
      load_[net_.gpu_down[b]] += w;
    } else {
      load_[mesh_edge(a, b)] += w;
    }
  }

  // Each of the run's k members sends w units to the others: on a star, over its switch link; on
  // an XGMI mesh, spread evenly over its k-1 direct links.
  void intra_spread(const std::vector<int>& members, const Run& run, double w) {
    const int k = run.size;
    for (int i = 0; i < k; ++i) {
      int a = members[run.first + i];
      if (star_) {
        load_[net_.gpu_up[a]] += w;
        load_[net_.gpu_down[a]] += w;
      } else {
        for (int j = 0; j < k; ++j)
          if (j != i) load_[mesh_edge(a, members[run.first + j])] += w / (k - 1);
      }
    }
  }

  void up_to_leaf(int a, double w) {
    int nic = nic_of(a);
    if (nic_on_switch_) {
      load_[net_.gpu_up[a]] += w;
      load_[net_.switch_to_nic[nic]] += w;
    } else {
      load_[net_.gpu_to_nic[a]] += w;
    }
    load_[net_.nic_up[nic]] += w;
  }

  void down_from_leaf(int b, double w) {
    int nic = nic_of(b);
    load_[net_.nic_down[nic]] += w;
    if (nic_on_switch_) {
      load_[net_.nic_to_switch[nic]] += w;
      load_[net_.gpu_down[b]] += w;
    } else {
      load_[net_.nic_to_gpu[b]] += w;
    }
  }

  void inter(int a, int b, double w) {
    up_to_leaf(a, w);
    int la = leaf_of(a), lb = leaf_of(b);
    if (la != lb) {
      load_[net_.leaf_up[la]] += w;
      load_[net_.leaf_down[lb]] += w;
    }
    down_from_leaf(b, w);
  }

  void flow(int a, int b, double w) {
    if (node_of(a) == node_of(b)) intra(a, b, w);
    else inter(a, b, w);
  }

  void add_ring(const std::vector<int>& m) {
    const int n = static_cast<int>(m.size());
    if (runs_.size() == 1) {
      if (star_) {
        for (int j = 0; j < n; ++j) intra(m[j], m[(j + 1) % n], 1.0);
      } else {
        intra_spread(m, runs_[0], 1.0);
      }
      return;
    }
    const int num_runs = static_cast<int>(runs_.size());
    for (int r = 0; r < num_runs; ++r) {
      const Run& run = runs_[r];
      const Run& next = runs_[(r + 1) % num_runs];
      const int k = run.size;
      if (k >= 2) {
        double w = static_cast<double>(k - 1) / k;
        if (star_) {
          for (int i = 0; i < k; ++i) intra(m[run.first + i], m[run.first + (i + 1) % k], w);
        } else {
          intra_spread(m, run, w);
        }
      }
      for (int i = 0; i < k; ++i) inter(m[run.first + i], m[next.first + i % next.size], 1.0 / k);
    }
  }

  void add_all_to_all(const std::vector<int>& m) {
    const int n = static_cast<int>(m.size());
    const double per_peer = 1.0 / (n - 1);
    // Members per leaf: leaves hold consecutive nodes, so runs of one leaf are adjacent.
    std::size_t r = 0;
    while (r < runs_.size()) {
      const int leaf = leaf_of(m[runs_[r].first]);
      std::size_t end = r;
      int in_leaf = 0;
      while (end < runs_.size() && leaf_of(m[runs_[end].first]) == leaf) in_leaf += runs_[end++].size;
      const double off_leaf = (n - in_leaf) * per_peer;
      if (off_leaf > 0) {
        load_[net_.leaf_up[leaf]] += off_leaf * in_leaf;
        load_[net_.leaf_down[leaf]] += off_leaf * in_leaf;
      }
      for (; r < end; ++r) {
        const Run& run = runs_[r];
        const int k = run.size;
        if (k >= 2) intra_spread(m, run, (k - 1) * per_peer);
        const double off_node = (n - k) * per_peer;
        if (off_node <= 0) continue;
        for (int i = 0; i < k; ++i) {
          up_to_leaf(m[run.first + i], off_node);
          down_from_leaf(m[run.first + i], off_node);
        }
      }
    }
  }

  const Network::Impl& net_;
  std::vector<double> load_;
  const int gpus_per_node_, nics_per_node_, nodes_per_leaf_;
  const bool star_, nic_on_switch_;
  std::vector<Run> runs_;
  int num_nodes_spanned_ = 1;
};

void check_shape(GroupShape shape, int world_size) {
  if (shape.size < 1 || shape.stride < 1)
    throw InputError("group shape: size and stride must be at least 1, got size " + std::to_string(shape.size) +
                     ", stride " + std::to_string(shape.stride));
  long long block = static_cast<long long>(shape.size) * shape.stride;
  if (block > world_size || world_size % block != 0)
    throw InputError("group shape: " + std::to_string(shape.size) + " ranks spaced " + std::to_string(shape.stride) +
                     " apart do not tile " + std::to_string(world_size) +
                     " GPUs (size x stride must divide the world size)");
}

}  // namespace

Network::Impl::Impl(const ClusterSpec& c, int world) : cluster(c), world_size(world) {
  if (world < 1) throw InputError("network: world size must be at least 1 GPU, got " + std::to_string(world));
  require(c.gpus_per_node >= 1, c, "gpus_per_node must be at least 1");
  require(c.nics_per_node >= 1, c, "nics_per_node must be at least 1");
  require(c.nodes_per_leaf >= 1, c, "nodes_per_leaf must be at least 1");
  require(c.intra_node.bandwidth_bytes_per_s > 0 && c.nic_bandwidth_bytes_per_s > 0, c,
          "link bandwidths must be positive");
  require(c.intra_node.efficiency_fraction > 0 && c.nic_efficiency_fraction > 0, c, "efficiencies must be positive");
  require(c.oversubscription >= 1.0, c, "oversubscription must be >= 1");

  const int g = c.gpus_per_node;
  const int nics = c.nics_per_node;
  num_nodes = (world + g - 1) / g;
  num_leaves = (num_nodes + c.nodes_per_leaf - 1) / c.nodes_per_leaf;
  const bool star = star_kind(c.intra_node_kind);
  const bool on_switch = nic_on_switch(c.intra_node_kind);
  const int num_gpus = num_nodes * g;
  const int num_nics = num_nodes * nics;

  auto add_vertex = [&](Kind kind, int index) { return boost::add_vertex(VertexInfo{kind, index}, graph); };
  auto add_edge = [&](Graph::vertex_descriptor u, Graph::vertex_descriptor v, double cap, Tier t) {
    boost::add_edge(u, v, EdgeInfo{cap, t, num_edges}, graph);
    capacity.push_back(cap);
    tier.push_back(t);
    return num_edges++;
  };

  const double intra_bw = c.intra_node.bandwidth_bytes_per_s * c.intra_node.efficiency_fraction;
  const double nic_bw = c.nic_bandwidth_bytes_per_s * c.nic_efficiency_fraction;
  const double uplink_bw = c.nodes_per_leaf * nics * nic_bw / c.oversubscription;

  std::vector<Graph::vertex_descriptor> gpu(num_gpus), node_switch, nic(num_nics), leaf(num_leaves);
  for (int r = 0; r < num_gpus; ++r) gpu[r] = add_vertex(Kind::gpu, r);
  if (star) {
    node_switch.resize(num_nodes);
    for (int n = 0; n < num_nodes; ++n) node_switch[n] = add_vertex(Kind::node_switch, n);
  }
  for (int i = 0; i < num_nics; ++i) nic[i] = add_vertex(Kind::nic, i);
  for (int l = 0; l < num_leaves; ++l) leaf[l] = add_vertex(Kind::leaf, l);
  const auto spine = add_vertex(Kind::spine, 0);

  // Inside each node.
  gpu_up.assign(num_gpus, -1);
  gpu_down.assign(num_gpus, -1);
  if (star) {
    for (int r = 0; r < num_gpus; ++r) {
      gpu_up[r] = add_edge(gpu[r], node_switch[r / g], intra_bw, Tier::intra_node);
      gpu_down[r] = add_edge(node_switch[r / g], gpu[r], intra_bw, Tier::intra_node);
    }
  } else if (g > 1) {
    mesh.assign(static_cast<std::size_t>(num_nodes) * g * g, -1);
    const double link_bw = intra_bw / (g - 1);
    for (int n = 0; n < num_nodes; ++n)
      for (int i = 0; i < g; ++i)
        for (int j = 0; j < g; ++j)
          if (i != j)
            mesh[static_cast<std::size_t>(n) * g * g + i * g + j] =
                add_edge(gpu[n * g + i], gpu[n * g + j], link_bw, Tier::intra_node);
  }

  // GPU i of a node reaches the network through NIC i*nics/g of its node.
  gpu_to_nic.assign(num_gpus, -1);
  nic_to_gpu.assign(num_gpus, -1);
  switch_to_nic.assign(num_nics, -1);
  nic_to_switch.assign(num_nics, -1);
  if (on_switch) {
    for (int i = 0; i < num_nics; ++i) {
      switch_to_nic[i] = add_edge(node_switch[i / nics], nic[i], nic_bw, Tier::inter_node);
      nic_to_switch[i] = add_edge(nic[i], node_switch[i / nics], nic_bw, Tier::inter_node);
    }
  } else {
    for (int r = 0; r < num_gpus; ++r) {
      int i = (r / g) * nics + (r % g) * nics / g;
      gpu_to_nic[r] = add_edge(gpu[r], nic[i], nic_bw, Tier::inter_node);
      nic_to_gpu[r] = add_edge(nic[i], gpu[r], nic_bw, Tier::inter_node);
    }
  }

  // The fabric.
  nic_up.resize(num_nics);
  nic_down.resize(num_nics);
  for (int i = 0; i < num_nics; ++i) {
    int l = (i / nics) / c.nodes_per_leaf;
    nic_up[i] = add_edge(nic[i], leaf[l], nic_bw, Tier::inter_node);
    nic_down[i] = add_edge(leaf[l], nic[i], nic_bw, Tier::inter_node);
  }
  leaf_up.resize(num_leaves);
  leaf_down.resize(num_leaves);
  for (int l = 0; l < num_leaves; ++l) {
    leaf_up[l] = add_edge(leaf[l], spine, uplink_bw, Tier::inter_node);
    leaf_down[l] = add_edge(spine, leaf[l], uplink_bw, Tier::inter_node);
  }
  DPLAN_CHECK(num_edges == static_cast<int>(boost::num_edges(graph)));
}

// Routes every group of the shape: the groups are the translates of group 0 {0, s, ..., (n-1)s}
// by i + b*n*s for 0 <= i < s, 0 <= b < world/(n*s). O(world_size) edge updates plus one pass over
// the edges. The collective ends when the slowest group does, so the bandwidth is the minimum over
// every loaded edge; with node-aligned layouts all groups are alike and this equals group 0's.
Route Network::Impl::route(Pattern pattern, GroupShape shape) const {
  Router router(*this);
  std::vector<int> members(static_cast<std::size_t>(shape.size));
  const int block = shape.size * shape.stride;
  for (int start = 0; start < world_size; start += block)
    for (int i = 0; i < shape.stride; ++i) {
      for (int j = 0; j < shape.size; ++j) members[j] = start + i + j * shape.stride;
      router.add_group(pattern, members);
    }
  return router.result();
}

Route Network::Impl::cached_route(Pattern pattern, GroupShape shape) const {
  check_shape(shape, world_size);
  const std::uint64_t key = (static_cast<std::uint64_t>(pattern) << 62) |
                            (static_cast<std::uint64_t>(shape.size) << 31) | static_cast<std::uint64_t>(shape.stride);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache.emplace(key, route(pattern, shape)).first->second;
}

Network::Network(const ClusterSpec& cluster, int world_size)
    : impl_(std::make_shared<Impl>(cluster, world_size)),
      cluster_(std::shared_ptr<const ClusterSpec>(impl_, &impl_->cluster)) {}

Network Network::with_gpu(const GpuSpec& gpu) const {
  Network copy = *this;
  auto cluster = std::make_shared<ClusterSpec>(*cluster_);
  cluster->gpu = gpu;
  copy.cluster_ = std::move(cluster);
  return copy;
}

const ClusterSpec& Network::cluster() const { return *cluster_; }
int Network::world_size() const { return impl_->world_size; }
int Network::num_nodes() const { return impl_->num_nodes; }

bool Network::crosses_nodes(GroupShape shape) const {
  return impl_->cached_route(Pattern::ring, shape).crosses_nodes;
}

}  // namespace dplan::costmodel
