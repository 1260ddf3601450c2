#include "dplan/costmodel/training.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <optional>
#include <span>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {
namespace {

std::string divisors_of(int n, int from = 1) {
  std::vector<std::string> out;
  for (int d = from; d <= n; ++d)
    if (n % d == 0) out.push_back(std::to_string(d));
  return join_choices(out);
}

[[noreturn]] void bad(const std::string& what) { throw InputError(what); }

}  // namespace

const char* to_string(Attention a) { return a == Attention::flash ? "flash" : "standard"; }

bool blockwise_attention(const TrainingSpec& t, const ParallelConfig& p) {
  return t.attention == Attention::flash || p.cp > 1;
}
const char* to_string(Recompute r) {
  return r == Recompute::none ? "none" : r == Recompute::selective ? "selective" : "full";
}
const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
    case Schedule::dualpipe: return "dualpipe";
  }
  return "?";
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "dualpipe"};
  return names;
}

const char* to_string(MoeDispatcher d) { return d == MoeDispatcher::deepep ? "deepep" : "alltoall"; }

MoeDispatcher moe_dispatcher_from_string(const std::string& s) {
  if (s == "alltoall") return MoeDispatcher::alltoall;
  if (s == "deepep") return MoeDispatcher::deepep;
  bad("unknown MoE dispatcher \"" + s + "\"; choose alltoall or deepep");
}

std::optional<std::string> moe_dispatcher_problem(const ClusterSpec& cluster, MoeDispatcher dispatcher) {
  // DeepEP validates the complete peer-access matrix of a node's GPUs over NVLink before it
  // allocates its buffer and refuses a partial one (deepseek-ai/DeepEP@0297fc8017 docs/legacy.md,
  // Requirements: "NVLink with full directed CUDA peer access between every pair"); NVSwitch
  // nodes give that, PCIe, NVLink bridges between pairs, XGMI and CPU cores do not.
  if (dispatcher != MoeDispatcher::deepep || cluster.intra_node_kind == IntraNodeKind::nvswitch ||
      cluster.gpus_per_node <= 1)
    return std::nullopt;
  return "--moe-dispatcher deepep needs NVLink between every pair of a node's GPUs (an NVSwitch node); cluster " +
         cluster.name + " has none: use --moe-dispatcher alltoall";
}

Precision precision_from_string(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "fp8") return Precision::fp8;
  bad("unknown precision \"" + s + "\"; choose bf16, fp16, fp8 or fp32");
}
Attention attention_from_string(const std::string& s) {
  if (s == "flash") return Attention::flash;
  if (s == "standard") return Attention::standard;
  bad("unknown attention \"" + s + "\"; choose flash or standard");
}
Recompute recompute_from_string(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  bad("unknown recompute \"" + s + "\"; choose none, selective or full");
}
Schedule schedule_from_string(const std::string& s) {
  for (Schedule x : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::dualpipe})
    if (s == to_string(x)) return x;
  bad("unknown schedule \"" + s + "\"; choose gpipe, 1f1b, interleaved or dualpipe");
}

const std::vector<std::string>& recompute_module_names() {
  static const std::vector<std::string> names = {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                                 "mlp",       "moe",     "shared_experts"};
  return names;
}

std::vector<std::string> to_strings(RecomputeModules modules) {
  std::vector<std::string> out;
  const std::vector<std::string>& names = recompute_module_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (modules.has(RecomputeModule(i))) out.push_back(names[i]);
  return out;
}

std::string to_string(RecomputeModules modules, const std::string& separator) {
  std::string out;
  for (const std::string& name : to_strings(modules)) out += (out.empty() ? "" : separator) + name;
  return out;
}

RecomputeModules recompute_modules_from_names(const std::vector<std::string>& given) {
  const std::vector<std::string>& names = recompute_module_names();
  std::string choices;
  for (const std::string& n : names) choices += (choices.empty() ? "" : ", ") + n;
  RecomputeModules modules{0};
  for (const std::string& name : given) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) bad("unknown recompute module \"" + name + "\"; choose from " + choices);
    modules.add(RecomputeModule(it - names.begin()));
  }
  if (modules.bits == 0) bad("no recompute module given; choose from " + choices);
  return modules;
}

RecomputeModules recompute_modules_from_string(const std::string& list) {
  std::vector<std::string> names(1);
  for (char c : list) {
    if (c != ',' && c != ' ') names.back() += c;
    else if (!names.back().empty()) names.emplace_back();
  }
  if (names.back().empty()) names.pop_back();
  return recompute_modules_from_names(names);
}

double activation_bytes(Precision precision) { return precision == Precision::fp32 ? 4.0 : 2.0; }

int num_microbatches(const TrainingSpec& t, const ParallelConfig& p) {
  return t.global_batch / (p.micro_batch * p.dp);
}

namespace {

int interleaved_chunks(const ParallelConfig& p) { return p.schedule == Schedule::interleaved ? p.vpp : 1; }

// A layout as the rules read it: every rule's condition and message take one.
struct LayoutView {
  const ModelSpec& model;
  const TrainingSpec& t;
  const ParallelConfig& p;
  int gpus;
};

// One layout rule: when it is broken, and validate()'s message naming the valid choices.
struct Rule {
  LayoutRule rule;
  bool (*broken)(const LayoutView&);
  std::string (*message)(const LayoutView&);
};

std::string not_positive(const char* name, long long v) {
  return std::string(name) + " must be a positive integer, got " + std::to_string(v);
}

// Slots per pipeline stage (transformer layers, plus the embedding and the loss where accounted as
// a layer each); see assign_chunks in training.h. Megatron-LM: get_num_layers_to_build
// (megatron/core/transformer/transformer_block.py), with the checks of
// TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py): first/last
// counts exclude the accounting flags, the other stages split the rest evenly, with vpp every
// stage's count divides by vpp, and with the accounting flags pp (* vpp) divides the slots.
struct PipelineSplit {
  int num_layers = 0;
  int extra = 0;                         // the embedding and the loss, where accounted as a layer each
  int ways = 0;                          // ways of splitting given: a stage list, first/last counts, accounting
  std::optional<std::vector<int>> slots;  // nullopt where the given counts cannot add up
};

bool listed_split(const ParallelConfig& p) { return !p.layers_per_stage.empty(); }
bool first_last_split(const ParallelConfig& p) { return p.first_stage_layers != 0 || p.last_stage_layers != 0; }
bool accounted_split(const ParallelConfig& p) { return p.account_for_embedding || p.account_for_loss; }

// The stages without a given count share the rest evenly (Megatron asserts it divides).
std::optional<std::vector<int>> first_last_slots(int num_layers, const ParallelConfig& p) {
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0) return std::nullopt;
  long long rest = num_layers;
  int others = p.pp;
  if (p.first_stage_layers) rest -= p.first_stage_layers, --others;
  if (p.last_stage_layers) rest -= p.last_stage_layers, --others;
  if (rest < 0 || (others == 0 && rest != 0) || (others > 0 && rest % others != 0)) return std::nullopt;
  std::vector<int> slots(p.pp, others > 0 ? int(rest / others) : 0);
  if (p.first_stage_layers) slots.front() = p.first_stage_layers;
  if (p.last_stage_layers) slots.back() = p.last_stage_layers;
  return slots;
}

// dplan's default: even, any remainder to the middle stages first (the first stage also runs the
// embedding, the last the LM head and loss), then the last, then the first.
std::vector<int> even_slots(int num_layers, int pp) {
  std::vector<int> slots(pp, num_layers / pp);
  std::vector<int> order;
  for (int s = 1; s + 1 < pp; ++s) order.push_back(s);
  if (pp > 1) order.push_back(pp - 1);
  order.push_back(0);
  for (int i = 0; i < num_layers % pp; ++i) slots[order[i]] += 1;
  return slots;
}

PipelineSplit pipeline_split(int num_layers, const ParallelConfig& p) {
  PipelineSplit s;
  s.num_layers = num_layers;
  s.extra = int(p.account_for_embedding) + int(p.account_for_loss);
  s.ways = int(listed_split(p)) + int(first_last_split(p)) + int(accounted_split(p));
  // The rules before split_adds_up hold where slots are read (one way, 1 <= pp <= the slots).
  if (s.ways > 1 || p.pp < 1 || p.pp > num_layers + s.extra) return s;
  if (listed_split(p)) {
    s.slots = p.layers_per_stage;
  } else if (first_last_split(p)) {
    if (p.pp >= 2) s.slots = first_last_slots(num_layers, p);
  } else if (accounted_split(p)) {
    // Megatron: (L + embedding + loss) % pp == 0, and % (pp * vpp) == 0 interleaved.
    if ((num_layers + s.extra) % p.pp == 0) s.slots = std::vector<int>(p.pp, (num_layers + s.extra) / p.pp);
  } else {
    s.slots = even_slots(num_layers, p.pp);
  }
  return s;
}

bool slots_add_up(const PipelineSplit& s) {
  if (!s.slots) return false;
  long long sum = 0;
  for (int n : *s.slots) sum += n;
  return sum == s.num_layers + s.extra;
}

// One rule of the pipeline split: when it is broken (on the split and the layout), and its message.
struct SplitRule {
  LayoutRule rule;
  bool (*broken)(const PipelineSplit&, const ParallelConfig&);
  std::string (*message)(const LayoutView&);
};

std::string divided_layers_message(const LayoutView& v) {
  const ParallelConfig& p = v.p;
  if (listed_split(p)) {
    long long sum = 0;
    for (int n : p.layers_per_stage) sum += n;
    return "the layer assignment holds " + std::to_string(sum) + " layers but " + v.model.name + " has " +
           std::to_string(v.model.num_layers);
  }
  if (first_last_split(p)) {
    const int others = p.pp - (p.first_stage_layers != 0) - (p.last_stage_layers != 0);
    const long long rest = (long long)v.model.num_layers - p.first_stage_layers - p.last_stage_layers;
    std::string given;
    if (p.first_stage_layers) given = "--first-stage-layers " + std::to_string(p.first_stage_layers);
    if (p.first_stage_layers && p.last_stage_layers) given += " and ";
    if (p.last_stage_layers) given += "--last-stage-layers " + std::to_string(p.last_stage_layers);
    return given + (p.first_stage_layers && p.last_stage_layers ? " leave " : " leaves ") + std::to_string(rest) +
           " of the " + std::to_string(v.model.num_layers) + " layers of " + v.model.name + " to " +
           std::to_string(others) + " other stages; choose counts that leave a multiple of " +
           std::to_string(std::max(others, 1)) + (others == 0 ? " (exactly none)" : "");
  }
  const int extra = int(p.account_for_embedding) + int(p.account_for_loss);
  return "pp " + std::to_string(p.pp) + " does not divide the " + std::to_string(v.model.num_layers) +
         " layers of " + v.model.name + " plus " + std::to_string(extra) +
         " accounted (embedding/loss); choose pp among " + divisors_of(v.model.num_layers + extra) +
         ", or other --account-for-embedding/--account-for-loss, or --first-stage-layers/--last-stage-layers";
}

std::string vpp_divides_message(const LayoutView& v);

std::string chunks_hold_a_layer_message(const LayoutView& v) {
  return "every pipeline stage and model chunk needs at least one layer, the embedding or the loss; pp " +
         std::to_string(v.p.pp) + " x vpp " + std::to_string(interleaved_chunks(v.p)) + " leaves one empty";
}

// The split's rules in the order they are checked; the first broken is reported.
const SplitRule kSplitRules[] = {
    {LayoutRule::split_one_way, [](const PipelineSplit& s, const ParallelConfig&) { return s.ways > 1; },
     [](const LayoutView&) -> std::string {
       return "choose one way to split the layers over the pipeline: a layers_per_stage list, "
              "--first-stage-layers/--last-stage-layers, or --account-for-embedding/--account-for-loss (Megatron-LM "
              "refuses both of the last two)";
     }},
    {LayoutRule::pp_within_layers,
     [](const PipelineSplit& s, const ParallelConfig& p) { return p.pp > s.num_layers + s.extra; },
     [](const LayoutView& v) {
       return "pp " + std::to_string(v.p.pp) + " exceeds the " + std::to_string(v.model.num_layers) + " layers of " +
              v.model.name + (accounted_split(v.p) ? " (plus the accounted embedding/loss)" : "") +
              "; pp must be at most the layer count";
     }},
    {LayoutRule::stages_listed,
     [](const PipelineSplit&, const ParallelConfig& p) {
       return listed_split(p) && int(p.layers_per_stage.size()) != p.pp;
     },
     [](const LayoutView& v) {
       return "the layer assignment lists " + std::to_string(v.p.layers_per_stage.size()) + " stages but pp is " +
              std::to_string(v.p.pp);
     }},
    {LayoutRule::first_last_need_pp,
     [](const PipelineSplit&, const ParallelConfig& p) { return first_last_split(p) && p.pp < 2; },
     [](const LayoutView& v) {
       return "--first-stage-layers/--last-stage-layers need pp >= 2, got pp " + std::to_string(v.p.pp);
     }},
    {LayoutRule::split_adds_up, [](const PipelineSplit& s, const ParallelConfig&) { return !slots_add_up(s); },
     divided_layers_message},
    {LayoutRule::vpp_divides_stage_layers,
     [](const PipelineSplit& s, const ParallelConfig& p) {
       return std::any_of(s.slots->begin(), s.slots->end(), [&](int n) { return n % interleaved_chunks(p) != 0; });
     },
     vpp_divides_message},
    {LayoutRule::chunks_hold_a_layer,
     [](const PipelineSplit& s, const ParallelConfig& p) {
       return std::any_of(s.slots->begin(), s.slots->end(), [&](int n) { return n / interleaved_chunks(p) < 1; });
     },
     chunks_hold_a_layer_message},
};

struct StageSlots {
  std::vector<int> slots;
  LayoutRule rule = LayoutRule::ok;
};

// The split's slots per stage and the first of kSplitRules it breaks (slots empty where broken).
StageSlots stage_slots(int num_layers, const ParallelConfig& p) {
  PipelineSplit split = pipeline_split(num_layers, p);
  for (const SplitRule& r : kSplitRules)
    if (r.broken(split, p)) return {{}, r.rule};
  return {std::move(*split.slots), LayoutRule::ok};
}

std::string vpp_divides_message(const LayoutView& v) {
  ParallelConfig one_chunk = v.p;
  one_chunk.schedule = Schedule::one_f_one_b;
  for (int n : stage_slots(v.model.num_layers, one_chunk).slots)
    if (n % v.p.vpp != 0)
      return "vpp " + std::to_string(v.p.vpp) + " does not divide the " + std::to_string(n) +
             " layers (embedding/loss accounted) of a pipeline stage; choose vpp among " + divisors_of(n) +
             ", or a split whose stages' counts it divides (--first-stage-layers/--last-stage-layers, "
             "--account-for-embedding/--account-for-loss)";
  return "";
}

}  // namespace

std::vector<std::vector<ModelChunk>> assign_chunks(int num_layers, const ParallelConfig& p) {
  const StageSlots split = stage_slots(num_layers, p);
  DPLAN_CHECK(split.rule == LayoutRule::ok);
  const int v = interleaved_chunks(p);
  std::vector<std::vector<ModelChunk>> chunks(p.pp, std::vector<ModelChunk>(v));
  // Through the model: virtual stage j of ranks 0..pp-1, then j+1 (get_transformer_layer_offset).
  int next = 0;
  for (int j = 0; j < v; ++j)
    for (int i = 0; i < p.pp; ++i) {
      ModelChunk& c = chunks[i][j];
      c.embedding = i == 0 && j == 0;
      c.loss = i == p.pp - 1 && j == v - 1;
      c.first_layer = next;
      c.num_layers = split.slots[i] / v - (c.embedding && p.account_for_embedding ? 1 : 0) -
                     (c.loss && p.account_for_loss ? 1 : 0);
      next += c.num_layers;
    }
  DPLAN_CHECK(next == num_layers);
  if (p.schedule == Schedule::dualpipe) {
    // Rank i holds model stage i and, as its second chunk, stage pp-1-i (DualPipe's mirror): the
    // end ranks hold the embedding and the loss both.
    std::vector<std::vector<ModelChunk>> mirrored(p.pp);
    for (int i = 0; i < p.pp; ++i) mirrored[i] = {chunks[i][0], chunks[p.pp - 1 - i][0]};
    return mirrored;
  }
  return chunks;
}

namespace {

// One assignment shared_chunks keeps, with the fields of its key (all that assign_chunks reads).
struct SharedAssignment {
  int num_layers = -1, pp = 0, chunks = 0;
  Schedule schedule = Schedule::one_f_one_b;
  std::vector<int> layers_per_stage;
  int first_stage_layers = 0, last_stage_layers = 0;
  bool account_for_embedding = false, account_for_loss = false;
  std::shared_ptr<const ChunkAssignment> assignment;

  bool answers(int layers, const ParallelConfig& p) const {
    return assignment && num_layers == layers && pp == p.pp && chunks == interleaved_chunks(p) &&
           schedule == p.schedule && first_stage_layers == p.first_stage_layers &&
           last_stage_layers == p.last_stage_layers && account_for_embedding == p.account_for_embedding &&
           account_for_loss == p.account_for_loss && layers_per_stage == p.layers_per_stage;
  }
};

struct SharedAssignments {
  std::array<SharedAssignment, kSharedAssignments> kept;
  int last = 0;  // the one found last: a search asks for the same split many times in a row
  int next = 0;  // the one replaced next (the oldest)
};

}  // namespace

std::shared_ptr<const ChunkAssignment> shared_chunks(int num_layers, const ParallelConfig& p) {
  thread_local SharedAssignments shared;
  if (shared.kept[shared.last].answers(num_layers, p)) return shared.kept[shared.last].assignment;
  for (int i = 0; i < kSharedAssignments; ++i)
    if (shared.kept[i].answers(num_layers, p)) {
      shared.last = i;
      return shared.kept[i].assignment;
    }
  SharedAssignment& a = shared.kept[shared.next];
  a.assignment = std::make_shared<const ChunkAssignment>(assign_chunks(num_layers, p));  // checks what it requires
  a.num_layers = num_layers, a.pp = p.pp, a.chunks = interleaved_chunks(p), a.schedule = p.schedule;
  a.layers_per_stage = p.layers_per_stage;
  a.first_stage_layers = p.first_stage_layers, a.last_stage_layers = p.last_stage_layers;
  a.account_for_embedding = p.account_for_embedding, a.account_for_loss = p.account_for_loss;
  shared.last = shared.next;
  shared.next = (shared.next + 1) % kSharedAssignments;
  return a.assignment;
}

std::vector<int> assign_layers(int num_layers, const ParallelConfig& p) {
  std::vector<int> layers;
  for (const auto& stage : assign_chunks(num_layers, p)) {
    int n = 0;
    for (const ModelChunk& c : stage) n += c.num_layers;
    layers.push_back(n);
  }
  return layers;
}

// The search's split for a (pp, vpp) that does not divide the layers (documented in
// docs/cost-model.md, "Uneven pipelines"). Megatron without flags requires pp * vpp to divide L, so
// the search uses the flags as users do (e.g. Llama-3.1-405B's 126 layers on pp 8 x vpp 8 with the
// embedding and the loss accounted):
//  1. account the loss (L + 1), the embedding (L + 1) or both (L + 2) where pp * vpp then divides
//     the slots: the loss first, as the LM head and cross-entropy outweigh the embedding lookup;
//  2. else --decoder-first/last-pipeline-num-layers: the pp - 2 middle stages hold m = ceil(L /
//     (pp vpp)) vpp layers each, the first and last share the rest R = L - (pp - 2) m in multiples
//     of vpp, the last the smaller half (it holds the LM head), each at least vpp and at most m;
//  3. else none (nullopt): the search leaves that (pp, vpp) out.
std::optional<ParallelConfig> megatron_split(int num_layers, ParallelConfig p) {
  const int v = interleaved_chunks(p), slots = p.pp * v;
  p.layers_per_stage.clear();
  p.first_stage_layers = p.last_stage_layers = 0;
  p.account_for_embedding = p.account_for_loss = false;
  if (num_layers % slots == 0) return p;
  for (auto [embedding, loss] : {std::pair{false, true}, {true, false}, {true, true}}) {
    if ((num_layers + int(embedding) + int(loss)) % slots != 0) continue;
    ParallelConfig q = p;
    q.account_for_embedding = embedding, q.account_for_loss = loss;
    if (stage_slots(num_layers, q).rule == LayoutRule::ok) return q;
  }
  if (p.pp < 2 || num_layers % v != 0) return std::nullopt;
  const int middle = (num_layers + slots - 1) / slots * v;
  const int rest = num_layers - (p.pp - 2) * middle;
  if (rest < 2 * v) return std::nullopt;
  p.last_stage_layers = rest / v / 2 * v;
  p.first_stage_layers = rest - p.last_stage_layers;
  if (p.first_stage_layers > middle && p.pp > 2) return std::nullopt;
  if (stage_slots(num_layers, p).rule != LayoutRule::ok) return std::nullopt;
  return p;
}

int padded_vocab(const ModelSpec& m, const TrainingSpec& t, int tp) {
  int multiple = std::max(1, t.vocab_pad_multiple) * tp;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

double microbatches_in_flight(const ParallelConfig& p, int stage, int m) {
  // Megatron-Core's EP overlap (core_v0.15.0): with a pipeline, one extra warm-up forward
  // (schedules.py). Without one (combined_1f1b_schedule_for_no_pipelining), micro-batch i+1's
  // forward runs layer by layer beside i's backward, which frees a layer for each one it stores
  // (model_chunk_schedule_plan.py run: forward layer j with backward layer L-1-j, the loss's backward
  // first and its forward last): one micro-batch held, and one layer more at a time (memory.cpp).
  const int extra = p.overlap_ep_comm ? 1 : 0;
  if (p.pp == 1) return 1;
  switch (p.schedule) {
    case Schedule::gpipe:
      return m;
    case Schedule::one_f_one_b:
      return std::min(p.pp - stage, m);
    case Schedule::dualpipe:
      // DeepSeek-V3 report Table 2: pp + 1 micro-batches' activations of one stage, on every rank;
      // a rank's two chunks are two stages, so (pp + 1) / 2 micro-batches of both.
      return std::min(double(p.pp + 1) / 2, double(m));
    case Schedule::interleaved: {
      // The warm-up forwards of pipeline_order (pipeline.h) and the one more that runs before the
      // first backward, capped at every forward (Megatron-Core's schedules.py). A test checks this
      // against the order itself.
      int v = p.vpp;
      int chunks = std::min(2 * (p.pp - stage - 1) + (v - 1) * p.pp + 1 + extra, m * v);
      return double(chunks) / v;
    }
  }
  return m;
}

namespace {

// The interleaved order's first in_flight * chunks forwards of a stage (schedules.py's order:
// groups of pp micro-batches through chunk 0, 1, ... in turn): `held(c, n)` for each run of n
// micro-batches through chunk c. REQUIRES: pp > 1, interleaved, chunks > 1.
template <class Held>
void walk_interleaved_warmup(const ParallelConfig& p, int chunks, int stage, int m, Held held) {
  long long left = std::llround(microbatches_in_flight(p, stage, m) * chunks);
  for (int first = 0; first < m && left > 0; first += p.pp)
    for (int c = 0; c < chunks && left > 0; ++c) {
      const long long n = std::min<long long>(left, std::min(p.pp, m - first));
      held(c, n);
      left -= n;
    }
}

}  // namespace

double chunk_microbatches_in_flight(const ParallelConfig& p, int chunks, int chunk, int stage, int m) {
  if (p.pp == 1 || p.schedule != Schedule::interleaved || chunks == 1) return microbatches_in_flight(p, stage, m);
  long long held = 0;
  walk_interleaved_warmup(p, chunks, stage, m, [&](int c, long long n) { held += c == chunk ? n : 0; });
  return double(held);
}

double layer_microbatches_in_flight(const ParallelConfig& p, const std::vector<ModelChunk>& chunks, int stage,
                                    int m) {
  const int v = int(chunks.size());
  if (p.pp == 1 || p.schedule != Schedule::interleaved || v == 1) {
    const double in_flight = microbatches_in_flight(p, stage, m);
    double sum = 0;
    for (const ModelChunk& c : chunks) sum += c.num_layers * in_flight;
    return sum;
  }
  // Every chunk's count (chunk_microbatches_in_flight) in one walk: whole numbers, so their sum
  // weighted by layers is exact in any order.
  long long sum = 0;
  walk_interleaved_warmup(p, v, stage, m, [&](int c, long long n) { sum += chunks[c].num_layers * n; });
  return double(sum);
}

namespace {

bool interleaved(const ParallelConfig& p) { return p.schedule == Schedule::interleaved; }

// The split's rule under the layout's own schedule (vpp chunks a stage where interleaved).
LayoutRule split_rule(const LayoutView& v) { return stage_slots(v.model.num_layers, v.p).rule; }

// The sizes: positive, within the bounds of training.h, and tp*pp*dp*cp == gpus.
const Rule kSizeRules[] = {
    {LayoutRule::gpus_positive, [](const LayoutView& v) { return v.gpus < 1; },
     [](const LayoutView& v) { return not_positive("--gpus", v.gpus); }},
    {LayoutRule::tp_positive, [](const LayoutView& v) { return v.p.tp < 1; },
     [](const LayoutView& v) { return not_positive("--tp", v.p.tp); }},
    {LayoutRule::pp_positive, [](const LayoutView& v) { return v.p.pp < 1; },
     [](const LayoutView& v) { return not_positive("--pp", v.p.pp); }},
    {LayoutRule::dp_positive, [](const LayoutView& v) { return v.p.dp < 1; },
     [](const LayoutView& v) { return not_positive("--dp", v.p.dp); }},
    {LayoutRule::cp_positive, [](const LayoutView& v) { return v.p.cp < 1; },
     [](const LayoutView& v) { return not_positive("--cp", v.p.cp); }},
    {LayoutRule::ep_positive, [](const LayoutView& v) { return v.p.ep < 1; },
     [](const LayoutView& v) { return not_positive("--ep", v.p.ep); }},
    {LayoutRule::vpp_positive, [](const LayoutView& v) { return v.p.vpp < 1; },
     [](const LayoutView& v) { return not_positive("--vpp", v.p.vpp); }},
    {LayoutRule::micro_batch_positive, [](const LayoutView& v) { return v.p.micro_batch < 1; },
     [](const LayoutView& v) { return not_positive("--mbs (micro-batch size)", v.p.micro_batch); }},
    {LayoutRule::global_batch_positive, [](const LayoutView& v) { return v.t.global_batch < 1; },
     [](const LayoutView& v) { return not_positive("--global-batch", v.t.global_batch); }},
    {LayoutRule::seq_positive, [](const LayoutView& v) { return v.t.seq_len < 1; },
     [](const LayoutView& v) { return not_positive("--seq", v.t.seq_len); }},
    {LayoutRule::size_limit,
     [](const LayoutView& v) {
       const ParallelConfig& p = v.p;
       return v.gpus > kMaxGpus || p.tp > kMaxGpus || p.pp > kMaxGpus || p.dp > kMaxGpus || p.cp > kMaxGpus ||
              p.ep > kMaxGpus || p.etp > kMaxGpus || p.vpp > kMaxVirtualStages || p.micro_batch > kMaxGlobalBatch ||
              v.t.global_batch > kMaxGlobalBatch || v.t.seq_len > kMaxSeqLen;
     },
     [](const LayoutView&) {
       return "sizes must be at most: --gpus, tp, pp, dp, cp, ep and etp " + std::to_string(kMaxGpus) + ", vpp " +
              std::to_string(kMaxVirtualStages) + ", micro-batch and global batch " +
              std::to_string(kMaxGlobalBatch) + ", --seq " + std::to_string(kMaxSeqLen);
     }},
    {LayoutRule::world_size,
     [](const LayoutView& v) { return bounded_world_size(v.p.tp, v.p.pp, v.p.dp, v.p.cp) != v.gpus; },
     [](const LayoutView& v) {
       const ParallelConfig& p = v.p;
       const long long world = bounded_world_size(p.tp, p.pp, p.dp, p.cp);
       std::string msg = "tp*pp*dp*cp = " + std::to_string(p.tp) + "*" + std::to_string(p.pp) + "*" +
                         std::to_string(p.dp) + "*" + std::to_string(p.cp) + " = " + std::to_string(world) +
                         " but --gpus is " + std::to_string(v.gpus);
       const long long model_parallel = static_cast<long long>(p.tp) * p.pp * p.cp;
       if (v.gpus % model_parallel == 0)
         msg += "; with these tp, pp and cp use --dp " + std::to_string(v.gpus / model_parallel);
       else
         msg += "; tp*pp*cp = " + std::to_string(model_parallel) + " must divide the GPU count";
       return msg;
     }},
};

const Rule kTensorRules[] = {
    {LayoutRule::tp_divides_heads,
     [](const LayoutView& v) { return std::gcd(v.model.num_heads, v.model.num_kv_heads) % v.p.tp != 0; },
     [](const LayoutView& v) {
       const int head_gcd = std::gcd(v.model.num_heads, v.model.num_kv_heads);
       return "tp " + std::to_string(v.p.tp) + " does not divide the " + std::to_string(v.model.num_heads) +
              " attention heads and " + std::to_string(v.model.num_kv_heads) + " key/value heads of " +
              v.model.name + "; valid tp: " + divisors_of(head_gcd);
     }},
    {LayoutRule::tp_divides_ffn, [](const LayoutView& v) { return v.model.ffn_hidden_size % v.p.tp != 0; },
     [](const LayoutView& v) {
       return "tp " + std::to_string(v.p.tp) + " does not divide the FFN size " +
              std::to_string(v.model.ffn_hidden_size);
     }},
};

const Rule kBatchRules[] = {
    {LayoutRule::batch_divisible,
     [](const LayoutView& v) {
       return v.t.global_batch % (static_cast<long long>(v.p.micro_batch) * v.p.dp) != 0;
     },
     [](const LayoutView& v) {
       const long long per_step = static_cast<long long>(v.p.micro_batch) * v.p.dp;
       return "global batch " + std::to_string(v.t.global_batch) + " is not divisible by micro-batch * dp = " +
              std::to_string(v.p.micro_batch) + "*" + std::to_string(v.p.dp) + " = " + std::to_string(per_step) +
              "; choose a global batch that is a multiple of " + std::to_string(per_step);
     }},
};

const Rule kScheduleRules[] = {
    {LayoutRule::interleaved_needs_pp, [](const LayoutView& v) { return interleaved(v.p) && v.p.pp < 2; },
     [](const LayoutView&) -> std::string { return "the interleaved schedule needs pp >= 2"; }},
    {LayoutRule::interleaved_needs_vpp, [](const LayoutView& v) { return interleaved(v.p) && v.p.vpp < 2; },
     [](const LayoutView&) -> std::string {
       return "the interleaved schedule needs --vpp >= 2 (virtual stages per pipeline rank)";
     }},
    // The split's per-chunk rules (kSplitRules) with vpp chunks a stage.
    {LayoutRule::vpp_divides_stage_layers,
     [](const LayoutView& v) { return interleaved(v.p) && split_rule(v) == LayoutRule::vpp_divides_stage_layers; },
     vpp_divides_message},
    {LayoutRule::chunks_hold_a_layer,
     [](const LayoutView& v) { return interleaved(v.p) && split_rule(v) == LayoutRule::chunks_hold_a_layer; },
     chunks_hold_a_layer_message},
    // Megatron-Core runs the micro-batches in groups of pp (microbatch_group_size_per_vp_stage) and
    // refuses a last group smaller than pp, which stalls the pipeline (schedules.py): m a multiple of pp.
    {LayoutRule::interleaved_needs_microbatches,
     [](const LayoutView& v) { return interleaved(v.p) && num_microbatches(v.t, v.p) % v.p.pp != 0; },
     [](const LayoutView& v) {
       return "the interleaved schedule needs a multiple of pp = " + std::to_string(v.p.pp) +
              " micro-batches per pipeline (global batch / (micro-batch x dp)), got " +
              std::to_string(num_microbatches(v.t, v.p));
     }},
    {LayoutRule::vpp_needs_interleaved, [](const LayoutView& v) { return !interleaved(v.p) && v.p.vpp != 1; },
     [](const LayoutView& v) { return "--vpp " + std::to_string(v.p.vpp) + " needs --schedule interleaved"; }},
    // deepseek-ai/DualPipe@bb214e8 dualpipe.py step(): num_ranks % 2 == 0, num_chunks % 2 == 0 and
    // num_chunks >= num_ranks * 2.
    {LayoutRule::dualpipe_needs_even_pp,
     [](const LayoutView& v) { return v.p.schedule == Schedule::dualpipe && (v.p.pp < 2 || v.p.pp % 2 != 0); },
     [](const LayoutView& v) {
       return "the dualpipe schedule needs an even pp >= 2 (rank i holds stages i and pp-1-i), got pp " +
              std::to_string(v.p.pp);
     }},
    {LayoutRule::dualpipe_needs_microbatches,
     [](const LayoutView& v) {
       const int m = num_microbatches(v.t, v.p);
       return v.p.schedule == Schedule::dualpipe && (m % 2 != 0 || m < 2 * v.p.pp);
     },
     [](const LayoutView& v) {
       return "the dualpipe schedule needs an even number of micro-batches per pipeline, at least 2 x pp = " +
              std::to_string(2 * v.p.pp) + " (global batch / (micro-batch x dp)), got " +
              std::to_string(num_microbatches(v.t, v.p));
     }},
};

const Rule kContextRules[] = {
    {LayoutRule::cp_divides_seq, [](const LayoutView& v) { return v.p.cp > 1 && v.t.seq_len % (2 * v.p.cp) != 0; },
     [](const LayoutView& v) {
       return "sequence length " + std::to_string(v.t.seq_len) + " is not divisible by 2*cp = " +
              std::to_string(2 * v.p.cp) + " (context parallel splits each sequence into 2*cp load-balanced chunks)";
     }},
};

const Rule kPositionRules[] = {
    {LayoutRule::seq_within_positions,
     [](const LayoutView& v) {
       return v.model.position == PositionKind::learned && v.t.seq_len > v.model.max_seq_len;
     },
     [](const LayoutView& v) {
       return "sequence length " + std::to_string(v.t.seq_len) + " exceeds the " +
              std::to_string(v.model.max_seq_len) + " learned positions of " + v.model.name;
     }},
};

const Rule kExpertRules[] = {
    {LayoutRule::etp_positive, [](const LayoutView& v) { return v.p.etp < 0; },
     [](const LayoutView& v) {
       return "--etp must be a positive integer (or 0: same as tp), got " + std::to_string(v.p.etp);
     }},
    // etp equal to tp is Megatron's default, which a dense model may name.
    {LayoutRule::ep_needs_moe,
     [](const LayoutView& v) {
       return !v.model.is_moe() && (v.p.ep > 1 || (v.p.etp > 0 && v.p.etp != v.p.tp));
     },
     [](const LayoutView& v) {
       return (v.p.ep > 1 ? "--ep " + std::to_string(v.p.ep) : "--etp " + std::to_string(v.p.etp)) +
              " needs a mixture-of-experts model; " + v.model.name + " is dense";
     }},
    {LayoutRule::ep_divides_experts,
     [](const LayoutView& v) { return v.model.is_moe() && v.model.num_experts % v.p.ep != 0; },
     [](const LayoutView& v) {
       return "ep " + std::to_string(v.p.ep) + " does not divide the " + std::to_string(v.model.num_experts) +
              " experts; valid ep: " + divisors_of(v.model.num_experts);
     }},
    {LayoutRule::etp_divides_expert_ffn,
     [](const LayoutView& v) { return v.model.is_moe() && v.model.ffn_hidden_size % v.p.expert_tp() != 0; },
     [](const LayoutView& v) {
       return "etp " + std::to_string(v.p.expert_tp()) + " does not divide the expert FFN size " +
              std::to_string(v.model.ffn_hidden_size) + "; valid etp: " + divisors_of(v.model.ffn_hidden_size);
     }},
    // Megatron-Core's parallel_state.py builds the expert groups from the tp*cp*dp ranks of each
    // pipeline stage (etp fastest, then ep, then expert dp), so ep*etp must divide them.
    {LayoutRule::ep_etp_divides_tp_cp_dp,
     [](const LayoutView& v) {
       const ParallelConfig& p = v.p;
       return v.model.is_moe() && (static_cast<long long>(p.tp) * p.cp * p.dp) %
                                          (static_cast<long long>(p.ep) * p.expert_tp()) !=
                                      0;
     },
     [](const LayoutView& v) {
       const ParallelConfig& p = v.p;
       const long long ranks = static_cast<long long>(p.tp) * p.cp * p.dp;
       return "ep*etp = " + std::to_string(p.ep) + "*" + std::to_string(p.expert_tp()) +
              " must divide tp*cp*dp = " + std::to_string(ranks) +
              " (the MoE layers fold etp, ep and expert dp over those ranks); valid ep*etp: " +
              divisors_of(static_cast<int>(ranks));
     }},
};

const Rule kShardingRules[] = {
    {LayoutRule::zero_stage_exists, [](const LayoutView& v) { return v.p.zero_stage < 0 || v.p.zero_stage > 3; },
     [](const LayoutView& v) {
       return "ZeRO stage " + std::to_string(v.p.zero_stage) + " does not exist; choose 0, 1, 2 or 3";
     }},
    {LayoutRule::dist_opt_needs_zero_0_or_1,
     [](const LayoutView& v) { return v.p.distributed_optimizer && v.p.zero_stage > 1; },
     [](const LayoutView& v) {
       return "--dist-opt is Megatron's distributed optimizer (ZeRO-1 sharding); combine it with --zero 0 or 1, "
              "not " +
              std::to_string(v.p.zero_stage);
     }},
};

const Rule kSequenceRules[] = {
    {LayoutRule::sp_needs_tp, [](const LayoutView& v) { return v.p.sequence_parallel && v.p.tp < 2; },
     [](const LayoutView&) -> std::string { return "sequence parallel (--sp) needs tp >= 2"; }},
};

// Megatron-Core's MoE communication options: the flex dispatcher with DeepEP
// (transformer_config.py, token_dispatcher.py MoEFlexTokenDispatcher: "Flex token dispatcher
// requires TPxEP > 1") and --overlap-moe-expert-parallel-comm (transformer_config.py
// __post_init__ at core_v0.14.0: ep > 1, alltoall or flex dispatcher, a virtual pipeline when
// pp > 1, no full recompute, a bf16 or fp16 model).
bool overlap(const LayoutView& v) { return v.p.overlap_ep_comm; }
const Rule kMoeCommRules[] = {
    {LayoutRule::deepep_needs_moe,
     [](const LayoutView& v) { return v.p.moe_dispatcher == MoeDispatcher::deepep && !v.model.is_moe(); },
     [](const LayoutView& v) {
       return "--moe-dispatcher deepep needs a mixture-of-experts model; " + v.model.name +
              " is dense: use --moe-dispatcher alltoall (the default)";
     }},
    {LayoutRule::deepep_needs_expert_groups,
     [](const LayoutView& v) {
       return v.p.moe_dispatcher == MoeDispatcher::deepep && static_cast<long long>(v.p.ep) * v.p.expert_tp() < 2;
     },
     [](const LayoutView& v) -> std::string {
       return "--moe-dispatcher deepep needs ep*etp > 1 (Megatron-Core's flex dispatcher runs over the etp x ep "
              "group and asserts TPxEP > 1); choose --ep among " +
              divisors_of(v.model.num_experts, 2) + ", or --moe-dispatcher alltoall";
     }},
    {LayoutRule::moe_comm_needs_megatron,
     [](const LayoutView& v) {
       return (overlap(v) || v.p.moe_dispatcher != MoeDispatcher::alltoall) && v.t.engine.engine != Engine::megatron;
     },
     [](const LayoutView& v) {
       return std::string(overlap(v) ? "--overlap-ep-comm" : "--moe-dispatcher deepep") +
              " is Megatron-Core's (its combined 1F1B schedule, its flex dispatcher); the plan's engine is " +
              engine_label(v.t.engine) + ": use --engine megatron";
     }},
    {LayoutRule::ep_overlap_needs_moe, [](const LayoutView& v) { return overlap(v) && !v.model.is_moe(); },
     [](const LayoutView& v) {
       return "--overlap-ep-comm needs a mixture-of-experts model; " + v.model.name + " is dense: drop it";
     }},
    {LayoutRule::ep_overlap_needs_ep, [](const LayoutView& v) { return overlap(v) && v.p.ep < 2; },
     [](const LayoutView& v) -> std::string {
       return "--overlap-ep-comm needs ep > 1 (Megatron-Core asserts expert_model_parallel_size > 1); choose --ep "
              "among " + divisors_of(v.model.num_experts, 2) + ", or drop --overlap-ep-comm";
     }},
    {LayoutRule::ep_overlap_needs_schedule,
     [](const LayoutView& v) {
       return overlap(v) && v.p.pp > 1 && v.p.schedule != Schedule::interleaved && v.p.schedule != Schedule::dualpipe;
     },
     [](const LayoutView& v) {
       return "--overlap-ep-comm with pp " + std::to_string(v.p.pp) + " needs --schedule interleaved with --vpp >= 2 "
              "(Megatron-Core runs its combined 1F1B without a pipeline or interleaved, and asserts a virtual "
              "pipeline size when pp > 1) or --schedule dualpipe; the schedule is " + to_string(v.p.schedule);
     }},
    {LayoutRule::ep_overlap_no_full_recompute,
     [](const LayoutView& v) { return overlap(v) && v.p.recompute == Recompute::full; },
     [](const LayoutView&) -> std::string {
       return "--overlap-ep-comm does not run with full recompute (Megatron-Core asserts recompute_granularity != "
              "full); use --recompute none or selective";
     }},
    {LayoutRule::ep_overlap_needs_16bit,
     [](const LayoutView& v) { return overlap(v) && v.t.precision == Precision::fp32; },
     [](const LayoutView&) -> std::string {
       return "--overlap-ep-comm needs bf16, fp16 or fp8 training (Megatron-Core asserts a bf16 or fp16 model); "
              "use --precision bf16";
     }},
};

const Rule kVocabRules[] = {
    {LayoutRule::vocab_pad_positive, [](const LayoutView& v) { return v.t.vocab_pad_multiple < 1; },
     [](const LayoutView&) -> std::string { return "vocab padding multiple must be positive"; }},
};

// The rules check_layout checks after the sizes, tp and the pipeline split, in order.
const std::span<const Rule> kRulesAfterSplit[] = {kBatchRules,    kScheduleRules, kContextRules,
                                                  kPositionRules, kExpertRules,   kShardingRules,
                                                  kSequenceRules, kVocabRules,    kMoeCommRules};

LayoutRule first_broken(std::span<const Rule> rules, const LayoutView& v) {
  for (const Rule& r : rules)
    if (r.broken(v)) return r.rule;
  return LayoutRule::ok;
}

// For the check_* functions that take a part of a layout: the parts they do not read.
const ModelSpec& no_model() {
  static const ModelSpec model;
  return model;
}
const TrainingSpec& no_training() {
  static const TrainingSpec training;
  return training;
}

}  // namespace

LayoutRule check_tensor_parallel(const ModelSpec& model, int tp) {
  ParallelConfig p;
  p.tp = tp;
  return first_broken(kTensorRules, LayoutView{model, no_training(), p, tp});
}

// The split's rules (kSplitRules) with one chunk a stage: pp within the layers, one way to split,
// the counts adding up, every stage holding a layer, the embedding or the loss. The chunks' rules
// need the schedule: check_schedule's.
LayoutRule check_pipeline_parallel(const ModelSpec& model, const ParallelConfig& p) {
  ParallelConfig one_chunk = p;
  one_chunk.schedule = Schedule::one_f_one_b;
  return stage_slots(model.num_layers, one_chunk).rule;  // one chunk a stage: vpp divides every count
}

LayoutRule check_batch(const TrainingSpec& t, int micro_batch, int dp) {
  ParallelConfig p;
  p.micro_batch = micro_batch, p.dp = dp;
  return first_broken(kBatchRules, LayoutView{no_model(), t, p, dp});
}

LayoutRule check_schedule(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  return first_broken(kScheduleRules, LayoutView{model, t, p, p.world_size()});
}

LayoutRule check_context_parallel(const TrainingSpec& t, int cp) {
  ParallelConfig p;
  p.cp = cp;
  return first_broken(kContextRules, LayoutView{no_model(), t, p, cp});
}

LayoutRule check_expert_parallel(const ModelSpec& model, const ParallelConfig& p) {
  return first_broken(kExpertRules, LayoutView{model, no_training(), p, p.world_size()});
}

LayoutRule check_sharding(const ParallelConfig& p) {
  return first_broken(kShardingRules, LayoutView{no_model(), no_training(), p, p.world_size()});
}

LayoutRule check_sequence_parallel(const ParallelConfig& p) {
  return first_broken(kSequenceRules, LayoutView{no_model(), no_training(), p, p.world_size()});
}

LayoutRule check_moe_comm(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  return first_broken(kMoeCommRules, LayoutView{model, t, p, p.world_size()});
}

long long bounded_world_size(long long tp, long long pp, long long dp, long long cp) {
  long long world = 1;
  for (long long size : {tp, pp, dp, cp}) {
    if (size > kMaxGpus) return kMaxGpus + 1LL;
    world *= size;  // at most 2^20 * 2^20: no overflow
    if (world > kMaxGpus) return kMaxGpus + 1LL;
  }
  return world;
}

LayoutRule check_layout(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p, int gpus) {
  const LayoutView v{model, t, p, gpus};
  if (LayoutRule rule = first_broken(kSizeRules, v); rule != LayoutRule::ok) return rule;
  // With positive sizes every check is defined; the first broken rule in this order is reported.
  if (LayoutRule rule = first_broken(kTensorRules, v); rule != LayoutRule::ok) return rule;
  if (LayoutRule rule = check_pipeline_parallel(model, p); rule != LayoutRule::ok) return rule;
  for (std::span<const Rule> rules : kRulesAfterSplit)
    if (LayoutRule rule = first_broken(rules, v); rule != LayoutRule::ok) return rule;
  return LayoutRule::ok;
}

namespace {

// validate()'s message for a broken rule, naming the valid choices: the message its table entry holds.
std::string rule_message(LayoutRule rule, const LayoutView& v) {
  for (const SplitRule& r : kSplitRules)
    if (r.rule == rule) return r.message(v);
  std::vector<std::span<const Rule>> tables = {kSizeRules, kTensorRules};
  tables.insert(tables.end(), std::begin(kRulesAfterSplit), std::end(kRulesAfterSplit));
  for (std::span<const Rule> rules : tables)
    for (const Rule& r : rules)
      if (r.rule == rule) return r.message(v);
  return "";
}

}  // namespace

std::optional<std::string> pipeline_split_problem(const ModelSpec& model, const ParallelConfig& p) {
  const LayoutRule rule = stage_slots(model.num_layers, p).rule;
  if (rule == LayoutRule::ok) return std::nullopt;
  return rule_message(rule, LayoutView{model, TrainingSpec{}, p, p.world_size()});
}

std::optional<std::string> moe_comm_problem(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  const LayoutRule rule = check_moe_comm(model, t, p);
  if (rule == LayoutRule::ok) return std::nullopt;
  return rule_message(rule, LayoutView{model, t, p, p.world_size()});
}

std::optional<std::string> layout_problem(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  const LayoutRule rule = check_layout(model, t, p, p.world_size());
  if (rule == LayoutRule::ok) return std::nullopt;
  return rule_message(rule, LayoutView{model, t, p, p.world_size()});
}

void validate(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& t, const ParallelConfig& p,
              int gpus) {
  if (LayoutRule rule = check_layout(model, t, p, gpus); rule != LayoutRule::ok)
    bad(rule_message(rule, LayoutView{model, t, p, gpus}));
  if (auto problem = moe_dispatcher_problem(cluster, p.moe_dispatcher)) bad(*problem);
  if (t.fp32_grads && t.grad_reduce_in_bf16)
    bad("fp32 gradients and a bf16 gradient reduce contradict each other; choose --fp32-grads or --grad-reduce-in-bf16");
  peak_flops_per_s(cluster.gpu, t.precision);  // throws if the GPU lacks this precision
}

json to_json(const TrainingSpec& t) {
  json j{{"seq_len", t.seq_len},
              {"global_batch", t.global_batch},
              {"precision", to_string(t.precision)},
              {"attention", to_string(t.attention)},
              {"fp32_grads", t.fp32_grads},
              {"vocab_pad_multiple", t.vocab_pad_multiple},
              {"bucket_mib", t.bucket_bytes / kMiB}};
  // The engine where it is not Megatron-LM's (which plans without the key were priced as), so that
  // such plans read back and write byte for byte as before.
  if (!(t.engine == engine_mechanics(Engine::megatron))) j["engine"] = engine_label(t.engine);
  if (!t.gradient_accumulation_fusion) j["gradient_accumulation_fusion"] = false;  // written where off, likewise
  if (t.grad_reduce_in_bf16) j["grad_reduce_in_bf16"] = true;  // written where set, likewise
  if (t.bf16_adam_moments) j["bf16_adam_moments"] = true;
  if (!t.recompute_modules.is_default()) j["recompute_modules"] = to_strings(t.recompute_modules);
  if (t.cross_entropy_fusion) j["cross_entropy_fusion"] = true;
  if (t.embedding_wgrad_deferral) j["embedding_wgrad_deferral"] = *t.embedding_wgrad_deferral;
  return j;
}

json to_json(const ParallelConfig& p) {
  json j{{"tp", p.tp},
         {"pp", p.pp},
         {"dp", p.dp},
         {"cp", p.cp},
         {"ep", p.ep},
         {"vpp", p.vpp},
         {"micro_batch", p.micro_batch},
         {"zero_stage", p.zero_stage},
         {"distributed_optimizer", p.distributed_optimizer},
         {"sequence_parallel", p.sequence_parallel},
         {"offload_optimizer", p.offload_optimizer},
         {"recompute", to_string(p.recompute)},
         {"schedule", to_string(p.schedule)},
         {"layers_per_stage", p.layers_per_stage}};
  // etp only when set: absent means "same as tp" (Megatron's default), so plans written before
  // expert tensor parallel read back unchanged.
  if (p.etp > 0) j["etp"] = p.etp;
  // Megatron's uneven split: written where given, so that files of even splits stay as before.
  if (p.first_stage_layers) j["first_stage_layers"] = p.first_stage_layers;
  if (p.last_stage_layers) j["last_stage_layers"] = p.last_stage_layers;
  if (p.account_for_embedding) j["account_for_embedding"] = true;
  if (p.account_for_loss) j["account_for_loss"] = true;
  // MoE communication: written where not the default, so that other plans stay as they were.
  if (p.moe_dispatcher != MoeDispatcher::alltoall) j["moe_dispatcher"] = to_string(p.moe_dispatcher);
  if (p.overlap_ep_comm) j["overlap_ep_comm"] = true;
  return j;
}

TrainingSpec training_from_json(const json& j, const std::string& file, const std::string& pointer) {
  ObjectReader r(j, file, pointer);
  TrainingSpec t;
  t.seq_len = static_cast<int>(r.int_in("seq_len", 1, kMaxSeqLen));
  t.global_batch = static_cast<int>(r.int_in("global_batch", 1, kMaxGlobalBatch));
  t.precision = precision_from_string(r.one_of("precision", {"fp32", "bf16", "fp16", "fp8"}));
  t.attention = attention_from_string(r.one_of("attention", {"flash", "standard"}));
  t.fp32_grads = r.boolean("fp32_grads");
  if (r.has("grad_reduce_in_bf16")) t.grad_reduce_in_bf16 = r.boolean("grad_reduce_in_bf16");
  if (r.has("bf16_adam_moments")) t.bf16_adam_moments = r.boolean("bf16_adam_moments");
  if (r.has("gradient_accumulation_fusion")) t.gradient_accumulation_fusion = r.boolean("gradient_accumulation_fusion");
  if (r.has("cross_entropy_fusion")) t.cross_entropy_fusion = r.boolean("cross_entropy_fusion");
  if (r.has("embedding_wgrad_deferral"))
    t.embedding_wgrad_deferral = static_cast<int>(r.int_in("embedding_wgrad_deferral", 0, kMaxGlobalBatch));
  // Megatron's --recompute-modules, written where not its default (core_attn).
  if (r.has("recompute_modules")) {
    const json& list = r.raw("recompute_modules");
    std::vector<std::string> names;
    if (!list.is_array() || list.empty()) r.fail("recompute_modules", "a list of recompute module names");
    for (const json& n : list) {
      if (!n.is_string()) r.fail("recompute_modules", "a list of recompute module names");
      names.push_back(n.get<std::string>());
    }
    try {
      t.recompute_modules = recompute_modules_from_names(names);
    } catch (const InputError& e) {
      throw InputError(r.where("recompute_modules") + ": " + e.what());
    }
  }
  t.vocab_pad_multiple = static_cast<int>(r.int_in("vocab_pad_multiple", 1, 1 << 16));
  t.bucket_bytes = r.number_in("bucket_mib", 1e-3, 1e6) * kMiB;
  // "megatron" or "deepspeed@v0.3" (engine.h); plans written before engines were priced have none:
  // Megatron-LM, which they were priced as.
  if (r.has("engine")) {
    const std::string label = r.string("engine");
    try {
      t.engine = engine_mechanics_from_label(label);
    } catch (const InputError& e) {
      throw InputError(r.where("engine") + ": " + e.what());
    }
  }
  r.finish();
  return t;
}

ParallelConfig parallel_from_json(const json& j, const std::string& file, const std::string& pointer) {
  ObjectReader r(j, file, pointer);
  ParallelConfig p;
  for (auto [key, size] : {std::pair{"tp", &p.tp}, {"pp", &p.pp}, {"dp", &p.dp}, {"cp", &p.cp}, {"ep", &p.ep}})
    *size = static_cast<int>(r.int_in(key, 1, kMaxGpus));
  if (bounded_world_size(p.tp, p.pp, p.dp, p.cp) > kMaxGpus)
    r.fail("dp", "sizes whose product tp*pp*dp*cp is at most " + std::to_string(kMaxGpus));
  if (r.has("etp")) p.etp = static_cast<int>(r.int_in("etp", 1, kMaxGpus));  // absent: as tp
  p.vpp = static_cast<int>(r.int_in("vpp", 1, kMaxVirtualStages));
  p.micro_batch = static_cast<int>(r.int_in("micro_batch", 1, kMaxGlobalBatch));
  p.zero_stage = static_cast<int>(r.int_in("zero_stage", 0, 3));
  p.distributed_optimizer = r.boolean("distributed_optimizer");
  p.sequence_parallel = r.boolean("sequence_parallel");
  p.offload_optimizer = r.boolean("offload_optimizer");
  p.recompute = recompute_from_string(r.one_of("recompute", {"none", "selective", "full"}));
  p.schedule = schedule_from_string(r.one_of("schedule", schedule_names()));
  const json& layers = r.raw("layers_per_stage");
  if (!layers.is_array()) r.fail("layers_per_stage", "a list of layer counts");
  for (const auto& n : layers) {
    if (!n.is_number_integer() || n.get<long long>() < 1 || n.get<long long>() > (1 << 16))
      r.fail("layers_per_stage", "a list of layer counts from 1 to 65536");
    p.layers_per_stage.push_back(n.get<int>());
  }
  // Megatron's uneven split, optional so that files written before it still read (absent: not
  // given); first/last 0 means not given (Megatron's None).
  if (r.has("first_stage_layers")) p.first_stage_layers = static_cast<int>(r.int_in("first_stage_layers", 0, 1 << 16));
  if (r.has("last_stage_layers")) p.last_stage_layers = static_cast<int>(r.int_in("last_stage_layers", 0, 1 << 16));
  if (r.has("account_for_embedding")) p.account_for_embedding = r.boolean("account_for_embedding");
  if (r.has("account_for_loss")) p.account_for_loss = r.boolean("account_for_loss");
  // Absent: the alltoall dispatcher without the EP overlap (what plans before them were priced as).
  if (r.has("moe_dispatcher")) p.moe_dispatcher = moe_dispatcher_from_string(r.one_of("moe_dispatcher", {"alltoall", "deepep"}));
  if (r.has("overlap_ep_comm")) p.overlap_ep_comm = r.boolean("overlap_ep_comm");
  r.finish();
  return p;
}

}  // namespace dplan::costmodel
