#include "gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "attention.h"
#include "dplan/costmodel/executor_support.h"
#include "dplan/costmodel/rotary.h"
#include "fused_ops.h"
#include "phase_clock.h"
#include "recompute.h"
#include "ring_attention.h"
#include "tp_ops.h"

namespace dplan::executor {
namespace {
using costmodel::FlopPart;
using costmodel::MlpKind;
using costmodel::NormKind;
using costmodel::PositionKind;

constexpr double kInitStd = 0.02;  // GPT-2 / Megatron --init-method-std

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL ^ seed;  // FNV-1a over the name, keyed by the seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// The full (unsplit) tensor a parameter starts from: a function of (seed, name) only.
at::Tensor draw(uint64_t seed, const std::string& name, at::IntArrayRef shape, double std) {
  at::Generator gen = at::detail::createCPUGenerator(name_seed(seed, name));
  return at::empty(shape, at::kFloat).normal_(0.0, std, gen);
}

at::Tensor shard(const at::Tensor& full, int64_t dim, int parts, int index) {
  if (parts == 1) return full;
  return full.chunk(parts, dim)[index];
}

void require_divides(int64_t parts, int64_t n, const std::string& what) {
  if (n % parts != 0)
    throw std::invalid_argument(what + " (" + std::to_string(n) + ") is not divisible by tp = " + std::to_string(parts));
}

// The shapes the layout must divide; std::invalid_argument names the one that does not.
void check_divisible_shapes(const costmodel::ModelSpec& model, int seq_len, const ParallelContext& ctx) {
  const int tp = ctx.tp.size();
  if (model.mtp_layers >= seq_len)
    throw std::invalid_argument("seq_len " + std::to_string(seq_len) + " leaves no target to the last of " +
                                std::to_string(model.mtp_layers) + " MTP modules (each predicts one token further)");
  require_divides(tp, model.num_heads, "num_heads");
  require_divides(tp, model.num_kv_heads, "num_kv_heads");
  require_divides(tp, model.ffn_hidden_size, "ffn_hidden_size");
  if (model.dense_ffn_hidden_size > 0) require_divides(tp, model.dense_ffn_hidden_size, "the dense layers' intermediate_size");
  if (model.shared_expert_ffn_size > 0) require_divides(tp, model.shared_expert_ffn_size, "the shared expert's width");
  const int cp = std::max(1, ctx.cp.size());
  // Context parallel: 2*cp chunks of the sequence, two per cp rank (ring_attention.h); the planner's
  // rule (costmodel check_context_parallel) refuses such plans first.
  if (cp > 1 && seq_len % (2 * cp) != 0)
    throw std::invalid_argument("seq_len (" + std::to_string(seq_len) + ") is not divisible by 2 * cp = " +
                                std::to_string(2 * cp));
  if (ctx.sequence_parallel) require_divides(tp, seq_len / cp, "seq_len / cp under sequence parallel");
  if (seq_len > model.max_seq_len && model.position == PositionKind::learned)
    throw std::invalid_argument("seq_len " + std::to_string(seq_len) + " exceeds the model's learned positions (" +
                                std::to_string(model.max_seq_len) + ")");
}
// The keys each of s queries sees under a causal sliding window of `window` keys (attention.h),
// as SDPA's boolean mask [s, s]: true where query i sees key j, j <= i and i - j < window.
at::Tensor window_mask(int64_t s, int64_t window, at::Device device) {
  at::Tensor i = at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  at::Tensor j = i.view({1, s});
  return (j <= i).logical_and_(i - j < window);
}
}  // namespace

void ParallelContext::count_flops(FlopPart part, double n) {
  (clock.within(Phase::recompute) ? flops.recompute : flops.forward)[static_cast<int>(part)] += n;
}

// The constructor's parts, one per part of the model built (the embedding, each block's attention
// and MLP, the head): each parameter drawn whole and cut to this rank's tp (or etp) slice, appended
// to params_ in the order the stage runs them, with the unit being built.
class GptStage::Builder {
 public:
  explicit Builder(GptStage& stage)
      : s_(stage),
        model_(stage.model_),
        ctx_(stage.ctx_),
        seed_(stage.seed_),
        tp_(stage.ctx_.tp.size()),
        r_(stage.ctx_.tp.rank()),
        H_(stage.model_.hidden_size),
        F_(stage.model_.ffn_hidden_size),
        sp_(stage.ctx_.sequence_parallel && tp_ > 1),
        ln_(stage.model_.norm == NormKind::layernorm),
        out_std_(kInitStd / std::sqrt(2.0 * stage.model_.num_layers)),  // Megatron's scaled init of output layers
        vocab_slice_(tp_slice({model_.vocab_size, H_}, 0, {{model_.vocab_size, stage.padded_vocab_}})) {}

  void embedding() {
    s_.wte_ = word_embedding();
    if (model_.position == PositionKind::learned)
      s_.wpe_ = add("wpe", draw(seed_, "wpe", {model_.max_seq_len, H_}, kInitStd), true, true);
    ++s_.num_units_;
    s_.chunk_of_unit_.push_back(0);
  }

  // This rank's layers, chunk by chunk; each chunk's first block noted.
  std::vector<int> layers() {
    std::vector<int> layers;
    const std::vector<StageSpec::Chunk>& chunks = s_.stage_.chunks;
    for (size_t c = 0; c < chunks.size(); ++c) {
      s_.chunk_first_block_.push_back(static_cast<int>(layers.size()));
      for (int i = 0; i < chunks[c].num_layers; ++i) {
        layers.push_back(chunks[c].first_layer + i);
        s_.chunk_of_unit_.push_back(static_cast<int>(c));
      }
    }
    s_.chunk_first_block_.push_back(static_cast<int>(layers.size()));
    return layers;
  }

  void block(int layer) {
    s_.blocks_.push_back(make_block(layer));
    ++s_.num_units_;
  }

  void head() {
    s_.final_norm_w_ = replicated("final_norm.weight", H_, 1.0);
    if (ln_) s_.final_norm_b_ = replicated("final_norm.bias", H_, 0.0);
    if (model_.tied_embeddings) {
      s_.head_w_ = s_.stage_.embedding ? s_.wte_ : word_embedding();
    } else {
      at::Tensor full = at::zeros({s_.padded_vocab_, H_}, at::kFloat);
      full.narrow(0, 0, model_.vocab_size).copy_(draw(seed_, "lm_head.weight", {model_.vocab_size, H_}, kInitStd));
      s_.head_w_ = add("lm_head.weight", shard(full, 0, tp_, r_), true, false, false, vocab_slice_);
    }
    // The MTP modules, in the head's unit: their layers numbered after the model's (as Hugging
    // Face's checkpoints number them), and the word embedding for their input where the stage has
    // none (a copy of the first stage's, its gradient summed with it as a tied head's is).
    if (model_.mtp_layers > 0 && !s_.stage_.embedding)
      s_.wte_ = model_.tied_embeddings ? s_.head_w_ : word_embedding();
    for (int k = 0; k < model_.mtp_layers; ++k) {
      const int layer = model_.num_layers + k;
      const std::string p = "layers." + std::to_string(layer) + ".mtp.";
      MtpModule m;
      m.enorm_w = replicated(p + "enorm.weight", H_, 1.0);
      if (ln_) m.enorm_b = replicated(p + "enorm.bias", H_, 0.0);
      m.hnorm_w = replicated(p + "hnorm.weight", H_, 1.0);
      if (ln_) m.hnorm_b = replicated(p + "hnorm.bias", H_, 0.0);
      m.eh_proj_w = split(p + "eh_proj.weight", {H_, 2 * H_}, kInitStd, 0, true);
      m.block = make_block(layer);
      m.final_norm_w = replicated(p + "final_norm.weight", H_, 1.0);
      if (ln_) m.final_norm_b = replicated(p + "final_norm.bias", H_, 0.0);
      s_.mtp_.push_back(std::move(m));
    }
    s_.head_unit_ = s_.num_units_++;
    s_.chunk_of_unit_.push_back(static_cast<int>(s_.stage_.chunks.size()) - 1);
  }

  void rotary_tables() {
    const int cp = std::max(1, ctx_.cp.size());
    // The model's frequencies over its rotary dims, scaled as its config says (costmodel/rotary.h).
    const costmodel::RotaryFrequencies freq = costmodel::rotary_frequencies(model_);
    at::Tensor inv = at::tensor(freq.inv_freq, at::kDouble);
    // [s, rotary dims / 2] at this cp rank's tokens' true positions (the whole sequence when cp is 1).
    at::Tensor angles = at::outer(cp_chunks(at::arange(s_.seq_len_, at::kDouble), 0, cp, ctx_.cp.rank()), inv);
    s_.rope_cos_ = (angles.cos() * freq.attention_scale).to(ctx_.device, ctx_.dtype);
    s_.rope_sin_ = (angles.sin() * freq.attention_scale).to(ctx_.device, ctx_.dtype);
  }

 private:
  // One transformer layer's parameters, drawn under its global index (layer < num_layers: the
  // model's; from num_layers on: the MTP modules').
  Block make_block(int layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    Block b;
    b.norm1_w = replicated(p + "norm1.weight", H_, 1.0);
    if (ln_) b.norm1_b = replicated(p + "norm1.bias", H_, 0.0);
    attention(b, p);
    b.norm2_w = replicated(p + "norm2.weight", H_, 1.0);
    if (ln_) b.norm2_b = replicated(p + "norm2.bias", H_, 0.0);
    // An MoE model's dense layers (Qwen's mlp_only_layers, DeepSeek's first k) have a dense MLP of
    // their own width; its MoE layers the experts, and the shared expert where the model has one.
    b.moe_layer = model_.is_moe() && !model_.is_dense_layer(layer);
    if (b.moe_layer) {
      moe_mlp(b, p);
      if (model_.shared_expert_ffn_size > 0) {
        b.shared = dense_mlp(p + "mlp.shared.", model_.shared_expert_ffn_size);
        // Qwen2MoeSparseMoeBlock.shared_expert_gate: sigmoid(x w) scales the shared expert's output.
        if (model_.shared_expert_gate) b.shared_gate_w = add(p + "mlp.shared_gate.weight",
                                                             draw(seed_, p + "mlp.shared_gate.weight", {1, H_}, kInitStd), true, true);
      }
    } else {
      b.mlp = dense_mlp(p + "mlp.", model_.is_moe() ? model_.dense_ffn_hidden_size : model_.ffn_hidden_size);
    }
    // A window as long as the sequence hides nothing: such a layer runs full causal attention.
    const int window = model_.attention_window(layer);
    if (window > 0 && window < s_.seq_len_) b.window = window;
    return b;
  }

  // replicated: the same on every tp rank (its grad is partial under SP, summed by GradSync).
  // `slice`: the part of the global tensor `local` is (default: all of it).
  at::Tensor add(const std::string& name, const at::Tensor& local, bool decay, bool replicated, bool tied = false,
                 GlobalSlice slice = {}) {
    at::Tensor t = local.to(ctx_.device, ctx_.dtype).contiguous().clone().set_requires_grad(true);
    if (slice.shape.empty()) slice.shape = local.sizes().vec();
    s_.params_.push_back({name, t, decay, replicated && sp_, tied, replicated, false, false, slice});
    s_.unit_of_param_.push_back(s_.num_units_);
    return t;
  }
  GlobalSlice tp_slice(at::IntArrayRef shape, int dim, std::vector<GlobalSlice::Section> sections = {}) const {
    return GlobalSlice{shape.vec(), dim, tp_, r_, std::move(sections)};
  }
  at::Tensor split(const std::string& name, at::IntArrayRef shape, double std, int64_t dim, bool decay) {
    at::Tensor full = std == 0 ? at::zeros(shape, at::kFloat) : draw(seed_, name, shape, std);
    return add(name, shard(full, dim, tp_, r_), decay, false, false, tp_slice(shape, static_cast<int>(dim)));
  }
  at::Tensor replicated(const std::string& name, int64_t n, double value) {
    return add(name, at::full({n}, value, at::kFloat), false, true);
  }
  at::Tensor word_embedding() {
    at::Tensor full = at::zeros({s_.padded_vocab_, H_}, at::kFloat);
    full.narrow(0, 0, model_.vocab_size).copy_(draw(seed_, "wte", {model_.vocab_size, H_}, kInitStd));
    return add("wte", shard(full, 0, tp_, r_), true, false, last_stage_uses_embedding(model_) && ctx_.num_stages > 1,
               vocab_slice_);
  }

  void attention(Block& b, const std::string& p) {
    if (model_.is_mla()) return latent_attention(b, p);
    // Column-parallel QKV: this rank's query heads, then its key heads, then its value heads.
    at::Tensor q = shard(draw(seed_, p + "attn.q.weight", {model_.q_dim(), H_}, kInitStd), 0, tp_, r_);
    at::Tensor k = shard(draw(seed_, p + "attn.k.weight", {model_.kv_dim(), H_}, kInitStd), 0, tp_, r_);
    at::Tensor v = shard(draw(seed_, p + "attn.v.weight", {model_.kv_dim(), H_}, kInitStd), 0, tp_, r_);
    const std::vector<GlobalSlice::Section> qkv_rows = {
        {model_.q_dim(), model_.q_dim()}, {model_.kv_dim(), model_.kv_dim()}, {model_.kv_dim(), model_.kv_dim()}};
    const int64_t qkv_dim = model_.q_dim() + 2 * model_.kv_dim();
    b.qkv_w = add(p + "attn.qkv.weight", at::cat({q, k, v}, 0), true, false, false, tp_slice({qkv_dim, H_}, 0, qkv_rows));
    if (model_.qkv_bias)
      b.qkv_b = add(p + "attn.qkv.bias", at::zeros({q.size(0) + 2 * k.size(0)}), false, false, false,
                    tp_slice({qkv_dim}, 0, qkv_rows));
    b.proj_w = split(p + "attn.proj.weight", {H_, model_.q_dim()}, out_std_, 1, true);
    // gpt-oss's sinks: one logit per head, split with the heads.
    if (model_.attention_sinks) b.sinks = split(p + "attn.sinks", {model_.num_heads}, kInitStd, 0, false);
    if (model_.out_bias) b.proj_b = replicated(p + "attn.proj.bias", H_, 0.0);
    if (model_.qk_norm) {
      // Qwen3's q_norm and k_norm: RMSNorm(head_dim), the same on every tp rank; each rank normalises
      // its own heads, so each holds part of the gradient, summed over tp (as the router's).
      auto head_norm = [&](const std::string& name) {
        at::Tensor w = replicated(p + name, model_.head_dim, 1.0);
        s_.params_.back().sequence_parallel_partial = tp_ > 1;
        return w;
      };
      b.q_norm_w = head_norm("attn.q_norm.weight");
      b.k_norm_w = head_norm("attn.k_norm.weight");
    }
  }

  // DeepSeek's multi-head latent attention (transformers DeepseekV3Attention; DeepSeek-V2, arXiv
  // 2405.04434, Sec. 2.1): the down projections and the latents' norms whole on every tp rank, as
  // Megatron-Core's MLASelfAttention keeps linear_q_down_proj and linear_kv_down_proj (under sequence
  // parallel each rank projects its own tokens: their gradients are partial, summed over tp); the
  // up projections column-parallel by heads, the output projection row-parallel.
  void latent_attention(Block& b, const std::string& p) {
    const int64_t heads = model_.num_heads, dqk = model_.head_dim, rope = model_.qk_rope_head_dim;
    const int64_t dv = model_.attn_out_dim() / heads, rq = model_.q_lora_rank, rkv = model_.kv_lora_rank;
    auto down = [&](const std::string& name, int64_t rows) {
      return add(name, draw(seed_, name, {rows, H_}, kInitStd), true, true);
    };
    if (rq > 0) {
      b.mla.q_a_w = down(p + "attn.q_a.weight", rq);
      if (model_.qkv_bias) b.mla.q_a_b = replicated(p + "attn.q_a.bias", rq, 0.0);
      b.mla.q_a_norm_w = replicated(p + "attn.q_a_norm.weight", rq, 1.0);
      b.mla.q_b_w = split(p + "attn.q_b.weight", {heads * dqk, rq}, kInitStd, 0, true);
    } else {
      b.mla.q_b_w = split(p + "attn.q.weight", {heads * dqk, H_}, kInitStd, 0, true);
    }
    b.mla.kv_a_w = down(p + "attn.kv_a.weight", rkv + rope);
    if (model_.qkv_bias) b.mla.kv_a_b = replicated(p + "attn.kv_a.bias", rkv + rope, 0.0);
    b.mla.kv_a_norm_w = replicated(p + "attn.kv_a_norm.weight", rkv, 1.0);
    b.mla.kv_b_w = split(p + "attn.kv_b.weight", {heads * (dqk - rope + dv), rkv}, kInitStd, 0, true);
    b.proj_w = split(p + "attn.proj.weight", {H_, heads * dv}, out_std_, 1, true);
    if (model_.out_bias) b.proj_b = replicated(p + "attn.proj.bias", H_, 0.0);
  }

  // A dense MLP of width f under the name prefix p ("layers.3.mlp.", "layers.3.mlp.shared.").
  DenseMlp dense_mlp(const std::string& p, int64_t f) {
    DenseMlp m;
    m.fc1_w = split(p + "fc1.weight", {f, H_}, kInitStd, 0, true);
    if (model_.mlp_bias) m.fc1_b = split(p + "fc1.bias", {f}, 0, 0, false);
    if (model_.mlp == MlpKind::swiglu) {
      m.gate_w = split(p + "gate.weight", {f, H_}, kInitStd, 0, true);
      if (model_.mlp_bias) m.gate_b = split(p + "gate.bias", {f}, 0, 0, false);
    }
    m.fc2_w = split(p + "fc2.weight", {H_, f}, out_std_, 1, true);
    if (model_.mlp_bias) m.fc2_b = replicated(p + "fc2.bias", H_, 0.0);
    return m;
  }

  void moe_mlp(Block& b, const std::string& p) {
    // The router, whole on every rank: each tp rank routes other tokens (moe.h), so its
    // gradient is partial over tp whether or not sequence parallel is on.
    const int64_t E = model_.num_experts, local = E / ctx_.ep.size();
    const int etp = ctx_.etp.size(), er = ctx_.etp.rank();
    if (F_ % etp != 0)
      throw std::invalid_argument("ffn_hidden_size (" + std::to_string(F_) + ") is not divisible by etp = " +
                                  std::to_string(etp));
    b.moe.router = add(p + "mlp.router.weight", draw(seed_, p + "mlp.router.weight", {E, H_}, kInitStd), true, true);
    s_.params_.back().sequence_parallel_partial = tp_ > 1;
    if (model_.router_bias) {
      // gpt-oss's GptOssTopKRouter.bias, drawn as its weight; DeepSeek-V3's e_score_correction_bias,
      // zero as transformers starts it, which no gradient reaches (ModelSpec::router_bias).
      const bool correction = model_.moe_router_score == costmodel::ModelSpec::RouterScore::sigmoid;
      const std::string name = p + "mlp.router.bias";
      b.moe.router_bias = add(name, correction ? at::zeros({E}) : draw(seed_, name, {E}, kInitStd), false, true);
      s_.params_.back().sequence_parallel_partial = tp_ > 1;
    }
    // This ep rank's experts, each drawn whole from its global name and cut to this etp rank's slice.
    b.moe.first_expert = static_cast<int>(ctx_.ep.rank() * local);
    auto expert = [&](const std::string& name, at::IntArrayRef shape, double std, int64_t dim) {
      at::Tensor t = add(name, shard(draw(seed_, name, shape, std), dim, etp, er), true, false, false,
                         GlobalSlice{shape.vec(), static_cast<int>(dim), etp, er, {}});
      s_.params_.back().expert = true;
      return t;
    };
    for (int64_t l = 0; l < local; ++l) {
      const std::string e = p + "mlp.experts." + std::to_string(b.moe.first_expert + l) + ".";
      b.moe.gate.push_back(expert(e + "gate.weight", {F_, H_}, kInitStd, 0));
      b.moe.up.push_back(expert(e + "up.weight", {F_, H_}, kInitStd, 0));
      b.moe.down.push_back(expert(e + "down.weight", {H_, F_}, out_std_, 1));
      if (model_.mlp_bias) {  // gpt-oss's gate_up_proj_bias and down_proj_bias, zero as it starts them
        auto bias = [&](const std::string& name, int64_t n, int parts) {
          at::Tensor t = add(name, shard(at::zeros({n}), 0, parts, parts > 1 ? er : 0), false, false, false,
                             GlobalSlice{{n}, 0, parts, parts > 1 ? er : 0, {}});
          s_.params_.back().expert = true;
          return t;
        };
        b.moe.gate_b.push_back(bias(e + "gate.bias", F_, etp));
        b.moe.up_b.push_back(bias(e + "up.bias", F_, etp));
        b.moe.down_b.push_back(bias(e + "down.bias", H_, 1));
        s_.params_.back().etp_replicated = etp > 1;
      }
    }
  }

  GptStage& s_;
  const costmodel::ModelSpec& model_;
  ParallelContext& ctx_;
  const uint64_t seed_;
  const int tp_, r_;
  const int64_t H_, F_;  // hidden_size, ffn_hidden_size
  const bool sp_, ln_;
  const double out_std_;
  const GlobalSlice vocab_slice_;
};

GptStage::GptStage(const costmodel::ModelSpec& model, const StageSpec& stage, int seq_len, int64_t padded_vocab,
                   ParallelContext& ctx, uint64_t seed)
    : model_(model), stage_(stage), seq_len_(seq_len), ctx_(ctx), seed_(seed), padded_vocab_(padded_vocab) {
  check_divisible_shapes(model, seq_len, ctx);
  if (padded_vocab_ < model.vocab_size || padded_vocab_ % ctx.tp.size() != 0)
    throw std::invalid_argument("a padded vocabulary of " + std::to_string(padded_vocab_) + " rows for " +
                                std::to_string(model.vocab_size) + " tokens over tp = " + std::to_string(ctx.tp.size()));
  if (stage.chunks.empty()) throw std::logic_error("a pipeline stage without model chunks");
  Builder build(*this);
  if (stage.embedding) build.embedding();
  for (int layer : build.layers()) build.block(layer);
  if (stage.lm_head) build.head();
  if (model.position == PositionKind::rotary) build.rotary_tables();
  softmax_scale_ = costmodel::softmax_scale(model);
  at::Tensor positions = cp_chunks(at::arange(seq_len, at::kLong), 0, std::max(1, ctx.cp.size()), ctx.cp.rank());
  query_positions_.assign(positions.data_ptr<int64_t>(), positions.data_ptr<int64_t>() + positions.numel());
}

double GptStage::causal_pairs(int64_t window) const {
  double pairs = 0;
  for (int64_t p : query_positions_) pairs += window > 0 ? std::min(p + 1, window) : p + 1;
  return pairs;
}

void GptStage::count_attention(const at::Tensor& q, const at::Tensor& v, double pairs) const {
  ctx_.count_flops(FlopPart::attention, 2.0 * double(q.size(0) * q.size(1)) * pairs * double(q.size(3) + v.size(3)));
}

std::vector<int64_t> GptStage::activation_shape(int64_t micro_batch) const {
  const int tp = ctx_.tp.size();
  const bool sp = sequence_parallel();
  const int64_t local = seq_len_ / std::max(1, ctx_.cp.size());  // this cp rank's two chunks
  return {micro_batch, sp ? local / tp : local, model_.hidden_size};
}

at::Tensor GptStage::norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  if (model_.norm == NormKind::layernorm) return at::layer_norm(x, {model_.hidden_size}, w, b, model_.norm_eps);
  return rms_norm(x, w, model_.norm_eps);  // saves x and rstd only, as fused kernels do
}

at::Tensor GptStage::embed(const at::Tensor& tokens) {
  Group& tp = ctx_.tp;
  const int64_t local = wte_.size(0), start = int64_t(tp.rank()) * local;
  at::Tensor ids = tokens.to(ctx_.device);
  at::Tensor outside = (ids < start).logical_or(ids >= start + local);
  at::Tensor rows = at::embedding(wte_, (ids - start).masked_fill(outside, 0));
  rows = rows.masked_fill(outside.unsqueeze(-1), 0.0);  // other ranks' rows: zero here, summed below
  const bool sp = sequence_parallel();
  at::Tensor x = sp ? scatter_to_sp(rows, tp, ctx_.clock, 1) : reduce_from_tp(rows, tp, ctx_.clock);
  if (wpe_.defined()) {
    const int64_t s = x.size(1), first = sp ? int64_t(tp.rank()) * s : 0;
    // Learned positions at the tokens' true positions: this cp rank's chunks, then the SP shard.
    x = x + cp_chunks(wpe_.narrow(0, 0, seq_len_), 0, ctx_.cp.size(), ctx_.cp.rank()).narrow(0, first, s);
  }
  if (model_.hidden_dropout > 0) x = at::dropout(x, model_.hidden_dropout, true);
  return x;
}

bool GptStage::sequence_parallel() const { return ctx_.sequence_parallel && ctx_.tp.size() > 1; }

// Into a tensor-parallel region: column-parallel linears of one input, which comes
// sequence-sharded under SP (gathered for the matmuls, saved as the shard) and else through f.
std::vector<at::Tensor> GptStage::column_parallel(const at::Tensor& x_in, const std::vector<at::Tensor>& weights,
                                                  const std::vector<at::Tensor>& biases, FlopPart part) const {
  std::vector<at::Tensor> out;
  if (sequence_parallel()) {
    out = sp_column_linears(x_in, weights, biases, ctx_.tp, ctx_.clock, 1);
  } else {
    at::Tensor x = copy_to_tp(x_in, ctx_.tp, ctx_.clock);
    for (size_t i = 0; i < weights.size(); ++i)
      out.push_back(i < biases.size() && biases[i].defined() ? at::linear(x, weights[i], biases[i]) : at::linear(x, weights[i]));
  }
  for (size_t i = 0; i < weights.size(); ++i) ctx_.count_linear(part, out[i], weights[i]);
  return out;
}

// Out of a row-parallel matrix: the partial sums added over tp (reduce-scatter under SP, else g),
// then the replicated bias and dropout.
at::Tensor GptStage::leave_tp(const at::Tensor& partial, const at::Tensor& bias) const {
  at::Tensor out = sequence_parallel() ? scatter_to_sp(partial, ctx_.tp, ctx_.clock, 1)
                                       : reduce_from_tp(partial, ctx_.tp, ctx_.clock);
  if (bias.defined()) out = out + bias;
  if (model_.hidden_dropout > 0) out = at::dropout(out, model_.hidden_dropout, true);
  return out;
}

// A row-parallel linear, out of the tensor-parallel region (leave_tp). On one tensor-parallel rank
// there is nothing to add up, and the bias goes into the GEMM (at::linear's addmm) rather than a
// pass of its own over the output, as torch.nn.Linear does it.
at::Tensor GptStage::row_parallel(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                                  FlopPart part) const {
  ctx_.count_flops(part, 2.0 * double(h.numel()) * double(weight.size(0)));
  if (ctx_.tp.size() > 1 || !bias.defined()) return leave_tp(at::linear(h, weight), bias);
  at::Tensor out = at::linear(h, weight, bias);
  return model_.hidden_dropout > 0 ? at::dropout(out, model_.hidden_dropout, true) : out;
}

at::Tensor GptStage::attention(const Block& blk, const at::Tensor& x_in) const {
  if (model_.is_mla()) return latent_attention(blk, x_in);
  Group& tp = ctx_.tp;
  at::Tensor qkv = column_parallel(x_in, {blk.qkv_w}, {blk.qkv_b}, FlopPart::qkv)[0];
  const int64_t b = qkv.size(0), s = qkv.size(1), d = model_.head_dim;
  const int64_t heads = model_.num_heads / tp.size(), kv_heads = model_.num_kv_heads / tp.size();
  auto split = qkv.split_with_sizes({heads * d, kv_heads * d, kv_heads * d}, -1);
  at::Tensor q = split[0].view({b, s, heads, d}).transpose(1, 2);
  at::Tensor k = split[1].view({b, s, kv_heads, d}).transpose(1, 2);
  at::Tensor v = split[2].view({b, s, kv_heads, d}).transpose(1, 2);
  if (blk.q_norm_w.defined()) {  // Qwen3Attention: per-head RMSNorm of q and k, before the rotation
    q = rms_norm(q.transpose(1, 2), blk.q_norm_w, model_.norm_eps).transpose(1, 2);
    k = rms_norm(k.transpose(1, 2), blk.k_norm_w, model_.norm_eps).transpose(1, 2);
  }
  if (rope_cos_.defined()) {
    q = rotate(q);
    k = rotate(k);
  }
  return row_parallel(attend(blk, q, k, v), blk.proj_w, blk.proj_b, FlopPart::out_proj);
}

// The latents' RMSNorm epsilon: DeepseekV3RMSNorm's default, with which transformers builds
// q_a_layernorm and kv_a_layernorm (not rms_norm_eps).
constexpr double kLatentNormEps = 1e-6;

// Multi-head latent attention (Builder::latent_attention): the down projections on this rank's
// tokens, the latents and the rotary key into the tensor-parallel region (gathered along the
// sequence under SP, else through f), the up projections to this rank's heads, the rotary key
// shared by all of them; q and k of nope + rope dims, v of v_head_dim.
at::Tensor GptStage::latent_attention(const Block& blk, const at::Tensor& x_in) const {
  const LatentAttention& w = blk.mla;
  Group& tp = ctx_.tp;
  const int64_t rope = model_.qk_rope_head_dim, nope = model_.head_dim - rope, rkv = model_.kv_lora_rank;
  const int64_t heads = model_.num_heads / tp.size(), dv = model_.attn_out_dim() / model_.num_heads;
  auto linear = [this](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    at::Tensor y = bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
    ctx_.count_linear(FlopPart::qkv, y, weight);
    return y;
  };
  at::Tensor q;
  if (w.q_a_w.defined()) {
    at::Tensor q_latent = rms_norm(linear(x_in, w.q_a_w, w.q_a_b), w.q_a_norm_w, kLatentNormEps);
    q = column_parallel(q_latent, {w.q_b_w}, {}, FlopPart::qkv)[0];
  } else {
    q = column_parallel(x_in, {w.q_b_w}, {}, FlopPart::qkv)[0];
  }
  at::Tensor kv_a = linear(x_in, w.kv_a_w, w.kv_a_b);
  at::Tensor kv = column_parallel(rms_norm(kv_a.narrow(-1, 0, rkv), w.kv_a_norm_w, kLatentNormEps), {w.kv_b_w}, {},
                                  FlopPart::qkv)[0];
  at::Tensor k_rope = kv_a.narrow(-1, rkv, rope);
  k_rope = sequence_parallel() ? gather_from_sp(k_rope, tp, ctx_.clock, 1) : copy_to_tp(k_rope, tp, ctx_.clock);
  const int64_t b = q.size(0), s = q.size(1);
  q = q.view({b, s, heads, nope + rope}).transpose(1, 2);
  auto q_parts = q.split_with_sizes({nope, rope}, -1);
  q = at::cat({q_parts[0], rotate(q_parts[1])}, -1);
  auto kv_parts = kv.view({b, s, heads, nope + dv}).transpose(1, 2).split_with_sizes({nope, dv}, -1);
  k_rope = rotate(k_rope.view({b, 1, s, rope}));
  at::Tensor k = at::cat({kv_parts[0], k_rope.expand({b, heads, s, rope})}, -1);
  return row_parallel(attend(blk, q, k, kv_parts[1]), blk.proj_w, blk.proj_b, FlopPart::out_proj);
}

// The attention core of this rank's heads: q [b, heads, s, d], k [b, kv_heads, s, d] and v
// [b, kv_heads, s, dv] to the context [b, s, heads * dv].
// Selective recompute replays the core in backward whichever kernel runs it, keeping q, k and v as
// Megatron-Core's checkpointed core attention does (recompute_modules core_attn, Transformer
// Engine's fused and context-parallel attention included): the eager path's s x s tensors, the
// blockwise kernels' output and log-sum-exp are not kept (the cost model's
// megatron_recompute_shares and megatron_recompute_dropped_bytes).
at::Tensor GptStage::attend(const Block& blk, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  if (ctx_.recompute != costmodel::Recompute::selective) return attention_kernel(blk, q, k, v);
  return recompute([this, &blk](const std::vector<at::Tensor>& in) { return attention_kernel(blk, in[0], in[1], in[2]); },
                   {q, k, v}, &ctx_.clock);
}

at::Tensor GptStage::attention_kernel(const Block& blk, at::Tensor q, at::Tensor k, at::Tensor v) const {
  const int64_t b = q.size(0), s = q.size(2), heads = q.size(1), kv_heads = k.size(1), dv = v.size(3);
  if (ctx_.cp.size() > 1) {
    // Context parallel: the ring, blockwise like flash attention whatever --attention says
    // (Megatron-Core runs context parallel only through Transformer Engine's fused attention; the
    // cost model prices it so, activations.cpp).
    // Attention dropout's masks from one seed drawn here, from the generator recompute restores.
    AttentionDropout dropout;
    if (model_.attention_dropout > 0)
      dropout = {model_.attention_dropout,
                 static_cast<uint64_t>(at::empty({1}, q.options().dtype(at::kLong)).random_().item<int64_t>())};
    count_attention(q, v, causal_pairs(blk.window));
    return ring_attention(q, k, v, ctx_.cp, &ctx_.clock, blk.window, blk.sinks, dropout, 64, softmax_scale_);
  }
  // Flash attention: grouped K/V stay at kv-head width.
  if (ctx_.attention == costmodel::Attention::flash) return flash_core(q, k, v, blk.window, blk.sinks);
  if (kv_heads < heads) {  // grouped-query attention: each key/value head serves heads/kv_heads queries
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  return attention_core(q, k, v, blk.window, blk.sinks).transpose(1, 2).reshape({b, s, heads * dv});
}

// Rotary embedding of q or k [b, heads, s, d] at this rank's positions, rotate-half convention
// (GPT-NeoX, Llama: transformers' apply_rotary_pos_emb), on the first rotary_width dims of each
// head (partial rotary: Nemotron, GPT-NeoX), the rest passed through.
at::Tensor GptStage::rotate(const at::Tensor& t) const {
  const int64_t s = t.size(2), d = t.size(3), rot = model_.rotary_width();
  at::Tensor cos = rope_cos_.narrow(0, 0, s), sin = rope_sin_.narrow(0, 0, s);
  auto halves = (rot < d ? t.narrow(-1, 0, rot) : t).chunk(2, -1);
  at::Tensor out = at::cat({halves[0] * cos - halves[1] * sin, halves[1] * cos + halves[0] * sin}, -1);
  return rot < d ? at::cat({out, t.narrow(-1, rot, d - rot)}, -1) : out;
}

// Flash attention: [b, s, heads * dv] out of q [b, heads, s, d], k [b, kv_heads, s, d] and v
// [b, kv_heads, s, dv]; window > 0: a sliding window; sinks: attention sinks (attention.h).
at::Tensor GptStage::flash_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                const at::Tensor& sinks) const {
  count_attention(q, v, causal_pairs(window));
  // SDPA has no sinks: ours on every device.
  if (sinks.defined()) return flash_attention(q, k, v, 64, model_.attention_dropout, window, sinks, softmax_scale_);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // The fused kernel (FlashAttention-2 where it applies); grouped K/V through enable_gqa (PyTorch
  // 2.5+, torch.nn.functional.scaled_dot_product_attention's docs), whose flash kernel reads them
  // at kv-head width as the cost model prices it. On the CPU too, without dropout: ATen's CPU flash
  // kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) saves what ours does (q, k, v, the
  // output, the log-sum-exp) and runs as one fused loop; with dropout, ours, whose masks recompute
  // and checkpoints replay from the generator.
  // A sliding window on the CPU: ours, which multiplies only the keys in the window (ATen's CPU
  // kernel would run a mask over every key); on CUDA the fused kernels take it as a boolean mask.
  // ATen's CPU flash kernel wants v as wide as q and k: MLA's narrower v takes ours there.
  if (q.is_cuda() || (model_.attention_dropout == 0 && window == 0 && v.size(3) == q.size(3))) {
    // SDPA saves its inputs as given: a strided view into the fused QKV projection (v always, q and
    // k without rotary) would keep that whole tensor alive. Copies of such views, as flash_attention
    // makes (attention.h), leave saved exactly q, k, v at their own widths; laid out as
    // [b, s, heads, d], the flash kernels' own layout, in which the CPU kernel then writes its output
    // too (it follows q's), so that [b, s, heads * d] below is a view of it, not a copy.
    auto bshd = [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); };
    std::optional<at::Tensor> mask;
    if (window > 0) mask = window_mask(q.size(2), window, q.device());
    at::Tensor out = at::scaled_dot_product_attention(bshd(q), bshd(k), bshd(v), mask, model_.attention_dropout,
                                                      /*is_causal=*/window == 0, /*scale=*/softmax_scale_,
                                                      /*enable_gqa=*/k.size(1) != q.size(1));
    return out.transpose(1, 2).reshape({q.size(0), q.size(2), q.size(1) * v.size(3)});
  }
#elif TORCH_VERSION_MAJOR >= 2
  if (q.is_cuda() && k.size(1) == q.size(1) && !model_.is_mla()) {  // the fused kernel (FlashAttention-2 where it applies)
    c10::optional<at::Tensor> mask;
    if (window > 0) mask = window_mask(q.size(2), window, q.device());
    at::Tensor out = at::scaled_dot_product_attention(q, k, v, mask, model_.attention_dropout, /*is_causal=*/window == 0);
    return out.transpose(1, 2).reshape({q.size(0), q.size(2), q.size(1) * q.size(3)});
  }
#endif
  return flash_attention(q, k, v, 64, model_.attention_dropout, window, {}, softmax_scale_);
}

// softmax(q k^T x softmax_scale_ + causal mask) v, per head: what selective recompute recomputes.
at::Tensor GptStage::attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    int64_t window, const at::Tensor& sinks) const {
  const int64_t s = q.size(2);
  count_attention(q, v, double(s) * double(s));  // every score, masked after
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * softmax_scale_;
  at::Tensor hidden = window > 0 ? window_mask(s, window, q.device()).logical_not()
                                 : at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  at::Tensor probs;
  if (sinks.defined()) {  // gpt-oss's eager_attention_forward: a sink column in the softmax, dropped after it
    at::Tensor column = sinks.to(scores.scalar_type()).view({1, -1, 1, 1}).expand({q.size(0), -1, s, 1});
    probs = at::softmax(at::cat({scores, column}, -1), -1).narrow(-1, 0, s);
  } else {
    probs = at::softmax(scores, -1);
  }
  if (model_.attention_dropout > 0) probs = at::dropout(probs, model_.attention_dropout, true);
  return at::matmul(probs, v);
}

at::Tensor GptStage::mlp(const Block& blk, const at::Tensor& x_in) const {
  if (!blk.moe_layer) return dense_mlp(blk.mlp, x_in);
  at::Tensor y = moe_mlp(model_, blk.moe, x_in, seq_len_, aux_scale_, ctx_, moe_counts_);
  if (!blk.shared.fc1_w.defined()) return y;
  // The shared expert runs on every token beside the routed ones (DeepSeekMoE, arXiv 2401.06066;
  // Qwen2MoeSparseMoeBlock), split over tp as any dense MLP; Qwen2-MoE scales it by its gate.
  at::Tensor shared = dense_mlp(blk.shared, x_in);
  if (blk.shared_gate_w.defined()) {
    // The gate's input is this rank's tokens (the sequence-parallel shard, or all of them).
    at::Tensor gate = at::linear(x_in, blk.shared_gate_w);
    ctx_.count_linear(FlopPart::mlp, gate, blk.shared_gate_w);
    shared = shared * at::sigmoid(gate);
  }
  return y + shared;
}

at::Tensor GptStage::dense_mlp(const DenseMlp& w, const at::Tensor& x_in) const {
  at::Tensor h;
  if (model_.mlp == MlpKind::swiglu) {
    auto up_gate = column_parallel(x_in, {w.fc1_w, w.gate_w}, {w.fc1_b, w.gate_b}, FlopPart::mlp);
    h = swiglu(up_gate[1], up_gate[0]);  // Shazeer 2020: down(silu(gate x) * up x); saves gate and up only
  } else {
    at::Tensor up = column_parallel(x_in, {w.fc1_w}, {w.fc1_b}, FlopPart::mlp)[0];
    if (model_.activation == "relu2") {
      h = at::relu(up).square();  // squared ReLU (So et al. 2021, Primer): Nemotron's relu2
    } else if (model_.activation == "relu") {
      h = at::relu(up);
    } else {
      // GELU exact (erf), or its tanh approximation where the config names one (GPT-2's gelu_new).
      h = at::gelu(up, *costmodel::gelu_approximation(model_.activation));
    }
  }
  return row_parallel(h, w.fc2_w, w.fc2_b, FlopPart::mlp);
}

at::Tensor GptStage::token_losses(const at::Tensor& normed, const at::Tensor& targets, bool keep_logits) {
  Group& tp = ctx_.tp;
  at::Tensor logits = column_parallel(normed, {head_w_}, {}, FlopPart::head)[0];  // [b, s, V/tp]
  const int64_t local = head_w_.size(0);
  if (keep_logits) {
    const int64_t real = std::clamp<int64_t>(model_.vocab_size - int64_t(tp.rank()) * local, 0, local);
    kept_logits_.push_back(logits.detach().narrow(-1, 0, real).to(at::kFloat).clone());
  }
  return vocab_parallel_cross_entropy(logits.reshape({-1, local}), targets.to(ctx_.device).reshape({-1}),
                                      int64_t(tp.rank()) * local, model_.vocab_size, tp, ctx_.clock);
}

at::Tensor GptStage::head_loss(const at::Tensor& x_in, const at::Tensor& targets, double loss_scale) {
  return token_losses(norm(x_in, final_norm_w_, final_norm_b_), targets, keep_logits_).sum() * loss_scale;
}

// DeepSeek-V3's multi-token prediction (arXiv 2412.19437, Sec. 2.2, eq. 21-25; Megatron-Core's
// MultiTokenPredictionBlock): module k (1..D) takes the previous module's output h (for k = 1 the
// main model's last layer's, before its final norm), projects [enorm(embed(t_{i+k})); hnorm(h_i)]
// (Megatron's order) back to h wide, runs its layer and predicts t_{i+k+1} through its final norm
// and the shared head. Its loss is the mean over the positions that have such a target (each
// sequence's last k have none: their loss is masked, and as attention is causal nothing they hold
// reaches the others), and mtp_loss_scale / D times the modules' sum joins the objective.
at::Tensor GptStage::mtp_loss(const at::Tensor& x_in, const at::Tensor& targets, double loss_scale) {
  if (mtp_.empty()) return {};
  const int64_t b = targets.size(0), s = targets.size(1);
  const int cp = ctx_.cp.size(), cp_rank = ctx_.cp.rank();
  Group& tp = ctx_.tp;
  at::Tensor h = x_in, total;
  for (size_t i = 0; i < mtp_.size(); ++i) {
    const MtpModule& m = mtp_[i];
    const int64_t k = static_cast<int64_t>(i) + 1;
    // Position j's input token is t_{j+k} = targets[j + k - 1], its target t_{j+k+1} = targets[j + k];
    // past the sequence's end token 0 stands in and the target is masked.
    at::Tensor ids = at::zeros_like(targets), next = at::zeros_like(targets);
    ids.narrow(1, 0, s - k + 1).copy_(targets.narrow(1, k - 1, s - k + 1));
    next.narrow(1, 0, s - k).copy_(targets.narrow(1, k, s - k));
    at::Tensor valid = at::zeros({b, s}, at::kFloat);
    valid.narrow(1, 0, s - k).fill_(1.0);
    at::Tensor e = norm(embed(cp_chunks(ids, 1, cp, cp_rank)), m.enorm_w, m.enorm_b);
    at::Tensor both = at::cat({e, norm(h, m.hnorm_w, m.hnorm_b)}, -1);
    // eh_proj column-parallel, its output gathered over tp (and split along the sequence again under SP).
    h = gather_from_tp(column_parallel(both, {m.eh_proj_w}, {}, FlopPart::mtp_proj)[0], tp, ctx_.clock, -1);
    if (sequence_parallel()) h = split_to_sp(h, tp, ctx_.clock, 1);
    h = run_layer(m.block, h);
    at::Tensor per_token = token_losses(norm(h, m.final_norm_w, m.final_norm_b), cp_chunks(next, 1, cp, cp_rank), false);
    at::Tensor mask = cp_chunks(valid, 1, cp, cp_rank).reshape({-1}).to(per_token.device(), per_token.scalar_type());
    // The mean over the global batch's positions with a target: loss_scale is 1 / (its tokens).
    at::Tensor loss = (per_token * mask).sum() * (loss_scale * double(s) / double(s - k));
    total = total.defined() ? total + loss : loss;
  }
  return total * (model_.mtp_loss_scale / double(mtp_.size()));
}

at::Tensor GptStage::run_layer(const Block& blk, const at::Tensor& x) const {
  if (ctx_.recompute == costmodel::Recompute::full)
    return recompute([this, &blk](const std::vector<at::Tensor>& in) { return layer(blk, in[0]); }, {x}, &ctx_.clock);
  return layer(blk, x);
}

at::Tensor GptStage::layer(const Block& blk, const at::Tensor& x_in) const {
  // GPT-NeoX's parallel residual (GPTNeoXLayer with use_parallel_residual): both from the same x.
  if (model_.parallel_residual)
    return x_in + attention(blk, norm(x_in, blk.norm1_w, blk.norm1_b)) + mlp(blk, norm(x_in, blk.norm2_w, blk.norm2_b));
  at::Tensor x = x_in + attention(blk, norm(x_in, blk.norm1_w, blk.norm1_b));
  return x + mlp(blk, norm(x, blk.norm2_w, blk.norm2_b));
}

at::Tensor GptStage::forward(int chunk, const at::Tensor& input, const at::Tensor& targets, double loss_scale) {
  // Each segment runs between its units' hooks (ZeRO-3's gather and release).
  auto segment = [this](std::vector<int> units, auto&& run) {
    if (hooks_) hooks_->before_forward(units);
    at::Tensor out = run();
    return hooks_ ? hooks_->after_forward(units, out) : out;
  };
  aux_scale_ = loss_scale * seq_len_;
  // Units are numbered in this rank's forward order: the embedding, the layers chunk by chunk, the head.
  int unit = (stage_.embedding ? 1 : 0) + chunk_first_block_.at(chunk);
  at::Tensor x = input;
  // Context parallel: this cp rank's two chunks of every sequence's tokens and targets.
  const int cp = ctx_.cp.size(), cp_rank = ctx_.cp.rank();
  if (has_embedding(chunk)) x = cp_chunks(input, 1, cp, cp_rank);
  const at::Tensor local_targets = has_head(chunk) ? cp_chunks(targets, 1, cp, cp_rank) : targets;
  if (has_embedding(chunk)) x = segment({0}, [&] { return embed(x); });
  for (int i = chunk_first_block_[chunk]; i < chunk_first_block_[chunk + 1]; ++i) {
    const Block& blk = blocks_[i];
    x = segment({unit++}, [&] { return run_layer(blk, x); });
  }
  if (!has_head(chunk)) return x;
  std::vector<int> head{head_unit_};
  // The head is the embedding's matrix, or the MTP modules embed with it.
  if (last_stage_uses_embedding(model_) && stage_.embedding) head.push_back(0);
  return segment(head, [&] {
    at::Tensor loss = head_loss(x, local_targets, loss_scale);
    // The MTP losses enter the gradient, not the loss reported (Megatron reports lm loss and
    // mtp loss apart): MTPLossAutoScaler's way, as the MoE balance loss's.
    if (!mtp_.empty()) loss = attach_loss(loss, mtp_loss(x, targets, loss_scale));
    return loss;
  });
}

}  // namespace dplan::executor
