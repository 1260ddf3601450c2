#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/model.h"
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

TEST_CASE("unsupported or inconsistent configs are rejected with the choices", "[model]") {
  auto msg = [](const json& c) {
    try {
      model_from_hf_config(c, "c.json", "x");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  json llama = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 128},
                {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100},
                {"max_position_embeddings", 128}};
  CHECK_NOTHROW(model_from_hf_config(llama, "c.json", "x"));
  json t5 = llama;
  t5["model_type"] = "t5";
  CHECK_THAT(msg(t5), Contains("unsupported model type \"t5\"; supported: llama, mistral, mixtral, qwen2, gpt_neox or gpt2"));
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
  for (const char* name : {"llama-3-70b", "mixtral-8x7b", "gpt-tiny", "gpt3-175b"}) {
    ModelSpec m = store().load_model(name);
    CHECK(model_from_json(to_json(m), "plan.json", "/model") == m);
  }
}
