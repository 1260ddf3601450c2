// Collective times on the routed topology: NCCL's own tuning model (NVIDIA/nccl@5067397c26,
// src/graph/tuning.cc; its constants in profiles/clusters/SOURCES.md section 3) on top of the bus
// bandwidths topology.cpp finds.
//
// time = latency + busbw_factor x max over the tiers t a route uses of (bytes + half_t) / busbw_t
// i.e. each tier's effective busbw(bytes) = busbw_t x bytes / (bytes + half_t): small messages do
// not reach the large-message bandwidth (pipeline fill and drain). busbw_t is the bottleneck of
// tier t (NVLink-class links, or NIC/leaf/spine links) for this shape; half_t = the profile's
// half_bandwidth x busbw_t / reference_t, where reference_t is what the fit saw: one GPU's link
// (intra-node) or all NICs of a node (inter-node). So the size penalty is a fixed fill time per
// tier (half / reference): NCCL runs fewer channels for a smaller share of the links, and fills
// them with proportionally fewer bytes. Taking the slower tier per size keeps "faster links never
// slow a collective" true. busbw factors (nccl-tests doc/PERFORMANCE.md): all-reduce 2(n-1)/n,
// all-gather, reduce-scatter and all-to-all (n-1)/n, send_recv 1. NCCL picks the fastest
// algorithm per call; so do we:
//   ring (every collective): latency = base + (steps - inter_steps) x intra_hop + inter_steps x net_hop,
//        steps = 2(n-1) for all-reduce, n-1 otherwise; inter_steps = 2(N-1) resp. N-1 over N nodes
//        (tuning.cc: nsteps, nInterSteps). All-to-all is not in NCCL's model: assumed like an
//        all-gather. send_recv: base + one hop (net_hop if any pair crosses nodes).
//   tree (all-reduce across nodes): latency = base + 2((n/N - 1) x intra_hop + floor(log2 N) x net_hop),
//        bandwidth: NCCL's tree algbw is busBw/2 with busBw x 0.92 (tuning.cc, Tree AllReduce), so
//        transfer = 2 x max_t (bytes + half_t) / (0.92 busbw_t).
//   PAT (all-gather, reduce-scatter with one rank per node): latency = 8.0 + ceil(log2 N) x net_hop,
//        bandwidth 0.75 of the ring's (see Network::cost).
//   NVLS (all-reduce with every group inside one NVSwitch node, nvls true): latency 25 us (NVLS
//        Simple hardware latency, base 0), algbw = nvls_efficiency x NVLink line rate independent
//        of n (every GPU sends its buffer to the switch once and reads the reduced result once):
//        transfer = (bytes + nvls_half) / algbw. 8 GPUs: busbw = 1.75 x algbw = 480 GB/s on H100.
//        NVLS is not forced above a size: it wins by the min-time rule from ~1.5 MiB up on H100,
//        where NCCL itself switches (RING/LL <= 1 MiB, NVLS >= 2 MiB on 8x H200,
//        profiles/clusters/SOURCES.md section 5).
//   NVLS only from kNvlsMinRanks GPUs: below that NCCL keeps the ring (the 4-7 GPU sweep on 8x
//        H200 in tests/data/components/nccl.json: 4 GPUs reach the ring's busbw, 5 NVLS's).
// Only the Simple protocol is modelled. NCCL's LL and LL128 (tuning.cc's latencies, x0.5 and x0.92
// bandwidth) were tried against the component sweeps: with the fitted fill time they move the mean
// from 7.8 % to 7.7 %, without it small messages come out 2-5x too fast; the fill time, not the
// protocol, sets a small message's time in this model.
// Not modelled: NCCL's 2-node tree boost (intra-node bandwidth on <= 2 nodes; nccl-tests#196),
// the ring "plateau" latency factor 1.9 and the tree correction table.
//
// Fits (least squares on log time; measured time = busbw_factor x bytes / measured busbw; the
// sweeps are in profiles/clusters/SOURCES.md section 5; residual = model time / measured time - 1):
//  8x A100 all_reduce_perf, ring (n=8, latency 8.4 + 14 x 3.4 = 56.0 us, busbw 0.78 x 300 = 234 GB/s),
//    fit on 1 MiB..16 GiB: half = 3.8 MiB (fill time 17 us). Residuals: 1 MiB -8%, 4 MiB +16%,
//    64 MiB -14%, 256 MiB -14%, 1 GiB -1%, 16 GiB +0.5%; 32 KiB +97% (LL protocol, not fitted).
//  8x H200 NVLS (latency 25 us, algbw 0.61 x 450 = 275 GB/s; ring half 6.0 MiB), fit on
//    16 MiB..16 GiB: nvls half = 13.4 MiB. Residuals of min(ring, NVLS): 16 MiB +3%, 64 MiB -5%,
//    256 MiB -2%, 1 GiB -2%, 16 GiB +0.5%; 1 MiB +74% (NCCL ran RING/LL there).
//  8x B200 (P6-B200, 1 node; algbw 0.54 x 900 = 486 GB/s; ring half 11.7 MiB), fit on 64 MiB..16 GiB:
//    nvls half = 61.9 MiB. Residuals: 64 MiB -15%, 1 GiB -9%, 16 GiB -0.1%; 1 MiB +74% (LL).
//  4 nodes x 8 P6-B200 (EFA 8 x 400 Gb/s; n=32, N=4; ring latency 282.8 us, tree 112.0 us; busbw
//    8 x 47 = 376 GB/s network, NVLink 720 x 8/7), fit on 1 MiB..16 GiB: inter-node half = 45 MiB
//    (fill time 125 us). Residuals of min(ring, tree): 1 MiB +3%, 64 MiB -7%, 1 GiB +5%, 16 GiB +2%.
// Other clusters' halves keep these fill times at their own rates (profiles/clusters/*.json).
#include <algorithm>
#include <cmath>
#include <string>

#include "dplan/costmodel/errors.h"
#include "topology.h"

namespace dplan::costmodel {
namespace {

constexpr double kRingBaseLatency_s = 8.4e-6;  // tuning.cc baseLat Ring/Simple
constexpr double kTreeBaseLatency_s = 8.4e-6;  // tuning.cc baseLat Tree/Simple
constexpr double kNvlsLatency_s = 25e-6;       // tuning.cc hwLat NVLink NVLS/Simple (baseLat 0)
constexpr double kTreeBandwidthFraction = 0.92;  // ncclTopoTuneModel: Tree AllReduce busBw x 0.92
constexpr double kPatBaseLatency_s = 8.0e-6;     // tuning.cc baseLat PAT
constexpr double kPatBandwidthFraction = 0.75;   // ncclTopoTuneModel: PAT busBw x 0.75
constexpr int kNvlsMinRanks = 5;                 // measured: see the top of this file

Pattern pattern_of(Collective op) {
  switch (op) {
    case Collective::all_to_all: return Pattern::all_to_all;
    case Collective::send_recv: return Pattern::chain;
    default: return Pattern::ring;
  }
}

// nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor.
double busbw_factor(Collective op, int n) {
  switch (op) {
    case Collective::all_reduce: return 2.0 * (n - 1) / n;
    case Collective::send_recv: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

// max over the tiers a route uses of (bytes + half_t) / (scale x busbw_t), per unit busbw factor,
// with half_t = half x busbw_t / reference_t (see the top of this file).
double transfer_s(const PathBandwidth& bw, const ClusterSpec& c, double bytes, double scale) {
  const double intra_reference = c.intra_node.bandwidth_bytes_per_s * c.intra_node.efficiency_fraction;
  const double inter_reference = c.nics_per_node * c.nic_bandwidth_bytes_per_s * c.nic_efficiency_fraction;
  double t = 0;
  if (bw.intra_node_bytes_per_s > 0)
    t = std::max(t, (bytes / bw.intra_node_bytes_per_s + c.intra_node.half_bandwidth_bytes / intra_reference) / scale);
  if (bw.inter_node_bytes_per_s > 0)
    t = std::max(t, (bytes / bw.inter_node_bytes_per_s + c.inter_node_half_bandwidth_bytes / inter_reference) / scale);
  return t;
}

}  // namespace

PathBandwidth Network::path_bandwidth(Collective op, GroupShape shape) const {
  return impl_->cached_route(pattern_of(op), shape).bandwidth;
}

double measured_collective_s(const LinkTier& tier, Collective op, int ranks, double bytes) {
  std::vector<std::pair<double, double>> curve;  // (bytes, seconds)
  for (const MeasuredCollective& x : tier.measured)
    if (x.op == op && x.ranks == ranks) curve.emplace_back(x.bytes, x.time_s);
  if (curve.empty()) return 0.0;
  std::sort(curve.begin(), curve.end());
  // Below the smallest size: its time (latency-bound); above the largest:
  // bandwidth-bound, linear.
  if (bytes <= curve.front().first) return curve.front().second;
  if (bytes >= curve.back().first) return curve.back().second * bytes / curve.back().first;
  auto hi = std::lower_bound(curve.begin(), curve.end(), std::pair{bytes, 0.0});
  auto lo = std::prev(hi);
  const double f = std::log(bytes / lo->first) / std::log(hi->first / lo->first);
  return std::exp(std::log(lo->second) + f * std::log(hi->second / lo->second));
}

CollectiveCost Network::cost(Collective op, double bytes, GroupShape shape) const {
  if (!std::isfinite(bytes) || bytes < 0)
    throw InputError("collective " + std::string(to_string(op)) + ": bytes must be a finite number >= 0, got " +
                     std::to_string(bytes));
  const Route route = impl_->cached_route(pattern_of(op), shape);
  CollectiveCost result;
  result.crosses_nodes = route.crosses_nodes;
  const int n = shape.size;
  if (n < 2 || bytes == 0) return result;

  const ClusterSpec& c = impl_->cluster;
  // Gloo (the shared-memory tier of one CPU machine) has no reduce-scatter: the
  // executor runs an all-reduce and keeps its slice (executor/src/comm.cpp),
  // which costs the all-reduce.
  if (op == Collective::reduce_scatter && c.intra_node_kind == IntraNodeKind::shared_memory && !route.crosses_nodes)
    op = Collective::all_reduce;
  const PathBandwidth& bw = route.bandwidth;
  if (!route.crosses_nodes) {
    if (const double measured_s = measured_collective_s(c.intra_node, op, n, bytes); measured_s > 0) {
      // Training's collectives wait longer than the probe's (wake-ups, partners arriving late:
      // measured_scale), and ranks time-sharing the cores wait for their partner's time slice
      // (1 / core_share); both are waits, and the longer hides the shorter.
      result.time_s = measured_s * std::max(c.intra_node.measured_scale, 1 / core_share(c, impl_->world_size));
      result.bus_bandwidth_bytes_per_s = bytes * busbw_factor(op, n) / result.time_s;
      return result;
    }
  }
  const int N = bw.max_nodes_spanned;
  const double intra_hop_s = c.intra_node.latency_s;
  const double net_hop_s = c.inter_node_latency_s;
  const double factor = busbw_factor(op, n);

  double time_s = 0;
  if (op == Collective::send_recv) {
    time_s = kRingBaseLatency_s + (route.crosses_nodes ? net_hop_s : intra_hop_s) + transfer_s(bw, c, bytes, 1.0);
  } else {
    const bool all_reduce = op == Collective::all_reduce;
    const int steps = all_reduce ? 2 * (n - 1) : n - 1;
    const int inter_steps = all_reduce ? 2 * (N - 1) : N - 1;
    time_s = kRingBaseLatency_s + (steps - inter_steps) * intra_hop_s + inter_steps * net_hop_s +
             factor * transfer_s(bw, c, bytes, 1.0);
    if (all_reduce && N > 1) {
      const double ranks_per_node = static_cast<double>(n) / N;
      const double tree_s = kTreeBaseLatency_s +
                            2 * ((ranks_per_node - 1) * intra_hop_s + std::floor(std::log2(N)) * net_hop_s) +
                            2 * transfer_s(bw, c, bytes, kTreeBandwidthFraction);
      time_s = std::min(time_s, tree_s);
    }
    // PAT (NCCL 2.23+, all-gather and reduce-scatter with one rank per node): a binomial tree
    // that reaches every node in log2 N network hops instead of the ring's N - 1, at 0.75 of the
    // ring's bus bandwidth (tuning.cc: baseLat PAT 8.0 us; ncclTopoTuneModel: PAT busBw x 0.75).
    // At hundreds of nodes (data-parallel groups across nodes with tp 8 inside them) the ring's
    // latency is what it saves.
    if ((op == Collective::all_gather || op == Collective::reduce_scatter) && N > 1 && n == N) {
      const double pat_s = kPatBaseLatency_s + std::ceil(std::log2(N)) * net_hop_s +
                           factor * transfer_s(bw, c, bytes, kPatBandwidthFraction);
      time_s = std::min(time_s, pat_s);
    }
    const double nvls_algbw = c.nvls_efficiency_fraction * c.intra_node.bandwidth_bytes_per_s;
    if (all_reduce && N == 1 && n >= kNvlsMinRanks && c.nvls && c.intra_node_kind == IntraNodeKind::nvswitch && nvls_algbw > 0) {
      const double nvls_s = kNvlsLatency_s + (bytes + c.nvls_half_bandwidth_bytes) / nvls_algbw;
      time_s = std::min(time_s, nvls_s);
    }
  }
  // Ranks time-sharing a machine's cores run their collectives' work (Gloo's
  // threads, the copies and sums) at that share of a core, as they do their
  // compute (time.cpp).
  result.time_s = time_s / core_share(c, impl_->world_size);
  result.bus_bandwidth_bytes_per_s = bytes * busbw_factor(op, n) / result.time_s;
  return result;
}

const char* to_string(Dim dim) {
  switch (dim) {
    case Dim::tp: return "tp";
    case Dim::cp: return "cp";
    case Dim::ep: return "ep";
    case Dim::dp: return "dp";
    case Dim::pp: return "pp";
    case Dim::etp: return "etp";
    case Dim::edp: return "edp";
  }
  return "?";
}

}  // namespace dplan::costmodel
