#include "dplan/costmodel/run_record.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "dplan/costmodel/errors.h"
#include "format_version.h"

namespace dplan::costmodel {
namespace {

int positive(ObjectReader& r, const char* key, long long max) { return static_cast<int>(r.int_in(key, 1, max)); }

// Names used as keys (phases, memory components): printed in compare's tables.
void check_name(const ObjectReader& r, const std::string& pointer, const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 64 &&
                  std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!ok)
    throw InputError(r.file() + ": " + pointer + ": key \"" + quote_for_message(name) +
                     "\" is not a name (letters, digits and _, at most 64)");
}

// stage_of_rank: world size entries, each in [0, pp), every stage held by at least one rank.
std::vector<int> read_stage_of_rank(ObjectReader& run, const RunLayout& layout) {
  const json& list = run.raw("stage_of_rank");
  const std::string where = run.where("stage_of_rank");
  if (!list.is_array()) throw InputError(where + ": expected a list of stages, got " + describe_json_value(list));
  const long long world = static_cast<long long>(layout.tp) * layout.cp * layout.dp * layout.pp;
  if (static_cast<long long>(list.size()) != world)
    throw InputError(where + ": expected " + std::to_string(world) + " entries (tp*cp*dp*pp), got " +
                     std::to_string(list.size()));
  std::vector<int> stages;
  for (size_t r = 0; r < list.size(); ++r) {
    const json& s = list[r];
    if (!s.is_number_integer() || s.get<long long>() < 0 || s.get<long long>() >= layout.pp)
      throw InputError(where + "/" + std::to_string(r) + ": expected a stage in 0.." + std::to_string(layout.pp - 1) +
                       ", got " + describe_json_value(s));
    stages.push_back(s.get<int>());
  }
  for (int stage = 0; stage < layout.pp; ++stage)
    if (std::find(stages.begin(), stages.end(), stage) == stages.end())
      throw InputError(where + ": no rank runs stage " + std::to_string(stage));
  return stages;
}

}  // namespace

json to_json(const RunRecord& run) {
  const RunLayout& l = run.layout;
  json steps = json::array();
  for (const RunStep& s : run.steps) {
    json step = {{"step", s.step}, {"loss", s.loss}, {"time_s", s.time_s}, {"warmup", s.warmup},
                 {"tokens_per_s", s.tokens_per_s}};
    if (s.grad_norm) step["grad_norm"] = *s.grad_norm;
    steps.push_back(step);
  }
  json phases = json::object();
  for (const auto& [name, seconds] : run.phases_s) phases[name] = seconds;
  json memory = json::object();
  for (const auto& [rank, components] : run.memory_bytes) {
    json row = json::object();
    for (const auto& [name, bytes] : components) row[name] = bytes;
    memory[std::to_string(rank)] = row;
  }
  const StepTimeStats& t = run.step_time;
  auto parts = [](const FlopsByPart& f) {
    json row = json::object();
    for (int i = 0; i < kNumFlopParts; ++i) row[to_string(static_cast<FlopPart>(i))] = f[i];
    return row;
  };
  json flops = json::object();
  for (const auto& [rank, f] : run.flops_by_rank)
    flops[std::to_string(rank)] = {{"forward", parts(f.forward)}, {"recompute", parts(f.recompute)}};
  json out{
      {"format_version", run.format_version},
      {"generator", "dplan"},
      {"plan", run.plan},
      {"layout",
       {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"cp", l.cp}, {"micro_batch", l.micro_batch},
        {"num_microbatches", l.num_microbatches}, {"global_batch", l.global_batch}, {"seq_len", l.seq_len},
        {"schedule", to_string(l.schedule)}, {"zero_stage", l.zero_stage}, {"recompute", to_string(l.recompute)},
        {"sequence_parallel", l.sequence_parallel}}},
      {"config", run.config},
      {"environment", run.environment},
      {"steps", steps},
      {"step_time_s",
       {{"median", t.median_s}, {"mean", t.mean_s}, {"min", t.min_s}, {"max", t.max_s}, {"p10", t.p10_s},
        {"p90", t.p90_s}, {"stdev", t.stdev_s}, {"count", t.count}}},
      {"tokens_per_s", run.tokens_per_s},
      {"phases_s", phases},
      {"phases_by_rank_s", run.phases_by_rank_s},
      {"memory", memory},
      {"memory_source", run.memory_source},
      {"stage_of_rank", run.stage_of_rank},
      {"replicas", {{"identical", run.replicas_identical}, {"weights_hash_by_rank", run.weights_hash_by_rank}}}};
  if (!run.startup_s.empty()) out["startup_s"] = run.startup_s;
  if (!run.flops_by_rank.empty()) out["flops"] = flops;
  if (run.checkpoints) {
    const RunCheckpoints& c = *run.checkpoints;
    json saves = json::array();
    for (const CheckpointSave& s : c.saves) {
      long long file_total = 0, state_total = 0;
      for (long long b : s.file_bytes_by_rank) file_total += b;
      for (long long b : s.state_bytes_by_rank) state_total += b;
      saves.push_back({{"step", s.step}, {"blocking_s", s.blocking_s}, {"wait_s", s.wait_s}, {"write_s", s.write_s},
                       {"file_bytes_by_rank", s.file_bytes_by_rank}, {"state_bytes_by_rank", s.state_bytes_by_rank},
                       {"file_bytes", file_total}, {"state_bytes", state_total}});
    }
    json block = {{"dir", c.dir}, {"async", c.async}, {"saves", saves}};
    if (c.resumed_from_step) block["resumed_from"] = {{"step", *c.resumed_from_step}, {"folder", c.resumed_from}};
    if (c.stopped_by_signal) block["stopped_by_signal"] = *c.stopped_by_signal;
    out["checkpoints"] = block;
  }
  return out;
}

namespace {

RunLayout read_layout(ObjectReader& r) {
  ObjectReader layout = r.object("layout");
  RunLayout l;
  l.tp = positive(layout, "tp", kMaxGpus);
  l.pp = positive(layout, "pp", kMaxGpus);
  l.dp = positive(layout, "dp", kMaxGpus);
  l.cp = positive(layout, "cp", kMaxGpus);
  if (bounded_world_size(l.tp, l.pp, l.dp, l.cp) > kMaxGpus)
    layout.fail("dp", "sizes whose product tp*pp*dp*cp is at most " + std::to_string(kMaxGpus));
  l.micro_batch = positive(layout, "micro_batch", kMaxGlobalBatch);
  l.num_microbatches = positive(layout, "num_microbatches", kMaxGlobalBatch);
  l.global_batch = positive(layout, "global_batch", kMaxGlobalBatch);
  l.seq_len = positive(layout, "seq_len", kMaxSeqLen);
  l.schedule = schedule_from_string(layout.one_of("schedule", schedule_names()));
  l.zero_stage = static_cast<int>(layout.int_in("zero_stage", 0, 3));
  l.recompute = recompute_from_string(layout.one_of("recompute", {"none", "selective", "full"}));
  l.sequence_parallel = layout.boolean("sequence_parallel");
  layout.finish();
  return l;
}

std::vector<RunStep> read_steps(ObjectReader& r) {
  const json& steps = r.raw("steps");
  if (!steps.is_array()) r.fail("steps", "a list of steps");
  std::vector<RunStep> out;
  for (size_t i = 0; i < steps.size(); ++i) {
    ObjectReader step(steps[i], r.file(), "/steps/" + std::to_string(i));
    RunStep s;
    s.step = static_cast<int>(step.non_negative_int("step"));
    s.loss = step.number("loss");
    if (step.has("grad_norm")) s.grad_norm = step.non_negative_number("grad_norm");
    s.time_s = step.positive_number("time_s");
    s.warmup = step.boolean("warmup");
    s.tokens_per_s = step.non_negative_number("tokens_per_s");
    step.finish();
    out.push_back(s);
  }
  return out;
}

StepTimeStats read_step_time(ObjectReader& r) {
  ObjectReader stats = r.object("step_time_s");
  StepTimeStats t;
  t.median_s = stats.non_negative_number("median");
  t.mean_s = stats.non_negative_number("mean");
  t.min_s = stats.non_negative_number("min");
  t.max_s = stats.non_negative_number("max");
  t.p10_s = stats.non_negative_number("p10");
  t.p90_s = stats.non_negative_number("p90");
  t.stdev_s = stats.non_negative_number("stdev");
  t.count = stats.non_negative_int("count");
  stats.finish();
  return t;
}

// One object of phase -> seconds (phases_s, or a row of phases_by_rank_s less its rank and
// stage). Format 2: the names of phases.h, in phases_s every one of them or none (a run that
// timed no phases); format 1: any names (its own vocabulary, measured_phases below).
std::map<std::string, double> read_phase_seconds(ObjectReader& reader, const json& object, const std::string& pointer,
                                                 int format, bool all) {
  std::map<std::string, double> out;
  for (const auto& [name, value] : object.items()) {
    if (name == "rank" || name == "stage") continue;
    if (format >= 2 && !phase_from_name(name))
      throw InputError(reader.file() + ": " + pointer + ": \"" + quote_for_message(name) +
                       "\" is not a phase; valid: " + phase_names());
    check_name(reader, pointer, name);
    out[name] = reader.non_negative_number(name);
  }
  if (format >= 2 && all && !out.empty())
    for (const PhaseInfo& info : phase_table())
      if (!out.count(info.name)) reader.non_negative_number(info.name);  // missing: the reader's one-line error
  return out;
}

void read_phases(ObjectReader& r, RunRecord& run) {
  ObjectReader phases = r.object("phases_s");
  run.phases_s = read_phase_seconds(phases, r.raw("phases_s"), "/phases_s", run.format_version, true);
  phases.finish();
  run.phases_by_rank_s = r.raw("phases_by_rank_s");
  if (!run.phases_by_rank_s.is_array()) r.fail("phases_by_rank_s", "a list of per-rank phases");
  const RunLayout& l = run.layout;
  const long long world = static_cast<long long>(l.tp) * l.pp * l.dp * l.cp;  // each checked by read_layout
  for (size_t i = 0; i < run.phases_by_rank_s.size(); ++i) {
    const std::string pointer = "/phases_by_rank_s/" + std::to_string(i);
    ObjectReader rank(run.phases_by_rank_s[i], r.file(), pointer);
    rank.int_in("rank", 0, world - 1);
    rank.int_in("stage", 0, l.pp - 1);
    read_phase_seconds(rank, run.phases_by_rank_s[i], pointer, run.format_version, false);
    rank.finish();
  }
}

std::map<int, std::map<std::string, long long>> read_memory(ObjectReader& r, const std::vector<int>& stage_of_rank) {
  std::map<int, std::map<std::string, long long>> out;
  ObjectReader memory = r.object("memory");
  // Looked up by hand: the reader's "a misspelling?" hint would point at another rank's number.
  for (size_t rank = 0; rank < stage_of_rank.size(); ++rank) {
    const std::string key = std::to_string(rank);
    if (!memory.has(key))
      throw InputError(r.file() + ": /memory: missing key \"" + key + "\" (rank " + key + ", which runs stage " +
                       std::to_string(stage_of_rank[rank]) + ")");
    ObjectReader components = memory.object(key);
    auto& rank_bytes = out[static_cast<int>(rank)];  // kept when empty, so it is written back
    for (const auto& [name, value] : memory.raw(key).items()) {
      check_name(r, "/memory/" + key, name);
      rank_bytes[name] = components.int_in(name, 0, 1LL << 53);  // bytes
    }
    components.finish();
  }
  memory.finish();
  return out;
}

// Written since the executor counts its FLOPs; older files lack it. Every rank, each with
// "forward" and "recompute", each every FlopPart's non-negative count per step.
std::map<int, RankStepFlops> read_flops(ObjectReader& r, size_t ranks) {
  std::map<int, RankStepFlops> out;
  ObjectReader flops = r.object("flops");
  for (size_t rank = 0; rank < ranks; ++rank) {
    const std::string key = std::to_string(rank);
    if (!flops.has(key)) throw InputError(r.file() + ": /flops: missing key \"" + key + "\" (rank " + key + ")");
    ObjectReader row = flops.object(key);
    RankStepFlops& f = out[static_cast<int>(rank)];
    for (auto [name, into] : {std::pair{"forward", &f.forward}, std::pair{"recompute", &f.recompute}}) {
      ObjectReader by_part = row.object(name);
      for (int i = 0; i < kNumFlopParts; ++i) (*into)[i] = by_part.non_negative_number(to_string(static_cast<FlopPart>(i)));
      by_part.finish();
    }
    row.finish();
  }
  flops.finish();
  return out;
}

std::vector<std::string> read_weight_hashes(ObjectReader& r, size_t ranks, bool& identical) {
  ObjectReader replicas = r.object("replicas");
  identical = replicas.boolean("identical");
  const json& hashes = replicas.raw("weights_hash_by_rank");
  if (!hashes.is_array() || hashes.size() != ranks)
    replicas.fail("weights_hash_by_rank", "a list of " + std::to_string(ranks) + " hashes");
  std::vector<std::string> out;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!hashes[i].is_string())
      throw InputError(replicas.where("weights_hash_by_rank") + "/" + std::to_string(i) + ": expected a string, got " +
                       describe_json_value(hashes[i]));
    out.push_back(hashes[i].get<std::string>());
  }
  replicas.finish();
  return out;
}

CheckpointSave read_save(const json& j, const std::string& file, const std::string& pointer, size_t ranks) {
  ObjectReader save(j, file, pointer);
  CheckpointSave s;
  s.step = static_cast<int>(save.non_negative_int("step"));
  s.blocking_s = save.non_negative_number("blocking_s");
  s.wait_s = save.non_negative_number("wait_s");
  s.write_s = save.non_negative_number("write_s");
  long long file_total = 0, state_total = 0;
  for (const auto& [key, list, total] : {std::tuple{"file_bytes_by_rank", &s.file_bytes_by_rank, &file_total},
                                         std::tuple{"state_bytes_by_rank", &s.state_bytes_by_rank, &state_total}}) {
    const json& bytes = save.raw(key);
    if (!bytes.is_array() || bytes.size() != ranks)
      save.fail(key, "a list of " + std::to_string(ranks) + " byte counts, one per rank");
    for (const json& b : bytes) {
      if (!b.is_number_integer() || b.get<long long>() < 0)
        throw InputError(save.where(key) + ": expected byte counts, got " + describe_json_value(b));
      list->push_back(b.get<long long>());
      *total += b.get<long long>();
    }
  }
  if (save.int_in("file_bytes", 0, 1LL << 62) != file_total)
    save.fail("file_bytes", "the sum of file_bytes_by_rank (" + std::to_string(file_total) + ")");
  if (save.int_in("state_bytes", 0, 1LL << 62) != state_total)
    save.fail("state_bytes", "the sum of state_bytes_by_rank (" + std::to_string(state_total) + ")");
  save.finish();
  return s;
}

// Written since checkpoints exist; older files lack it.
RunCheckpoints read_checkpoints(ObjectReader& r, size_t ranks) {
  ObjectReader c = r.object("checkpoints");
  RunCheckpoints out;
  out.dir = c.string("dir");
  out.async = c.boolean("async");
  if (c.has("resumed_from")) {
    ObjectReader from = c.object("resumed_from");
    out.resumed_from_step = static_cast<int>(from.non_negative_int("step"));
    out.resumed_from = from.string("folder");
    from.finish();
  }
  if (c.has("stopped_by_signal")) out.stopped_by_signal = static_cast<int>(c.int_in("stopped_by_signal", 1, 64));
  const json& saves = c.raw("saves");
  if (!saves.is_array()) c.fail("saves", "a list of saves");
  for (size_t i = 0; i < saves.size(); ++i)
    out.saves.push_back(read_save(saves[i], r.file(), "/checkpoints/saves/" + std::to_string(i), ranks));
  c.finish();
  return out;
}

// Written since start-up is timed; older files lack it. Each part a non-negative number of
// seconds, "total" among them.
std::map<std::string, double> read_startup(ObjectReader& r) {
  ObjectReader startup = r.object("startup_s");
  std::map<std::string, double> out;
  for (const auto& [part, value] : r.raw("startup_s").items()) out[part] = startup.non_negative_number(part);
  if (!out.count("total")) startup.fail("total", "the start-up's total in seconds");
  startup.finish();
  return out;
}

}  // namespace

RunRecord run_record_from_json(const json& j, const std::string& file) {
  ObjectReader r(j, file);
  RunRecord run;
  run.format_version =
      check_format_version(r, kRunFormatVersion, kOldestRunFormatVersion, "a run.json, which dplan run -o writes");
  r.string("generator");
  // The layout first: what compare needs first (and what tells a run.json from a plan).
  run.layout = read_layout(r);
  run.plan = r.string("plan");
  r.object("config");
  run.config = r.raw("config");
  r.object("environment");
  run.environment = r.raw("environment");
  run.steps = read_steps(r);
  run.step_time = read_step_time(r);
  run.tokens_per_s = r.non_negative_number("tokens_per_s");
  read_phases(r, run);
  run.stage_of_rank = read_stage_of_rank(r, run.layout);
  run.memory_bytes = read_memory(r, run.stage_of_rank);
  run.memory_source = r.string("memory_source");
  run.weights_hash_by_rank = read_weight_hashes(r, run.stage_of_rank.size(), run.replicas_identical);
  if (r.has("checkpoints")) run.checkpoints = read_checkpoints(r, run.stage_of_rank.size());
  if (r.has("startup_s")) run.startup_s = read_startup(r);
  if (r.has("flops")) run.flops_by_rank = read_flops(r, run.stage_of_rank.size());
  r.finish();
  return run;
}

std::vector<MeasuredPhase> measured_phases(const RunRecord& run, const std::string& file) {
  auto seconds = [&](const char* name) {
    auto it = run.phases_s.find(name);
    if (it == run.phases_s.end()) throw InputError(file + ": /phases_s: missing key \"" + std::string(name) + "\"");
    return it->second;
  };
  std::vector<MeasuredPhase> out;
  if (run.format_version >= 2) {
    for (const PhaseInfo& info : phase_table()) out.push_back({info.phase, seconds(info.name), {}});
    return out;
  }
  // Format 1 (docs/run-json.md, "format 1"): eight phases, some holding others of phases.h.
  // Files written before expert parallelism timed the all-to-alls inside tp_comm.
  const bool ep_apart = run.phases_s.count("ep_comm") > 0;
  out.push_back({Phase::forward, seconds("forward"), {}});
  out.push_back({Phase::backward, seconds("backward"), {Phase::recompute}});
  out.push_back({Phase::tp_comm, seconds("tp_comm"),
                 ep_apart ? std::vector<Phase>{Phase::cp_comm} : std::vector<Phase>{Phase::cp_comm, Phase::ep_comm}});
  if (ep_apart) out.push_back({Phase::ep_comm, seconds("ep_comm"), {}});
  out.push_back({Phase::pp_bubble, seconds("pp_wait"), {Phase::pp_p2p}});
  out.push_back({Phase::dp_comm, seconds("dp_comm"), {Phase::param_gather}});
  out.push_back({Phase::optimizer, seconds("optimizer"), {Phase::offload}});
  out.push_back({Phase::overhead, seconds("other"), {}});
  return out;
}

RunRecord read_run_record(const std::string& path) { return run_record_from_json(read_json_file(path), path); }

const OutputKind& run_record_output() {
  static const OutputKind kind = json_output_kind("run record", [](const json& j) { run_record_from_json(j, "-o"); });
  return kind;
}

}  // namespace dplan::costmodel
