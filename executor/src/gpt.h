// One pipeline stage of a GPT-style decoder, split over a tensor-parallel group in Megatron's way:
// vocabulary-parallel embedding and LM head, column-parallel QKV and first MLP matrices,
// row-parallel output projections, replicated norms and row-parallel biases; sequence parallel
// optional. Pre-norm blocks: x += attn(norm1(x)); x += mlp(norm2(x)), or GPT-NeoX's parallel
// residual x += attn(norm1(x)) + mlp(norm2(x)). Multi-head or grouped-query attention (q/k norms,
// sliding windows on the model's windowed layers), a GELU, ReLU or squared-ReLU MLP or a SwiGLU one,
// LayerNorm or RMSNorm, learned or rotary positions (partial, scaled: costmodel/rotary.h), as the
// model spec says; or DeepSeek's multi-head latent attention.
//
// Every parameter is initialised from its global name and the seed alone (the full matrix is drawn,
// then this rank's slice is kept), so the model is the same function of the seed whatever the
// layout: what the parity tests rely on.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm.h"
#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/model.h"
#include "moe.h"
#include "dplan/costmodel/training.h"
#include "global_slice.h"

namespace dplan::executor {

class MemoryMeter;
class PhaseClock;

// The matrix-multiply FLOPs this rank ran, by part (costmodel::FlopPart, what rank_step_flops
// predicts), summed over the run: each from its operands' shapes where it runs (a linear layer's
// 2 x rows x out x in, the attention core's 2 x (d + dv) per query-key pair it attends: every pair
// of the s x s scores for eager attention, the causal pairs in the window for the blockwise
// kernels); forward, and apart what recompute replays (run inside the clock's recompute phase).
struct FlopCounts {
  costmodel::FlopsByPart forward{}, recompute{};
};

// Whether the last stage uses the word embedding too: its head is tied to it, or its MTP modules
// embed their tokens with it. With pp > 1 the first and the last stage then each hold a copy,
// their gradients summed over the embedding group (rank_setup.cpp).
inline bool last_stage_uses_embedding(const costmodel::ModelSpec& model) {
  return model.tied_embeddings || model.mtp_layers > 0;
}

// What every piece of one rank's model runs in: its process groups and layout choices, and where
// it reports time (the phase clock) and communication buffers (the memory meter).
struct ParallelContext {
  ParallelContext(PhaseClock& clock, MemoryMeter& meter) : clock(clock), meter(meter) {}
  PhaseClock& clock;
  MemoryMeter& meter;
  Group world, tp, pp, dp;
  // Context parallel: the ranks that share this rank's tp, dp and pp coordinates and split each
  // sequence between them (2 cp chunks each, causally balanced). Gradients of parameters that every
  // cp rank holds (all dense ones) are summed over dp x cp: dp_cp (the same ranks as dp when cp is 1).
  Group cp, dp_cp;
  // MoE parallel folding (Megatron-Core): within a stage's tp x cp x dp ranks, expert tensor
  // parallel etp fastest, then expert parallel ep, then expert data parallel edp, over which the
  // experts' gradients are summed (costmodel/mesh.h).
  Group etp, ep, edp;
  Group embedding;                // first and last stage (same tp, dp): tied embedding gradients
  bool has_embedding_group = false;
  int stage = 0, num_stages = 1;
  bool sequence_parallel = false;
  costmodel::Recompute recompute = costmodel::Recompute::none;  // selective: the attention core; full: each layer
  // flash: exact attention that stores no s x s tensor (attention.h; SDPA on CUDA with LibTorch 2);
  // standard: softmax(q k^T) v from ATen ops, which keeps the probabilities for backward.
  costmodel::Attention attention = costmodel::Attention::flash;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;  // parameters and activations (bf16: mixed precision)
  FlopCounts flops;
  // Adds `flops` of `part` to the forward's count, or to recompute's while a recompute replays.
  void count_flops(costmodel::FlopPart part, double flops);
  // A linear layer's: 2 x out.numel() x weight's input width.
  void count_linear(costmodel::FlopPart part, const at::Tensor& out, const at::Tensor& weight) {
    count_flops(part, 2.0 * double(out.numel()) * double(weight.size(1)));
  }
};

// What one pipeline rank holds: its model chunks, each a run of consecutive layers, in the order
// this rank runs them forward (one chunk, or vpp of them under the interleaved schedule, chunk j
// holding virtual stage j * pp + rank: costmodel::assign_chunks); the embedding comes first in
// chunk 0, the final norm, head and loss last in the last chunk.
struct StageSpec {
  struct Chunk {
    int first_layer = 0, num_layers = 0;
  };
  std::vector<Chunk> chunks;
  bool embedding = false, lm_head = false;
};

struct Parameter {
  std::string name;             // global name, e.g. "layers.3.mlp.fc1.weight"
  at::Tensor tensor;            // this rank's shard (a leaf that requires grad)
  bool weight_decay = true;     // false for norms and biases
  bool sequence_parallel_partial = false;  // replicated over tp, but its grad is partial under SP
  bool tied_embedding = false;  // the word embedding, held by the first and the last stage
  bool tp_replicated = false;   // the same values on every tp rank (norms, row-parallel biases, positions)
  // An MoE expert's weight: this rank holds its ep rank's experts (etp slice); its gradient is
  // summed and ZeRO-sharded over ctx.edp, not dp (moe.h).
  bool expert = false;
  bool etp_replicated = false;  // an expert's parameter every etp rank holds whole (its down bias)
  GlobalSlice slice;            // the part of the global tensor this rank holds
};

// ZeRO-3 gathers a unit's parameters just before the unit runs and frees them after (Rajbhandari
// et al. 2020, §5.3; FSDP's units). A unit is the embedding, one transformer layer, or the final
// norm and head; a segment of forward uses one unit, the head segment also the embedding's when the
// embedding is tied on the same stage. after_forward may return the output with a hook attached
// (what gathers the parameters again before the segment's backward).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(const std::vector<int>& units) = 0;
  virtual at::Tensor after_forward(const std::vector<int>& units, const at::Tensor& output) = 0;
};

class GptStage {
 public:
  // `padded_vocab`: the embedding's and the head's rows, a multiple of tp (the plan's padding,
  // costmodel::padded_vocab); the rows past the vocabulary stay zero and out of the loss, so the
  // model is the same function whatever the padding.
  GptStage(const costmodel::ModelSpec& model, const StageSpec& stage, int seq_len, int64_t padded_vocab,
           ParallelContext& ctx, uint64_t seed);

  // Runs model chunk `chunk` of this rank. The embedding's chunk takes token ids [b, s] (int64; the
  // whole sequence: each cp rank keeps its two chunks, as it does of the head's targets), the
  // others the previous virtual stage's output. Returns the chunk's output
  // [b, s / cp / (tp if SP), h], or from the head's chunk the summed per-token loss of this rank's
  // tokens times `loss_scale` (a scalar).
  at::Tensor forward(int chunk, const at::Tensor& input, const at::Tensor& targets, double loss_scale);
  int num_chunks() const { return static_cast<int>(stage_.chunks.size()); }
  bool has_embedding(int chunk) const { return stage_.embedding && chunk == 0; }
  bool has_head(int chunk) const { return stage_.lm_head && chunk == num_chunks() - 1; }
  // The chunk each unit belongs to (the embedding's is chunk 0, the head's the last).
  int chunk_of_unit(int unit) const { return chunk_of_unit_.at(unit); }

  // Shape and dtype of what this stage receives from (sends to) the neighbouring stage.
  std::vector<int64_t> activation_shape(int64_t micro_batch) const;

  std::vector<Parameter>& parameters() { return params_; }
  // The unit (0 .. num_units - 1, in forward order) each parameter belongs to.
  const std::vector<int>& unit_of_parameter() const { return unit_of_param_; }
  int num_units() const { return num_units_; }
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // While on, the head keeps each micro-batch's logits (fp32, [b, s, this rank's vocabulary slice
  // without padding]) for --save-reference; turning it off drops them.
  void keep_logits(bool on) {
    keep_logits_ = on;
    if (!on) kept_logits_.clear();
  }
  const std::vector<at::Tensor>& kept_logits() const { return kept_logits_; }
  const MoeCounts& moe_counts() const { return moe_counts_; }
  const FlopCounts& flop_counts() const { return ctx_.flops; }

 private:
  // A dense MLP, split over tp: fc1 (the up projection) and, gated, its gate; fc2 the down one.
  struct DenseMlp {
    at::Tensor fc1_w, fc1_b, gate_w, gate_b, fc2_w, fc2_b;
  };
  // DeepSeek's multi-head latent attention (ModelSpec::is_mla): the down projections to the q and
  // kv latents (kv_a's last qk_rope_head_dim rows: the shared rotary key), their biases and norms,
  // whole on every tp rank; the up projections split by heads (q_b: the plain q projection of
  // hidden_size columns where there is no q latent, q_a undefined).
  struct LatentAttention {
    at::Tensor q_a_w, q_a_b, q_a_norm_w, q_b_w, kv_a_w, kv_a_b, kv_a_norm_w, kv_b_w;
  };
  struct Block {
    at::Tensor norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, q_norm_w, k_norm_w, sinks;
    LatentAttention mla;  // where the model has it (then qkv_w is undefined)
    at::Tensor norm2_w, norm2_b;
    bool moe_layer = false;
    DenseMlp mlp;     // a dense layer's MLP
    MoeWeights moe;   // an MoE layer's router and experts,
    DenseMlp shared;  // its shared expert where the model has one (fc1 undefined: none),
    at::Tensor shared_gate_w;  // and Qwen2-MoE's sigmoid gate on it [1, h]
    int64_t window = 0;  // a sliding window shorter than the sequence (attention.h), 0: none
  };
  // DeepSeek-V3's multi-token prediction module (ModelSpec::mtp_layers; arXiv 2412.19437, Sec. 2.2;
  // Megatron-Core's MultiTokenPredictionLayer), on the last stage: the norms of its two inputs (the
  // next token's embedding, the previous module's output), eh_proj [h, 2h] (column-parallel, its
  // output gathered over tp), a layer numbered after the model's, and its final norm before the
  // shared head.
  struct MtpModule {
    at::Tensor enorm_w, enorm_b, hnorm_w, hnorm_b, eh_proj_w, final_norm_w, final_norm_b;
    Block block;
  };
  at::Tensor& add(const std::string& name, at::Tensor full, int64_t split_dim, bool decay, bool replicated);
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  bool sequence_parallel() const;
  std::vector<at::Tensor> column_parallel(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                          const std::vector<at::Tensor>& biases, costmodel::FlopPart part) const;
  at::Tensor leave_tp(const at::Tensor& partial, const at::Tensor& bias) const;
  at::Tensor row_parallel(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                          costmodel::FlopPart part) const;
  // Counts the attention core's FLOPs: b x heads x its query-key pairs x 2 (d + dv) (FlopCounts).
  void count_attention(const at::Tensor& q, const at::Tensor& v, double pairs) const;
  // The causal query-key pairs this rank's queries attend (their true positions: the cp chunks),
  // within `window` keys where it is > 0.
  double causal_pairs(int64_t window) const;
  at::Tensor attention(const Block& blk, const at::Tensor& x) const;
  at::Tensor latent_attention(const Block& blk, const at::Tensor& x) const;
  at::Tensor attend(const Block& blk, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  at::Tensor attention_kernel(const Block& blk, at::Tensor q, at::Tensor k, at::Tensor v) const;
  at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            const at::Tensor& sinks) const;
  at::Tensor flash_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                        const at::Tensor& sinks) const;
  at::Tensor rotate(const at::Tensor& t) const;
  at::Tensor layer(const Block& blk, const at::Tensor& x) const;
  // layer(), under full recompute replayed in backward.
  at::Tensor run_layer(const Block& blk, const at::Tensor& x) const;
  at::Tensor mlp(const Block& blk, const at::Tensor& x) const;
  at::Tensor dense_mlp(const DenseMlp& w, const at::Tensor& x) const;
  at::Tensor embed(const at::Tensor& tokens);
  at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, double loss_scale);
  // The per-token loss [N] of the shared head on normed hidden states and their targets (global ids).
  at::Tensor token_losses(const at::Tensor& normed, const at::Tensor& targets, bool keep_logits);
  // The MTP modules' weighted losses for the main model's last hidden states and the whole
  // sequences' targets (the head's chunk of forward); undefined without MTP modules.
  at::Tensor mtp_loss(const at::Tensor& x, const at::Tensor& targets, double loss_scale);
  class Builder;  // the constructor's parts (gpt.cpp)

  costmodel::ModelSpec model_;
  StageSpec stage_;
  int seq_len_;
  ParallelContext& ctx_;
  uint64_t seed_;
  int64_t padded_vocab_;
  std::vector<Parameter> params_;
  std::vector<int> unit_of_param_;
  std::vector<int> chunk_of_unit_;
  std::vector<int> chunk_first_block_;  // index into blocks_ of each chunk's first layer, and one past the last
  int num_units_ = 0;
  int head_unit_ = -1;
  UnitHooks* hooks_ = nullptr;
  std::vector<Block> blocks_;
  std::vector<MtpModule> mtp_;
  at::Tensor wte_, wpe_, final_norm_w_, final_norm_b_, head_w_;
  at::Tensor rope_cos_, rope_sin_;
  std::vector<int64_t> query_positions_;  // of this rank's tokens in the sequence (its cp chunks)
  double softmax_scale_ = 0;  // costmodel::softmax_scale
  mutable MoeCounts moe_counts_;
  bool keep_logits_ = false;
  std::vector<at::Tensor> kept_logits_;
  double aux_scale_ = 0;  // this forward's loss_scale x seq_len (moe.h)
};

}  // namespace dplan::executor
