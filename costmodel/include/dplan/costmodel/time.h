// Step time of one layout with its breakdown: compute (forward, backward, recompute), tensor-,
// context- and expert-parallel communication, pipeline send/recv and bubble, data-parallel gradient
// reduction overlapped with backward, ZeRO-3 parameter gathers with prefetch, the distributed
// optimizer's reduce-scatter + all-gather, the optimizer step and offload traffic. Communication is
// reported exposed (on the critical path) and hidden (overlapped) separately. Each phase is a
// function of its own in time_phases.h; estimate_time composes them.
#pragma once

#include <map>
#include <string>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/network.h"
#include "dplan/costmodel/phases.h"

namespace dplan::costmodel {

// Overlap switches the engines expose (Megatron --overlap-grad-reduce, --overlap-param-gather,
// --tp-comm-overlap; PyTorch DDP overlaps gradient buckets by default).
struct OverlapOptions {
  bool grad_reduce = true;    // data-parallel reduction runs in buckets during backward
  bool param_gather = true;   // distributed-optimizer / ZeRO all-gather overlaps the next forward
  bool tp_comm = false;       // tensor-parallel collectives overlap GEMMs (needs sequence parallel)
  bool operator==(const OverlapOptions&) const = default;
};

struct TimeBreakdown {
  // Critical-path seconds per step, by phase (phases.h); they add up to step_time_s.
  double forward_s = 0, backward_s = 0, recompute_s = 0;
  double tp_comm_s = 0, cp_comm_s = 0, ep_comm_s = 0;
  double pp_p2p_s = 0, pp_bubble_s = 0;
  double dp_comm_s = 0;        // exposed gradient reduction (all-reduce or reduce-scatter)
  double param_gather_s = 0;   // exposed ZeRO-3 / distributed-optimizer parameter all-gathers
  double optimizer_s = 0, offload_s = 0;
  double overhead_s = 0;       // per-step fixed costs outside the kernels above (host, data loading)
  // The part of forward_s + backward_s spent in matrix multiplies (the attention core included);
  // the rest is element-wise work (norms, activations, softmax, loss). Not a phase of its own.
  double gemm_s = 0;
  // Communication that ran under compute (not in step_time_s).
  double hidden_comm_s = 0;
  // What that hidden communication cost the compute beside it (its SMs), inside forward_s and
  // backward_s. Not a phase of its own.
  double comm_contention_s = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;              // model FLOPs / (step time * GPUs * dense peak)
  double hfu = 0;              // executed FLOPs incl. recompute / (...)
  double bubble_fraction = 0;  // pp_bubble_s / step_time_s
  double exposed_comm_s() const {
    return tp_comm_s + cp_comm_s + ep_comm_s + pp_p2p_s + dp_comm_s + param_gather_s + offload_s;
  }
  double seconds(Phase p) const;                 // the phase's field above
  std::map<std::string, double> phases() const;  // name -> seconds, the JSON "time" object (phases.h)
};

// REQUIRES: validate(model, network.cluster(), training, parallel, network.world_size()) passed,
// and `memory` is estimate_memory() of the same layout (the search has it already).
TimeBreakdown estimate_time(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                            const ParallelConfig& parallel, const MemoryEstimate& memory,
                            const OverlapOptions& overlap = {});
TimeBreakdown estimate_time(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                            const ParallelConfig& parallel, const OverlapOptions& overlap = {});

// The device estimate_time prices compute on: the cluster's GPU as `world_size` ranks see it
// (CoreSharing::device), at the training engine's pace (engine.h: gemm_scale on the GEMMs' and
// attention's sustained fraction, elementwise_scale on the element-wise work's HBM efficiency).
// No layout changes it beyond its world size, so a search makes it once (dplan_cost_function)
// instead of copying the GPU's profile, its sources included, for every layout it prices.
GpuSpec priced_device(const ClusterSpec& cluster, int world_size, const TrainingSpec& training);
// The first estimate_time with the device made by the caller and, where `layer` is given, one
// layer's times made by the caller too: a search reuses them across the layouts that differ only
// in what layer_times does not read (the ZeRO stage, the distributed optimizer, offload).
// REQUIRES: as above, device == priced_device(network.cluster(), parallel.world_size(), training),
// and *layer == layer_times(model, device, training, parallel) where given.
TimeBreakdown estimate_time(const ModelSpec& model, const Network& network, const TrainingSpec& training,
                            const ParallelConfig& parallel, const MemoryEstimate& memory,
                            const OverlapOptions& overlap, const GpuSpec& device, const LayerTimes* layer = nullptr);

// The group a tied word embedding's gradients are all-reduced over when the first and last
// pipeline stages hold its two copies, as the network can price it (see time.cpp).
GroupShape embedding_group_shape(const ParallelConfig& parallel);

json to_json(const TimeBreakdown& time);

}  // namespace dplan::costmodel
