// dplan's memory per rank against Megatron-LM's own measurements: the CI golden values
// (tests/data/memory/megatron-ci-golden.json, NVIDIA/Megatron-LM@d98e8a64dd; README.md there),
// torch.cuda.max_memory_allocated() of the last global rank (the last pipeline stage) on one node
// of 8 H100 or A100, for each test case's own model and layout. Each row is the case's arguments
// turned into dplan's model, training and layout (megatron_case below: Megatron's own defaults where
// the case gives none), and dplan's allocator bytes of the last stage (its total less the profile's
// framework reserve, which the allocator does not see) against the measured peak.
//
// The cases dplan cannot express (Mamba layers, the Muon optimizer, Megatron-FSDP, activation
// offloading, CUDA graphs, explicit pipeline layouts) are listed with their reason, not compared.
// The bounds are today's error plus a margin, as components_test.cpp's are: rows that miss badly
// carry a looser bound of their own ("miss", with the reason), so a change that makes them worse
// fails; issue-level target: every row within 10 %.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/json_io.h"
#include "dplan/costmodel/memory.h"
#include "compared_table.h"
#include "test_profiles.h"

using namespace dplan;
using namespace dplan::costmodel;
using dplan::testing::Compared;
using dplan::testing::report;
using dplan::testing::store;

namespace {

struct MegatronCase {
  ModelSpec model;
  TrainingSpec training;
  ParallelConfig parallel;
  std::string cluster;
};

// Why dplan cannot express the case, or nullopt.
std::optional<std::string> not_expressible(const json& a) {
  if (a.contains("hybrid-layer-pattern")) return "Mamba layers";
  if (a.contains("optimizer") && a.at("optimizer") != "adam") return "the " + a.at("optimizer").get<std::string>() + " optimizer";
  if (a.contains("use-megatron-fsdp")) return "Megatron-FSDP's own buffers";
  if (a.contains("fine-grained-activation-offloading")) return "activation offloading";
  if (a.contains("cuda-graph-impl")) return "CUDA graphs";
  if (a.contains("pipeline-model-parallel-layout")) return "an explicit pipeline layout";
  if (a.contains("num-distributed-optimizer-instances") && a.at("num-distributed-optimizer-instances") != 1)
    return "several distributed-optimizer instances";
  return std::nullopt;
}

int int_arg(const json& a, const char* key, int fallback) { return a.contains(key) ? a.at(key).get<int>() : fallback; }
bool flag(const json& a, const char* key) { return a.contains(key) && a.at(key) != false; }

// The first k dense layers of "([0]*k+[1]*n)" (Megatron's --moe-layer-freq pattern), or 0.
int leading_dense_layers(const json& a) {
  if (!a.contains("moe-layer-freq") || !a.at("moe-layer-freq").is_string()) return 0;
  const std::string s = a.at("moe-layer-freq");
  const size_t star = s.find("[0]*");
  return star == std::string::npos ? 0 : std::stoi(s.substr(star + 4));
}

// Megatron-LM's arguments (megatron/training/arguments.py at the pinned commit) as dplan's inputs,
// with Megatron's defaults where the case gives none: learned absolute positions, LayerNorm, biases
// on every linear layer, tied embeddings, GELU MLP of 4h (SwiGLU: 8h/3 rounded down to 64), dropout
// 0.1, vocabulary padded to a multiple of 128 x tp, etp = tp, attention through Transformer Engine's
// fused kernels unless --attention-backend unfused or the local implementation.
MegatronCase megatron_case(const json& row) {
  const json& a = row.at("args");
  MegatronCase c;
  ModelSpec& m = c.model;
  m.name = row.at("case");
  m.family = "gpt";
  m.num_layers = int_arg(a, "num-layers", 0);
  m.hidden_size = int_arg(a, "hidden-size", 0);
  m.num_heads = int_arg(a, "num-attention-heads", 0);
  m.num_kv_heads = flag(a, "group-query-attention") ? int_arg(a, "num-query-groups", m.num_heads) : m.num_heads;
  m.head_dim = int_arg(a, "kv-channels", m.hidden_size / m.num_heads);
  const bool swiglu = flag(a, "swiglu");
  m.mlp = swiglu ? MlpKind::gated : MlpKind::plain;
  m.activation = swiglu ? "silu" : "gelu";
  m.ffn_hidden_size = int_arg(a, "ffn-hidden-size", swiglu ? (4 * m.hidden_size * 2 / 3) / 64 * 64 : 4 * m.hidden_size);
  m.vocab_size = row.at("vocab_size");
  m.max_seq_len = int_arg(a, "max-position-embeddings", int_arg(a, "seq-length", 0));
  m.norm = a.value("normalization", std::string("LayerNorm")) == "RMSNorm" ? NormKind::rmsnorm : NormKind::layernorm;
  m.position = a.value("position-embedding-type", std::string("learned_absolute")) == "learned_absolute"
                   ? PositionKind::learned
                   : PositionKind::rotary;
  m.tied_embeddings = !flag(a, "untie-embeddings-and-output-weights");
  const bool bias = !flag(a, "disable-bias-linear");
  m.qkv_bias = m.out_bias = m.mlp_bias = bias;
  m.hidden_dropout = a.contains("hidden-dropout") ? a.at("hidden-dropout").get<double>() : 0.1;
  m.attention_dropout = a.contains("attention-dropout") ? a.at("attention-dropout").get<double>() : 0.1;
  if (a.contains("num-experts")) {
    m.num_experts = a.at("num-experts");
    m.experts_per_token = int_arg(a, "moe-router-topk", 2);
    for (int i = 0; i < leading_dense_layers(a); ++i) m.dense_layers.push_back(i);
    m.dense_ffn_hidden_size = m.num_dense_layers() > 0 ? m.ffn_hidden_size : 0;
    m.ffn_hidden_size = int_arg(a, "moe-ffn-hidden-size", m.ffn_hidden_size);
    m.shared_expert_ffn_size = int_arg(a, "moe-shared-expert-intermediate-size", 0);
    m.router_bias = flag(a, "moe-router-enable-expert-bias");
  }
  m.mtp_layers = int_arg(a, "mtp-num-layers", 0);
  if (flag(a, "multi-latent-attention")) {
    m.q_lora_rank = int_arg(a, "q-lora-rank", 0);
    m.kv_lora_rank = int_arg(a, "kv-lora-rank", 0);
    m.qk_rope_head_dim = int_arg(a, "qk-pos-emb-head-dim", 64);
    m.head_dim = int_arg(a, "qk-head-dim", 128) + m.qk_rope_head_dim;
    m.v_head_dim = int_arg(a, "v-head-dim", 128);
    m.num_kv_heads = m.num_heads;
  } else {
    m.qk_norm = flag(a, "qk-layernorm");
  }

  TrainingSpec& t = c.training;
  t.seq_len = int_arg(a, "seq-length", 0);
  t.global_batch = int_arg(a, "global-batch-size", 0);
  t.precision = a.contains("fp8-format") ? Precision::fp8 : flag(a, "fp16") ? Precision::fp16 : Precision::bf16;
  const bool unfused = a.value("attention-backend", std::string("auto")) == "unfused" ||
                       a.value("transformer-impl", std::string("transformer_engine")) == "local";
  t.attention = unfused ? Attention::standard : Attention::flash;
  t.gradient_accumulation_fusion = !flag(a, "no-gradient-accumulation-fusion");
  t.vocab_pad_multiple = int_arg(a, "make-vocab-size-divisible-by", 128);
  t.cross_entropy_fusion = flag(a, "cross-entropy-loss-fusion");
  if (flag(a, "defer-embedding-wgrad-compute")) t.embedding_wgrad_deferral = int_arg(a, "wgrad-deferral-limit", 0);

  ParallelConfig& p = c.parallel;
  p.tp = int_arg(a, "tensor-model-parallel-size", 1);
  p.pp = int_arg(a, "pipeline-model-parallel-size", 1);
  p.cp = int_arg(a, "context-parallel-size", 1);
  p.ep = int_arg(a, "expert-model-parallel-size", 1);
  p.etp = int_arg(a, "expert-tensor-parallel-size", 0);
  p.dp = row.at("gpus").get<int>() / (p.tp * p.pp * p.cp);
  p.micro_batch = int_arg(a, "micro-batch-size", 1);
  p.sequence_parallel = flag(a, "sequence-parallel");
  p.distributed_optimizer = flag(a, "use-distributed-optimizer");
  const std::string granularity = a.value("recompute-granularity", std::string(""));
  p.recompute = granularity == "full" ? Recompute::full : granularity == "selective" ? Recompute::selective : Recompute::none;
  if (a.contains("recompute-modules"))
    t.recompute_modules = recompute_modules_from_names(a.at("recompute-modules").get<std::vector<std::string>>());
  if (a.contains("num-layers-per-virtual-pipeline-stage"))
    p.vpp = m.num_layers / p.pp / a.at("num-layers-per-virtual-pipeline-stage").get<int>();
  p.vpp = int_arg(a, "num-virtual-stages-per-pipeline-rank", p.vpp);
  if (p.vpp > 1) p.schedule = Schedule::interleaved;
  p.first_stage_layers = int_arg(a, "decoder-first-pipeline-num-layers", 0);
  p.last_stage_layers = int_arg(a, "decoder-last-pipeline-num-layers", 0);
  p.account_for_embedding = flag(a, "account-for-embedding-in-pipeline-split");
  p.account_for_loss = flag(a, "account-for-loss-in-pipeline-split");
  p.overlap_ep_comm = flag(a, "overlap-moe-expert-parallel-comm");
  c.cluster = row.at("gpu") == "a100" ? "dgx-a100-80g" : "dgx-h100";
  return c;
}

// A row's bound: 10 %; a row beyond it is a known miss only where a mechanism dplan does not
// count yet explains it, with that mechanism's looser bound (the table marks it "miss").
struct Bound {
  double fraction = 0.10;
  std::string miss;  // empty: not a known miss
};
Bound bound_of(const json& a, const ParallelConfig& p) {
  Bound b;
  auto add = [&](bool applies, double fraction, const char* why) {
    if (!applies) return;
    b.fraction = std::max(b.fraction, fraction);
    b.miss += (b.miss.empty() ? "" : "; ") + std::string(why);
  };
  add(a.contains("num-experts"), 0.28, "the token dispatcher's permutation and all-to-all buffers");
  add(a.contains("fp8-format"), 0.22, "Transformer Engine's FP8 scaling and transpose caches");
  add(p.tp > 1 || p.cp > 1, 0.15, "tensor- and context-parallel communication buffers");
  return b;
}

}  // namespace

TEST_CASE("memory of Megatron-LM's CI cases against their measured peaks (the last rank)", "[memory][golden]") {
  const json file = read_json_file(std::string(DPLAN_VALIDATION_DIR) + "/memory/megatron-ci-golden.json");
  std::vector<Compared> rows;
  std::vector<std::string> skipped, misses;
  for (const json& row : file.at("rows")) {
    const std::string name = row.at("case");
    if (const std::optional<std::string> why = not_expressible(row.at("args"))) {
      skipped.push_back(name + ": " + *why);
      continue;
    }
    const MegatronCase c = megatron_case(row);
    const ClusterSpec cluster = store().load_cluster(c.cluster);
    const LayoutRule rule = check_layout(c.model, c.training, c.parallel, c.parallel.world_size());
    if (rule != LayoutRule::ok) {
      skipped.push_back(name + ": dplan's layout rules refuse it (rule " + std::to_string(int(rule)) + ")");
      continue;
    }
    const MemoryEstimate mem = estimate_memory(c.model, cluster, c.training, c.parallel, 0.0);
    const StageMemory& last = mem.stages.back();
    const double predicted = last.total_bytes() - last.reserve_bytes;
    const double measured = row.at("measured").at("mem_max_allocated_bytes").get<double>();
    Bound bound;
    if (std::abs(predicted / measured - 1) > bound.fraction) bound = bound_of(row.at("args"), c.parallel);
    rows.push_back({name, predicted / kGiB, measured / kGiB, bound.fraction, !bound.miss.empty()});
    if (!bound.miss.empty()) misses.push_back(name + ": " + bound.miss);
  }
  std::printf("\n%zu cases not compared:\n", skipped.size());
  for (const std::string& s : skipped) std::printf("- %s\n", s.c_str());
  std::printf("\nknown misses (their own bound):\n");
  for (const std::string& s : misses) std::printf("- %s\n", s.c_str());
  report("Megatron-LM CI: last rank's peak allocated memory (estimate_memory, last stage less the reserve)", "GiB",
         rows, 0.08);
}
