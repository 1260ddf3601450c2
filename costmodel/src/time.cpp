#include "dplan/costmodel/time.h"

#include "dplan/costmodel/core_sharing.h"
#include "dplan/costmodel/memory.h"
#include "dplan/costmodel/time_phases.h"

namespace dplan::costmodel {

GroupShape embedding_group_shape(const ParallelConfig& p) {
  // The network prices groups that tile the world; two ranks half a pipeline apart do when pp is
  // even, and with stages placed in order they cross the same tier as the first and last stage
  // (both inside one node, or in different ones). Odd pp: the pipeline group's ring.
  const GroupShape pipeline = Mesh(p).shape(Dim::pp);
  return p.pp % 2 == 0 ? GroupShape{2, pipeline.stride * p.pp / 2} : pipeline;
}

double TimeBreakdown::seconds(Phase p) const {
  switch (p) {
    case Phase::forward: return forward_s;
    case Phase::backward: return backward_s;
    case Phase::recompute: return recompute_s;
    case Phase::tp_comm: return tp_comm_s;
    case Phase::cp_comm: return cp_comm_s;
    case Phase::ep_comm: return ep_comm_s;
    case Phase::pp_p2p: return pp_p2p_s;
    case Phase::pp_bubble: return pp_bubble_s;
    case Phase::dp_comm: return dp_comm_s;
    case Phase::param_gather: return param_gather_s;
    case Phase::optimizer: return optimizer_s;
    case Phase::offload: return offload_s;
    case Phase::overhead: return overhead_s;
  }
  return 0;
}

std::map<std::string, double> TimeBreakdown::phases() const {
  std::map<std::string, double> out;
  for (const PhaseInfo& info : phase_table()) out[info.name] = seconds(info.phase);
  return out;
}

TimeBreakdown estimate_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                            const OverlapOptions& overlap) {
  return estimate_time(m, net, t, p, estimate_memory(m, net.cluster(), t, p), overlap);
}

// The phases of time_phases.h on the critical path: the critical stage's micro-batches, the
// pipeline around them, then what follows the last backward (data-parallel communication and the
// optimizer). Ranks that share cores change the device's pace, the pipeline's play-out and the
// tensor-parallel groups' compute, all through CoreSharing.
GpuSpec priced_device(const ClusterSpec& cluster, int world_size, const TrainingSpec& t) {
  ParallelConfig ranks;
  ranks.dp = world_size;  // CoreSharing's device reads the world size alone
  GpuSpec gpu = CoreSharing(cluster, ranks).device(cluster.gpu);
  // The engine's kernels at their pace against the profile's (engine.h).
  gpu.sustained_fraction *= t.engine.gemm_scale;
  gpu.memory_efficiency *= t.engine.elementwise_scale;
  return gpu;
}

TimeBreakdown estimate_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                            const MemoryEstimate& mem, const OverlapOptions& overlap) {
  return estimate_time(m, net, t, p, mem, overlap, priced_device(net.cluster(), p.world_size(), t));
}

TimeBreakdown estimate_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                            const MemoryEstimate& mem, const OverlapOptions& overlap, const GpuSpec& gpu,
                            const LayerTimes* layer) {
  const ClusterSpec& cluster = net.cluster();
  const CoreSharing sharing(cluster, p);
  const double hide = cluster.comm_overlap_fraction;
  const LayerTimes lt = layer ? *layer : layer_times(m, gpu, t, p);
  LayerComm comm{tensor_parallel_comm(m, net, t, p), context_parallel_comm(m, net, t, p, lt, hide),
                 expert_parallel_comm_s(m, net, t, p), zero3_comm(m, net, gpu, t, p, mem, lt, hide)};
  if (p.overlap_ep_comm) comm.ep_pair_hidden_s = ep_overlap_pair_hidden_s(m, moe_dispatch_combine(m, net, t, p), lt, hide);
  // Reused from layout to layout (a search prices thousands), so that their vectors are not made anew.
  thread_local std::vector<StageTime> stages;
  stage_times(m, gpu, t, p, lt, comm, overlap, stages);
  // Without gradient-accumulation fusion each micro-batch adds its gradients in a pass of its own,
  // after each chunk's backward (its layers' share of the stage's parameters).
  if (!gradient_accumulation_fused(t, p))
    for (size_t i = 0; i < stages.size(); ++i) {
      StageTime& s = stages[i];
      const double add_s = unfused_accumulation_s(gpu, t, p, mem.stages[i].num_params);
      s.backward_s += add_s;
      int layers = 0;
      for (const ChunkTime& c : s.chunks) layers += c.layers;
      for (ChunkTime& c : s.chunks) c.backward_s += layers > 0 ? add_s * c.layers / layers : add_s / s.chunks.size();
    }
  const int critical = critical_stage(stages);
  const StageTime& c = stages[critical];

  TimeBreakdown r;
  // How often the critical stage runs all its chunks: once per micro-batch, half as often under
  // dualpipe, where each micro-batch passes one of a rank's two stages.
  const double microbatches = num_microbatches(t, p) / (p.schedule == Schedule::dualpipe ? 2.0 : 1.0);
  r.forward_s = microbatches * c.forward_s;
  r.backward_s = microbatches * c.backward_s;
  r.recompute_s = microbatches * c.recompute_s;
  r.tp_comm_s = microbatches * c.tp_s;
  r.cp_comm_s = microbatches * c.cp_s;
  r.ep_comm_s = microbatches * c.ep_s;
  r.param_gather_s = microbatches * c.zero3_s;
  r.hidden_comm_s = microbatches * c.hidden_s;
  const double ep_hidden_s = microbatches * c.ep_hidden_s;
  const double gemm_s = microbatches * c.gemm_s;

  const PipelineTime pipeline = pipeline_time(m, net, t, p, stages, critical, sharing);
  for (double* phase : {&r.forward_s, &r.backward_s, &r.recompute_s, &r.tp_comm_s, &r.cp_comm_s, &r.ep_comm_s,
                        &r.param_gather_s})
    *phase *= pipeline.pace;
  r.pp_bubble_s = pipeline.bubble_s;
  r.pp_p2p_s = pipeline.p2p_s;
  r.hidden_comm_s += pipeline.p2p_hidden_s;

  const double pace = sharing.tensor_parallel_pace(r.forward_s + r.backward_s + r.recompute_s, r.tp_comm_s);
  r.forward_s *= pace;
  r.backward_s *= pace;
  r.recompute_s *= pace;
  r.gemm_s = gemm_s * pipeline.pace * pace;

  const DataParallelComm dp = data_parallel_comm(m, net, t, p, mem, c, overlap);
  r.dp_comm_s = dp.grad_reduce_s;
  r.hidden_comm_s += dp.grad_reduce_hidden_s;
  r.param_gather_s += dp.param_gather_s;
  r.hidden_comm_s += dp.param_gather_hidden_s;
  r.dp_comm_s += dp.tied_embedding_s + dp.mirror_grad_s;

  // Hidden communication still takes SMs: NCCL runs each channel as one thread block on an SM
  // (NCCL environment docs, NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS), and Transformer Engine's
  // TP-overlap kernels take SMs too, so compute beside a collective runs on the SMs left: it slows
  // by kCommSms / sm_count of the time communication is hidden. kCommSms = 8 is an assumption
  // (a few channels per ring; TE's userbuffers reserve up to 16 SMs); the validation runs cannot
  // separate it (public2.json: 0 / 4 / 8 / 16 SMs gave a mean error of 4.7 / 4.7 / 4.7 / 4.8 %
  // once refitted; docs/cost-model.md). Not on a CPU machine, where ranks sharing cores are
  // CoreSharing's business. DeepEP's dispatch and combine hidden by the EP overlap take
  // kDeepepSms (time_phases.h) instead.
  if (cluster.intra_node_kind != IntraNodeKind::shared_memory && gpu.sm_count > 0) {
    constexpr double kCommSms = 8;
    const double ep_sms = p.moe_dispatcher == MoeDispatcher::deepep ? kDeepepSms : kCommSms;
    r.comm_contention_s = (r.hidden_comm_s - ep_hidden_s) * std::min(1.0, kCommSms / gpu.sm_count) +
                          ep_hidden_s * std::min(1.0, ep_sms / gpu.sm_count);
    const double compute_s = r.forward_s + r.backward_s;
    if (compute_s > 0) {
      const double forward_share = r.forward_s / compute_s;
      r.forward_s += r.comm_contention_s * forward_share;
      r.backward_s += r.comm_contention_s * (1 - forward_share);
    }
  }

  const OptimizerTime optimizer = optimizer_time(gpu, cluster, t, p, mem);
  r.optimizer_s = optimizer.optimizer_s;
  r.offload_s = optimizer.offload_s;
  r.overhead_s = step_overhead_s(net, gpu, t, p, mem);
  summarize(r, m, cluster, t, p);
  return r;
}

json to_json(const TimeBreakdown& t) {
  json phases = json::object();
  for (const auto& [k, v] : t.phases()) phases[k] = v;
  return json{{"step_time_s", t.step_time_s}, {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu},
              {"hfu", t.hfu},                 {"bubble_fraction", t.bubble_fraction}, {"gemm_s", t.gemm_s},
              {"comm_contention_s", t.comm_contention_s},
              {"exposed_comm_s", t.exposed_comm_s()}, {"hidden_comm_s", t.hidden_comm_s}, {"time", phases}};
}

}  // namespace dplan::costmodel
