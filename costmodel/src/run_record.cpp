#include "dplan/costmodel/run_record.h"

#include <algorithm>
#include <cctype>

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
  json out{
      {"format_version", kRunFormatVersion},
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

RunRecord run_record_from_json(const json& j, const std::string& file) {
  ObjectReader r(j, file);
  check_format_version(r, kRunFormatVersion);
  r.string("generator");
  RunRecord run;
  // The layout first: what compare needs first (and what tells a run.json from a plan).
  ObjectReader layout = r.object("layout");
  RunLayout& l = run.layout;
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
  l.schedule = schedule_from_string(layout.one_of("schedule", {"gpipe", "1f1b", "interleaved"}));
  l.zero_stage = static_cast<int>(layout.int_in("zero_stage", 0, 3));
  l.recompute = recompute_from_string(layout.one_of("recompute", {"none", "selective", "full"}));
  l.sequence_parallel = layout.boolean("sequence_parallel");
  layout.finish();
  run.plan = r.string("plan");

  r.object("config");
  run.config = r.raw("config");
  r.object("environment");
  run.environment = r.raw("environment");

  const json& steps = r.raw("steps");
  if (!steps.is_array()) r.fail("steps", "a list of steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    ObjectReader step(steps[i], file, "/steps/" + std::to_string(i));
    RunStep s;
    s.step = static_cast<int>(step.non_negative_int("step"));
    s.loss = step.number("loss");
    if (step.has("grad_norm")) s.grad_norm = step.non_negative_number("grad_norm");
    s.time_s = step.positive_number("time_s");
    s.warmup = step.boolean("warmup");
    s.tokens_per_s = step.non_negative_number("tokens_per_s");
    step.finish();
    run.steps.push_back(s);
  }

  ObjectReader stats = r.object("step_time_s");
  StepTimeStats& t = run.step_time;
  t.median_s = stats.non_negative_number("median");
  t.mean_s = stats.non_negative_number("mean");
  t.min_s = stats.non_negative_number("min");
  t.max_s = stats.non_negative_number("max");
  t.p10_s = stats.non_negative_number("p10");
  t.p90_s = stats.non_negative_number("p90");
  t.stdev_s = stats.non_negative_number("stdev");
  t.count = stats.non_negative_int("count");
  stats.finish();
  run.tokens_per_s = r.non_negative_number("tokens_per_s");

  ObjectReader phases = r.object("phases_s");
  for (const auto& [name, value] : r.raw("phases_s").items()) {
    check_name(r, "/phases_s", name);
    run.phases_s[name] = phases.non_negative_number(name);
  }
  phases.finish();
  run.phases_by_rank_s = r.raw("phases_by_rank_s");
  if (!run.phases_by_rank_s.is_array()) r.fail("phases_by_rank_s", "a list of per-rank phases");
  const long long world = static_cast<long long>(l.tp) * l.pp * l.dp * l.cp;  // each checked above
  for (size_t i = 0; i < run.phases_by_rank_s.size(); ++i) {
    const std::string pointer = "/phases_by_rank_s/" + std::to_string(i);
    ObjectReader rank(run.phases_by_rank_s[i], file, pointer);
    rank.int_in("rank", 0, world - 1);
    rank.int_in("stage", 0, l.pp - 1);
    for (const auto& [name, value] : run.phases_by_rank_s[i].items()) {
      if (name == "rank" || name == "stage") continue;
      check_name(r, pointer, name);
      rank.non_negative_number(name);
    }
    rank.finish();
  }

  run.stage_of_rank = read_stage_of_rank(r, l);
  ObjectReader memory = r.object("memory");
  // Looked up by hand: the reader's "a misspelling?" hint would point at another rank's number.
  for (size_t rank = 0; rank < run.stage_of_rank.size(); ++rank) {
    const std::string key = std::to_string(rank);
    if (!memory.has(key))
      throw InputError(file + ": /memory: missing key \"" + key + "\" (rank " + key + ", which runs stage " +
                       std::to_string(run.stage_of_rank[rank]) + ")");
    ObjectReader components = memory.object(key);
    auto& rank_bytes = run.memory_bytes[static_cast<int>(rank)];  // kept when empty, so it is written back
    for (const auto& [name, value] : memory.raw(key).items()) {
      check_name(r, "/memory/" + key, name);
      rank_bytes[name] = components.int_in(name, 0, 1LL << 53);  // bytes
    }
    components.finish();
  }
  memory.finish();
  run.memory_source = r.string("memory_source");

  ObjectReader replicas = r.object("replicas");
  run.replicas_identical = replicas.boolean("identical");
  const json& hashes = replicas.raw("weights_hash_by_rank");
  if (!hashes.is_array() || hashes.size() != run.stage_of_rank.size())
    replicas.fail("weights_hash_by_rank", "a list of " + std::to_string(run.stage_of_rank.size()) + " hashes");
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!hashes[i].is_string())
      throw InputError(replicas.where("weights_hash_by_rank") + "/" + std::to_string(i) + ": expected a string, got " +
                       describe_json_value(hashes[i]));
    run.weights_hash_by_rank.push_back(hashes[i].get<std::string>());
  }
  replicas.finish();
  if (r.has("checkpoints")) {  // written since checkpoints exist; older files lack it
    ObjectReader c = r.object("checkpoints");
    RunCheckpoints& out = run.checkpoints.emplace();
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
    for (size_t i = 0; i < saves.size(); ++i) {
      const std::string pointer = "/checkpoints/saves/" + std::to_string(i);
      ObjectReader save(saves[i], file, pointer);
      CheckpointSave s;
      s.step = static_cast<int>(save.non_negative_int("step"));
      s.blocking_s = save.non_negative_number("blocking_s");
      s.wait_s = save.non_negative_number("wait_s");
      s.write_s = save.non_negative_number("write_s");
      long long file_total = 0, state_total = 0;
      for (const auto& [key, list, total] : {std::tuple{"file_bytes_by_rank", &s.file_bytes_by_rank, &file_total},
                                             std::tuple{"state_bytes_by_rank", &s.state_bytes_by_rank, &state_total}}) {
        const json& bytes = save.raw(key);
        if (!bytes.is_array() || bytes.size() != run.stage_of_rank.size())
          save.fail(key, "a list of " + std::to_string(run.stage_of_rank.size()) + " byte counts, one per rank");
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
      out.saves.push_back(s);
    }
    c.finish();
  }
  r.finish();
  return run;
}

RunRecord read_run_record(const std::string& path) { return run_record_from_json(read_json_file(path), path); }

const OutputKind& run_record_output() {
  static const OutputKind kind = json_output_kind("run record", [](const json& j) { run_record_from_json(j, "-o"); });
  return kind;
}

}  // namespace dplan::costmodel
