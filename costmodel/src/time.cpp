#include "dplan/costmodel/time.h"

#include <algorithm>
#include <cmath>

#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/pipeline.h"

namespace dplan::costmodel {
namespace {

// Host side of optimizer offload. Assumptions, documented in README: PCIe Gen4/5 x16 moves about
// 25 GB/s per GPU in practice (HARDWARE.md section 2: Gen4 31 GB/s, Gen5 63 GB/s per direction
// line rate), and a node's CPUs stream about 100 GB/s of DDR bandwidth for CPU Adam, shared by its GPUs.
constexpr double kHostLinkBytesPerS = 25e9;
constexpr double kHostMemoryBytesPerS = 100e9;

// Exposed part of `comm_s` that overlaps `window_s` of compute, never below
// `floor_s` (the part that cannot start before the window ends, e.g. the last
// gradient bucket). The cluster's comm_overlap is the fraction of the window
// that actually hides communication: 1 where collectives run on their own
// engines or SMs beside the GEMMs, near 0 where they need the same core (Gloo
// on a CPU rank).
double exposed(double comm_s, double window_s, double floor_s, double overlap_fraction) {
  return std::min(comm_s, std::max(comm_s - overlap_fraction * window_s, floor_s));
}

}  // namespace

GroupShape embedding_group_shape(const ParallelConfig& p) {
  // The network prices groups that tile the world; two ranks half a pipeline apart do when pp is
  // even, and with stages placed in order they cross the same tier as the first and last stage
  // (both inside one node, or in different ones). Odd pp: the pipeline group's ring.
  const GroupShape pipeline = group_shape(p, Dim::pp);
  return p.pp % 2 == 0 ? GroupShape{2, pipeline.stride * p.pp / 2} : pipeline;
}

std::map<std::string, double> TimeBreakdown::phases() const {
  return {{"forward", forward_s},       {"backward", backward_s},   {"recompute", recompute_s},
          {"tp_comm", tp_comm_s},       {"cp_comm", cp_comm_s},     {"ep_comm", ep_comm_s},
          {"pp_p2p", pp_p2p_s},         {"pp_bubble", pp_bubble_s}, {"dp_comm", dp_comm_s},
          {"param_gather", param_gather_s}, {"optimizer", optimizer_s}, {"offload", offload_s}};
}

TimeBreakdown estimate_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                            const OverlapOptions& overlap) {
  return estimate_time(m, net, t, p, estimate_memory(m, net.cluster(), t, p), overlap);
}

TimeBreakdown estimate_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                            const MemoryEstimate& mem, const OverlapOptions& overlap) {
  const ClusterSpec& cluster = net.cluster();
  // Ranks that share one machine's cores run at core_share of the probe's pace (every core busy):
  // more ranks than cores time-share them, fewer contend less (the local-cpu cluster; dedicated
  // devices are unaffected). The network scales its collectives by the same share (Network::cost).
  GpuSpec gpu = cluster.gpu;
  if (const double share = core_share(cluster, p.world_size()); share != 1) {
    for (auto& [precision, flops] : gpu.peak_flops_per_s) flops *= share;
    for (MeasuredGemm& x : gpu.matmul_measured) x.time_s /= share;
    gpu.kernel_overhead_s /= share;
    gpu.hbm_bandwidth_bytes_per_s *= share;
  }
  const double hide = cluster.comm_overlap_fraction;
  const double B = activation_bytes(t.precision);
  const double T = double(p.micro_batch) * t.seq_len / p.cp;  // tokens per micro-batch on one GPU
  const double h = m.hidden_size;
  const int microbatches = num_microbatches(t, p);
  const double v = p.schedule == Schedule::interleaved ? p.vpp : 1;
  const std::vector<int> layers = assign_layers(m.num_layers, p);
  const LayerTimes lt = layer_times(m, gpu, t, p);
  const EdgeTimes et = edge_times(m, gpu, t, p);
  const BytesPerParam bpp = bytes_per_param(t);

  // Tensor parallel: per layer two collectives forward and two backward on T*h activations —
  // all-reduces, or with sequence parallel all-gather + reduce-scatter of the same volume
  // (Korthikanti et al. 2022, Sec. 4.2.2). Full recompute replays the forward pair.
  double tp_layer_fwd = 0, tp_edge = 0;
  if (p.tp > 1) {
    GroupShape tp_shape = group_shape(p, Dim::tp);
    double bytes = T * h * B;
    double one = p.sequence_parallel ? 0.5 * (net.cost(Collective::all_gather, bytes, tp_shape).time_s +
                                              net.cost(Collective::reduce_scatter, bytes, tp_shape).time_s)
                                     : net.cost(Collective::all_reduce, bytes, tp_shape).time_s;
    tp_layer_fwd = 2 * one;
    tp_edge = one;  // embedding output (first stage), LM-head input (last stage)
  }
  const double tp_layer = tp_layer_fwd * (2 + (p.recompute == Recompute::full ? 1 : 0));

  // Context parallel: ring attention passes each K,V chunk cp-1 times around the ring, hidden
  // behind the attention core; backward also returns dK, dV (Liu et al. 2023, Ring Attention).
  double cp_layer = 0, cp_layer_fwd = 0, cp_hidden_layer = 0;
  if (p.cp > 1) {
    double chunk = 2 * T * m.kv_dim() / p.tp * B;
    double step = net.cost(Collective::send_recv, chunk, group_shape(p, Dim::cp)).time_s;
    double fwd = (p.cp - 1) * step, bwd = 2 * fwd;
    double fwd_exposed = exposed(fwd, lt.attention_core_s, 0, hide);
    double bwd_exposed = exposed(bwd, 2.5 * lt.attention_core_s, 0, hide);
    cp_layer = fwd_exposed + bwd_exposed + (p.recompute == Recompute::full ? fwd_exposed : 0);
    cp_layer_fwd = fwd_exposed;
    cp_hidden_layer = fwd + bwd - fwd_exposed - bwd_exposed;
  }

  // Expert parallel: all-to-all dispatch and combine of the routed tokens, forward and backward.
  double ep_layer = 0;
  if (m.is_moe() && p.ep > 1) {
    double bytes = T * m.experts_per_token * h * B;
    ep_layer = 4 * net.cost(Collective::all_to_all, bytes, group_shape(p, Dim::ep)).time_s;
  }

  // ZeRO-3: every layer's parameters are gathered before its forward and its backward, and its
  // gradients reduce-scattered after backward; the next layer's gather is prefetched under the
  // current layer's compute (FSDP / DeepSpeed), so only the excess and the first gather show.
  double zero3_layer_exposed = 0, zero3_layer_fwd = 0, zero3_first = 0, zero3_hidden_layer = 0;
  GroupShape dp_shape{p.dp * p.cp, p.tp};
  if (p.zero_stage >= 3 && dp_shape.size > 1) {
    double layer_params = mem.stages[0].num_layers > 0
                              ? (mem.stages[0].num_params) / std::max(1, mem.stages[0].num_layers)
                              : 0;
    double gather = net.cost(Collective::all_gather, layer_params * bpp.weights, dp_shape).time_s;
    double scatter = net.cost(Collective::reduce_scatter, layer_params * bpp.grads, dp_shape).time_s;
    double fwd = exposed(gather, lt.forward_s, 0, hide), bwd = exposed(gather + scatter, lt.backward_s, 0, hide);
    zero3_layer_exposed = fwd + bwd;
    zero3_layer_fwd = fwd;
    zero3_first = gather;
    zero3_hidden_layer = 2 * gather + scatter - zero3_layer_exposed;
  }

  // Per stage, per micro-batch: compute and the communication inside it.
  struct StageTime {
    double fwd = 0, bwd = 0, rec = 0, tp = 0, cp = 0, ep = 0, zero3 = 0, hidden = 0;
    double fwd_comm = 0;  // the part of tp + cp + ep + zero3 in the forward pass
    double total() const { return fwd + bwd + rec + tp + cp + ep + zero3; }
  };
  std::vector<StageTime> st(p.pp);
  int critical = 0;
  for (int i = 0; i < p.pp; ++i) {
    const bool first = i == 0, last = i == p.pp - 1;
    StageTime& s = st[i];
    double n = layers[i];
    s.fwd = n * lt.forward_s + (first ? et.embedding_forward_s : 0) + (last ? et.head_forward_s : 0);
    s.bwd = n * lt.backward_s + (first ? et.embedding_backward_s : 0) + (last ? et.head_backward_s : 0);
    s.rec = n * lt.recompute_s;
    double tp = n * tp_layer + (first ? tp_edge : 0) + (last ? 2 * tp_edge : 0);
    if (overlap.tp_comm && p.sequence_parallel) {
      s.hidden += tp;  // collective-GEMM overlap (Megatron --tp-comm-overlap)
    } else {
      s.tp = tp;
      s.fwd_comm += n * tp_layer_fwd + (first ? tp_edge : 0) + (last ? tp_edge : 0);
    }
    s.cp = n * cp_layer;
    s.ep = n * ep_layer;
    s.zero3 = n * zero3_layer_exposed + zero3_first;
    s.fwd_comm += n * (cp_layer_fwd + ep_layer / 2 + zero3_layer_fwd) + zero3_first;
    s.hidden += n * (cp_hidden_layer + zero3_hidden_layer);
    if (s.total() > st[critical].total()) critical = i;
  }
  const StageTime& c = st[critical];

  TimeBreakdown r;
  r.forward_s = microbatches * c.fwd;
  r.backward_s = microbatches * c.bwd;
  r.recompute_s = microbatches * c.rec;
  r.tp_comm_s = microbatches * c.tp;
  r.cp_comm_s = microbatches * c.cp;
  r.ep_comm_s = microbatches * c.ep;
  r.param_gather_s = microbatches * c.zero3;
  r.hidden_comm_s = microbatches * c.hidden;

  if (p.pp > 1) {
    if (cluster.cores_per_node > 0) {
      // Ranks that share cores: a stage that waits hands its cores to the stages that work, so the
      // fill, the drain and the waits inside 1F1B's steady state run faster than the steady state
      // (every other machine: the closed form below). Played out (pipeline.h); the critical stage's
      // phases take the pace it ran at, and its waits are the bubble.
      std::vector<PipelineStage> stages;
      for (const StageTime& s : st) stages.push_back({s.fwd + s.fwd_comm, s.total() - s.fwd - s.fwd_comm});
      // The speed with k stages running, once per layout rather than once per event.
      const double all = core_share(cluster, p.world_size());
      std::vector<double> speed(p.pp + 1);
      for (int k = 1; k <= p.pp; ++k) speed[k] = core_share(cluster, std::max(1, p.world_size() * k / p.pp)) / all;
      const PipelineTimeline run =
          play_pipeline(stages, microbatches, p.schedule, p.vpp, [&](int running) { return speed[running]; });
      const double busy_s = run.busy_s[critical];
      const double pace = c.total() > 0 ? busy_s / (microbatches * c.total()) : 1;
      for (double* phase : {&r.forward_s, &r.backward_s, &r.recompute_s, &r.tp_comm_s, &r.cp_comm_s, &r.ep_comm_s,
                            &r.param_gather_s})
        *phase *= pace;
      r.pp_bubble_s = run.makespan_s - busy_s;
    } else {
      // Bubble: (p-1) micro-batch slots for GPipe and 1F1B, (p-1)/v with v model chunks
      // (Narayanan et al. 2021, Sec. 2.2: bubble fraction (p-1)/m, and (p-1)/(v m) interleaved).
      r.pp_bubble_s = (p.pp - 1) * c.total() / v;
    }
    // Send/recv of one activation per micro-batch each way, per model chunk; with tp > 1 each
    // rank sends its 1/tp slice (Megatron's scatter/gather optimisation, Sec. 4.1).
    double message = T * h * B / p.tp;
    double hop = net.cost(Collective::send_recv, message, group_shape(p, Dim::pp)).time_s;
    r.pp_p2p_s = 2 * hop * (v * microbatches + p.pp - 1);
  }

  // Ranks beyond the cores in several tensor-parallel groups (pp 1): between the data-parallel
  // syncs the groups run independently, and while one waits in its collectives the others compute
  // on the cores it leaves (the processor sharing the pipeline play-out above assumes too). A group's
  // waits stay as they are, which time-sharing stretches (a partner that has no core does not
  // answer); its compute C (at the pace its group has alone) takes wall time Tc, during which each
  // of the other k - 1 groups computes at random with the probability q = Tc / (Tc + W) that it is
  // not waiting, their phases being independent. With j of them computing beside it, the group runs
  // at s(j) = share((1 + j) tp ranks) / share(tp ranks) of its alone pace, so
  //     C = Tc * E[s(J)],  J ~ Binomial(k - 1, q),
  // solved for Tc. No waits (W = 0) gives the even share (every group always computing); long waits
  // give the group's alone pace. (Measured tp 2 x dp 2 over tp 2 on 2 cores, gpt-small: 0.61-1.05
  // of the step over 30 runs, averaging 0.85; this gives 0.81 and 0.83 from two probes here, the
  // even share 1.0, the group's alone pace plus its waits 0.69-0.81.)
  if (cluster.cores_per_node > 0 && p.pp == 1 && r.tp_comm_s > 0) {
    const int ranks = std::min(p.world_size(), cluster.gpus_per_node);
    const int groups = ranks / p.tp;
    if (ranks > cluster.cores_per_node && groups > 1) {
      const double compute_s = r.forward_s + r.backward_s + r.recompute_s;
      const double alone = core_share(cluster, p.tp);
      const double alone_s = compute_s * core_share(cluster, p.world_size()) / alone;
      const double wait_s = r.tp_comm_s;
      std::vector<double> weighted_speed(groups);  // C(k - 1, j) s(j), once per layout
      double pick = 1;
      for (int j = 0; j < groups; ++j) {
        weighted_speed[j] = pick * core_share(cluster, p.tp * (1 + j)) / alone;
        pick = pick * (groups - 1 - j) / (j + 1);
      }
      // E[s(J)] for a given Tc; Tc * E[s(J)] grows with Tc, from <= C at Tc = C to >= C at the
      // even share, so bisection finds the one root.
      auto mean_speed = [&](double tc_s) {
        const double q = tc_s / (tc_s + wait_s);
        double mean = 0;
        for (int j = 0; j < groups; ++j) mean += weighted_speed[j] * std::pow(q, j) * std::pow(1 - q, groups - 1 - j);
        return mean;
      };
      double lo_s = alone_s, hi_s = std::max(alone_s, compute_s);
      for (int i = 0; i < 60 && hi_s - lo_s > 1e-9 * hi_s; ++i) {
        const double mid_s = (lo_s + hi_s) / 2;
        (mid_s * mean_speed(mid_s) < alone_s ? lo_s : hi_s) = mid_s;
      }
      const double pace = compute_s > 0 ? hi_s / compute_s : 1;
      r.forward_s *= pace;
      r.backward_s *= pace;
      r.recompute_s *= pace;
    }
  }

  // Data-parallel gradient reduction of the stage that finishes last (stage 0 in 1F1B), in
  // buckets during the last micro-batch's backward; ZeRO >= 1 and the distributed optimizer use
  // reduce-scatter, then all-gather the updated parameters.
  const StageMemory& s0 = mem.stages[0];
  double grad_bytes = s0.num_params * bpp.grads;
  if (dp_shape.size > 1) {
    bool sharded = p.zero_stage >= 1 || p.distributed_optimizer;
    if (p.zero_stage < 3) {
      double comm = net.cost(sharded ? Collective::reduce_scatter : Collective::all_reduce, grad_bytes, dp_shape).time_s;
      double buckets = std::max(1.0, std::ceil(grad_bytes / t.bucket_bytes));
      double exposed_s = overlap.grad_reduce ? exposed(comm, c.bwd + c.rec, comm / buckets, hide) : comm;
      // ZeRO-2 keeps only its gradient shard, so every micro-batch's gradients
      // are reduce-scattered in its backward (Rajbhandari et al. 2020,
      // Sec. 5.2; DeepSpeed stage 2 with gradient accumulation); ZeRO 0-1 and
      // the distributed optimizer reduce once, in the last one.
      const double times = p.zero_stage == 2 ? microbatches : 1;
      r.dp_comm_s = times * exposed_s;
      r.hidden_comm_s += times * (comm - exposed_s);
    }
    if (sharded && p.zero_stage < 3) {
      double gather = net.cost(Collective::all_gather, s0.num_params * bpp.weights, dp_shape).time_s;
      double exposed_s = overlap.param_gather ? exposed(gather, c.fwd, 0, hide) : gather;
      r.param_gather_s += exposed_s;
      r.hidden_comm_s += gather - exposed_s;
    }
  }

  // A tied word embedding on separate first and last stages: the two copies' gradients are summed by
  // an all-reduce between those two stages once per step, after the data-parallel reduction and
  // exposed (Megatron-LM's embedding group, Narayanan et al. 2021 Sec. 4; finalize_model_grads).
  // ZeRO-2 and -3 keep only their shard of the gradient, so they sum the shard.
  if (p.pp > 1 && m.tied_embeddings) {
    double bytes = double(padded_vocab(m, t, p.tp)) / p.tp * h * bpp.grads;
    if (p.zero_stage >= 2) bytes /= p.dp * p.cp;
    r.dp_comm_s += net.cost(Collective::all_reduce, bytes, embedding_group_shape(p)).time_s;
  }

  // Optimizer step over the local (possibly sharded) parameters; offloaded: on the host, after the
  // gradients cross PCIe, and the updated 16-bit weights come back.
  int shards = (p.zero_stage >= 1 || p.distributed_optimizer) ? p.dp * p.cp : 1;
  double local_params = 0;
  for (const auto& s : mem.stages) local_params = std::max(local_params, s.num_params / shards);
  if (p.offload_optimizer) {
    double transfer = local_params * (bpp.grads + bpp.weights) / kHostLinkBytesPerS;
    double host = local_params * 28.0 * cluster.gpus_per_node / kHostMemoryBytesPerS;
    r.offload_s = transfer + host;
  } else {
    r.optimizer_s = optimizer_step_s(gpu, t, local_params);
  }

  r.step_time_s = r.forward_s + r.backward_s + r.recompute_s + r.exposed_comm_s() + r.pp_bubble_s + r.optimizer_s;
  r.tokens_per_s = double(t.global_batch) * t.seq_len / r.step_time_s;
  r.bubble_fraction = r.pp_bubble_s / r.step_time_s;
  const double peak = peak_flops_per_s(cluster.gpu, t.precision) * p.world_size();
  const double model_flops = model_flops_per_step(m, t);
  double tokens = double(t.global_batch) * t.seq_len;
  LayerFlops lf = layer_forward_flops(m, tokens, t.seq_len);
  double recompute_flops = p.recompute == Recompute::full        ? m.num_layers * lf.total()
                           : p.recompute == Recompute::selective ? m.num_layers * lf.attention
                                                                 : 0.0;
  r.mfu = model_flops / (r.step_time_s * peak);
  r.hfu = (model_flops + recompute_flops) / (r.step_time_s * peak);
  return r;
}

json to_json(const TimeBreakdown& t) {
  json phases = json::object();
  for (const auto& [k, v] : t.phases()) phases[k] = v;
  return json{{"step_time_s", t.step_time_s}, {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu},
              {"hfu", t.hfu},                 {"bubble_fraction", t.bubble_fraction},
              {"exposed_comm_s", t.exposed_comm_s()}, {"hidden_comm_s", t.hidden_comm_s}, {"time", phases}};
}

}  // namespace dplan::costmodel
