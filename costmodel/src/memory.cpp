#include "dplan/costmodel/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {
namespace {


std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

// Parameters one GPU holds for one layer, split into the part sharded over dp*cp by ZeRO and the
// expert part sharded over the expert data-parallel group, edp = tp*cp*dp/(etp*ep). Megatron splits
// q,k,v,o, fc1 (gate, up) and fc2 over tp; row-parallel biases, norms and the router stay
// replicated (Shoeybi et al. 2019, Sec. 3), and so do MLA's down projections and latent norms
// (LayerParams::attention_replicated). Shared experts are dense parameters split over tp. Each GPU
// holds E/ep experts, each split over etp (Megatron-Core MoE parallel folding: experts are sharded
// by ep and etp, replicated over edp, and the distributed optimizer shards their states over edp:
// Liu et al. 2025, arXiv 2504.14960).
struct GpuLayerParams {
  double dense = 0, expert = 0;
  double dense_replicated = 0;   // of dense: held whole by every tp rank
  double expert_replicated = 0;  // of expert: held whole by every etp rank (fc2's bias)
};

// One layer of `kind` on one GPU.
GpuLayerParams gpu_layer_params(const ModelSpec& m, const ParallelConfig& p, LayerKind kind) {
  const double h = m.hidden_size, t = p.tp;
  const double gated = m.mlp == MlpKind::swiglu ? 2.0 : 1.0;
  // One MLP of width f split `ways` ways: its weights and column-parallel biases; fc2's bias replicated.
  auto mlp = [&](double f, double ways) {
    return (gated + 1) * h * f / ways + (m.mlp_bias ? gated * f / ways + h : 0);
  };
  const LayerParams lp = layer_params(m, kind);
  GpuLayerParams g;
  g.dense = (lp.attention - lp.attention_replicated) / t + lp.attention_replicated + lp.norms;
  g.dense_replicated = lp.attention_replicated + lp.norms;
  const double fc2_bias = m.mlp_bias ? h : 0;  // row-parallel: not split
  if (kind == LayerKind::moe && m.is_moe()) {
    const double router = h * m.num_experts + (m.router_bias ? m.num_experts : 0);
    g.dense += router;
    g.dense_replicated += router;
    if (m.shared_expert_ffn_size > 0) {
      g.dense += mlp(m.shared_expert_ffn_size, t) + (m.shared_expert_gate ? h : 0);
      g.dense_replicated += fc2_bias + (m.shared_expert_gate ? h : 0);
    }
    g.expert = double(m.num_experts) / p.ep * mlp(m.ffn_hidden_size, p.expert_tp());  // E/ep experts, split over etp
    g.expert_replicated = double(m.num_experts) / p.ep * fc2_bias;
  } else {
    g.dense += mlp(m.is_moe() ? m.dense_ffn_hidden_size : m.ffn_hidden_size, t);
    g.dense_replicated += fc2_bias;
  }
  return g;
}

// Models with dense and MoE layers hold their mean (layer_params).
GpuLayerParams gpu_layer_params(const ModelSpec& m, const ParallelConfig& p) {
  auto of = [&](LayerKind kind) { return gpu_layer_params(m, p, kind); };
  const double moe = m.moe_layer_fraction();
  if (moe == 0) return of(LayerKind::dense);
  if (moe == 1) return of(LayerKind::moe);
  const GpuLayerParams d = of(LayerKind::dense), e = of(LayerKind::moe);
  auto mix = [&](double a, double b) { return (1 - moe) * a + moe * b; };
  return {mix(d.dense, e.dense), mix(d.expert, e.expert), mix(d.dense_replicated, e.dense_replicated),
          mix(d.expert_replicated, e.expert_replicated)};
}

// The largest parameter tensor one GPU holds, as Megatron's modules hold them (LayerParams::tensors):
// the fused QKV projection (at most the attention's weights) or the MLP's fc1 with gate and up
// fused, each split over tp.
double largest_tensor_params(const ModelSpec& m, const ParallelConfig& p) {
  const double gated = m.mlp == MlpKind::swiglu ? 2.0 : 1.0;
  const double ffn = m.is_moe() && m.moe_layer_fraction() < 1 ? m.dense_ffn_hidden_size : m.ffn_hidden_size;
  const LayerParams lp = layer_params(m);
  return std::max(gated * m.hidden_size * ffn, lp.attention - lp.attention_replicated) / p.tp;
}

}  // namespace

int nccl_communicators(const ParallelConfig& p) {
  int n = 0;
  for (int ranks : {p.tp, p.cp, p.dp * p.cp, p.pp, p.ep, p.ep > 1 ? p.expert_dp() : 1}) n += ranks > 1;
  return n;
}

double outside_allocator_bytes(const GpuSpec& gpu, const ParallelConfig& p) {
  return gpu.framework_reserve_bytes + nccl_communicators(p) * gpu.nccl_buffers_per_communicator_bytes;
}

namespace {

// The layers of [first, first + n) with a dense MLP (all of a dense model's; an MoE model's
// ModelSpec::dense_layers).
int dense_layers_in(const ModelSpec& m, int first, int n) {
  if (!m.is_moe()) return n;
  auto at = [&](int layer) { return std::lower_bound(m.dense_layers.begin(), m.dense_layers.end(), layer); };
  return static_cast<int>(at(first + n) - at(first));
}

// stage_params into `out`, with the layer assignment given (estimate_memory has it, and reuses
// `out` from layout to layout). Each stage holds its own layers: an MoE model's dense layers
// (DeepSeek's first k, Qwen's mlp_only_layers) where they are, not the mean layer everywhere.
void stage_params_of(const ModelSpec& m, const ParallelConfig& p, int vocab_size, const ChunkAssignment& chunks,
                     std::vector<StageParams>& out) {
  const GpuLayerParams dense_layer = gpu_layer_params(m, p, LayerKind::dense);
  const GpuLayerParams moe_layer = m.is_moe() ? gpu_layer_params(m, p, LayerKind::moe) : dense_layer;
  const double h = m.hidden_size, vocab = vocab_size;
  const double final_norm = m.norm == NormKind::layernorm ? 2 * h : h;
  const double positions = m.position == PositionKind::learned ? double(m.max_seq_len) * h : 0;
  out.clear();
  out.reserve(p.pp);
  for (int stage = 0; stage < p.pp; ++stage) {
    const bool first = holds_embedding(chunks[stage]), last = holds_loss(chunks[stage]);
    int layers = 0, dense = 0;
    for (const ModelChunk& chunk : chunks[stage]) {
      layers += chunk.num_layers;
      dense += dense_layers_in(m, chunk.first_layer, chunk.num_layers);
    }
    const double moe = layers - dense;
    auto sum = [&](double GpuLayerParams::*field) { return dense * dense_layer.*field + moe * moe_layer.*field; };
    // Layers, plus the vocabulary-parallel embedding (and learned positions, replicated over tp)
    // on the first stage, the final norm and LM head on the last. A tied head on a separate last
    // stage keeps its own copy of the embedding (Megatron's shared word embeddings).
    StageParams s;
    s.num_layers = layers;
    s.dense = sum(&GpuLayerParams::dense);
    s.dense_tp_replicated = sum(&GpuLayerParams::dense_replicated);
    s.expert = sum(&GpuLayerParams::expert);
    s.expert_etp_replicated = sum(&GpuLayerParams::expert_replicated);
    if (first) {
      s.dense += vocab * h / p.tp + positions;
      s.dense_tp_replicated += positions;
    }
    if (last) {
      s.dense += final_norm;
      s.dense_tp_replicated += final_norm;
      if (!m.tied_embeddings || p.pp > 1) s.dense += vocab * h / p.tp;
      if (m.tied_embeddings && p.pp > 1) s.embedding_copy = vocab * h / p.tp;
      // MTP modules (mtp_params) live on the last stage: each a layer of mtp_layer_kind, its norms
      // (replicated over tp) and eh_proj (column-parallel, Megatron's multi_token_prediction.py),
      // and the stage holds the word embedding for their input (GPTModel builds it where
      // pre_process or mtp_process), shared with the first stage's as a tied head's is.
      if (m.mtp_layers > 0) {
        const GpuLayerParams mtp = gpu_layer_params(m, p, mtp_layer_kind(m));
        const double norms = mtp_module_extra_params(m) - 2 * h * h;
        s.dense += m.mtp_layers * (mtp.dense + norms + 2 * h * h / p.tp);
        s.dense_tp_replicated += m.mtp_layers * (mtp.dense_replicated + norms);
        s.expert += m.mtp_layers * mtp.expert;
        s.expert_etp_replicated += m.mtp_layers * mtp.expert_replicated;
        if (!first && s.embedding_copy == 0) {
          s.dense += vocab * h / p.tp;
          s.embedding_copy = vocab * h / p.tp;
        }
      }
    }
    out.push_back(s);
  }
}

}  // namespace

std::vector<StageParams> stage_params(const ModelSpec& m, const ParallelConfig& p, int vocab_size) {
  std::vector<StageParams> out;
  stage_params_of(m, p, vocab_size, *shared_chunks(m.num_layers, p), out);
  return out;
}

LargestPart largest_part(const StageMemory& s) {
  const LargestPart parts[] = {{s.weights_bytes, "weights"},
                               {s.grads_bytes, "gradients"},
                               {s.optimizer_bytes, "optimizer states"},
                               {s.activations_bytes, "activations"},
                               {s.other_bytes(), "logits, buffers and reserve"}};
  return *std::max_element(std::begin(parts), std::end(parts),
                           [](const LargestPart& a, const LargestPart& b) { return a.bytes < b.bytes; });
}

bool gradients_in_fp32(const TrainingSpec& t) {
  // fp16 keeps the engine's fp16 gradients (its loss scaling is sized for them); bf16 and fp8,
  // whose parameters are bf16, take the engine's rule.
  const bool bf16_params = t.precision == Precision::bf16 || t.precision == Precision::fp8;
  return t.precision == Precision::fp32 || t.fp32_grads ||
         (bf16_params && t.engine.bf16_grads_in_fp32 && !t.grad_reduce_in_bf16);
}

double adam_moment_bytes(const TrainingSpec& t) { return t.bf16_adam_moments ? 2 + 2 : 4 + 4; }

BytesPerParam bytes_per_param(const TrainingSpec& t) {
  const double grads = gradients_in_fp32(t) ? 4.0 : 2.0;
  const double moments = adam_moment_bytes(t);
  // The fp32 master copy of 16-bit weights. --bf16-adam-moments is Megatron's precision-aware
  // optimizer, whose Transformer Engine FusedAdam keeps only the 16 bits of each fp32 master the
  // bf16 weight lacks (store_param_remainders, on by default from TE 2.1, for bf16 training and
  // FP8's delayed scaling, the recipe dplan's export leaves: megatron/core/optimizer/
  // optimizer_config.py and __init__.py at core_v0.15.0).
  const double master = t.bf16_adam_moments ? 2.0 : 4.0;
  switch (t.precision) {
    case Precision::fp32:
      return {4, 4, moments};  // fp32 weights and grads, stepped in place
    case Precision::bf16:
    case Precision::fp16:
      return {2, grads, master + moments};  // ZeRO's K = 12 with an fp32 master and fp32 moments
    case Precision::fp8:  // bf16 weights + Transformer Engine's fp8 copy for the GEMMs (or none)
      return {t.engine.fp8_keeps_16bit_operands ? 2.0 : 3.0, grads, master + moments};
  }
  return {};
}

double gradient_reduce_bytes(const TrainingSpec& t) {
  return t.precision == Precision::fp32 || t.fp32_grads ? 4.0 : 2.0;
}

ModelStateBytes model_state_bytes(double n, int shard_ranks, const TrainingSpec& t, const ParallelConfig& p) {
  BytesPerParam b = bytes_per_param(t);
  const double nd = std::max(1, shard_ranks);
  const bool shard_optimizer = p.zero_stage >= 1 || p.distributed_optimizer;
  // FSDP2's fp32 shards are the master weights: 4 + 4 + the moments (fp8: the 16-bit copy is the gathered unit).
  if (p.zero_stage >= 3 && t.engine.fp32_sharded_params && t.precision != Precision::fp32) b = {4, 4, adam_moment_bytes(t)};
  ModelStateBytes s;
  s.weights_bytes = n * b.weights / (p.zero_stage >= 3 ? nd : 1.0);
  s.grads_bytes = n * b.grads / (p.zero_stage >= 2 ? nd : 1.0);
  double optimizer = n * b.optimizer / (shard_optimizer ? nd : 1.0);
  if (!p.offload_optimizer) {
    s.optimizer_bytes = optimizer;
    return s;
  }
  // Offloaded, the step runs on the host over host tensors of its own: fp32 weights (an extra
  // copy when training is fp32, which otherwise steps the parameters in place) and an fp32 copy
  // of the reduced gradients, as DeepSpeed's ZeRO-Offload keeps them (deepspeed/runtime/zero/
  // stage_1_and_2.py with cpu_offload: single_partition_of_fp32_groups and their fp32 .grad on
  // the CPU). So 4 (weights) + 8 (Adam moments) + 4 (gradients) bytes per parameter in any
  // precision, sharded as the optimizer states are.
  const double host_weights = t.precision == Precision::fp32 ? 4.0 : 0.0, host_grads = 4.0;
  s.host_optimizer_bytes = optimizer + n * (host_weights + host_grads) / (shard_optimizer ? nd : 1.0);
  return s;
}

MemoryEstimate estimate_memory(const ModelSpec& m, const ClusterSpec& c, const TrainingSpec& t,
                               const ParallelConfig& p, double headroom_fraction) {
  const int microbatches = num_microbatches(t, p);
  const std::shared_ptr<const ChunkAssignment> assignment = shared_chunks(m.num_layers, p);
  const ChunkAssignment& chunks = *assignment;
  const double h = m.hidden_size;
  const double vocab = padded_vocab(m, t, p.tp);
  const double act = activation_bytes(t.precision);
  const double sp = p.sequence_parallel ? p.tp : 1;
  const double tokens = double(t.seq_len) / p.cp * p.micro_batch;  // per micro-batch on one GPU
  const GpuLayerParams layer = gpu_layer_params(m, p);
  thread_local std::vector<StageParams> params;  // reused from layout to layout
  stage_params_of(m, p, static_cast<int>(vocab), chunks, params);
  const LayerActivations full_layer = activations_per_layer(m, t, p);
  const double stored_per_layer = stored_activation_bytes_per_layer(m, t, p);
  const BytesPerParam bpp = bytes_per_param(t);
  const int dense_shards = p.dp * p.cp;
  const int expert_shards = p.expert_dp();
  // The same on every stage.
  const double dispatch = moe_dispatch_bytes(m, t, p);
  const double worst_case_routing = moe_worst_case_imbalance(m, p);
  const double outside_allocator = outside_allocator_bytes(c.gpu, p);
  const double fc2_backward = backward_working_set_bytes(m, t, p, false);

  MemoryEstimate est;
  est.stages.reserve(p.pp);
  est.capacity_bytes = c.gpu.memory_capacity_bytes();
  est.headroom_fraction = headroom_fraction;
  est.host_capacity_bytes = c.host_memory_bytes;
  for (int stage = 0; stage < p.pp; ++stage) {
    const bool first = holds_embedding(chunks[stage]), last = holds_loss(chunks[stage]);
    StageMemory s;
    s.stage = stage;
    for (const ModelChunk& chunk : chunks[stage]) s.num_layers += chunk.num_layers;
    s.microbatches_in_flight = microbatches_in_flight(p, stage, microbatches);

    // Parameters (stage_params): layers, embedding, final norm and LM head.
    const double dense = params[stage].dense;
    const double expert = params[stage].expert;
    s.num_params = dense + expert;
    s.expert_params = expert;
    ModelStateBytes dense_state = model_state_bytes(dense, dense_shards, t, p);
    ModelStateBytes expert_state = model_state_bytes(expert, expert_shards, t, p);
    s.weights_bytes = dense_state.weights_bytes + expert_state.weights_bytes;
    s.grads_bytes = dense_state.grads_bytes + expert_state.grads_bytes;
    s.optimizer_bytes = dense_state.optimizer_bytes + expert_state.optimizer_bytes;
    s.host_bytes = dense_state.host_optimizer_bytes + expert_state.host_optimizer_bytes;

    // Activations: what each layer stores, for every micro-batch in flight (per chunk where the
    // interleaved chunks differ: layer_microbatches_in_flight), plus the largest of the working
    // sets that come one at a time on top of them.
    const double layer_microbatches = layer_microbatches_in_flight(p, chunks[stage], stage, microbatches);
    s.activations_bytes = stored_per_layer * layer_microbatches;
    // Routed experts keep their activations unless the whole layer, or under Megatron's selective
    // recompute the whole MoE module, is recomputed (its input only).
    const bool moe_recomputed = p.recompute == Recompute::selective &&
                                t.engine.selective == SelectiveRecompute::attention_core &&
                                t.recompute_modules.has(RecomputeModule::moe);
    if (p.recompute != Recompute::full && !moe_recomputed)
      s.moe_worst_case_extra_bytes =
          (worst_case_routing - 1) * full_layer.routed_expert_bytes * layer_microbatches;
    // A layer's backward: the layer being recomputed (its full set beyond what it stored), with
    // full recompute the gradient arriving at its output (the stored input is all it kept), and
    // the gradients of its first backward GEMM (fc2).
    double layer_backward = 0;
    if (s.num_layers > 0) {
      if (p.recompute != Recompute::none) layer_backward += full_layer.total() - stored_per_layer;
      if (p.recompute == Recompute::full) layer_backward += act * tokens * h / sp;
      layer_backward += fc2_backward;
      // An MoE layer's backward runs its dispatch and combine in reverse: the permuted and the
      // received gradients' copies are live beside it.
      layer_backward += dispatch;
      // The EP overlap without a pipeline pairs each backward layer with the next micro-batch's
      // forward layer (microbatches_in_flight): that layer's stored set comes before the other frees.
      if (p.overlap_ep_comm && p.pp == 1) layer_backward += stored_per_layer;
    }
    double working = layer_backward;
    // Embedding dropout mask per in-flight micro-batch (Korthikanti Sec. 4.3: sbhp/t).
    if (first && m.hidden_dropout > 0) s.activations_bytes += tokens * h / sp * s.microbatches_in_flight;
    if (last) {
      // The micro-batches whose forward through the loss chunk is held: the stage's in-flight
      // count, but for the interleaved order only the last chunk's (chunk_microbatches_in_flight).
      double loss_in_flight = s.microbatches_in_flight;
      for (size_t j = 0; j < chunks[stage].size(); ++j)
        if (chunks[stage][j].loss)
          loss_in_flight = chunk_microbatches_in_flight(p, int(chunks[stage].size()), int(j), stage, microbatches);
      // Final norm input and LM-head input per such micro-batch (Korthikanti: 4sbh/t) ...
      s.activations_bytes += 2 * act * tokens * h / sp * loss_in_flight;
      // ... and the fp32 logits each keeps for its cross-entropy backward (4sbv/t).
      const double logits_one = 4.0 * tokens * vocab / p.tp;
      s.logits_bytes = logits_one * loss_in_flight;
      // Each MTP module keeps as much again for each such micro-batch, as a layer (the mean layer's
      // stored set) with a head of its own: the inputs of its embedding and hidden norms, eh_proj's
      // 2h-wide input, its final norm's and LM head's inputs, and its own fp32 logits.
      s.activations_bytes += m.mtp_layers * (stored_per_layer + 6 * act * tokens * h / sp) * loss_in_flight;
      s.logits_bytes += m.mtp_layers * logits_one * loss_in_flight;
      // The last stage's moments, one at a time (autograd frees a tensor when its last use is
      // done): the loss's forward, where the head's 16-bit logits are cast to fp32 beside them; the
      // head's backward (its dX, dW and 16-bit dY; backward_working_set_bytes), the micro-batch's
      // fp32 logits still counted; then the layers' backward, after that micro-batch's fp32 logits
      // are freed. Measured on one H100 (scripts/gpu-check.sh, llama-3.2-1b, seq 4096, mbs 4): the
      // sum of all three over-counted full recompute's activations by 44 %.
      // Megatron's fused cross-entropy (TrainingSpec::cross_entropy_fusion) holds one more fp32
      // logits tensor in the loss's forward: its compiled kernels compute out of place what the
      // unfused loss exponentiates and normalises in place. Measured in Megatron-LM's CI golden
      // values (tests/data/memory: gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion against
      // ..._resume_torch_dist, the same layout unfused): +0.381 GiB, one fp32 [T, V/tp] being 0.385.
      const double logits16 =
          (act < 4 ? act * tokens * vocab / p.tp : 0.0) + (t.cross_entropy_fusion ? logits_one : 0.0);
      working = std::max({logits16, backward_working_set_bytes(m, t, p, true), layer_backward - logits_one});
      // Deferred LM-head weight gradients (TrainingSpec::embedding_wgrad_deferral): each deferred
      // micro-batch's 16-bit output gradient [T, V/tp] and input [T, h] wait for the flush
      // (core_v0.15.0 tensor_parallel/layers.py, grad_output_buffer and embedding_activation_buffer).
      if (t.embedding_wgrad_deferral && p.pp > 1) {
        const int limit = *t.embedding_wgrad_deferral;
        const double deferred = limit == 0 ? microbatches : std::min(limit, microbatches);
        s.logits_bytes += deferred * act * tokens * (vocab / p.tp + h);
      }
    }
    s.activations_bytes += std::max(0.0, working);

    // Buffers. Stages 0 and 1 reduce the gradients where they live (Megatron's contiguous grad
    // buffer, DDP's gradient_as_bucket_view): nothing extra. ZeRO-2 makes a bucket's unsharded
    // gradients exist only while it fills and reduces: one filling, one reducing (DeepSpeed's
    // reduce_bucket_size) but never more than the stage's own gradients, plus the received slice.
    // ZeRO-3 gathers a whole layer before use and prefetches the next (DeepSpeed / FSDP), and
    // one layer's unsharded gradients fill while the previous one's reduce.
    const double stage_grads = (dense + expert) * bpp.grads;
    if (p.zero_stage == 2) {
      const double bucket = std::min(t.bucket_bytes, stage_grads);
      s.buffers_bytes += std::min(2 * bucket, stage_grads) + bucket / dense_shards;
    } else if (p.zero_stage >= 3) {
      const double layer_params = s.num_layers > 0 ? layer.dense + layer.expert : dense + expert;
      double gathered = 2 * layer_params, unsharded_grads = 2 * layer_params;
      if (t.engine.sharded.max_live_params > 0) {
        // Parameter by parameter (DeepSpeed ZeRO-3, partitioned_param_coordinator.py): gathered
        // parameters stay live up to max_live_params, and the tensor in use is gathered whole
        // beyond it; gradients fill a reduce bucket (reduce_bucket_size, the plan's bucket) beside
        // the tensor whose gradient is being made (stage3.py's ipg bucket).
        const double largest = largest_tensor_params(m, p);
        gathered = std::min(gathered, t.engine.sharded.max_live_params + largest);
        unsharded_grads = std::min(unsharded_grads, t.bucket_bytes / bpp.grads + largest);
      }
      if (t.engine.fp32_sharded_params && t.precision != Precision::fp32) {
        // FSDP2: the gathered units are 16-bit; a unit's 16-bit gradients are cast to fp32 for the
        // reduce-scatter (one unit at a time, both copies), whose fp32 shard is the gradient itself.
        s.buffers_bytes += gathered * act + layer_params * (act + 4.0);
      } else {
        s.buffers_bytes += gathered * bpp.weights + unsharded_grads * bpp.grads + layer_params * bpp.grads / dense_shards;
      }
    }
    // Pipeline send and receive buffers for one activation tensor each way.
    if (p.pp > 1) s.buffers_bytes += 2 * act * tokens * h / sp;
    s.reserve_bytes = outside_allocator;
    est.stages.push_back(s);
  }

  double host_per_gpu = 0;
  for (const auto& s : est.stages) {
    if (s.total_bytes() > est.peak_bytes) {
      est.peak_bytes = s.total_bytes();
      est.worst_stage = s.stage;
    }
    host_per_gpu = std::max(host_per_gpu, s.host_bytes);
  }
  est.host_bytes_per_node = host_per_gpu * c.gpus_per_node;
  est.fits = est.host_bytes_per_node <= est.host_capacity_bytes;
  for (const auto& s : est.stages) est.fits = est.fits && s.total_bytes() <= est.usable_bytes();
  return est;
}

std::vector<std::string> memory_problems(const MemoryEstimate& est) {
  std::vector<std::string> problems;
  for (const auto& s : est.stages) {
    if (s.total_bytes() <= est.usable_bytes()) continue;
    LargestPart largest = largest_part(s);
    const std::string limit = est.headroom_fraction > 0
                                  ? gib(est.usable_bytes()) + " (" + gib(est.capacity_bytes) + " of HBM less " +
                                        std::to_string(static_cast<int>(std::lround(100 * est.headroom_fraction))) +
                                        " % headroom)"
                                  : gib(est.capacity_bytes) + " of HBM";
    problems.push_back("stage " + std::to_string(s.stage) + " needs " + gib(s.total_bytes()) + " > " + limit +
                       " (largest: " + largest.name + " " + gib(largest.bytes) + ")");
  }
  if (est.host_bytes_per_node > est.host_capacity_bytes)
    problems.push_back("offloaded optimizer states need " + gib(est.host_bytes_per_node) + " per node > " +
                       gib(est.host_capacity_bytes) + " of host memory");
  return problems;
}

json to_json(const MemoryEstimate& e) {
  json stages = json::array();
  for (const auto& s : e.stages) {
    stages.push_back({{"stage", s.stage},
                      {"num_layers", s.num_layers},
                      {"num_params", s.num_params},
                      {"microbatches_in_flight", s.microbatches_in_flight},
                      {"weights_bytes", s.weights_bytes},
                      {"grads_bytes", s.grads_bytes},
                      {"optimizer_bytes", s.optimizer_bytes},
                      {"activations_bytes", s.activations_bytes},
                      {"logits_bytes", s.logits_bytes},
                      {"buffers_bytes", s.buffers_bytes},
                      {"reserve_bytes", s.reserve_bytes},
                      {"other_bytes", s.other_bytes()},
                      {"total_bytes", s.total_bytes()},
                      {"host_bytes", s.host_bytes}});
    // MoE layouts only, so that other plans' files stay as they were.
    if (s.moe_worst_case_extra_bytes > 0) stages.back()["moe_worst_case_extra_bytes"] = s.moe_worst_case_extra_bytes;
  }
  return json{{"fits", e.fits},
              {"peak_bytes", e.peak_bytes},
              {"worst_stage", e.worst_stage},
              {"capacity_bytes", e.capacity_bytes},
              {"host_bytes_per_node", e.host_bytes_per_node},
              {"host_capacity_bytes", e.host_capacity_bytes},
              {"reasons", memory_problems(e)},
              {"stages", stages}};
}

}  // namespace dplan::costmodel
