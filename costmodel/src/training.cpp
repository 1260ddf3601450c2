#include "dplan/costmodel/training.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/units.h"

namespace dplan::costmodel {
namespace {

std::string divisors_of(int n) {
  std::vector<std::string> out;
  for (int d = 1; d <= n; ++d)
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
  return s == Schedule::gpipe ? "gpipe" : s == Schedule::one_f_one_b ? "1f1b" : "interleaved";
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
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  if (s == "interleaved") return Schedule::interleaved;
  bad("unknown schedule \"" + s + "\"; choose gpipe, 1f1b or interleaved");
}

double activation_bytes(Precision precision) { return precision == Precision::fp32 ? 4.0 : 2.0; }

int num_microbatches(const TrainingSpec& t, const ParallelConfig& p) {
  return t.global_batch / (p.micro_batch * p.dp);
}

namespace {

int interleaved_chunks(const ParallelConfig& p) { return p.schedule == Schedule::interleaved ? p.vpp : 1; }

// Slots per pipeline stage (transformer layers, plus the embedding and the loss where accounted as
// a layer each) and the first rule the split breaks; see assign_chunks in training.h. Megatron-LM:
// get_num_layers_to_build (megatron/core/transformer/transformer_block.py), with the checks of
// TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py): first/last
// counts exclude the accounting flags, the other stages split the rest evenly, with vpp every
// stage's count divides by vpp, and with the accounting flags pp (* vpp) divides the slots.
struct StageSlots {
  std::vector<int> slots;
  LayoutRule rule = LayoutRule::ok;
};

StageSlots stage_slots(int num_layers, const ParallelConfig& p) {
  StageSlots out;
  auto broken = [&](LayoutRule rule) {
    out.rule = rule;
    return out;
  };
  const int pp = p.pp, v = interleaved_chunks(p);
  const bool listed = !p.layers_per_stage.empty();
  const bool first_last = p.first_stage_layers != 0 || p.last_stage_layers != 0;
  const bool accounted = p.account_for_embedding || p.account_for_loss;
  const int extra = int(p.account_for_embedding) + int(p.account_for_loss);
  if (int(listed) + int(first_last) + int(accounted) > 1) return broken(LayoutRule::split_one_way);
  if (pp > num_layers + extra) return broken(LayoutRule::pp_within_layers);
  if (listed) {
    if (int(p.layers_per_stage.size()) != pp) return broken(LayoutRule::stages_listed);
    out.slots = p.layers_per_stage;
  } else if (first_last) {
    if (pp < 2) return broken(LayoutRule::first_last_need_pp);
    if (p.first_stage_layers < 0 || p.last_stage_layers < 0) return broken(LayoutRule::split_adds_up);
    // The stages without a given count share the rest evenly (Megatron asserts it divides).
    long long rest = num_layers;
    int others = pp;
    if (p.first_stage_layers) rest -= p.first_stage_layers, --others;
    if (p.last_stage_layers) rest -= p.last_stage_layers, --others;
    if (rest < 0 || (others == 0 && rest != 0) || (others > 0 && rest % others != 0))
      return broken(LayoutRule::split_adds_up);
    const int middle = others > 0 ? int(rest / others) : 0;
    out.slots.assign(pp, middle);
    if (p.first_stage_layers) out.slots.front() = p.first_stage_layers;
    if (p.last_stage_layers) out.slots.back() = p.last_stage_layers;
  } else if (accounted) {
    // Megatron: (L + embedding + loss) % pp == 0, and % (pp * vpp) == 0 interleaved.
    if ((num_layers + extra) % pp != 0) return broken(LayoutRule::split_adds_up);
    out.slots.assign(pp, (num_layers + extra) / pp);
  } else {
    // dplan's default: even, any remainder to the middle stages first (the first stage also runs
    // the embedding, the last the LM head and loss), then the last, then the first.
    out.slots.assign(pp, num_layers / pp);
    std::vector<int> order;
    for (int s = 1; s + 1 < pp; ++s) order.push_back(s);
    if (pp > 1) order.push_back(pp - 1);
    order.push_back(0);
    for (int i = 0; i < num_layers % pp; ++i) out.slots[order[i]] += 1;
  }
  long long sum = 0;
  for (int n : out.slots) sum += n;
  if (sum != num_layers + extra) return broken(LayoutRule::split_adds_up);
  for (int n : out.slots)
    if (n % v != 0) return broken(LayoutRule::vpp_divides_stage_layers);
  for (int n : out.slots)
    if (n / v < 1) return broken(LayoutRule::chunks_hold_a_layer);
  return out;
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
  return chunks;
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
  if (p.pp == 1) return 1.0;
  switch (p.schedule) {
    case Schedule::gpipe:
      return m;
    case Schedule::one_f_one_b:
      return std::min(p.pp - stage, m);
    case Schedule::interleaved: {
      // The warm-up forwards of pipeline_order (pipeline.h) and the one more that runs before the
      // first backward; with only pp micro-batches every forward is warm-up (Megatron-Core's
      // schedules.py). A test checks this against the order itself.
      int v = p.vpp;
      int chunks = m == p.pp ? m * v : std::min(2 * (p.pp - stage - 1) + (v - 1) * p.pp + 1, m * v);
      return double(chunks) / v;
    }
  }
  return m;
}

double layer_microbatches_in_flight(const ParallelConfig& p, const std::vector<ModelChunk>& chunks, int stage,
                                    int m) {
  int layers = 0;
  for (const ModelChunk& c : chunks) layers += c.num_layers;
  const double in_flight = microbatches_in_flight(p, stage, m);
  const int v = int(chunks.size());
  if (p.pp == 1 || p.schedule != Schedule::interleaved || v == 1) return layers * in_flight;
  // The first in_flight * v forwards of the stage, in schedules.py's order.
  long long left = std::llround(in_flight * v), sum = 0;
  for (int first = 0; first < m && left > 0; first += p.pp)
    for (int c = 0; c < v && left > 0; ++c) {
      const long long n = std::min<long long>(left, std::min(p.pp, m - first));
      sum += n * chunks[c].num_layers;
      left -= n;
    }
  return double(sum);
}

LayoutRule check_tensor_parallel(const ModelSpec& model, int tp) {
  if (std::gcd(model.num_heads, model.num_kv_heads) % tp != 0) return LayoutRule::tp_divides_heads;
  if (model.ffn_hidden_size % tp != 0) return LayoutRule::tp_divides_ffn;
  return LayoutRule::ok;
}

// The split's rules (stage_slots) with one chunk a stage: pp within the layers, one way to split,
// the counts adding up, every stage holding a layer, the embedding or the loss. The chunks' rules
// need the schedule: check_schedule's.
LayoutRule check_pipeline_parallel(const ModelSpec& model, const ParallelConfig& p) {
  ParallelConfig one_chunk = p;
  one_chunk.schedule = Schedule::one_f_one_b;
  return stage_slots(model.num_layers, one_chunk).rule;  // one chunk a stage: vpp divides every count
}

LayoutRule check_batch(const TrainingSpec& t, int micro_batch, int dp) {
  return t.global_batch % (static_cast<long long>(micro_batch) * dp) != 0 ? LayoutRule::batch_divisible
                                                                         : LayoutRule::ok;
}

LayoutRule check_schedule(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  if (p.schedule == Schedule::interleaved) {
    if (p.pp < 2) return LayoutRule::interleaved_needs_pp;
    if (p.vpp < 2) return LayoutRule::interleaved_needs_vpp;
    if (LayoutRule rule = stage_slots(model.num_layers, p).rule;
        rule == LayoutRule::vpp_divides_stage_layers || rule == LayoutRule::chunks_hold_a_layer)
      return rule;
    // Megatron-Core runs the micro-batches in groups of pp (microbatch_group_size_per_vp_stage) and
    // refuses a last group smaller than pp, which stalls the pipeline (schedules.py): m a multiple of pp.
    if (num_microbatches(t, p) % p.pp != 0) return LayoutRule::interleaved_needs_microbatches;
  } else if (p.vpp != 1) {
    return LayoutRule::vpp_needs_interleaved;
  }
  return LayoutRule::ok;
}

LayoutRule check_context_parallel(const TrainingSpec& t, int cp) {
  return cp > 1 && t.seq_len % (2 * cp) != 0 ? LayoutRule::cp_divides_seq : LayoutRule::ok;
}

LayoutRule check_expert_parallel(const ModelSpec& model, const ParallelConfig& p) {
  if (p.etp < 0) return LayoutRule::etp_positive;
  if (!model.is_moe())  // etp equal to tp is Megatron's default, which a dense model may name
    return p.ep > 1 || (p.etp > 0 && p.etp != p.tp) ? LayoutRule::ep_needs_moe : LayoutRule::ok;
  if (model.num_experts % p.ep != 0) return LayoutRule::ep_divides_experts;
  if (model.ffn_hidden_size % p.expert_tp() != 0) return LayoutRule::etp_divides_expert_ffn;
  // Megatron-Core's parallel_state.py builds the expert groups from the tp*cp*dp ranks of each
  // pipeline stage (etp fastest, then ep, then expert dp), so ep*etp must divide them.
  if ((static_cast<long long>(p.tp) * p.cp * p.dp) % (static_cast<long long>(p.ep) * p.expert_tp()) != 0)
    return LayoutRule::ep_etp_divides_tp_cp_dp;
  return LayoutRule::ok;
}

LayoutRule check_sharding(const ParallelConfig& p) {
  if (p.zero_stage < 0 || p.zero_stage > 3) return LayoutRule::zero_stage_exists;
  if (p.distributed_optimizer && p.zero_stage > 1) return LayoutRule::dist_opt_needs_zero_0_or_1;
  return LayoutRule::ok;
}

LayoutRule check_sequence_parallel(const ParallelConfig& p) {
  return p.sequence_parallel && p.tp < 2 ? LayoutRule::sp_needs_tp : LayoutRule::ok;
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
  const std::pair<LayoutRule, long long> sizes[] = {
      {LayoutRule::gpus_positive, gpus},         {LayoutRule::tp_positive, p.tp},
      {LayoutRule::pp_positive, p.pp},           {LayoutRule::dp_positive, p.dp},
      {LayoutRule::cp_positive, p.cp},           {LayoutRule::ep_positive, p.ep},
      {LayoutRule::vpp_positive, p.vpp},         {LayoutRule::micro_batch_positive, p.micro_batch},
      {LayoutRule::global_batch_positive, t.global_batch}, {LayoutRule::seq_positive, t.seq_len}};
  for (const auto& [rule, size] : sizes)
    if (size < 1) return rule;
  if (gpus > kMaxGpus || p.tp > kMaxGpus || p.pp > kMaxGpus || p.dp > kMaxGpus || p.cp > kMaxGpus ||
      p.ep > kMaxGpus || p.etp > kMaxGpus || p.vpp > kMaxVirtualStages || p.micro_batch > kMaxGlobalBatch ||
      t.global_batch > kMaxGlobalBatch || t.seq_len > kMaxSeqLen)
    return LayoutRule::size_limit;
  if (bounded_world_size(p.tp, p.pp, p.dp, p.cp) != gpus) return LayoutRule::world_size;
  // With positive sizes every check is defined; the first broken rule in this order is reported.
  const LayoutRule positions = model.position == PositionKind::learned && t.seq_len > model.max_seq_len
                                   ? LayoutRule::seq_within_positions
                                   : LayoutRule::ok;
  const LayoutRule vocab = t.vocab_pad_multiple < 1 ? LayoutRule::vocab_pad_positive : LayoutRule::ok;
  for (LayoutRule rule :
       {check_tensor_parallel(model, p.tp), check_pipeline_parallel(model, p), check_batch(t, p.micro_batch, p.dp),
        check_schedule(model, t, p), check_context_parallel(t, p.cp), positions, check_expert_parallel(model, p),
        check_sharding(p), check_sequence_parallel(p), vocab})
    if (rule != LayoutRule::ok) return rule;
  return LayoutRule::ok;
}

namespace {

// validate()'s message for a broken rule, naming the valid choices.
std::string rule_message(LayoutRule rule, const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p,
                         int gpus) {
  auto not_positive = [](const char* name, long long v) {
    return std::string(name) + " must be a positive integer, got " + std::to_string(v);
  };
  switch (rule) {
    case LayoutRule::ok: return "";
    case LayoutRule::gpus_positive: return not_positive("--gpus", gpus);
    case LayoutRule::tp_positive: return not_positive("--tp", p.tp);
    case LayoutRule::pp_positive: return not_positive("--pp", p.pp);
    case LayoutRule::dp_positive: return not_positive("--dp", p.dp);
    case LayoutRule::cp_positive: return not_positive("--cp", p.cp);
    case LayoutRule::ep_positive: return not_positive("--ep", p.ep);
    case LayoutRule::vpp_positive: return not_positive("--vpp", p.vpp);
    case LayoutRule::micro_batch_positive: return not_positive("--mbs (micro-batch size)", p.micro_batch);
    case LayoutRule::global_batch_positive: return not_positive("--global-batch", t.global_batch);
    case LayoutRule::seq_positive: return not_positive("--seq", t.seq_len);
    case LayoutRule::size_limit:
      return "sizes must be at most: --gpus, tp, pp, dp, cp, ep and etp " + std::to_string(kMaxGpus) + ", vpp " +
             std::to_string(kMaxVirtualStages) + ", micro-batch and global batch " + std::to_string(kMaxGlobalBatch) +
             ", --seq " + std::to_string(kMaxSeqLen);
    case LayoutRule::world_size: {
      const long long world = bounded_world_size(p.tp, p.pp, p.dp, p.cp);
      std::string msg = "tp*pp*dp*cp = " + std::to_string(p.tp) + "*" + std::to_string(p.pp) + "*" +
                        std::to_string(p.dp) + "*" + std::to_string(p.cp) + " = " + std::to_string(world) +
                        " but --gpus is " + std::to_string(gpus);
      const long long model_parallel = static_cast<long long>(p.tp) * p.pp * p.cp;
      if (gpus % model_parallel == 0)
        msg += "; with these tp, pp and cp use --dp " + std::to_string(gpus / model_parallel);
      else
        msg += "; tp*pp*cp = " + std::to_string(model_parallel) + " must divide the GPU count";
      return msg;
    }
    case LayoutRule::tp_divides_heads: {
      int head_gcd = std::gcd(model.num_heads, model.num_kv_heads);
      return "tp " + std::to_string(p.tp) + " does not divide the " + std::to_string(model.num_heads) +
             " attention heads and " + std::to_string(model.num_kv_heads) + " key/value heads of " + model.name +
             "; valid tp: " + divisors_of(head_gcd);
    }
    case LayoutRule::tp_divides_ffn:
      return "tp " + std::to_string(p.tp) + " does not divide the FFN size " + std::to_string(model.ffn_hidden_size);
    case LayoutRule::pp_within_layers:
      return "pp " + std::to_string(p.pp) + " exceeds the " + std::to_string(model.num_layers) + " layers of " +
             model.name + (p.account_for_embedding || p.account_for_loss ? " (plus the accounted embedding/loss)" : "") +
             "; pp must be at most the layer count";
    case LayoutRule::split_one_way:
      return "choose one way to split the layers over the pipeline: a layers_per_stage list, --first-stage-layers/"
             "--last-stage-layers, or --account-for-embedding/--account-for-loss (Megatron-LM refuses both of the "
             "last two)";
    case LayoutRule::first_last_need_pp:
      return "--first-stage-layers/--last-stage-layers need pp >= 2, got pp " + std::to_string(p.pp);
    case LayoutRule::stages_listed:
      return "the layer assignment lists " + std::to_string(p.layers_per_stage.size()) + " stages but pp is " +
             std::to_string(p.pp);
    case LayoutRule::split_adds_up: {
      const int extra = int(p.account_for_embedding) + int(p.account_for_loss);
      if (!p.layers_per_stage.empty()) {
        long long sum = 0;
        for (int n : p.layers_per_stage) sum += n;
        return "the layer assignment holds " + std::to_string(sum) + " layers but " + model.name + " has " +
               std::to_string(model.num_layers);
      }
      if (p.first_stage_layers != 0 || p.last_stage_layers != 0) {
        const int others = p.pp - (p.first_stage_layers != 0) - (p.last_stage_layers != 0);
        const long long rest = (long long)model.num_layers - p.first_stage_layers - p.last_stage_layers;
        std::string given;
        if (p.first_stage_layers) given = "--first-stage-layers " + std::to_string(p.first_stage_layers);
        if (p.first_stage_layers && p.last_stage_layers) given += " and ";
        if (p.last_stage_layers) given += "--last-stage-layers " + std::to_string(p.last_stage_layers);
        return given + (p.first_stage_layers && p.last_stage_layers ? " leave " : " leaves ") + std::to_string(rest) +
               " of the " +
               std::to_string(model.num_layers) + " layers of " + model.name + " to " + std::to_string(others) +
               " other stages; choose counts that leave a multiple of " + std::to_string(std::max(others, 1)) +
               (others == 0 ? " (exactly none)" : "");
      }
      return "pp " + std::to_string(p.pp) + " does not divide the " + std::to_string(model.num_layers) +
             " layers of " + model.name + " plus " + std::to_string(extra) +
             " accounted (embedding/loss); choose pp among " + divisors_of(model.num_layers + extra) +
             ", or other --account-for-embedding/--account-for-loss, or --first-stage-layers/--last-stage-layers";
    }
    case LayoutRule::batch_divisible:
      return "global batch " + std::to_string(t.global_batch) + " is not divisible by micro-batch * dp = " +
             std::to_string(p.micro_batch) + "*" + std::to_string(p.dp) + " = " +
             std::to_string(static_cast<long long>(p.micro_batch) * p.dp) +
             "; choose a global batch that is a multiple of " +
             std::to_string(static_cast<long long>(p.micro_batch) * p.dp);
    case LayoutRule::interleaved_needs_pp: return "the interleaved schedule needs pp >= 2";
    case LayoutRule::interleaved_needs_vpp:
      return "the interleaved schedule needs --vpp >= 2 (virtual stages per pipeline rank)";
    case LayoutRule::vpp_divides_stage_layers: {
      ParallelConfig one_chunk = p;
      one_chunk.schedule = Schedule::one_f_one_b;
      for (int n : stage_slots(model.num_layers, one_chunk).slots)
        if (n % p.vpp != 0)
          return "vpp " + std::to_string(p.vpp) + " does not divide the " + std::to_string(n) +
                 " layers (embedding/loss accounted) of a pipeline stage; choose vpp among " + divisors_of(n) +
                 ", or a split whose stages' counts it divides (--first-stage-layers/--last-stage-layers, "
                 "--account-for-embedding/--account-for-loss)";
      return "";
    }
    case LayoutRule::chunks_hold_a_layer:
      return "every pipeline stage and model chunk needs at least one layer, the embedding or the loss; pp " +
             std::to_string(p.pp) + " x vpp " + std::to_string(p.schedule == Schedule::interleaved ? p.vpp : 1) +
             " leaves one empty";
    case LayoutRule::interleaved_needs_microbatches:
      return "the interleaved schedule needs a multiple of pp = " + std::to_string(p.pp) +
             " micro-batches per pipeline (global batch / (micro-batch x dp)), got " +
             std::to_string(num_microbatches(t, p));
    case LayoutRule::vpp_needs_interleaved:
      return "--vpp " + std::to_string(p.vpp) + " needs --schedule interleaved";
    case LayoutRule::cp_divides_seq:
      return "sequence length " + std::to_string(t.seq_len) + " is not divisible by 2*cp = " +
             std::to_string(2 * p.cp) + " (context parallel splits each sequence into 2*cp load-balanced chunks)";
    case LayoutRule::seq_within_positions:
      return "sequence length " + std::to_string(t.seq_len) + " exceeds the " + std::to_string(model.max_seq_len) +
             " learned positions of " + model.name;
    case LayoutRule::ep_needs_moe:
      return (p.ep > 1 ? "--ep " + std::to_string(p.ep) : "--etp " + std::to_string(p.etp)) +
             " needs a mixture-of-experts model; " + model.name + " is dense";
    case LayoutRule::ep_divides_experts:
      return "ep " + std::to_string(p.ep) + " does not divide the " + std::to_string(model.num_experts) +
             " experts; valid ep: " + divisors_of(model.num_experts);
    case LayoutRule::etp_positive:
      return "--etp must be a positive integer (or 0: same as tp), got " + std::to_string(p.etp);
    case LayoutRule::etp_divides_expert_ffn:
      return "etp " + std::to_string(p.expert_tp()) + " does not divide the expert FFN size " +
             std::to_string(model.ffn_hidden_size) + "; valid etp: " + divisors_of(model.ffn_hidden_size);
    case LayoutRule::ep_etp_divides_tp_cp_dp: {
      const long long ranks = static_cast<long long>(p.tp) * p.cp * p.dp;
      return "ep*etp = " + std::to_string(p.ep) + "*" + std::to_string(p.expert_tp()) + " must divide tp*cp*dp = " +
             std::to_string(ranks) + " (the MoE layers fold etp, ep and expert dp over those ranks); valid ep*etp: " +
             divisors_of(static_cast<int>(ranks));
    }
    case LayoutRule::zero_stage_exists:
      return "ZeRO stage " + std::to_string(p.zero_stage) + " does not exist; choose 0, 1, 2 or 3";
    case LayoutRule::dist_opt_needs_zero_0_or_1:
      return "--dist-opt is Megatron's distributed optimizer (ZeRO-1 sharding); combine it with --zero 0 or 1, not " +
             std::to_string(p.zero_stage);
    case LayoutRule::sp_needs_tp: return "sequence parallel (--sp) needs tp >= 2";
    case LayoutRule::vocab_pad_positive: return "vocab padding multiple must be positive";
  }
  return "";
}

}  // namespace

std::optional<std::string> pipeline_split_problem(const ModelSpec& model, const ParallelConfig& p) {
  const LayoutRule rule = stage_slots(model.num_layers, p).rule;
  if (rule == LayoutRule::ok) return std::nullopt;
  return rule_message(rule, model, TrainingSpec{}, p, p.world_size());
}

std::optional<std::string> layout_problem(const ModelSpec& model, const TrainingSpec& t, const ParallelConfig& p) {
  const LayoutRule rule = check_layout(model, t, p, p.world_size());
  if (rule == LayoutRule::ok) return std::nullopt;
  return rule_message(rule, model, t, p, p.world_size());
}

void validate(const ModelSpec& model, const ClusterSpec& cluster, const TrainingSpec& t, const ParallelConfig& p,
              int gpus) {
  if (LayoutRule rule = check_layout(model, t, p, gpus); rule != LayoutRule::ok)
    bad(rule_message(rule, model, t, p, gpus));
  peak_flops_per_s(cluster.gpu, t.precision);  // throws if the GPU lacks this precision
}

json to_json(const TrainingSpec& t) {
  return json{{"seq_len", t.seq_len},
              {"global_batch", t.global_batch},
              {"precision", to_string(t.precision)},
              {"attention", to_string(t.attention)},
              {"fp32_grads", t.fp32_grads},
              {"vocab_pad_multiple", t.vocab_pad_multiple},
              {"bucket_mib", t.bucket_bytes / kMiB}};
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
  t.vocab_pad_multiple = static_cast<int>(r.int_in("vocab_pad_multiple", 1, 1 << 16));
  t.bucket_bytes = r.number_in("bucket_mib", 1e-3, 1e6) * kMiB;
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
  p.schedule = schedule_from_string(r.one_of("schedule", {"gpipe", "1f1b", "interleaved"}));
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
  r.finish();
  return p;
}

}  // namespace dplan::costmodel
