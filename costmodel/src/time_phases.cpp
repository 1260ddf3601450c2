#include "dplan/costmodel/time_phases.h"

#include <algorithm>
#include <cmath>

#include "dplan/costmodel/pipeline.h"

namespace dplan::costmodel {
namespace {

// Host side of optimizer offload. Assumptions, documented in docs/cost-model.md: the PCIe link of
// kHostLinkBytesPerS per GPU (hardware.h), and a node's CPUs stream about 100 GB/s of DDR bandwidth
// for CPU Adam, shared by its GPUs.
constexpr double kHostMemoryBytesPerS = 100e9;

}  // namespace

// The exposed part: what the window, as far as it hides communication, leaves over, between the
// floor and the whole. The overlap fraction is 1 where collectives run on their own engines or SMs
// beside the GEMMs, near 0 where they need the same core (Gloo on a CPU rank).
double exposed_s(double comm_s, double window_s, double floor_s, double overlap_fraction) {
  return std::min(comm_s, std::max(comm_s - overlap_fraction * window_s, floor_s));
}

double tokens_per_microbatch(const TrainingSpec& t, const ParallelConfig& p) {
  return double(p.micro_batch) * t.seq_len / p.cp;
}


// Tensor parallel: per layer two collectives forward and two backward on T*h activations —
// all-reduces, or with sequence parallel all-gather + reduce-scatter of the same volume
// (Korthikanti et al. 2022, Sec. 4.2.2). Recompute replays the forward's share it reruns
// (recomputed_comm: all of it under full recompute).
TensorParallelComm tensor_parallel_comm(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                        const ParallelConfig& p) {
  TensorParallelComm c;
  if (p.tp > 1) {
    GroupShape tp_shape = Mesh(p).shape(Dim::tp);
    double bytes = tokens_per_microbatch(t, p) * m.hidden_size * activation_bytes(t.precision);
    double one = p.sequence_parallel ? 0.5 * (net.cost(Collective::all_gather, bytes, tp_shape).time_s +
                                              net.cost(Collective::reduce_scatter, bytes, tp_shape).time_s)
                                     : net.cost(Collective::all_reduce, bytes, tp_shape).time_s;
    c.layer_forward_s = 2 * one;
    c.edge_s = one;  // embedding output (first stage), LM-head input (last stage)
  }
  c.layer_s = c.layer_forward_s * (2 + recomputed_comm(m, t, p).tp);
  return c;
}

// Context parallel: ring attention passes each K,V chunk cp-1 times around the ring, hidden
// behind the attention core; backward passes K,V again and each block's dK, dV with it, which
// go one step further to arrive home: cp-1 K,V and cp dK,dV transfers (Liu et al. 2023, Ring
// Attention; Transformer Engine's AttnFuncWithCPAndKVP2P backward; executor/src/ring_attention.h).
// Causal load balance: Megatron-Core splits the sequence into 2*cp chunks and gives rank i chunks
// i and 2cp-1-i (hence seq divisible by 2*cp), so every rank does the same causal work and the
// core's time per rank is the causal half of its s/cp queries over s keys (compute.cpp); each
// ring step runs on s/cp keys, which the attention kernel's efficiency by key length prices.
ContextParallelComm context_parallel_comm(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                          const ParallelConfig& p, const LayerTimes& lt, double hide) {
  ContextParallelComm c;
  if (p.cp > 1) {
    double chunk = 2 * tokens_per_microbatch(t, p) * m.kv_dim() / p.tp * activation_bytes(t.precision);
    double step = net.cost(Collective::send_recv, chunk, Mesh(p).shape(Dim::cp)).time_s;
    double fwd = (p.cp - 1) * step, bwd = fwd + p.cp * step;
    double fwd_exposed = exposed_s(fwd, lt.attention_core_s, 0, hide);
    double bwd_exposed = exposed_s(bwd, 2.5 * lt.attention_core_s, 0, hide);
    c.layer_s = fwd_exposed + bwd_exposed + recomputed_comm(m, t, p).cp * fwd_exposed;
    c.layer_forward_s = fwd_exposed;
    c.hidden_layer_s = fwd + bwd - fwd_exposed - bwd_exposed;
  }
  return c;
}

// Expert parallel, as Megatron-Core's alltoall token dispatcher runs it (MoEAlltoAllTokenDispatcher,
// with MoE parallel folding, Liu et al. 2025, arXiv 2504.14960): a rank enters the MoE layer with
// its T/tp tokens (the sequence-parallel split; Megatron refuses MoE with tp > 1 in training without
// sequence parallel, moe_layer.py, so that is the layout priced even when --sp is off) and sends
// each token's k routed copies to the ranks of its ep group that hold their experts: an all-to-all
// of (T/tp)*k*h elements per rank (dispatch), and the same back (combine). With etp > 1 the tokens a
// rank received are all-gathered over its etp group before the experts, etp*(T/tp)*k*h gathered,
// and the experts' partial outputs reduce-scattered after. Backward runs the same collectives on
// the gradients; full recompute replays the forward's. Routing is taken as balanced (Megatron's
// load-balancing auxiliary loss keeps it near; the imbalance left is not priced), so each rank
// receives what it sends. Token dropping / capacity factors are not modelled (Megatron's default
// is dropless). With DeepEP (MoeDispatcher::deepep) the dispatch and combine are deepep_transfer_s.
DispatchCombine moe_dispatch_combine(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                     const ParallelConfig& p) {
  DispatchCombine r;
  const int etp = p.expert_tp();
  if (!m.is_moe() || (p.ep <= 1 && etp <= 1)) return r;
  if (p.moe_dispatcher == MoeDispatcher::deepep) {
    r.dispatch_s = r.combine_s = deepep_transfer_s(m, net, t, p);
    return r;
  }
  const double bytes = tokens_per_microbatch(t, p) / p.tp * m.experts_per_token * m.hidden_size *
                       activation_bytes(t.precision);
  const Mesh mesh(p);
  const double all_to_all = net.cost(Collective::all_to_all, bytes, mesh.shape(Dim::ep)).time_s;
  r.dispatch_s = r.combine_s = all_to_all;
  if (etp > 1) {
    r.dispatch_s += net.cost(Collective::all_gather, etp * bytes, mesh.shape(Dim::etp)).time_s;
    r.combine_s += net.cost(Collective::reduce_scatter, etp * bytes, mesh.shape(Dim::etp)).time_s;
  }
  return r;
}

// DeepEP's normal (high-throughput) kernels as Megatron-Core's flex dispatcher runs them
// (token_dispatcher.py MoEFlexTokenDispatcher at core_v0.14.0: one group over the etp x ep ranks, a
// token's k experts as etp*k targets among etp*E), priced by what they move and over which link
// (deepseek-ai/DeepEP@0297fc8017 docs/legacy.md, the V1 kernels Megatron calls through
// fused_a2a.py's deep_ep.Buffer; DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.2):
//  - a token goes once to every rank that holds one of its experts' shards, not once per expert
//    (the alltoall dispatcher's k copies): with k of E experts drawn evenly, E/ep a rank, a token
//    reaches ep (1 - C(E - E/ep, k) / C(E, k)) ep ranks, times etp;
//  - across nodes it crosses the network once per node holding any of them (RDMA to the same
//    local rank there), then NVLink forwards it inside that node: nodes (1 - C(E - E_node, k) /
//    C(E, k)) node copies, E_node the experts of one node's ranks;
//  - the two stages run pipelined, so the slower sets the time: RDMA copies over the GPU's NIC
//    share, NVLink copies over its NVLink, each at the fraction of line rate DeepEP's README
//    measured, counted as DeepEP counts them (every copy, the rank's own included: "logical
//    bandwidth"): intranode EP8 dispatch 153 GB/s (combine 158) of the H800's 200 GB/s NVLink
//    line rate per direction (hgx-h800.json) = 0.765; internode RDMA on 50 GB/s CX7 NICs: EP16
//    (2 nodes) 43 GB/s, EP32 (4 nodes) 57, EP64 (8 nodes) 50 (the smaller of dispatch and
//    combine), used for 2-3, 4-7 and 8 or more nodes;
//  - latency: one NVLink hop, and one network hop across nodes. Not priced: the CPU's wait for the
//    receive counts before each dispatch (docs/legacy.md, "implicit CPU wait"), FP8 dispatch
//    (Megatron's flex dispatcher sends the activations' dtype), DeepSeek's node-limited routing.
double deepep_transfer_s(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p) {
  const int etp = p.expert_tp();
  const int ranks = p.ep * etp;
  if (!m.is_moe() || ranks < 2) return 0;
  const ClusterSpec& c = net.cluster();
  const int per_node = std::max(1, std::min(ranks, c.gpus_per_node));
  const int nodes = (ranks + per_node - 1) / per_node;
  const double E = m.num_experts, k = m.experts_per_token;
  // P(none of a token's k distinct experts among `held` of the E): C(E - held, k) / C(E, k).
  auto missed = [&](double held) {
    double q = 1;
    for (int i = 0; i < int(k); ++i) q *= std::max(0.0, (E - held - i) / (E - i));
    return q;
  };
  const double row_bytes = tokens_per_microbatch(t, p) / p.tp * m.hidden_size * activation_bytes(t.precision);
  const double rank_copies = etp * p.ep * (1 - missed(E / p.ep));
  const double nvlink_bytes_per_s = c.intra_node.bandwidth_bytes_per_s * kDeepepNvlinkFraction;
  double time_s = row_bytes * rank_copies / nvlink_bytes_per_s + c.intra_node.latency_s;
  if (nodes > 1) {
    const double node_experts = std::min(E, std::max(E / p.ep, E * per_node / ranks));
    const double node_copies = nodes * (1 - missed(node_experts));
    const double fraction = nodes >= 8 ? 50.0 / 50 : nodes >= 4 ? 57.0 / 50 : 43.0 / 50;
    const double nic_bytes_per_s = c.nics_per_node * c.nic_bandwidth_bytes_per_s / c.gpus_per_node * fraction;
    time_s = std::max(time_s, row_bytes * node_copies / nic_bytes_per_s + c.intra_node.latency_s) +
             c.inter_node_latency_s;
  }
  return time_s;
}

double expert_parallel_comm_s(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p) {
  const DispatchCombine dc = moe_dispatch_combine(m, net, t, p);
  // Per mean layer (ModelSpec): the dense layers of an MoE model dispatch nothing.
  return m.moe_layer_fraction() * (dc.dispatch_s + dc.combine_s) * (2 + recomputed_comm(m, t, p).ep);
}

// Megatron-Core's EP overlap (--overlap-moe-expert-parallel-comm; core_v0.14.0
// models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run): a layer's forward
// of one micro-batch and its backward of another run together, the communication on its own
// stream beside the computation:
//   comm:    combine_bwd        | dispatch_fwd    dispatch_bwd | combine_fwd
//   compute: attention fwd      | MLP bwd (dW)    MLP fwd      | attention bwd
// Each of the four transfers hides behind the compute beside it, as far as the cluster's overlap
// fraction lets a window hide communication (exposed_s); what shows is the rest. The attention side
// is the layer's time outside the MLP's GEMMs (element-wise work included; selective recompute's
// replay runs before the attention backward). Per mean layer: the dense layers of an MoE model
// have nothing to hide.
double ep_overlap_pair_hidden_s(const ModelSpec& m, const DispatchCombine& dc, const LayerTimes& lt,
                                double overlap_fraction) {
  if (dc.dispatch_s + dc.combine_s <= 0) return 0;
  const double attention_forward_s = std::max(0.0, lt.forward_s - lt.mlp_forward_s);
  const double attention_backward_s = std::max(0.0, lt.backward_s - lt.mlp_backward_s) + lt.recompute_s;
  // The backward of a combine is a dispatch of the gradients, and the backward of a dispatch a combine.
  const std::pair<double, double> pairs[] = {{dc.dispatch_s, attention_forward_s},
                                             {dc.dispatch_s, lt.mlp_backward_s},
                                             {dc.combine_s, lt.mlp_forward_s},
                                             {dc.combine_s, attention_backward_s}};
  double hidden_s = 0;
  for (const auto& [comm_s, window_s] : pairs) hidden_s += comm_s - exposed_s(comm_s, window_s, 0, overlap_fraction);
  return m.moe_layer_fraction() * hidden_s;
}

double ep_overlap_paired_fraction(const TrainingSpec& t, const ParallelConfig& p, int stage) {
  if (!p.overlap_ep_comm) return 0;
  const int m = num_microbatches(t, p);
  if (p.schedule == Schedule::dualpipe) {
    // dualpipe.py step(): step 4 runs m/2 - pp + half_rank + 1 rounds of two overlapped
    // forward-backward pairs (F0B1, F1B0) among the rank's m forwards; half_rank = min(i, pp-1-i).
    const int half_rank = std::min(stage, p.pp - 1 - stage);
    return m > 0 ? std::clamp(2.0 * (m / 2 - p.pp + half_rank + 1) / m, 0.0, 1.0) : 0;
  }
  const int v = p.schedule == Schedule::interleaved ? p.vpp : 1;
  const long long total = static_cast<long long>(m) * v;
  // Megatron-Core schedules.py get_pp_rank_microbatches (core_v0.14.0): 2(pp - rank - 1) +
  // (v - 1) pp warm-up forwards, one more with the overlap; none but the first without a pipeline
  // (combined_1f1b_schedule_for_no_pipelining). Capped at every forward.
  const long long warmup =
      p.pp == 1 ? 1 : std::min<long long>(total, 2LL * (p.pp - stage - 1) + (v - 1LL) * p.pp + 1);
  return total > 0 ? double(total - warmup) / total : 0;
}

namespace {

// A collective over a stage's parameters: the dense ones over dp*cp and, in an MoE model, the
// experts' over their expert data-parallel group (tp*cp*dp/(etp*ep) ranks; memory.cpp shards them
// there). Megatron-Core keeps the two in separate buffers and runs them one after the other
// (DistributedDataParallel's expert_parallel_buffers), so the times add. `buckets` collectives in
// all, split between the two by their bytes (at least one each).
double dense_and_expert_cost(const Network& net, Collective op, const ParallelConfig& p, double dense_bytes,
                             double expert_bytes, double buckets = 1) {
  const double total = dense_bytes + expert_bytes;
  auto bucketed = [&](double bytes, const GroupShape& shape) {
    if (bytes <= 0) return 0.0;
    const double n = std::max(1.0, std::round(buckets * bytes / total));
    return n * net.cost(op, bytes / n, shape).time_s;
  };
  const Mesh mesh(p);
  return bucketed(dense_bytes, mesh.data_parallel_shape()) + bucketed(expert_bytes, mesh.shape(Dim::edp));
}

// Parameters one rank's optimizer steps over, on its largest stage: all of them, or with ZeRO >= 1
// or the distributed optimizer its shard, the dense part over dp*cp and the experts over their
// expert data-parallel group (memory.cpp).
double local_optimizer_params(const ParallelConfig& p, const MemoryEstimate& mem) {
  const bool sharded = p.zero_stage >= 1 || p.distributed_optimizer;
  const int shards = sharded ? p.dp * p.cp : 1, expert_shards = sharded ? p.expert_dp() : 1;
  double local_params = 0;
  for (const auto& s : mem.stages)
    local_params = std::max(local_params, (s.num_params - s.expert_params) / shards + s.expert_params / expert_shards);
  return local_params;
}

}  // namespace

// ZeRO-3: every layer's parameters are gathered before its forward and its backward, and its
// gradients reduce-scattered after backward, as the plan's engine runs them (engine.h,
// ShardedDataParallel):
//  - one collective per layer, or one per parameter tensor (LayerParams::tensors), each paying its
//    latency at the group's size (the ring's n - 1 steps, collectives.cpp);
//  - with per-rank copies, each collective also costs the engine's per_rank_s per rank of its group
//    (a copy_ each) and moves its bytes through HBM once more (read and write);
//  - prefetched, the next gather runs under the current layer's compute (FSDP, DeepSpeed today), so
//    only the excess and the first gather show; not prefetched (a device synchronize before each
//    gather), all of it shows; between the two, the engine's prefetch_overlap of it can hide;
//  - an engine that gathers again for the recompute pays a third gather under full recompute.
Zero3Comm zero3_comm(const ModelSpec& m, const Network& net, const GpuSpec& gpu, const TrainingSpec& t,
                     const ParallelConfig& p, const MemoryEstimate& mem, const LayerTimes& lt, double hide) {
  Zero3Comm c;
  // MoE: a layer's experts gather and reduce-scatter over their expert data-parallel group, beside
  // the dense part's over dp*cp (dense_and_expert_cost).
  const Mesh mesh(p);
  if (p.zero_stage < 3 || (mesh.data_parallel_shape().size <= 1 && mesh.shape(Dim::edp).size <= 1)) return c;
  const ShardedDataParallel& engine = t.engine.sharded;
  const BytesPerParam bpp = bytes_per_param(t);
  const StageMemory& s0 = mem.stages[0];
  const double layers = std::max(1, s0.num_layers);
  const double expert_params = s0.expert_params / layers, dense_params = (s0.num_params - s0.expert_params) / layers;
  const double collectives = engine.unit == ShardUnit::parameter ? std::max(1.0, layer_params(m).tensors) : 1.0;
  auto collective_s = [&](Collective op, double bytes_per_param) {
    double s = dense_and_expert_cost(net, op, p, dense_params * bytes_per_param, expert_params * bytes_per_param,
                                     collectives);
    if (engine.per_rank_s > 0) {
      const double ranks = mesh.data_parallel_shape().size, bytes = (dense_params + expert_params) * bytes_per_param;
      s += collectives * ranks * engine.per_rank_s + 2 * bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency);
    }
    return s;
  };
  const double gather = collective_s(Collective::all_gather, bpp.weights);
  const double scatter = collective_s(Collective::reduce_scatter, gradient_reduce_bytes(t));
  const double regather = engine.regather_for_recompute && p.recompute == Recompute::full ? gather : 0;
  const double overlap = hide * engine.prefetch_overlap;
  const double fwd = exposed_s(gather, lt.forward_s, 0, overlap);
  const double bwd = exposed_s(gather + scatter, lt.backward_s, 0, overlap);
  const double rec = exposed_s(regather, lt.recompute_s, 0, overlap);
  c.layer_s = fwd + bwd + rec;
  c.layer_forward_s = fwd;
  c.first_s = gather;
  c.hidden_layer_s = 2 * gather + scatter + regather - c.layer_s;
  return c;
}

// Per stage, per micro-batch: the stage's layers' compute and the communication inside it; the
// chunk holding the embedding adds it, the chunk holding the loss the LM head (EdgeTimes), and
// their tp collectives. Summed over the stage's model chunks (assign_chunks), each chunk's share
// kept for the pipeline's play-out (StageTime::chunks).
std::vector<StageTime> stage_times(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t,
                                   const ParallelConfig& p, const LayerTimes& lt, const LayerComm& comm,
                                   const OverlapOptions& overlap) {
  std::vector<StageTime> st;
  stage_times(m, gpu, t, p, lt, comm, overlap, st);
  return st;
}

void stage_times(const ModelSpec& m, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p,
                 const LayerTimes& lt, const LayerComm& comm, const OverlapOptions& overlap, std::vector<StageTime>& st) {
  const std::shared_ptr<const ChunkAssignment> assignment = shared_chunks(m.num_layers, p);
  const ChunkAssignment& chunks = *assignment;
  const EdgeTimes et = edge_times(m, gpu, t, p);
  const double ep_forward_share = 1 / (2 + recomputed_comm(m, t, p).ep);  // see expert_parallel_comm_s
  st.resize(p.pp);
  for (StageTime& s : st) {  // every figure 0 again, the storage of its chunks kept
    std::vector<ChunkTime> storage = std::move(s.chunks);
    storage.clear();
    s = StageTime{};
    s.chunks = std::move(storage);
  }
  for (int i = 0; i < p.pp; ++i) {
    StageTime& s = st[i];
    // The EP overlap hides each layer's transfers in the steps that pair a forward with a backward
    // (ep_overlap_paired_fraction of this stage's), spread over its micro-batches.
    const double ep_hidden = ep_overlap_paired_fraction(t, p, i) * comm.ep_pair_hidden_s;
    const double ep_exposed = comm.ep_s - ep_hidden;
    // One layer's part of a chunk's time: what one costs on this stage (LayerTimes and LayerComm); the
    // rest of a chunk is its edge (embedding, LM head).
    const double layer_s = lt.forward_s + lt.backward_s + lt.recompute_s + comm.cp.layer_s + ep_exposed +
                           comm.zero3.layer_s + (overlap.tp_comm && p.sequence_parallel ? 0 : comm.tp.layer_s);
    s.chunks.reserve(chunks[i].size());
    for (size_t j = 0; j < chunks[i].size(); ++j) {
      const ModelChunk& chunk = chunks[i][j];
      const bool first = chunk.embedding, last = chunk.loss;
      // The loss chunk runs the MTP modules' transformer layers too (their heads are its edge).
      const int layers = chunk.num_layers + (last ? m.mtp_layers : 0);
      const double n = layers;
      const double forward_before = s.forward_s + s.forward_comm_s, total_before = s.total_s();
      s.forward_s += n * lt.forward_s + (first ? et.embedding_forward_s : 0) + (last ? et.head_forward_s : 0);
      s.backward_s += n * lt.backward_s + (first ? et.embedding_backward_s : 0) + (last ? et.head_backward_s : 0);
      s.recompute_s += n * lt.recompute_s;
      s.gemm_s += n * (lt.gemm_forward_s + lt.gemm_backward_s) +
                  (last ? et.head_gemm_forward_s + et.head_gemm_backward_s : 0);
      double tp = n * comm.tp.layer_s + (first ? comm.tp.edge_s : 0) + (last ? 2 * comm.tp.edge_s : 0);
      if (overlap.tp_comm && p.sequence_parallel) {
        s.hidden_s += tp;  // collective-GEMM overlap (Megatron --tp-comm-overlap)
      } else {
        s.tp_s += tp;
        s.forward_comm_s += n * comm.tp.layer_forward_s + (first ? comm.tp.edge_s : 0) + (last ? comm.tp.edge_s : 0);
      }
      s.cp_s += n * comm.cp.layer_s;
      s.ep_s += n * ep_exposed;
      s.ep_hidden_s += n * ep_hidden;
      s.hidden_s += n * ep_hidden;
      // ZeRO-3's first gather is not hidden: once a stage, before its first chunk.
      const double zero3_first = j == 0 ? comm.zero3.first_s : 0;
      s.zero3_s += n * comm.zero3.layer_s + zero3_first;
      s.forward_comm_s +=
          n * (comm.cp.layer_forward_s + ep_exposed * ep_forward_share + comm.zero3.layer_forward_s) + zero3_first;
      s.hidden_s += n * (comm.cp.hidden_layer_s + comm.zero3.hidden_layer_s);
      const double forward = (s.forward_s + s.forward_comm_s) - forward_before;
      const double chunk_s = s.total_s() - total_before;
      s.chunks.push_back({.forward_s = forward, .backward_s = chunk_s - forward, .edge_s = chunk_s - n * layer_s,
                          .layers = layers});
    }
  }
}

std::optional<double> uneven_chunk_slot_s(const std::vector<StageTime>& st) {
  bool even = true;
  for (const StageTime& s : st)
    for (const ChunkTime& c : s.chunks) even = even && !st[0].chunks.empty() && c.layers == st[0].chunks.front().layers;
  if (even) return std::nullopt;
  double slot = 0;
  for (const StageTime& s : st) {
    double edges = 0;
    for (const ChunkTime& c : s.chunks) edges += c.edge_s;
    for (const ChunkTime& c : s.chunks)
      slot = std::max(slot, c.forward_s + c.backward_s - c.edge_s + edges / double(s.chunks.size()));
  }
  return slot;
}

int critical_stage(const std::vector<StageTime>& st) {
  int critical = 0;
  for (int i = 0; i < int(st.size()); ++i)
    if (st[i].total_s() > st[critical].total_s()) critical = i;
  return critical;
}

// Bubble: (p-1) micro-batch slots for GPipe and 1F1B, (p-1)/v with v model chunks (Narayanan et
// al. 2021, Sec. 2.2: bubble fraction (p-1)/m, and (p-1)/(v m) interleaved), a slot being the
// critical stage's time per micro-batch and chunk. Uneven splits (chunks of different layer
// counts: Megatron's first/last stage counts, an accounted embedding or loss, a listed
// assignment): the same p-1 fill-and-drain slots, each as long as the longest chunk of any stage,
// its stage's embedding and LM head spread over its chunks as the closed form spreads them. That
// is the closed form wherever the chunks hold equal layer counts, and for uneven chunks it stays
// within a few percent above the schedule played out (tests/costmodel/pipeline_split_test.cpp),
// at the closed form's cost (playing every layout out made the search ~25x slower).
// Where ranks share cores, a stage that waits hands its cores to the stages that work, so the
// fill, the drain and the waits inside 1F1B's steady state run faster than the steady state: the
// schedule is played out instead (pipeline.h), each chunk at its own time; the critical stage's
// phases take the pace it ran at, and its waits are the bubble.
PipelineTime pipeline_time(const ModelSpec& m, const Network& net, const TrainingSpec& t, const ParallelConfig& p,
                           const std::vector<StageTime>& st, int critical, const CoreSharing& sharing) {
  PipelineTime r;
  if (p.pp <= 1) return r;
  const StageTime& c = st[critical];
  const int microbatches = num_microbatches(t, p);
  const double v = p.schedule == Schedule::interleaved ? p.vpp : 1;
  const bool dualpipe = p.schedule == Schedule::dualpipe;
  if (dualpipe) {
    // DeepSeek-V3 report (arXiv 2412.19437) Table 2: DualPipe's bubble is (pp/2 - 1)(F&B + B - 3W)
    // in one chunk's (one model stage's) times: F its forward, B its whole backward, W the
    // weight-gradient part of B, F&B a forward and a backward run together. Here F and B are the
    // critical rank's mean over its two stages; F&B = F + B (the EP transfers the pair hides are
    // the EP overlap's, stage_times); W = half the backward's GEMMs (each linear layer's dW GEMM
    // has the FLOPs of its dX GEMM), a third of the chunk's GEMM time.
    const double f = (c.forward_s + c.forward_comm_s) / 2, b = c.total_s() / 2 - f, w = c.gemm_s / 6;
    r.bubble_s = (p.pp / 2 - 1) * (f + b + b - 3 * w);
  } else if (sharing.fills_waits()) {
    std::vector<PipelineStage> stages;
    for (const StageTime& s : st) {
      PipelineStage& stage = stages.emplace_back();
      stage.forward_s = s.forward_s + s.forward_comm_s;
      stage.backward_s = s.total_s() - s.forward_s - s.forward_comm_s;
      for (const ChunkTime& c : s.chunks) {
        stage.chunk_forward_s.push_back(c.forward_s);
        stage.chunk_backward_s.push_back(c.backward_s);
      }
    }
    const PipelineTimeline run = play_pipeline(stages, microbatches, p.schedule, p.vpp,
                                               [&](int running) { return sharing.pipeline_speed(running); });
    const double busy_s = run.busy_s[critical];
    r.pace = c.total_s() > 0 ? busy_s / (microbatches * c.total_s()) : 1;
    r.bubble_s = run.makespan_s - busy_s;
  } else {
    const std::optional<double> slot = uneven_chunk_slot_s(st);
    r.bubble_s = slot ? (p.pp - 1) * *slot : (p.pp - 1) * c.total_s() / v;
  }
  // Send/recv of one activation per micro-batch each way, per model chunk; with tp > 1 each
  // rank sends its 1/tp slice (Megatron's scatter/gather optimisation, Sec. 4.1).
  double message = tokens_per_microbatch(t, p) * m.hidden_size * activation_bytes(t.precision) / p.tp;
  double hop = net.cost(Collective::send_recv, message, Mesh(p).shape(Dim::pp)).time_s;
  // Each micro-batch crosses a rank once each way: under dualpipe through one of its two stages.
  const double hops = (dualpipe ? microbatches / 2.0 : v * microbatches) + p.pp - 1;
  if (dualpipe) {
    // DualPipe hides the pipeline's send/recv under the chunk beside it (DeepSeek-V3 report,
    // Sec. 3.2.1); the fill's and drain's pp - 1 hops each way wait in full.
    const double steady = exposed_s(hop, (c.forward_s + c.forward_comm_s) / 2, 0, net.cluster().comm_overlap_fraction);
    r.p2p_s = 2 * (steady * microbatches / 2.0 + hop * (p.pp - 1));
    r.p2p_hidden_s = 2 * hop * hops - r.p2p_s;
  } else if (p.schedule == Schedule::interleaved) {
    // Megatron-LM's interleaved schedule overlaps each send/recv with the next model chunk's
    // compute (--overlap-p2p-communication, on by default and required for pp 2:
    // megatron/training/arguments.py), so in the steady state only what a chunk's forward cannot
    // cover shows; the fill's and drain's p2p - 1 hops each way wait in full.
    const double chunk_s = c.forward_s / v;
    const double steady = exposed_s(hop, chunk_s, 0, net.cluster().comm_overlap_fraction);
    r.p2p_s = 2 * (steady * v * microbatches + hop * (p.pp - 1));
    r.p2p_hidden_s = 2 * hop * hops - r.p2p_s;
  } else {
    r.p2p_s = 2 * hop * hops;
  }
  return r;
}

// Megatron-LM's distributed data parallel sizes its buckets with the data-parallel group:
// max(40M, 1M x dp) parameters (megatron/core/distributed/distributed_data_parallel.py, when
// --ddp-bucket-size is not given), so that large groups run fewer, larger collectives. Other
// engines use the plan's bucket (PyTorch DDP's bucket_cap_mb, 25 MiB by default).
double gradient_bucket_bytes(const TrainingSpec& t, const ParallelConfig& p) {
  if (!p.distributed_optimizer) return t.bucket_bytes;
  return std::max(40e6, 1e6 * p.dp * p.cp) * gradient_reduce_bytes(t);
}

// Data-parallel gradient reduction of the stage that finishes last (stage 0 in 1F1B), in buckets
// during the last micro-batch's backward; ZeRO >= 1 and the distributed optimizer use
// reduce-scatter, then all-gather the updated parameters.
DataParallelComm data_parallel_comm(const ModelSpec& m, const Network& net, const TrainingSpec& t,
                                    const ParallelConfig& p, const MemoryEstimate& mem, const StageTime& c,
                                    const OverlapOptions& overlap) {
  DataParallelComm r;
  const double hide = net.cluster().comm_overlap_fraction;
  const BytesPerParam bpp = bytes_per_param(t);
  const Mesh mesh(p);
  const GroupShape dp_shape = mesh.data_parallel_shape();
  const StageMemory& s0 = mem.stages[0];
  double grad_bytes = s0.num_params * gradient_reduce_bytes(t);
  // MoE: the experts' gradients reduce over their expert data-parallel group, the rest over dp*cp
  // (dense_and_expert_cost).
  const double dense_params = s0.num_params - s0.expert_params;
  auto dp_and_edp = [&](Collective op, double bytes_per_param, double buckets) {
    return dense_and_expert_cost(net, op, p, dense_params * bytes_per_param, s0.expert_params * bytes_per_param,
                                 buckets);
  };
  if ((dp_shape.size > 1 || mesh.shape(Dim::edp).size > 1) && p.zero_stage < 3) {
    bool sharded = p.zero_stage >= 1 || p.distributed_optimizer;
    // One collective per bucket, each paying its latency: at hundreds of ranks a ring's latency
    // ((n-1) hops) rivals its transfer, so the bucket count matters as much as the bytes.
    const double buckets = std::max(1.0, std::ceil(grad_bytes / gradient_bucket_bytes(t, p)));
    double comm = dp_and_edp(sharded ? Collective::reduce_scatter : Collective::all_reduce, gradient_reduce_bytes(t), buckets);
    double exposed = overlap.grad_reduce ? exposed_s(comm, c.backward_s + c.recompute_s, comm / buckets, hide) : comm;
    // ZeRO-2 keeps only its gradient shard, so every micro-batch's gradients are reduce-scattered in
    // its backward (Rajbhandari et al. 2020, Sec. 5.2; DeepSpeed stage 2 with gradient
    // accumulation); ZeRO 0-1 and the distributed optimizer reduce once, in the last one.
    const double times = p.zero_stage == 2 ? num_microbatches(t, p) : 1;
    r.grad_reduce_s = times * exposed;
    r.grad_reduce_hidden_s = times * (comm - exposed);
    if (sharded) {
      double gather = dp_and_edp(Collective::all_gather, bpp.weights, buckets);
      double gather_exposed = overlap.param_gather ? exposed_s(gather, c.forward_s, 0, hide) : gather;
      r.param_gather_s = gather_exposed;
      r.param_gather_hidden_s = gather - gather_exposed;
    }
  }
  // A tied word embedding on separate first and last stages: the two copies' gradients are summed
  // by an all-reduce between those two stages once per step, after the data-parallel reduction and
  // exposed (Megatron-LM's embedding group, Narayanan et al. 2021 Sec. 4; finalize_model_grads).
  // ZeRO-2 and -3 keep only their shard of the gradient, so they sum the shard.
  if (p.pp > 1 && m.tied_embeddings) {
    double bytes = double(padded_vocab(m, t, p.tp)) / p.tp * m.hidden_size * gradient_reduce_bytes(t);
    if (p.zero_stage >= 2) bytes /= p.dp * p.cp;
    r.tied_embedding_s = net.cost(Collective::all_reduce, bytes, embedding_group_shape(p)).time_s;
  }
  // DualPipe: every model stage lives on two ranks (i and pp-1-i), whose gradients of it are summed
  // once per step. DeepSeek-V3's report does not say how; priced as an all-reduce of the rank's
  // (shard of its) gradients over the pair, hidden under the backward as the data-parallel reduce is.
  if (p.schedule == Schedule::dualpipe) {
    double bytes = s0.num_params * gradient_reduce_bytes(t);
    if (p.zero_stage >= 2) bytes /= p.dp * p.cp;
    const double comm = net.cost(Collective::all_reduce, bytes, embedding_group_shape(p)).time_s;
    const double exposed = overlap.grad_reduce ? exposed_s(comm, c.backward_s + c.recompute_s, 0, hide) : comm;
    r.mirror_grad_s = exposed;
    r.grad_reduce_hidden_s += comm - exposed;
  }
  return r;
}

// Optimizer step over the local (possibly sharded) parameters of the largest stage; offloaded: on
// the host, after the gradients cross PCIe, and the updated 16-bit weights come back.
OptimizerTime optimizer_time(const GpuSpec& gpu, const ClusterSpec& cluster, const TrainingSpec& t,
                             const ParallelConfig& p, const MemoryEstimate& mem) {
  OptimizerTime r;
  const BytesPerParam bpp = bytes_per_param(t);
  const double local_params = local_optimizer_params(p, mem);
  if (p.offload_optimizer) {
    double transfer = local_params * (bpp.grads + bpp.weights) / kHostLinkBytesPerS;
    double host = local_params * 28.0 * cluster.gpus_per_node / kHostMemoryBytesPerS;
    r.offload_s = transfer + host;
  } else {
    r.optimizer_s = optimizer_step_s(gpu, t, local_params);
  }
  return r;
}

// Per-step work outside the phases above, on the critical path (Megatron-LM's training step,
// megatron/core/optimizer: zero_grad_buffer, clip_grad_norm / get_grad_norm_fp32, and the loss
// averaged over data-parallel ranks for logging): zeroing the gradient buffer (write its bytes),
// the gradient norm (read the local, possibly sharded, gradients; one fp32 all-reduce over every
// rank, latency-bound), and the loss's all-reduce over the data-parallel group. Two kernels each
// for the memory-bound parts.
double step_overhead_s(const Network& net, const GpuSpec& gpu, const TrainingSpec& t, const ParallelConfig& p,
                       const MemoryEstimate& mem) {
  const BytesPerParam bpp = bytes_per_param(t);
  double grad_bytes = 0;
  for (const StageMemory& s : mem.stages) grad_bytes = std::max(grad_bytes, s.grads_bytes);
  double seconds = memory_time_s(gpu, grad_bytes) + memory_time_s(gpu, local_optimizer_params(p, mem) * bpp.grads) +
                   4 * gpu.kernel_overhead_s;
  const int world = p.world_size();
  if (world > 1) seconds += net.cost(Collective::all_reduce, 4, GroupShape{world, 1}).time_s;
  const GroupShape dp_shape = Mesh(p).data_parallel_shape();
  if (dp_shape.size > 1) seconds += net.cost(Collective::all_reduce, 4, dp_shape).time_s;
  return seconds;
}

// Step time is the sum of the critical-path phases. MFU counts the model's FLOPs
// (model_flops_per_step), HFU adds what recompute replays (every layer's forward, or its attention
// core for selective recompute), both against the dense peak of every GPU of the layout
// (Chowdhery et al. 2022, PaLM, Appendix B).
void summarize(TimeBreakdown& r, const ModelSpec& m, const ClusterSpec& cluster, const TrainingSpec& t,
               const ParallelConfig& p) {
  r.step_time_s =
      r.forward_s + r.backward_s + r.recompute_s + r.exposed_comm_s() + r.pp_bubble_s + r.optimizer_s + r.overhead_s;
  r.tokens_per_s = double(t.global_batch) * t.seq_len / r.step_time_s;
  r.bubble_fraction = r.pp_bubble_s / r.step_time_s;
  const double peak = peak_flops_per_s(cluster.gpu, t.precision) * p.world_size();
  const double model_flops = model_flops_per_step(m, t);
  double tokens = double(t.global_batch) * t.seq_len;
  r.mfu = model_flops / (r.step_time_s * peak);
  r.hfu = (model_flops + recompute_flops(m, t, p, tokens, t.seq_len)) / (r.step_time_s * peak);
}

}  // namespace dplan::costmodel
