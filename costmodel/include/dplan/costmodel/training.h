// How the model is trained (TrainingSpec: sequence length, global batch, precision, attention
// kernel, optimizer) and how the work is split over GPUs (ParallelConfig: tensor, pipeline, data,
// context and expert parallel sizes, virtual stages, micro-batch, ZeRO stage, recompute, ...).
// Conventions follow Megatron-LM: global batch counts sequences; dp = gpus / (tp*pp*cp); ranks are
// ordered tp fastest, then cp, dp, pp. MoE layers fold their own groups over the same tp*cp*dp ranks
// of a pipeline stage (Megatron-Core's MoE parallel folding, Liu et al. 2025, arXiv 2504.14960):
// expert tensor parallel etp fastest, then expert parallel ep, then expert data parallel
// edp = tp*cp*dp / (etp*ep); so ep may exceed dp*cp.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dplan/costmodel/engine.h"
#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {

enum class Attention { flash, standard };
enum class Recompute { none, selective, full };
// dualpipe: DeepSeek's bidirectional pipeline (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1;
// deepseek-ai/DualPipe@bb214e8 dualpipe.py): rank i holds model stages i and pp-1-i, half the
// micro-batches enter at each end, and a forward of one direction runs beside a backward of the
// other. Priced by its closed form (time_phases.cpp); no engine dplan exports to runs it.
enum class Schedule { gpipe, one_f_one_b, interleaved, dualpipe };
// How MoE layers move tokens to their experts and back (Megatron-Core's token dispatcher):
// alltoall: NCCL all-to-all over the ep group (--moe-token-dispatcher-type alltoall);
// deepep: DeepEP's dispatch/combine kernels over the etp*ep group, NVLink inside a node and RDMA
// between nodes, each token sent once per node and once per GPU (--moe-token-dispatcher-type flex
// --moe-enable-deepep). time_phases.cpp prices both.
enum class MoeDispatcher { alltoall, deepep };

// What selective recompute reruns under Megatron-LM: its --recompute-modules (core_v0.15.0
// megatron/core/transformer/transformer_config.py recompute_modules; default core_attn).
// core_attn, mlp, moe and shared_experts checkpoint the module (its input is kept, everything it
// saves inside is dropped and its forward replayed in backward); moe_act, layernorm and
// mla_up_proj discard their output after use (CheckpointWithoutOutput) and recompute it before the
// backward needs it. activations.cpp counts what each drops, compute.cpp what each replays.
enum class RecomputeModule { core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts };
struct RecomputeModules {
  unsigned bits = 1u << unsigned(RecomputeModule::core_attn);
  bool has(RecomputeModule m) const { return bits & (1u << unsigned(m)); }
  void add(RecomputeModule m) { bits |= 1u << unsigned(m); }
  bool is_default() const { return bits == RecomputeModules{}.bits; }
  bool operator==(const RecomputeModules&) const = default;
};
// Megatron's names, in its order: "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp",
// "moe", "shared_experts".
const std::vector<std::string>& recompute_module_names();
std::vector<std::string> to_strings(RecomputeModules modules);  // the set's names, in that order
std::string to_string(RecomputeModules modules, const std::string& separator);  // them joined
// The set of these names (plan files, Megatron's argument lists); an unknown one, or none, throws
// InputError listing them.
RecomputeModules recompute_modules_from_names(const std::vector<std::string>& names);
// The same from a comma- or space-separated list (the CLI's --recompute-modules).
RecomputeModules recompute_modules_from_string(const std::string& list);

struct TrainingSpec {
  int seq_len = 0;
  int global_batch = 0;                   // sequences per optimizer step
  Precision precision = Precision::bf16;
  Attention attention = Attention::flash;
  bool fp32_grads = false;                // keep 16-bit training's gradients in fp32 (Megatron main_grad)
  // 16-bit gradients where the engine would keep bf16 training's in fp32
  // (EngineMechanics::bf16_grads_in_fp32): Megatron-LM's --grad-reduce-in-bf16, NeMo's
  // optim.grad_sync_dtype bf16. Excludes fp32_grads. gradients_in_fp32 (memory.h) resolves both.
  bool grad_reduce_in_bf16 = false;
  // AdamW's two moments kept in bf16 (the fp32 master weights stay): 4 + 2 + 2 bytes of optimizer
  // state per parameter instead of 12. DeepSeek-V3 trained so (arXiv 2412.19437, Sec. 3.3.3,
  // "Low-Precision Optimizer States"); Megatron-LM's --use-precision-aware-optimizer --exp-avg-dtype
  // bf16 --exp-avg-sq-dtype bf16 (core_v0.15.0, with the distributed optimizer).
  bool bf16_adam_moments = false;
  // Megatron's weight-gradient GEMMs accumulate straight into the gradient buffer (main_grad);
  // false: --no-gradient-accumulation-fusion, each micro-batch's gradients added in a pass of their
  // own (unfused_accumulation_s).
  bool gradient_accumulation_fusion = true;
  // Megatron-LM's --cross-entropy-loss-fusion (core_v0.15.0 fusions/fused_cross_entropy.py, the
  // native implementation): the loss's forward holds one more fp32 [T, V/tp] tensor than the
  // unfused one (memory.cpp).
  bool cross_entropy_fusion = false;
  // Megatron-LM's --defer-embedding-wgrad-compute --wgrad-deferral-limit N: the LM head's weight
  // gradient of up to N micro-batches (0: all of them) waits for the pipeline flush, keeping each
  // one's output gradient and input on the last stage. nullopt: not deferred. Needs pp > 1 and
  // gradient-accumulation fusion (Megatron's ModelParallelConfig); with pp 1 nothing is deferred.
  std::optional<int> embedding_wgrad_deferral{};
  // What --recompute selective reruns where the engine's selective recompute is Megatron's
  // (SelectiveRecompute::attention_core); other engines refuse a set other than the default.
  RecomputeModules recompute_modules{};
  int vocab_pad_multiple = 128;           // Megatron --make-vocab-size-divisible-by (times tp)
  double bucket_bytes = 25.0 * kMiB;      // gradient bucket (PyTorch DDP bucket_cap_mb = 25)
  // The engine that runs the plan and how it implements it (engine.h); Megatron-LM unless said.
  EngineMechanics engine = engine_mechanics(Engine::megatron);
  bool operator==(const TrainingSpec&) const = default;
};

struct ParallelConfig {
  int tp = 1;                 // tensor parallel
  int pp = 1;                 // pipeline parallel
  int dp = 1;                 // data parallel
  int cp = 1;                 // context parallel
  int ep = 1;                 // expert parallel: experts split over ep ranks (ep*etp divides tp*cp*dp)
  int etp = 0;                // expert tensor parallel; 0: same as tp (Megatron's default when
                              // --expert-tensor-parallel-size is unset)
  int vpp = 1;                // virtual pipeline stages (model chunks) per pipeline rank
  int micro_batch = 1;        // sequences per micro-batch
  int zero_stage = 0;         // 0..3 (DeepSpeed ZeRO / FSDP)
  bool distributed_optimizer = false;  // Megatron's: optimizer state sharded over dp (ZeRO-1 memory)
  bool sequence_parallel = false;      // Megatron sequence parallel (needs tp > 1)
  bool offload_optimizer = false;      // optimizer states and fp32 master weights in host memory
  Recompute recompute = Recompute::none;
  Schedule schedule = Schedule::one_f_one_b;
  std::vector<int> layers_per_stage;   // empty: even split (see assign_layers)
  // Megatron-LM's uneven pipeline split (see assign_chunks): transformer layers on the first and
  // last pipeline stage (--decoder-first/last-pipeline-num-layers; 0: not given), and the
  // embedding / the loss counted as one layer each in the split
  // (--account-for-embedding/loss-in-pipeline-split).
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  bool account_for_embedding = false;
  bool account_for_loss = false;
  // MoE communication (time_phases.cpp expert_parallel_comm): the token dispatcher, and Megatron-Core's
  // expert-parallel overlap (--overlap-moe-expert-parallel-comm): one micro-batch's forward runs
  // beside another's backward, layer by layer, so each one's dispatch and combine hide behind the
  // other's compute (combined 1F1B; needs ep > 1, pp 1 or the interleaved schedule, no full recompute).
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;
  bool overlap_ep_comm = false;

  int world_size() const { return tp * pp * dp * cp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // Expert data parallel: the ranks holding the same expert shard, tp*cp*dp / (etp*ep); its
  // gradients reduce (and the distributed optimizer shards) over these.
  int expert_dp() const { return std::max(1, tp * cp * dp / std::max(1, expert_tp() * ep)); }
  bool operator==(const ParallelConfig&) const = default;
};

// Bytes of one stored activation element: 4 for fp32 training, 2 otherwise (fp8 training keeps
// activations in 16 bits outside the GEMM inputs).
double activation_bytes(Precision precision);

// Micro-batches per pipeline per step: global_batch / (micro_batch * dp).
int num_microbatches(const TrainingSpec& training, const ParallelConfig& parallel);

// One model chunk (virtual pipeline stage): the transformer layers [first_layer, first_layer +
// num_layers) and whether it holds the embedding (chunk 0 of stage 0) or the LM head and loss
// (the last chunk of the last stage).
struct ModelChunk {
  int first_layer = 0, num_layers = 0;
  bool embedding = false, loss = false;
  bool operator==(const ModelChunk&) const = default;
};

// The layer assignment, [pipeline stage][model chunk] (one chunk per stage unless interleaved,
// vpp with it): the one owner of which layers each rank holds, used by memory, time, the plan file,
// the search and the executor. As Megatron-LM builds them (megatron/core/transformer/
// transformer_block.py get_num_layers_to_build, transformer_layer.py get_transformer_layer_offset):
//  - each stage holds a number of "slots": with --account-for-embedding/loss-in-pipeline-split the
//    L layers plus the embedding and/or the loss as one slot each, split evenly over pp;
//    with --decoder-first/last-pipeline-num-layers the given counts on the first/last stage and
//    the rest evenly over the others; an explicit layers_per_stage list; else (none of these) an
//    even split with any remainder to the middle stages (dplan's default; Megatron requires pp to
//    divide L there);
//  - with vpp chunks each stage's slots split evenly over its chunks, and the chunks follow each
//    other through the model in the order virtual stage j of every rank 0..pp-1, then j+1
//    (Megatron's interleaved order, Narayanan et al. 2021 Sec. 2.2);
//  - an accounted embedding takes a slot of chunk 0 of stage 0, an accounted loss one of the last
//    chunk of the last stage.
// REQUIRES: check_pipeline_parallel and check_schedule give ok (DPLAN_CHECK otherwise).
std::vector<std::vector<ModelChunk>> assign_chunks(int num_layers, const ParallelConfig& parallel);
// assign_chunks' answer, shared rather than built again: one layout's evaluation reads it three
// times (memory, parameters, time) and a search's layouts share a few dozen splits, so each thread
// keeps the last kSharedAssignments it was asked for, keyed by what assign_chunks reads (the layer
// count, pp, the schedule and its chunks, and the split's fields). The same value as
// assign_chunks (tests/costmodel/pipeline_split_test.cpp checks it). REQUIRES: as assign_chunks.
using ChunkAssignment = std::vector<std::vector<ModelChunk>>;
inline constexpr int kSharedAssignments = 16;
std::shared_ptr<const ChunkAssignment> shared_chunks(int num_layers, const ParallelConfig& parallel);
// Whether a stage's chunks hold the embedding (first stage; both end stages under dualpipe), the loss.
// (Inline: the memory model asks per stage of every layout it prices.)
inline bool holds_embedding(const std::vector<ModelChunk>& stage_chunks) {
  return std::any_of(stage_chunks.begin(), stage_chunks.end(), [](const ModelChunk& c) { return c.embedding; });
}
inline bool holds_loss(const std::vector<ModelChunk>& stage_chunks) {
  return std::any_of(stage_chunks.begin(), stage_chunks.end(), [](const ModelChunk& c) { return c.loss; });
}

// Transformer layers per pipeline stage (its chunks' sum), from assign_chunks.
std::vector<int> assign_layers(int num_layers, const ParallelConfig& parallel);

// The split the search gives a (pp, vpp) (vpp of the interleaved schedule) that does not divide
// the layers, the way Megatron users split them (docs/cost-model.md, "Uneven pipelines"): the
// loss, the embedding, or both accounted as a layer where pp*vpp then divides the slots, else
// first/last stage counts around middle stages of ceil(L / (pp vpp)) vpp layers (training.cpp).
// Returns `parallel` with the split's fields set (cleared where pp*vpp divides L), or nullopt
// where no such split exists.
std::optional<ParallelConfig> megatron_split(int num_layers, ParallelConfig parallel);

// Vocabulary after Megatron's padding to a multiple of vocab_pad_multiple * tp.
int padded_vocab(const ModelSpec& model, const TrainingSpec& training, int tp);

// Micro-batches whose activations a pipeline stage holds at its peak, in units of "one
// micro-batch through all of this stage's layers":
//   GPipe: m; 1F1B: min(pp - stage, m) (Narayanan et al. 2021, Sec. 2.2);
//   interleaved with v chunks: min(2(pp-stage-1) + (v-1)pp + 1, m v) chunk-micro-batches of 1/v
//   stage each (Megatron's warm-up count + 1), i.e. stage 0 holds L(1 + (p-1)/(p v)) layers'
//   worth (Korthikanti et al. 2022, Sec. 4.2.3). With pp = 1 one micro-batch at a time.
//   With overlap_ep_comm one more (Megatron-Core schedules.py: one extra warm-up forward so that
//   every 1F1B step pairs independent micro-batches; with pp 1, micro-batch i+1's forward runs
//   beside i's backward: 2 at a time).
double microbatches_in_flight(const ParallelConfig& parallel, int stage, int num_microbatches);

// Layer-micro-batches whose activations stage `stage` holds at its peak: its layers times
// microbatches_in_flight, except that with interleaved chunks of unequal sizes it counts the
// layers of the chunks the warm-up forwards ran through (groups of pp micro-batches through chunk
// 0, then 1, ...: Megatron-LM's schedules.py order), the peak being the warm-up plus one forward.
// Equal chunks give num_layers * microbatches_in_flight exactly.
double layer_microbatches_in_flight(const ParallelConfig& parallel, const std::vector<ModelChunk>& stage_chunks,
                                    int stage, int num_microbatches);
// The same peak for model chunk `chunk` of the stage's `chunks`: how many micro-batches' forwards
// through it the stage holds (microbatches_in_flight, but for the interleaved schedule's order).
double chunk_microbatches_in_flight(const ParallelConfig& parallel, int chunks, int chunk, int stage,
                                    int num_microbatches);

// Bounds on sizes, checked where a size is read (flags, files) and by check_layout, so that every
// product of sizes the model forms fits in int and the search stays finite. A larger size is
// refused with the bound named.
inline constexpr int kMaxGpus = 1 << 20;         // 1,048,576 devices: beyond any cluster built or planned
inline constexpr int kMaxSeqLen = 1 << 24;       // tokens per sequence
inline constexpr int kMaxGlobalBatch = 1 << 24;  // sequences per optimizer step (and per micro-batch)
inline constexpr int kMaxVirtualStages = 1 << 10;

// tp*pp*dp*cp for any positive sizes, without overflow: the product, or kMaxGpus + 1 when it is
// larger than kMaxGpus.
long long bounded_world_size(long long tp, long long pp, long long dp, long long cp);

// The rules a layout must follow, in the order validate() checks them. Each check below returns
// the first rule its part of the layout breaks, or ok; check_layout runs them all. The search's
// enumeration (planner/search.h) applies the same checks dimension by dimension.
enum class LayoutRule {
  ok,
  gpus_positive, tp_positive, pp_positive, dp_positive, cp_positive, ep_positive, vpp_positive,
  micro_batch_positive, global_batch_positive, seq_positive,
  size_limit,                     // each size within the bounds below (kMaxGpus, ...)
  world_size,                     // tp*pp*dp*cp == gpus
  tp_divides_heads,               // tp divides the attention heads and key/value heads
  tp_divides_ffn,
  pp_within_layers,               // pp <= layers (plus the embedding and loss where accounted)
  split_one_way,                  // one way to split: a stage list, first/last counts, or accounting
  first_last_need_pp,             // first/last stage counts need pp >= 2
  stages_listed,                  // an explicit layer assignment lists pp stages,
  split_adds_up,                  // the stages' layers add up to the model's (and split evenly
                                  //   where Megatron splits them evenly),
  batch_divisible,                // micro_batch * dp divides the global batch
  interleaved_needs_pp,           // the interleaved schedule needs pp >= 2,
  interleaved_needs_vpp,          // vpp >= 2,
  vpp_divides_stage_layers,       // vpp dividing every stage's layers (embedding/loss accounted),
  chunks_hold_a_layer,            // every chunk holding a layer, the embedding or the loss,
  interleaved_needs_microbatches, // and a multiple of pp micro-batches (Megatron's groups of pp)
  vpp_needs_interleaved,          // vpp > 1 only with the interleaved schedule
  dualpipe_needs_even_pp,         // dualpipe: an even pp >= 2 (dualpipe.py asserts num_ranks % 2 == 0),
  dualpipe_needs_microbatches,    //   an even number of micro-batches, at least 2 pp (num_chunks >= 2 num_ranks)
  cp_divides_seq,                 // 2*cp divides the sequence
  seq_within_positions,           // learned positions cover the sequence
  etp_positive,                   // etp 0 (as tp) or positive
  ep_needs_moe,
  ep_divides_experts,
  etp_divides_expert_ffn,         // etp divides the expert FFN size
  ep_etp_divides_tp_cp_dp,        // ep*etp divides tp*cp*dp (MoE parallel folding)
  zero_stage_exists,              // ZeRO 0..3
  dist_opt_needs_zero_0_or_1,
  sp_needs_tp,
  vocab_pad_positive,
  deepep_needs_moe,               // --moe-dispatcher deepep: a mixture-of-experts model,
  deepep_needs_expert_groups,     //   and ep*etp > 1 (Megatron's flex dispatcher asserts TPxEP > 1)
  moe_comm_needs_megatron,        // either: the plan's engine Megatron-LM
  ep_overlap_needs_moe,           // --overlap-ep-comm: a mixture-of-experts model,
  ep_overlap_needs_ep,            //   ep > 1,
  ep_overlap_needs_schedule,      //   pp 1, the interleaved schedule or dualpipe,
  ep_overlap_no_full_recompute,   //   no full recompute,
  ep_overlap_needs_16bit,         //   and bf16, fp16 or fp8 training (Megatron-Core transformer_config.py)
};

LayoutRule check_tensor_parallel(const ModelSpec& model, int tp);
LayoutRule check_pipeline_parallel(const ModelSpec& model, const ParallelConfig& parallel);  // pp, layers
LayoutRule check_batch(const TrainingSpec& training, int micro_batch, int dp);
LayoutRule check_schedule(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel);
LayoutRule check_context_parallel(const TrainingSpec& training, int cp);
LayoutRule check_expert_parallel(const ModelSpec& model, const ParallelConfig& parallel);  // ep, etp, tp, dp, cp
LayoutRule check_sharding(const ParallelConfig& parallel);                                 // ZeRO, dist-opt
LayoutRule check_sequence_parallel(const ParallelConfig& parallel);
LayoutRule check_moe_comm(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel);
// check_moe_comm's one-line message (naming the valid choices), or nullopt.
std::optional<std::string> moe_comm_problem(const ModelSpec& model, const TrainingSpec& training,
                                            const ParallelConfig& parallel);
// Every rule, the sizes' positivity and tp*pp*dp*cp == gpus first.
LayoutRule check_layout(const ModelSpec& model, const TrainingSpec& training, const ParallelConfig& parallel,
                        int gpus);

// Checks every rule a launcher would assert (check_layout, then that the GPU has the precision's
// math) and throws InputError naming the problem and the valid choices: sizes positive,
// tp*pp*dp*cp == gpus, tp divides heads and kv heads, pp <= layers, global batch divisible by
// micro_batch*dp, ep divides experts, etp the expert FFN, ep*etp divides tp*cp*dp, vpp only with the interleaved schedule, zero stage
// 0..3, sequence parallel only with tp > 1, seq divisible by cp.
void validate(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& training,
              const ParallelConfig& parallel, int gpus);

// The pipeline split's rules alone (check_pipeline_parallel, and the per-chunk ones of
// check_schedule): validate()'s one-line message for the first broken, or nullopt. For readers of
// files that hold a layout (plan.json), so that assign_chunks' requirement holds after a read.
std::optional<std::string> pipeline_split_problem(const ModelSpec& model, const ParallelConfig& parallel);

// Every rule of check_layout for a layout a file holds (its world size its own): validate()'s
// one-line message for the first broken, or nullopt. What plan.json's reader checks, so that
// `dplan run` refuses what `dplan estimate` refuses (e.g. a cp whose 2*cp chunks do not divide the
// sequence).
std::optional<std::string> layout_problem(const ModelSpec& model, const TrainingSpec& training,
                                          const ParallelConfig& parallel);

json to_json(const TrainingSpec& training);
json to_json(const ParallelConfig& parallel);
TrainingSpec training_from_json(const json& j, const std::string& file, const std::string& pointer);
ParallelConfig parallel_from_json(const json& j, const std::string& file, const std::string& pointer);

const char* to_string(Attention a);
// Whether the attention core runs blockwise (FlashAttention's tiles: the causal half of the work,
// no s x s tensor stored): flash attention, and context parallel whatever --attention says, whose
// ring runs only through fused attention (Megatron-Core's context parallel requires Transformer
// Engine's; the executor's ring is blockwise, executor/src/ring_attention.h).
bool blockwise_attention(const TrainingSpec& t, const ParallelConfig& p);
const char* to_string(Recompute r);
const char* to_string(Schedule s);
const char* to_string(MoeDispatcher d);
MoeDispatcher moe_dispatcher_from_string(const std::string& s);  // "alltoall" or "deepep"; throws InputError listing them
// Why the cluster cannot run DeepEP's kernels (they need NVLink with peer access between every pair
// of a node's GPUs: NVSwitch), one line naming the choices, or nullopt. validate() checks it; so
// does the CLI before a search.
std::optional<std::string> moe_dispatcher_problem(const ClusterSpec& cluster, MoeDispatcher dispatcher);
Precision precision_from_string(const std::string& s);    // throws InputError listing choices
Attention attention_from_string(const std::string& s);
Recompute recompute_from_string(const std::string& s);
Schedule schedule_from_string(const std::string& s);
// "gpipe", "1f1b", "interleaved", "dualpipe": the names plan and run files and the CLI accept.
const std::vector<std::string>& schedule_names();

}  // namespace dplan::costmodel
