#include <catch2/catch.hpp>

#include <cmath>

#include "dplan/costmodel/compute.h"
#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/rotary.h"
#include "dplan/planner/profiles.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::store;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

TEST_CASE("parameter counts of the presets are exact", "[model]") {
  // Standard Llama count: q,k,v,o + 3-matrix SwiGLU + 2 RMSNorm per layer + final norm + untied
  // embedding and head (transformers' modeling_llama.py modules; the 8B and 70B values match HF's num_parameters()).
  CHECK(num_params(store().load_model("llama-3-8b")) == 8030261248.0);
  CHECK(num_params(store().load_model("llama-2-70b")) == 68976648192.0);
  CHECK(num_params(store().load_model("llama-3-70b")) == 70553706496.0);
  CHECK(num_params(store().load_model("llama-2-7b")) == 6738415616.0);
  CHECK(num_params(store().load_model("llama-2-13b")) == 13015864320.0);
  CHECK(num_params(store().load_model("llama-3.1-405b")) == 405853388800.0);
  CHECK(num_params(store().load_model("mistral-7b")) == 7241732096.0);
  ModelSpec mixtral = store().load_model("mixtral-8x7b");
  CHECK(num_params(mixtral) == 46702792704.0);
  CHECK(num_active_params(mixtral) == 12879925248.0);
}

TEST_CASE("Megatron GPT presets match Eq. 2 of Narayanan et al. 2021", "[model]") {
  // P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)); our count adds the final LayerNorm (2h).
  for (const char* name : {"gpt-1.7b", "gpt-18.4b", "gpt-145.6b", "gpt-1t"}) {
    ModelSpec m = store().load_model(name);
    double l = m.num_layers, h = m.hidden_size, V = m.vocab_size, s = m.max_seq_len;
    double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    CHECK_THAT(num_params(m), WithinRel(eq2 + 2 * h, 1e-12));
  }
}

TEST_CASE("size shorthands name presets", "[model]") {
  CHECK(store().load_model("70B").name == "llama-3-70b");
  CHECK(store().load_model("8b").name == "llama-3-8b");
  CHECK(store().load_model("405B").name == "llama-3.1-405b");
  CHECK(store().load_model("175B").name == "gpt3-175b");
  CHECK(store().load_model("1T").name == "gpt-1t");
  CHECK(store().load_model("LLAMA-2-7B").name == "llama-2-7b");
}

TEST_CASE("Hugging Face configs of each family map to the right structure", "[model]") {
  SECTION("gpt2: learned positions, LayerNorm, GELU, biases, tied head, n_inner defaults to 4h") {
    json c = {{"model_type", "gpt2"}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"n_inner", nullptr},
              {"vocab_size", 50257}, {"n_positions", 1024}, {"attn_pdrop", 0.1}, {"resid_pdrop", 0.1}};
    ModelSpec m = model_from_hf_config(c, "gpt2.json", "gpt2");
    CHECK(m.ffn_hidden_size == 3072);
    CHECK(m.position == PositionKind::learned);
    CHECK(m.tied_embeddings);
    CHECK(m.attention_dropout == 0.1);
    // GPT-2 small has 124,439,808 parameters (HF GPT2LMHeadModel.num_parameters()).
    CHECK(num_params(m) == 124439808.0);
  }
  SECTION("gpt_neox: biases everywhere, LayerNorm, untied head") {
    // Pythia-160M: 162,322,944 parameters (HF GPTNeoXForCausalLM.num_parameters()).
    json c = {{"model_type", "gpt_neox"}, {"hidden_size", 768}, {"intermediate_size", 3072},
              {"num_hidden_layers", 12}, {"num_attention_heads", 12}, {"vocab_size", 50304},
              {"max_position_embeddings", 2048}, {"hidden_act", "gelu"}, {"rotary_pct", 0.25},
              {"use_parallel_residual", true}, {"tie_word_embeddings", false}};
    ModelSpec m = model_from_hf_config(c, "pythia.json", "pythia-160m");
    CHECK(m.mlp == MlpKind::gelu);
    CHECK(num_params(m) == 162322944.0);
  }
  SECTION("qwen2: q/k/v biases only") {
    json c = {{"model_type", "qwen2"}, {"hidden_size", 896}, {"intermediate_size", 4864},
              {"num_hidden_layers", 24}, {"num_attention_heads", 14}, {"num_key_value_heads", 2},
              {"vocab_size", 151936}, {"max_position_embeddings", 32768}, {"tie_word_embeddings", true}};
    ModelSpec m = model_from_hf_config(c, "qwen.json", "qwen2-0.5b");
    CHECK(m.qkv_bias);
    CHECK_FALSE(m.out_bias);
    // Qwen2-0.5B: 494,032,768 parameters (model card).
    CHECK(num_params(m) == 494032768.0);
  }
}

namespace {
// The InputError a config.json gives, or "(no error)".
std::string config_error(const json& c) {
  try {
    model_from_hf_config(c, "c.json", "x");
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return std::string("(no error)");
}
}  // namespace

TEST_CASE("unsupported or inconsistent configs are rejected with the choices", "[model]") {
  const auto msg = config_error;
  json llama = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 128},
                {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100},
                {"max_position_embeddings", 128}};
  CHECK_NOTHROW(model_from_hf_config(llama, "c.json", "x"));
  json t5 = llama;
  t5["model_type"] = "t5";
  CHECK_THAT(msg(t5), Contains("unsupported model type \"t5\"; supported: llama, mistral, mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, nemotron, gpt_neox or gpt2"));
  json typo = llama;
  typo["num_key_value_head"] = 2;
  CHECK_THAT(msg(typo), Contains("unknown key \"num_key_value_head\""));
  CHECK_THAT(msg(typo), Contains("num_key_value_heads"));
  json missing = llama;
  missing.erase("vocab_size");
  CHECK_THAT(msg(missing), Contains("missing key \"vocab_size\""));
  json gqa = llama;
  gqa["num_key_value_heads"] = 3;
  CHECK_THAT(msg(gqa), Contains("must be a multiple of num_key_value_heads"));
  json negative = llama;
  negative["hidden_size"] = -64;
  CHECK_THAT(msg(negative), Contains("c.json: /hidden_size: expected an integer from 1 to 1048576, got -64"));
}

TEST_CASE("dplan's own model JSON round-trips", "[model]") {
  for (const char* name : {"llama-3-70b", "mixtral-8x7b", "gpt-tiny", "gpt3-175b", "nemotron-4-340b", "qwen3-8b",
                           "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"}) {
    INFO(name);
    ModelSpec m = store().load_model(name);
    CHECK(model_from_json(to_json(m), "plan.json", "/model") == m);
  }
}

TEST_CASE("today's models: parameter counts match their model cards", "[model]") {
  // Counts derived from the public config.json (profiles/models/SOURCES.md), module by module as
  // the transformers modeling files build them.
  SECTION("Nemotron-4 340B: 341 B (model card), untied, squared-ReLU non-gated MLP with GQA") {
    ModelSpec m = store().load_model("nemotron-4-340b");
    CHECK(m.mlp == MlpKind::plain);
    CHECK(m.activation == "relu2");
    CHECK(m.norm == NormKind::layernorm);  // LayerNorm1P: weight and bias
    CHECK(m.kv_dim() == 8 * 192);
    CHECK(num_params(m) == 341029195776.0);
  }
  SECTION("Qwen3-8B: 8.2 B, 6.95 B without embeddings (model card)") {
    ModelSpec m = store().load_model("qwen3-8b");
    CHECK(m.qk_norm);
    CHECK(num_params(m) == 8190735360.0);
    CHECK_THAT(num_params(m) - 2.0 * m.vocab_size * m.hidden_size, WithinRel(6.95e9, 1e-3));
  }
  SECTION("Qwen3-235B-A22B: 235 B total, 22 B active") {
    ModelSpec m = store().load_model("qwen3-235b-a22b");
    CHECK(m.num_moe_layers() == 94);
    CHECK(num_params(m) == 235093634560.0);
    CHECK(num_active_params(m) == 22190763520.0);
  }
  SECTION("DeepSeek-V3: 671 B total, 37 B active (MTP module not counted)") {
    ModelSpec m = store().load_model("deepseek-v3");
    CHECK(m.is_mla());
    CHECK(m.head_dim == 192);
    CHECK(m.dense_layers == std::vector<int>{0, 1, 2});
    CHECK(m.shared_expert_ffn_size == 2048);
    CHECK(num_params(m) == 671026419200.0);
    CHECK(num_active_params(m) == 37552297472.0);
    // Its one MTP module (num_nextn_predict_layers): the model card's 685 B on Hugging Face are the
    // 671 B and 14 B of MTP weights, which there include the module's own copies of the embedding and
    // the head (deepseek-ai/DeepSeek-V3 README.md).
    CHECK(m.mtp_layers == 1);
    CHECK_THAT(mtp_params(m) + 2.0 * m.vocab_size * m.hidden_size, WithinRel(14e9, 0.05));
    CHECK(mtp_params(m) == layer_params(m, LayerKind::moe).total() + 3 * 7168.0 + 2 * 7168.0 * 7168);
    ModelSpec no_mtp = m;
    no_mtp.mtp_layers = 0;
    CHECK(mtp_params(no_mtp) == 0);
    CHECK(model_from_json(to_json(m), "plan.json", "/model").mtp_layers == 1);
    CHECK_FALSE(to_json(no_mtp).contains("mtp_layers"));
  }
  SECTION("gpt-oss-120b: 116.83 B total, 5.13 B active without the input embedding (model card)") {
    ModelSpec m = store().load_model("gpt-oss-120b");
    CHECK(m.num_sliding_layers() == 18);
    CHECK(m.sliding_layers.front() == 0);  // layer_types: the even layers
    CHECK(m.sliding_window == 128);
    CHECK(num_params(m) == 116829156672.0);
    CHECK(num_active_params(m) - double(m.vocab_size) * m.hidden_size == 5132849472.0);
  }
}

TEST_CASE("earlier MoE models with shared experts match their model cards", "[model]") {
  SECTION("Qwen1.5-MoE-A2.7B (qwen2_moe): 14.3 B total, 2.7 B activated") {
    // Qwen/Qwen1.5-MoE-A2.7B config.json.
    json c = {{"model_type", "qwen2_moe"}, {"hidden_size", 2048}, {"intermediate_size", 5632},
              {"moe_intermediate_size", 1408}, {"shared_expert_intermediate_size", 5632}, {"num_hidden_layers", 24},
              {"num_attention_heads", 16}, {"num_key_value_heads", 16}, {"vocab_size", 151936},
              {"max_position_embeddings", 8192}, {"num_experts", 60}, {"num_experts_per_tok", 4},
              {"decoder_sparse_step", 1}, {"norm_topk_prob", false}, {"tie_word_embeddings", false},
              {"use_sliding_window", false}, {"max_window_layers", 21}};
    ModelSpec m = model_from_hf_config(c, "qwen-moe.json", "qwen1.5-moe-a2.7b");
    CHECK(num_params(m) == 14315784192.0);
    CHECK(num_active_params(m) == 2689173504.0);
  }
  SECTION("DeepSeek-V2-Lite (deepseek_v2): 15.7 B total, plain q projection, 2 shared experts, 1 dense layer") {
    // deepseek-ai/DeepSeek-V2-Lite config.json; its 2.4 B active leaves out the input embedding.
    json c = {{"model_type", "deepseek_v2"}, {"hidden_size", 2048}, {"intermediate_size", 10944},
              {"moe_intermediate_size", 1408}, {"num_hidden_layers", 27}, {"num_attention_heads", 16},
              {"num_key_value_heads", 16}, {"vocab_size", 102400}, {"max_position_embeddings", 163840},
              {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
              {"v_head_dim", 128}, {"n_routed_experts", 64}, {"n_shared_experts", 2}, {"num_experts_per_tok", 6},
              {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"topk_method", "greedy"},
              {"tie_word_embeddings", false}};
    ModelSpec m = model_from_hf_config(c, "dsv2.json", "deepseek-v2-lite");
    CHECK(num_params(m) == 15706484224.0);
    CHECK_THAT(num_active_params(m) - double(m.vocab_size) * m.hidden_size, WithinRel(2.4e9, 0.03));
  }
}

TEST_CASE("mixed dense and MoE models: the mean layer times the layers is the layers' sum", "[model]") {
  for (const char* name : {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "llama-3-8b"}) {
    INFO(name);
    ModelSpec m = store().load_model(name);
    double outside = double(m.vocab_size) * m.hidden_size * (m.tied_embeddings ? 1 : 2) + m.hidden_size;
    CHECK_THAT(m.num_layers * layer_params(m).total(), WithinRel(num_params(m) - outside, 1e-12));
  }
  ModelSpec ds = store().load_model("deepseek-v3");
  CHECK(layer_params(ds, LayerKind::dense).experts == 0);
  CHECK(layer_params(ds, LayerKind::moe).mlp == 2048.0 * 7168 * 3 + 256 * 7168 + 256);  // shared expert, router + bias
}

TEST_CASE("forward FLOPs per token are twice the active matrix parameters", "[model]") {
  // Outside attention's score and value products, each weight of a token's path does one multiply
  // and one add: layer FLOPs / token = 2 x active layer weights (biases, norms and sinks aside).
  for (const char* name : {"nemotron-4-340b", "qwen3-8b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"}) {
    INFO(name);
    ModelSpec m = store().load_model(name);
    LayerFlops f = layer_forward_flops(m, 1.0, 4096);
    double weights = num_active_params(m) - 2.0 * m.vocab_size * m.hidden_size;
    CHECK_THAT(m.num_layers * (f.total() - f.attention), WithinRel(2 * weights, 2e-3));
  }
}

TEST_CASE("sliding-window layers price attention over their window", "[model]") {
  ModelSpec m = store().load_model("gpt-oss-120b");
  ModelSpec full = m;
  full.sliding_layers.clear();
  full.sliding_window = 0;
  const double s = 8192, w = 128;
  double ratio = layer_forward_flops(m, s, s).attention / layer_forward_flops(full, s, s).attention;
  // Half the layers full, half windowed: sum_i min(i, w) ~= s w - w^2/2 of the causal s^2/2.
  CHECK_THAT(ratio, WithinRel(0.5 + 0.5 * (2 * w - w * w / s) / s, 1e-12));
  // A window at least the sequence is full attention.
  CHECK(layer_forward_flops(m, 128, 128).attention == layer_forward_flops(full, 128, 128).attention);
}

TEST_CASE("config.json of the new families", "[model]") {
  const auto msg = config_error;
  SECTION("gpt_neox with relu2 stays a plain MLP with biases") {
    json c = {{"model_type", "gpt_neox"}, {"hidden_size", 64}, {"intermediate_size", 256},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100},
              {"max_position_embeddings", 128}, {"hidden_act", "relu2"}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    CHECK(m.mlp == MlpKind::plain);
    CHECK(m.activation == "relu2");
    CHECK(layer_params(m).mlp == 2.0 * 64 * 256 + 256 + 64);
  }
  SECTION("nemotron biases follow attention_bias and mlp_bias") {
    json c = {{"model_type", "nemotron"}, {"hidden_size", 64}, {"intermediate_size", 256},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"vocab_size", 100}, {"max_position_embeddings", 128}, {"mlp_bias", true}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    CHECK(layer_params(m).mlp == 2.0 * 64 * 256 + 256 + 64);
    CHECK(layer_params(m).attention == 64.0 * (64 + 2 * 32) + 64 * 64);
    c["hidden_act"] = "relu3";
    CHECK_THAT(msg(c), Contains("relu3"));
  }
  SECTION("qwen3_moe dense layers from mlp_only_layers and decoder_sparse_step") {
    json c = {{"model_type", "qwen3_moe"}, {"hidden_size", 64}, {"intermediate_size", 256},
              {"moe_intermediate_size", 32}, {"num_hidden_layers", 6}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"head_dim", 16}, {"vocab_size", 100}, {"max_position_embeddings", 128},
              {"num_experts", 8}, {"num_experts_per_tok", 2}, {"decoder_sparse_step", 2},
              {"mlp_only_layers", {1}}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    CHECK(m.dense_layers == std::vector<int>{0, 1, 2, 4});  // layers 0, 2, 4 by the step; 1 listed (3 and 5 have experts)
    CHECK(m.dense_ffn_hidden_size == 256);
    c["mlp_only_layers"] = {7};
    CHECK_THAT(msg(c), Contains("/mlp_only_layers: expected a list of layer indices from 0 to 5"));
  }
  SECTION("qwen2_moe's gated shared expert") {
    json c = {{"model_type", "qwen2_moe"}, {"hidden_size", 64}, {"intermediate_size", 256},
              {"moe_intermediate_size", 32}, {"shared_expert_intermediate_size", 128}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"vocab_size", 100}, {"max_position_embeddings", 128},
              {"num_experts", 8}, {"num_experts_per_tok", 2}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    CHECK(layer_params(m).mlp == 64.0 * 8 + 3.0 * 64 * 128 + 64);
    CHECK(layer_params(m).experts == 8 * 3.0 * 64 * 32);
  }
  SECTION("deepseek_v3 needs the MLA dimensions; q_lora_rank null is a plain q projection") {
    json c = {{"model_type", "deepseek_v3"}, {"hidden_size", 64}, {"intermediate_size", 256},
         {"moe_intermediate_size", 32}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
         {"vocab_size", 100}, {"max_position_embeddings", 128}, {"n_routed_experts", 8},
         {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"q_lora_rank", nullptr},
         {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8},
         {"n_group", 4}, {"topk_group", 2}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    // q_proj 64 x 4*12, kv_a 64 x (16+4) + norm 16, kv_b 16 x 4*(8+8), o 4*8 x 64.
    CHECK(layer_params(m).attention == 64.0 * 48 + 64 * 20 + 16 + 16 * 64 + 32 * 64);
    CHECK(m.dense_layers == std::vector<int>{0});
    // transformers' DeepseekV3 routing: sigmoid scores with the correction bias, 4 groups of which
    // 2 are chosen, renormalised, scaled by 2.5; interleaved rotary rows.
    CHECK(m.moe_router_score == ModelSpec::RouterScore::sigmoid);
    CHECK(m.router_bias);
    CHECK(m.moe_groups == 4);
    CHECK(m.moe_group_topk == 2);
    CHECK(m.moe_norm_topk_prob);
    CHECK(m.moe_routed_scaling == 2.5);
    CHECK(m.rope_interleave);
    CHECK(model_from_json(to_json(m), "plan.json", "/model") == m);
    // Its defaults, 8 groups, leave one of 8 experts in each: no two best to sum.
    json defaults = c;
    defaults.erase("n_group");
    defaults.erase("topk_group");
    CHECK_THAT(msg(defaults), Contains("n_group 8 leaves fewer than two in each"));
    json few = c;
    few["topk_group"] = 1;
    few["num_experts_per_tok"] = 3;
    CHECK_THAT(msg(few), Contains("hold fewer than num_experts_per_tok (3)"));
    // DeepSeek-V2: softmax, greedy unless group_limited_greedy, never renormalised.
    json v2 = c;
    v2["model_type"] = "deepseek_v2";
    v2["norm_topk_prob"] = true;
    ModelSpec m2 = model_from_hf_config(v2, "c.json", "x");
    CHECK(m2.moe_router_score == ModelSpec::RouterScore::softmax);
    CHECK(m2.moe_groups == 0);
    CHECK_FALSE(m2.moe_norm_topk_prob);
    CHECK(m2.moe_routed_scaling == 1.0);
    v2["topk_method"] = "group_limited_greedy";
    CHECK(model_from_hf_config(v2, "c.json", "x").moe_groups == 4);
    v2["topk_method"] = "noaux";
    CHECK_THAT(msg(v2), Contains("valid: greedy, group_limited_greedy"));
    c.erase("kv_lora_rank");
    CHECK_THAT(msg(c), Contains("missing key \"kv_lora_rank\""));
  }
  SECTION("gpt_oss layer types") {
    json c = {{"model_type", "gpt_oss"}, {"hidden_size", 64}, {"intermediate_size", 64},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"vocab_size", 100}, {"max_position_embeddings", 128}, {"num_local_experts", 4},
              {"experts_per_token", 2}, {"sliding_window", 32},
              {"layer_types", {"sliding_attention", "full_attention"}}};
    ModelSpec m = model_from_hf_config(c, "c.json", "x");
    CHECK(m.sliding_layers == std::vector<int>{0});
    CHECK(m.attention_window(0) == 32);
    CHECK(m.attention_window(1) == 0);
    CHECK(m.experts_per_token == 2);
    c["layer_types"] = {"sliding_attention", "chunked_attention"};
    CHECK_THAT(msg(c), Contains("unknown layer type \"chunked_attention\"; valid: sliding_attention or full_attention"));
  }
}

TEST_CASE("plan files written before the MLP kind split still read", "[model]") {
  json j = to_json(store().load_model("llama-3-8b"));
  for (const char* key : {"activation", "dense_layers", "dense_ffn_hidden_size", "shared_expert_ffn_size",
                          "shared_expert_gate", "router_bias", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                          "v_head_dim", "qk_norm", "attention_sinks", "sliding_window", "sliding_layers"})
    j.erase(key);
  j["mlp"] = "swiglu";
  ModelSpec m = model_from_json(j, "plan.json", "/model");
  CHECK(m == store().load_model("llama-3-8b"));
  j["mlp"] = "gelu";
  CHECK(model_from_json(j, "plan.json", "/model").mlp == MlpKind::plain);
}

TEST_CASE("the layer's GEMM time follows the architecture", "[model]") {
  const GpuSpec gpu = store().load_gpu("h100-sxm5-80gb");
  SECTION("shared experts run beside the routed ones") {
    ModelSpec m = store().load_model("deepseek-v3");
    ModelSpec none = m;
    none.shared_expert_ffn_size = 0;
    TrainingSpec t{.seq_len = 4096, .global_batch = 64};
    ParallelConfig p{.tp = 8, .pp = 1, .dp = 8, .ep = 8};
    CHECK(layer_times(m, gpu, t, p).gemm_forward_s > layer_times(none, gpu, t, p).gemm_forward_s);
  }
  SECTION("windowed layers attend to fewer keys") {
    ModelSpec m = store().load_model("gpt-oss-120b");
    ModelSpec full = m;
    full.sliding_layers.clear();
    full.sliding_window = 0;
    TrainingSpec t{.seq_len = 32768, .global_batch = 64};
    ParallelConfig p{.tp = 1, .pp = 1, .dp = 64, .ep = 8};
    CHECK(layer_times(m, gpu, t, p).attention_core_s < 0.6 * layer_times(full, gpu, t, p).attention_core_s);
  }
  SECTION("a plain MLP does two thirds of a gated one's work") {
    ModelSpec m = store().load_model("nemotron-4-340b");
    ModelSpec gated = m;
    gated.mlp = MlpKind::gated;
    TrainingSpec t{.seq_len = 4096, .global_batch = 64};
    ParallelConfig p{.tp = 8, .pp = 1, .dp = 8};
    LayerFlops plain_f = layer_forward_flops(m, 4096, 4096), gated_f = layer_forward_flops(gated, 4096, 4096);
    CHECK_THAT(plain_f.mlp / gated_f.mlp, WithinRel(2.0 / 3.0, 1e-12));
    CHECK(layer_times(m, gpu, t, p).gemm_forward_s < layer_times(gated, gpu, t, p).gemm_forward_s);
  }
  SECTION("dense layers of an MoE model are priced at their share") {
    ModelSpec m = store().load_model("deepseek-v3");
    ModelSpec all_moe = m;
    all_moe.dense_layers.clear();
    all_moe.dense_ffn_hidden_size = 0;
    const double moe = layer_forward_flops(all_moe, 4096, 4096).mlp;
    ModelSpec dense_mlp = m;  // the dense layer's MLP, as a dense model
    dense_mlp.num_experts = dense_mlp.experts_per_token = 0;
    dense_mlp.dense_layers.clear();
    dense_mlp.shared_expert_ffn_size = 0;
    dense_mlp.router_bias = false;
    dense_mlp.ffn_hidden_size = m.dense_ffn_hidden_size;
    dense_mlp.dense_ffn_hidden_size = 0;
    const double dense = layer_forward_flops(dense_mlp, 4096, 4096).mlp;
    CHECK_THAT(layer_forward_flops(m, 4096, 4096).mlp, WithinRel((58 * moe + 3 * dense) / 61, 1e-12));
  }
}

TEST_CASE("each model check names the inconsistency it finds, in validate's order", "[model]") {
  // One change per case to a model that passes: mixtral-8x7b (8 experts, 2 a token, 32 layers),
  // deepseek-v3 (latent attention, 3 dense layers, a shared expert), gpt-oss-120b (sliding windows).
  struct Case {
    const char* model;
    void (*change)(ModelSpec&);
    const char* message;
  };
  const Case cases[] = {
      {"mixtral-8x7b", [](ModelSpec& m) { m.head_dim = 0; }, "m.json: layers, hidden size, heads, kv heads"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.head_dim = 1 << 20; }, "num_attention_heads x head_dim (33554432)"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.num_kv_heads = 3; }, "must be a multiple of num_key_value_heads (3)"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.experts_per_token = 9; }, "num_experts_per_tok (9) must be between 1"},
      // Routing is checked before the activation.
      {"mixtral-8x7b",
       [](ModelSpec& m) {
         m.experts_per_token = 0;
         m.activation = "swiglu";
       },
       "num_experts_per_tok (0)"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.activation = "swiglu"; }, "unknown activation \"swiglu\"; valid: gelu"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.dense_layers = {32}; }, "dense layers must be distinct layer indices from 0 to 31"},
      {"llama-3-8b", [](ModelSpec& m) { m.dense_layers = {0}; }, "dense layers are counted only in MoE models"},
      {"mixtral-8x7b",
       [](ModelSpec& m) {
         for (int i = 0; i < 32; ++i) m.dense_layers.push_back(i);
         m.dense_ffn_hidden_size = 100;
       },
       "every layer is dense"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.dense_layers = {0}; }, "a dense-layer MLP size (0) is needed exactly"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.shared_expert_ffn_size = -1; }, "shared-expert MLP sizes must be from 0"},
      {"llama-3-8b", [](ModelSpec& m) { m.router_bias = true; }, "shared experts and router biases need experts"},
      {"mixtral-8x7b", [](ModelSpec& m) { m.shared_expert_gate = true; }, "a shared-expert gate needs a shared expert"},
      {"deepseek-v3", [](ModelSpec& m) { m.kv_lora_rank = -1; }, "q_lora_rank, kv_lora_rank, qk_rope_head_dim and"},
      {"deepseek-v3", [](ModelSpec& m) { m.qk_rope_head_dim = m.head_dim; }, "must be from 1 to below the query/key"},
      {"deepseek-v3", [](ModelSpec& m) { m.v_head_dim = 0; }, "multi-head latent attention needs v_head_dim"},
      {"deepseek-v3", [](ModelSpec& m) { m.num_kv_heads = 1; }, "as many key/value heads as heads"},
      {"llama-3-8b", [](ModelSpec& m) { m.v_head_dim = 64; }, "belong to multi-head latent attention"},
      {"deepseek-v3", [](ModelSpec& m) { m.v_head_dim = 1 << 20; }, "num_attention_heads x v_head_dim must be at most"},
      {"gpt-oss-120b", [](ModelSpec& m) { m.sliding_window = -1; }, "the sliding window must be from 0 to"},
      {"gpt-oss-120b", [](ModelSpec& m) { m.sliding_layers.push_back(100); }, "sliding-window layers must be distinct"},
      {"gpt-oss-120b", [](ModelSpec& m) { m.sliding_window = 0; }, "sliding-window layers need a window"},
      {"gpt-oss-120b", [](ModelSpec& m) { m.rotary_dim = 3; }, "the rotary dims (3) must be even"},
  };
  for (const Case& c : cases) {
    ModelSpec m = store().load_model(c.model);
    REQUIRE_NOTHROW(validate(m, "m.json"));
    c.change(m);
    INFO(c.model << ": " << c.message);
    CHECK_THROWS_WITH(validate(m, "m.json"), Contains(c.message));
  }
}

namespace {
// A small config.json of `family` (hidden 64, 4 heads of 16, `layers` layers) with `extra` keys, read.
ModelSpec small_config(const std::string& family, const json& extra, int layers = 2) {
  json c = {{"model_type", family}, {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", layers},
            {"num_attention_heads", 4}, {"vocab_size", 100}, {"max_position_embeddings", 128}};
  c.update(extra);
  return model_from_hf_config(c, "c.json", "x");
}
}  // namespace

TEST_CASE("the norm epsilon and the rotary base and scaling come from the config, else the family's default", "[model]") {
  auto read = [](const std::string& family, const json& extra) { return small_config(family, extra); };
  // transformers 5.23's configuration classes: rms_norm_eps 1e-6 (Llama, Qwen), 1e-5 (Mixtral);
  // rope_theta 10000, Mixtral's 1e6.
  CHECK(read("llama", json::object()).norm_eps == 1e-6);
  CHECK(read("llama", json::object()).rope_theta == 10000.0);
  CHECK(read("mixtral", {{"num_local_experts", 4}, {"num_experts_per_tok", 2}}).norm_eps == 1e-5);
  CHECK(read("mixtral", {{"num_local_experts", 4}, {"num_experts_per_tok", 2}}).rope_theta == 1e6);
  CHECK(read("qwen3", {{"rms_norm_eps", 1e-5}, {"rope_theta", 1e6}}).norm_eps == 1e-5);
  CHECK(read("qwen3", {{"rope_theta", 1e6}}).rope_theta == 1e6);
  // transformers 5 writes the base inside rope_parameters; 4 wrote rope_scaling beside rope_theta.
  ModelSpec v5 = read("llama", {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}});
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling.empty());
  ModelSpec llama31 = read("llama", {{"rope_theta", 500000.0},
                                     {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}});
  CHECK(llama31.rope_theta == 500000.0);
  CHECK(llama31.rope_scaling == "llama3");
  CHECK(read("llama", {{"rope_scaling", nullptr}}).rope_scaling.empty());
  // Other families' keys: GPT-2's layer_norm_epsilon, GPT-NeoX's rotary_emb_base, Nemotron's norm_eps.
  json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}, {"vocab_size", 100},
               {"n_positions", 64}, {"layer_norm_epsilon", 1e-6}};
  CHECK(model_from_hf_config(gpt2, "c.json", "x").norm_eps == 1e-6);
  CHECK(read("gpt_neox", {{"rotary_emb_base", 20000.0}, {"layer_norm_eps", 1e-6}}).rope_theta == 20000.0);
  CHECK(read("gpt_neox", {{"rotary_emb_base", 20000.0}, {"layer_norm_eps", 1e-6}}).norm_eps == 1e-6);
  CHECK(read("nemotron", {{"norm_eps", 1e-6}}).norm_eps == 1e-6);
  // gpt-oss defaults to YaRN scaling, with GptOssConfig's parameters.
  const ModelSpec oss = read("gpt_oss", {{"num_local_experts", 4}, {"num_experts_per_tok", 2}});
  CHECK(oss.rope_scaling == "yarn");
  CHECK(oss.rope_scaling_params.at("factor") == 32.0);
  CHECK(oss.swiglu_limit == 7.0);
  CHECK(oss.swiglu_alpha == 1.702);
  CHECK(model_from_json(to_json(oss), "plan.json", "/model") == oss);
  CHECK(llama31.rope_scaling_params == json{{"factor", 8.0}});
  // Bad values are one line naming the key.
  CHECK_THROWS_WITH(read("llama", {{"rms_norm_eps", 0}}), Contains("c.json: /rms_norm_eps"));
  CHECK_THROWS_WITH(read("llama", {{"rope_parameters", {{"rope_theta", "big"}}}}), Contains("/rope_parameters/rope_theta"));
  CHECK_THROWS_WITH(read("llama", {{"rope_scaling", 8}}), Contains("/rope_scaling: expected an object"));

  // Carried in plan files: written where they differ from what older plans ran with, read back.
  CHECK(model_from_json(to_json(llama31), "plan.json", "/model") == llama31);
  CHECK(to_json(llama31).at("norm_eps") == 1e-6);
  ModelSpec old_defaults = read("llama", {{"rms_norm_eps", 1e-5}});
  CHECK(!to_json(old_defaults).contains("norm_eps"));
  CHECK(!to_json(old_defaults).contains("rope_theta"));
  CHECK(!to_json(old_defaults).contains("rope_scaling"));
  CHECK(model_from_json(to_json(old_defaults), "plan.json", "/model") == old_defaults);
}

TEST_CASE("sliding windows land on the layers each family's transformers code windows", "[model]") {
  auto read = [](const std::string& family, const json& extra) { return small_config(family, extra, 4); };
  const json moe = {{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}};
  // Mistral: 4096 on every layer unless null; Mixtral: none unless given.
  CHECK(read("mistral", json::object()).sliding_layers == std::vector<int>{0, 1, 2, 3});
  CHECK(read("mistral", json::object()).sliding_window == 4096);
  CHECK(read("mistral", {{"sliding_window", nullptr}}).sliding_layers.empty());
  CHECK(read("mistral", {{"sliding_window", nullptr}}).sliding_window == 0);
  CHECK(read("mixtral", {{"num_local_experts", 4}, {"num_experts_per_tok", 2}}).sliding_window == 0);
  // Qwen2 and Qwen3: only with use_sliding_window, from max_window_layers on, or where layer_types says.
  CHECK(read("qwen2", {{"sliding_window", 8}}).sliding_layers.empty());
  CHECK(read("qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 1}}).sliding_layers ==
        std::vector<int>{1, 2, 3});
  CHECK(read("qwen3", {{"use_sliding_window", true}, {"sliding_window", 8},
                       {"layer_types", {"full_attention", "sliding_attention", "full_attention", "full_attention"}}})
            .sliding_layers == std::vector<int>{1});
  // Qwen2-MoE: the even layers below max_window_layers; Qwen3-MoE: every layer.
  json q2 = moe;
  q2.update({{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 3}});
  CHECK(read("qwen2_moe", q2).sliding_layers == std::vector<int>{0, 2});
  CHECK(read("qwen3_moe", q2).sliding_layers == std::vector<int>{0, 1, 2, 3});
  // A window as long as the sequence binds nothing (mistral-7b at 4096 tokens).
  const ModelSpec mistral = read("mistral", json::object());
  CHECK_FALSE(mistral.window_binds(4096));
  CHECK(mistral.window_binds(8192));
  // Carried in plans; a plan written before sliding_layers counted gpt-oss's even layers.
  CHECK(model_from_json(to_json(mistral), "plan.json", "/model") == mistral);
  json old = to_json(store().load_model("gpt-oss-120b"));
  old.erase("sliding_layers");
  old["num_sliding_layers"] = 18;
  CHECK(model_from_json(old, "plan.json", "/model") == store().load_model("gpt-oss-120b"));
  old["num_sliding_layers"] = 5;
  CHECK_THROWS_WITH(model_from_json(old, "plan.json", "/model"),
                    Contains("5 windowed layers, but not which; plan again from the model's config.json"));
  json bad = to_json(mistral);
  bad["sliding_layers"] = {2, 1};
  CHECK_THROWS_WITH(model_from_json(bad, "plan.json", "/model"), Contains("ascending"));
}

TEST_CASE("scaled rotary frequencies are transformers' own", "[model]") {
  // ROPE_INIT_FUNCTIONS of transformers 5.23 (modeling_rope_utils.py, fp32) for head_dim 16, base 5e4:
  // llama3 {factor 8, low 1, high 4, original 16}; yarn {factor 4, original 16, beta_fast 8, beta_slow 1};
  // linear {factor 2}.
  ModelSpec m = store().load_model("llama-3-8b");
  m.hidden_size = 64;
  m.num_heads = 4;
  m.head_dim = 16;
  m.max_seq_len = 64;
  m.rope_theta = 50000.0;
  auto check = [&](const std::string& type, const json& params, const std::vector<double>& want, double scale) {
    m.rope_scaling = type;
    m.rope_scaling_params = params;
    const RotaryFrequencies f = rotary_frequencies(m);
    INFO(type);
    REQUIRE(f.inv_freq.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK_THAT(f.inv_freq[i], WithinRel(want[i], 1e-6));
    CHECK_THAT(f.attention_scale, WithinRel(scale, 1e-12));
  };
  check("llama3", {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                   {"original_max_position_embeddings", 16}},
        {0.5760563611984253, 0.03232501819729805, 0.008359254337847233, 0.0021617042366415262, 0.0005590170039795339,
         0.00014456186909228563, 3.738372106454335e-05, 9.667434824223164e-06}, 1.0);
  check("yarn", {{"factor", 4.0}, {"original_max_position_embeddings", 16}, {"beta_fast", 8.0}, {"beta_slow", 1.0}},
        {1.0, 0.0646500363945961, 0.016718508675694466, 0.0043234084732830524, 0.0011180340079590678,
         0.00028912373818457127, 7.47674421290867e-05, 1.933486964844633e-05}, 1.138629436111989);
  check("linear", {{"factor", 2.0}},
        {0.5, 0.1293000727891922, 0.03343701735138893, 0.008646816946566105, 0.0022360680159181356,
         0.0005782474763691425, 0.0001495348842581734, 3.866973929689266e-05}, 1.0);
  // A scaling it does not compute, or one missing a parameter: one line naming it.
  m.rope_scaling = "longrope";
  CHECK_THROWS_WITH(rotary_frequencies(m), Contains("the longrope rotary scaling is not computed; computed: linear, llama3, yarn"));
  m.rope_scaling = "llama3";
  m.rope_scaling_params = {{"factor", 8.0}};
  CHECK_THROWS_WITH(rotary_frequencies(m), Contains("the llama3 rotary scaling needs \"low_freq_factor\""));
  // Partial rotary: frequencies over the rotated dims only (Nemotron's, GPT-NeoX's).
  m.rope_scaling.clear();
  m.rotary_dim = 4;
  const std::vector<double> partial = rotary_frequencies(m).inv_freq;
  REQUIRE(partial.size() == 2);
  CHECK(partial[0] == 1.0);
  CHECK_THAT(partial[1], WithinRel(1.0 / std::sqrt(50000.0), 1e-12));
}

TEST_CASE("partial rotary and GPT-NeoX's parallel residual are read", "[model]") {
  auto read = [](const std::string& family, const json& extra) { return small_config(family, extra); };
  // Nemotron: half of each 16-wide head by default; transformers 5 keeps the factor in rope_parameters.
  CHECK(read("nemotron", json::object()).rotary_dim == 8);
  CHECK(read("nemotron", {{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}}}}).rotary_dim == 4);
  CHECK(read("nemotron", {{"partial_rotary_factor", 1.0}}).rotary_dim == 0);  // all of it
  // GPT-NeoX: rotary_pct 0.25 and the parallel residual by default.
  const ModelSpec neox = read("gpt_neox", json::object());
  CHECK(neox.rotary_dim == 4);
  CHECK(neox.rotary_width() == 4);
  CHECK(neox.parallel_residual);
  CHECK_FALSE(read("gpt_neox", {{"use_parallel_residual", false}}).parallel_residual);
  CHECK(read("llama", json::object()).rotary_width() == 16);
  CHECK(model_from_json(to_json(neox), "plan.json", "/model") == neox);
  CHECK_THROWS_WITH(read("nemotron", {{"partial_rotary_factor", 0.05}}), Contains("leaves 0 rotated dims"));
}

TEST_CASE("the MoE balance loss's coefficient is the config's where it trains with it, else 0", "[model]") {
  const json mixtral = {{"model_type", "mixtral"}, {"hidden_size", 64}, {"intermediate_size", 128},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100},
                        {"max_position_embeddings", 128}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
  auto coef = [&](const json& extra) {
    json c = mixtral;
    c.update(extra);
    return model_from_hf_config(c, "c.json", "x").moe_aux_loss_coef;
  };
  // transformers adds router_aux_loss_coef (default 0.001) x its balance loss only with output_router_logits.
  CHECK(coef(json::object()) == 0.0);
  CHECK(coef({{"router_aux_loss_coef", 0.02}}) == 0.0);
  CHECK(coef({{"router_aux_loss_coef", 0.02}, {"output_router_logits", true}}) == 0.02);
  CHECK(coef({{"output_router_logits", true}}) == 0.001);
  CHECK_THROWS_WITH(coef({{"router_aux_loss_coef", -1}, {"output_router_logits", true}}), Contains("/router_aux_loss_coef"));
  // A dense model's plan has no such key; an MoE model's plan carries it where it is not the 0.01
  // older plans ran with.
  CHECK(!to_json(store().load_model("llama-3-8b")).contains("moe_aux_loss_coef"));
  json c = mixtral;
  c["output_router_logits"] = true;
  const ModelSpec m = model_from_hf_config(c, "c.json", "x");
  CHECK(to_json(m).at("moe_aux_loss_coef") == 0.001);
  CHECK(model_from_json(to_json(m), "plan.json", "/model") == m);
}

TEST_CASE("Qwen-MoE: norm_topk_prob and the expert count under either name", "[model]") {
  json c = {{"model_type", "qwen3_moe"}, {"hidden_size", 64}, {"intermediate_size", 128}, {"moe_intermediate_size", 32},
            {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100},
            {"max_position_embeddings", 128}, {"num_experts", 4}, {"num_experts_per_tok", 2}};
  // Qwen3MoeSparseMoeBlock renormalises the top-k weights only with norm_topk_prob, false by default.
  CHECK(!model_from_hf_config(c, "c.json", "x").moe_norm_topk_prob);
  c["norm_topk_prob"] = true;
  const ModelSpec normalised = model_from_hf_config(c, "c.json", "x");
  CHECK(normalised.moe_norm_topk_prob);
  CHECK(!to_json(normalised).contains("moe_norm_topk_prob"));
  c["norm_topk_prob"] = false;
  const ModelSpec raw = model_from_hf_config(c, "c.json", "x");
  CHECK(to_json(raw).at("moe_norm_topk_prob") == false);
  CHECK(model_from_json(to_json(raw), "plan.json", "/model") == raw);
  // transformers 5 saves num_experts as num_local_experts.
  json v5 = c;
  v5.erase("num_experts");
  v5["num_local_experts"] = 4;
  CHECK(model_from_hf_config(v5, "c.json", "x").num_experts == 4);
  c["num_local_experts"] = 8;
  CHECK_THROWS_WITH(model_from_hf_config(c, "c.json", "x"), Contains("/num_local_experts: differs from num_experts (4)"));
}
