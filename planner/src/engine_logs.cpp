// Reading the engines' training logs (the formats and their sources: engine_logs.h).
#include "dplan/planner/engine_logs.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <string_view>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/planner/engines.h"
#include "engine_parts.h"

namespace dplan::planner {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// A run.json: dplan run's and dplan-worker's measurement (docs/run-json.md).
constexpr const char* kRunName = "run";
constexpr const char* kRunDisplayName = "dplan run";

// The engine whose log reader reads `format` (not a run.json).
const EngineDescriptor& reader_of(LogFormat format) {
  DPLAN_CHECK(format.engine && descriptor(*format.engine).log);
  return descriptor(*format.engine);
}

// "iteration line (megatron/training/training.py training_log)": what a step line is, in messages.
std::string step_lines(const LogReader& r) { return std::string(r.step_line) + " (" + r.step_line_source + ")"; }

// The text with terminal colour sequences (ESC [ ... letter) removed: torchtitan colours its step
// lines (torchtitan/tools/utils.py Color).
std::string strip_ansi(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\x1b' && i + 1 < line.size() && line[i + 1] == '[') {
      size_t j = i + 2;
      while (j < line.size() && !std::isalpha(static_cast<unsigned char>(line[j]))) ++j;
      i = j;
      continue;
    }
    out += line[i];
  }
  return out;
}

// No engine prints a step line this long; longer lines are left out (read as empty), which also
// keeps std::regex, whose matcher recurses per character, off megabyte-long lines.
constexpr size_t kMaxLineChars = 16384;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end - start > kMaxLineChars) {
      out.emplace_back();
      start = end + 1;
      continue;
    }
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(strip_ansi(line));
    start = end + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

// A number as the engines print it: "1,234.5" (torchtitan's thousands separators), "3.2E-04".
std::optional<double> number(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  text = trim(text);
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A count as printed ("32", "1,024", "8.0"): a whole number in 0 .. 2^53, else nullopt (not stated).
std::optional<long long> whole(const std::string& text) {
  std::optional<double> v = number(text);
  if (!v || *v < 0 || *v > 9007199254740992.0 || *v != std::floor(*v)) return std::nullopt;
  return static_cast<long long>(*v);
}

// "a: 1 | b: 2 |" -> {a: "1", b: "2"}: the "key: value" fields of a '|'-separated line, split on
// the last ": " of each field (Megatron's keys hold no ": ").
std::map<std::string, std::string> bar_fields(std::string_view text) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('|', start);
    if (end == std::string_view::npos) end = text.size();
    std::string field = trim(text.substr(start, end - start));
    size_t colon = field.rfind(':');
    if (colon != std::string::npos) out.emplace(trim(field.substr(0, colon)), trim(field.substr(colon + 1)));
    start = end + 1;
  }
  return out;
}

// The argument / config dumps: Megatron's _print_args (megatron/training/arguments.py) and
// DeepSpeed's DeepSpeedConfig.print (deepspeed/runtime/config.py) both print "  name .... value".
const std::regex kDumpLine(R"((?:^|\s)([a-z_][a-z0-9_]*) \.+ (\S+)\s*$)");

void read_dump(const std::string& line, std::map<std::string, std::string>& dump) {
  if (line.find(" ..") == std::string::npos) return;
  std::smatch m;
  if (std::regex_search(line, m, kDumpLine)) dump.emplace(m[1], m[2]);  // the first one counts
}

std::optional<long long> dumped_int(const std::map<std::string, std::string>& dump, const std::string& key) {
  auto it = dump.find(key);
  if (it == dump.end()) return std::nullopt;
  return whole(it->second);  // "None" and the like: not stated
}

// --- signatures: which format a line shows -------------------------------------------------------

const std::regex kMegatronIteration(R"(\biteration\s+(\d+)/\s*(\d+)\s*\|)");
const std::regex kMegatronMemory(
    R"(\[Rank (\d+)\].*memory \(MB\) \| allocated: ([0-9.eE+-]+) \| max allocated: ([0-9.eE+-]+) \|)");
const std::regex kTitanStep(
    R"((?:^|[^a-z_])step:\s*(\d+)\s+loss:\s*(\S+)\s+(?:grad_norm:\s*(\S+)\s+)?memory:\s*([0-9.]+)\s*GiB\(([0-9.]+)%\)\s+tps:\s*([0-9,]+)\s+tflops:\s*([0-9,.]+)\s+mfu:\s*([0-9.]+%|N/A))");
const std::regex kDeepSpeedThroughput(
    R"(epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=([^,]+), CurrSamplesPerSec=([^,]+), MemAllocated=([0-9.]+)GB, MaxMemAllocated=([0-9.]+)GB)");
const std::regex kDeepSpeedProgress(R"(\bstep=\d+, skipped=\d+, lr=)");

// JSON for run_record_from_json to read (and refuse if it is no run.json): text opening with '{',
// or a whole JSON list (log lines open with '[' too: "[titan]", "[2025-...]").
bool is_json_object_text(const std::string& text) {
  size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return false;
  return text[b] == '{' || (text[b] == '[' && json::accept(text));
}

// The engine whose lines the text shows most (the first in table order among equals), or nullopt.
std::optional<LogFormat> detect_lines(const std::vector<std::string>& lines) {
  std::optional<LogFormat> best;
  long long most = 0;
  for (const EngineDescriptor& d : engines()) {
    if (!d.log) continue;
    long long count = 0;
    for (const auto& line : lines) count += d.log->signature(line);
    if (count > most) {
      most = count;
      best = LogFormat{d.id};
    }
  }
  return best;
}

// "Megatron-LM iteration lines, torchtitan step lines, DeepSpeed ThroughputTimer lines".
std::string log_kinds() {
  std::string s;
  for (const EngineDescriptor& d : engines())
    if (d.log) s += (s.empty() ? "" : ", ") + std::string(d.display_name) + " " + d.log->step_line + "s";
  return s;
}

std::string foreign_message(const std::string& file) {
  std::string formats;
  for (const std::string& n : log_format_names()) formats += (formats.empty() ? "" : "|") + n;
  return file + ": neither a run.json nor a training log dplan reads (" + log_kinds() + "); --format " + formats +
         " forces one";
}

// "a run.json" or "a DeepSpeed log": what a file reads as, in messages.
std::string reads_as(LogFormat format) {
  return format == LogFormat::run ? std::string("a run.json") : std::string("a ") + engine_name(format) + " log";
}

// One entry per step: several ranks may log the same step; the slowest rank's rate and time,
// the largest memory. In step order.
std::vector<LogStep> one_per_step(const std::vector<LogStep>& logged) {
  std::map<long long, LogStep> by_step;
  for (const LogStep& s : logged) {
    auto [it, fresh] = by_step.emplace(s.step, s);
    if (fresh) continue;
    LogStep& k = it->second;
    auto keep = [](std::optional<double>& into, const std::optional<double>& v, bool larger) {
      if (!v) return;
      if (!into || (larger ? *v > *into : *v < *into)) into = v;
    };
    keep(k.time_s, s.time_s, true);
    keep(k.tokens_per_s_per_gpu, s.tokens_per_s_per_gpu, false);
    keep(k.samples_per_s, s.samples_per_s, false);
    keep(k.tflops_per_gpu, s.tflops_per_gpu, false);
    keep(k.mfu_percent, s.mfu_percent, false);
    keep(k.peak_memory_bytes, s.peak_memory_bytes, true);
  }
  std::vector<LogStep> steps;
  for (auto& [step, s] : by_step) steps.push_back(s);
  return steps;
}

double median(std::vector<double> v) {
  DPLAN_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


// train_micro_batch_size_per_gpu from DeepSpeedConfig.print. A name of 29 characters or more gets
// no dots: "  train_micro_batch_size_per_gpu  2".
std::optional<long long> deepspeed_micro_batch(const std::vector<std::string>& lines) {
  const std::regex micro(R"(\strain_micro_batch_size_per_gpu \.* ?(\d+)\s*$)");
  for (const auto& line : lines) {
    std::smatch m;
    if (line.find("train_micro_batch_size_per_gpu") != std::string::npos && std::regex_search(line, m, micro))
      return whole(m[1]);
  }
  return std::nullopt;
}

// DeepSpeed's wall-clock timers (the global ones, ms, in log order): the median over the lines
// after warm-up, seconds, under run.json's phase names; a timer missing from one of them is none.
std::map<std::string, double> deepspeed_phases(const std::vector<std::map<std::string, double>>& timer_lines) {
  std::map<std::string, double> phases;
  if (static_cast<long long>(timer_lines.size()) <= kWarmupLogLines) return phases;
  auto median_of = [&](const char* key) -> std::optional<double> {
    std::vector<double> v;
    for (size_t i = kWarmupLogLines; i < timer_lines.size(); ++i)
      if (auto it = timer_lines[i].find(key); it != timer_lines[i].end()) v.push_back(it->second / 1e3);
    if (v.size() + kWarmupLogLines != timer_lines.size()) return std::nullopt;
    return median(v);
  };
  if (auto v = median_of("fwd")) phases["forward"] = *v;
  if (auto v = median_of("bwd_inner")) phases["backward"] = *v;
  else if (auto b = median_of("bwd")) phases["backward"] = *b;
  if (auto v = median_of("bwd_allreduce")) phases["dp_comm"] = *v;
  if (auto v = median_of("step")) phases["optimizer"] = *v;
  return phases;
}

}  // namespace

// --- each engine's lines (the engine table, engines.cpp, names these) ----------------------------

namespace detail {

bool megatron_signature(const std::string& line) {
  return line.find("iteration") != std::string::npos &&
         (line.find("elapsed time per iteration (ms)") != std::string::npos ||
          line.find("consumed samples:") != std::string::npos);
}
bool torchtitan_signature(const std::string& line) {
  return line.find("[titan]") != std::string::npos ||
         (line.find("step:") != std::string::npos && line.find("loss:") != std::string::npos &&
          (line.find("tps:") != std::string::npos || line.find("grad_norm:") != std::string::npos));
}
bool deepspeed_signature(const std::string& line) {
  return line.find("SamplesPerSec=") != std::string::npos || line.find("time (ms) | fwd") != std::string::npos ||
         (line.find("skipped=") != std::string::npos && std::regex_search(line, kDeepSpeedProgress));
}

// The readers: one LogStep per complete step line.

void read_megatron_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps) {
  std::map<std::string, std::string> dump;
  for (const auto& line : lines) {
    read_dump(line, dump);
    std::smatch m;
    if (line.find("memory (MB)") != std::string::npos && std::regex_search(line, m, kMegatronMemory)) {
      if (std::optional<double> max_allocated = number(m[3]))
        log.peak_memory_bytes = std::max(log.peak_memory_bytes.value_or(0.0), *max_allocated * kMiB);
      continue;
    }
    if (line.find("iteration") == std::string::npos || !std::regex_search(line, m, kMegatronIteration)) continue;
    // Complete: every field closed by " |" (training_log ends each field so), the time among them.
    const std::string rest = trim(line.substr(m.position(0) + m.length(0)));
    if (rest.empty() || rest.back() != '|') continue;
    const std::map<std::string, std::string> fields = bar_fields(rest);
    auto field = [&](const char* key) -> std::optional<double> {
      auto it = fields.find(key);
      return it == fields.end() ? std::nullopt : number(it->second);
    };
    std::optional<double> ms = field("elapsed time per iteration (ms)");
    if (!ms) continue;
    std::optional<long long> step = whole(m[1]);
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.time_s = *ms / 1e3;
    s.tflops_per_gpu = field("throughput per GPU (TFLOP/s/GPU)");
    s.loss = field("lm loss");
    if (std::optional<long long> batch = whole(fields.count("global batch size") ? fields.at("global batch size") : "")) {
      const long long b = *batch;
      if (log.global_batch && *log.global_batch != b)
        throw InputError(log.file + ": the global batch size changes from " + std::to_string(*log.global_batch) +
                         " to " + std::to_string(b) + " at iteration " + std::to_string(s.step) +
                         " (batch size ramp-up); compare a log of one layout");
      log.global_batch = b;
    }
    steps.push_back(s);
  }
  if (!log.global_batch) log.global_batch = dumped_int(dump, "global_batch_size");
  log.micro_batch = dumped_int(dump, "micro_batch_size");
  log.seq_len = dumped_int(dump, "seq_length");
  log.world_size = dumped_int(dump, "world_size");
  log.tp = dumped_int(dump, "tensor_model_parallel_size");
  log.pp = dumped_int(dump, "pipeline_model_parallel_size");
  log.cp = dumped_int(dump, "context_parallel_size");
}


void read_torchtitan_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps) {
  const std::regex global_batch(R"(global batch size (\d+))"), seq(R"(sequence length (\d+))"),
      tokens(R"((\d+) tokens per train step)");
  for (const auto& line : lines) {
    std::smatch m;
    if (line.find("Trainer is initialized with") != std::string::npos) {
      if (std::regex_search(line, m, global_batch)) log.global_batch = whole(m[1]);
      if (std::regex_search(line, m, seq)) log.seq_len = whole(m[1]);
      if (std::regex_search(line, m, tokens)) log.tokens_per_step = whole(m[1]);
      continue;
    }
    if (line.find("tps:") == std::string::npos || !std::regex_search(line, m, kTitanStep)) continue;
    std::optional<long long> step = whole(m[1]);
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.loss = number(m[2]);
    s.peak_memory_bytes = number(m[4]).value_or(0) * kGiB;
    s.tokens_per_s_per_gpu = number(m[6]);
    s.tflops_per_gpu = number(m[7]);
    if (m[8] != "N/A") s.mfu_percent = number(std::string(m[8]).substr(0, m[8].length() - 1));
    if (!s.tokens_per_s_per_gpu) continue;
    steps.push_back(s);
  }
}


void read_deepspeed_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps) {
  std::map<std::string, std::string> dump;
  std::vector<std::map<std::string, double>> timer_lines;  // global timers, ms, in order
  for (const auto& line : lines) {
    read_dump(line, dump);
    std::smatch m;
    if (size_t t = line.find("time (ms) |"); t != std::string::npos) {
      std::map<std::string, double> timers;
      for (const auto& [k, v] : bar_fields(std::string_view(line).substr(t + 9)))
        if (std::optional<double> ms = number(v)) timers[k] = *ms;
      // The per-step (global) timers; the micro-step ones are named *_microstep.
      if (timers.count("fwd") || timers.count("bwd") || timers.count("step")) timer_lines.push_back(timers);
      continue;
    }
    if (line.find("SamplesPerSec=") == std::string::npos || !std::regex_search(line, m, kDeepSpeedThroughput)) continue;
    std::optional<long long> step = whole(m[3]);
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.samples_per_s = number(m[5]);
    if (std::optional<double> max_gb = number(m[7])) s.peak_memory_bytes = *max_gb * kGiB;  // "GB" = 1024^3 bytes
    if (!s.samples_per_s) continue;
    steps.push_back(s);
  }
  log.global_batch = dumped_int(dump, "train_batch_size");
  log.dp = dumped_int(dump, "world_size");  // config.py: the data-parallel world
  log.micro_batch = deepspeed_micro_batch(lines);
  log.phases_s = deepspeed_phases(timer_lines);
}

}  // namespace detail

const char* to_string(LogFormat format) { return format.engine ? to_string(*format.engine) : kRunName; }
const char* engine_name(LogFormat format) {
  return format.engine ? descriptor(*format.engine).display_name : kRunDisplayName;
}

std::vector<std::string> log_format_names() {
  std::vector<std::string> names;
  for (const EngineDescriptor& d : engines())
    if (d.log) names.push_back(to_string(d.id));
  names.push_back(kRunName);
  return names;
}

LogFormat log_format_from_string(const std::string& name) {
  if (name == kRunName) return LogFormat::run;
  if (std::optional<Engine> engine = engine_from_string(name); engine && descriptor(*engine).log) return LogFormat{engine};
  throw InputError("--format: unknown format " + quote_for_message(name) + "; valid: " + join_choices(log_format_names()));
}

std::optional<LogFormat> detect_log_format(const std::string& text) {
  if (is_json_object_text(text)) return LogFormat::run;
  return detect_lines(lines_of(text));
}

LogFormat measurement_format(const std::string& text, const std::string& file, std::optional<LogFormat> forced) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    std::vector<std::string> logs = log_format_names();
    logs.pop_back();  // run
    throw InputError(file + ": empty; expected a run.json or a training log (" + join_choices(logs) + ")");
  }
  if (forced == LogFormat::run && !is_json_object_text(text))
    if (std::optional<LogFormat> seen = detect_lines(lines_of(text)))
      throw InputError(file + ": not a run.json (--format run); it reads as " + reads_as(*seen) + ": --format " +
                       to_string(*seen));
  if (forced) return *forced;
  std::optional<LogFormat> f = detect_log_format(text);
  if (!f) throw InputError(foreign_message(file));
  return *f;
}

EngineLog parse_engine_log(const std::string& text, const std::string& file, std::optional<LogFormat> forced) {
  const LogFormat format = measurement_format(text, file, forced);
  if (format == LogFormat::run)
    throw InputError(file + ": a run.json is read by read_run_record, not as an engine log");
  const EngineDescriptor& d = reader_of(format);
  const LogReader& reader = *d.log;
  const std::vector<std::string> lines = lines_of(text);
  EngineLog log;
  log.format = format;
  log.file = file;
  std::vector<LogStep> logged;  // as logged, possibly several per step (one per rank)
  reader.read(lines, log, logged);
  log.lines_read = std::string(reader.step_line) + "s (" + reader.log_file + ", format as of " +
                   with_versions(reader.format_as_of, d) + ")";
  if (logged.empty()) {
    if (std::any_of(lines.begin(), lines.end(), reader.signature))
      throw InputError(file + ": a " + d.display_name + " log with no complete " + step_lines(reader) +
                       "; is it empty or cut short?");
    std::optional<LogFormat> seen = is_json_object_text(text) ? std::optional(LogFormat::run) : detect_lines(lines);
    if (seen)
      throw InputError(file + ": no " + d.display_name + " " + step_lines(reader) + " in it (--format " + to_string(d.id) +
                       "); it reads as " + reads_as(*seen) + ": --format " + to_string(*seen));
    throw InputError(foreign_message(file));
  }
  log.steps = one_per_step(logged);
  for (int i = 0; i < kWarmupLogLines && i < static_cast<int>(log.steps.size()); ++i) log.steps[i].warmup = true;
  if (static_cast<long long>(log.steps.size()) <= kWarmupLogLines)
    throw InputError(file + ": " + std::to_string(log.steps.size()) + " complete " + d.display_name + " step line" +
                     (log.steps.size() == 1 ? "" : "s") + ", all warm-up (the first " +
                     std::to_string(kWarmupLogLines) + " logged steps are left out); at least " +
                     std::to_string(kWarmupLogLines + 1) + " are needed");
  return log;
}

LogMeasurement measure_log(const EngineLog& log, const costmodel::Plan& plan, const std::string& plan_file) {
  const long long global_batch = plan.training.global_batch;
  const long long seq_len = plan.training.seq_len;
  const long long world = plan.parallel.world_size();
  auto check = [&](const std::optional<long long>& stated, long long planned, const std::string& what) {
    if (stated && *stated != planned)
      throw InputError(log.file + " and " + plan_file + " do not belong together: the " + engine_name(log.format) +
                       " log states " + what + " " + std::to_string(*stated) + ", " + plan_file + " plans " +
                       std::to_string(planned) + "; compare a log with the plan it ran");
  };
  check(log.global_batch, global_batch, "global batch size");
  check(log.micro_batch, plan.parallel.micro_batch, "micro batch size");
  check(log.seq_len, seq_len, "sequence length");
  check(log.tokens_per_step, global_batch * seq_len, "tokens per train step");
  check(log.world_size, world, "world size");
  check(log.tp, plan.parallel.tp, "tensor parallel size");
  check(log.pp, plan.parallel.pp, "pipeline parallel size");
  check(log.cp, plan.parallel.cp, "context parallel size");
  check(log.dp, plan.parallel.dp, "data parallel size");

  LogMeasurement m;
  m.format = log.format;
  m.description = std::string(engine_name(log.format)) + " log, " + log.lines_read;
  const double tokens_per_step = static_cast<double>(global_batch) * static_cast<double>(seq_len);
  std::vector<double> times, tflops, mfu;
  const LogReader& reader = *reader_of(log.format).log;
  for (const LogStep& s : log.steps) {
    if (s.warmup) continue;
    double t = 0;
    switch (reader.step_time) {
      case StepTime::logged: t = s.time_s.value_or(0); break;
      case StepTime::from_tokens_per_s_per_gpu: {
        // tps = tokens per second per device: the global rate is tps x world size.
        const double tps = s.tokens_per_s_per_gpu.value_or(0);
        t = tps > 0 ? tokens_per_step / (tps * static_cast<double>(world)) : 0;
        m.step_time_from_rate = true;
        break;
      }
      case StepTime::from_global_samples_per_s: {
        // CurrSamplesPerSec: train_batch_size (the global batch) / the step's seconds.
        const double sps = s.samples_per_s.value_or(0);
        t = sps > 0 ? static_cast<double>(global_batch) / sps : 0;
        m.step_time_from_rate = true;
        break;
      }
    }
    if (!(t > 0) || !std::isfinite(t))
      throw InputError(log.file + ": step " + std::to_string(s.step) + " states no positive rate or time");
    times.push_back(t);
    if (s.tflops_per_gpu) tflops.push_back(*s.tflops_per_gpu);
    if (s.mfu_percent) mfu.push_back(*s.mfu_percent / 100);
  }
  m.measured_steps = static_cast<long long>(times.size());
  m.step_time_s = median(times);
  m.tokens_per_s = tokens_per_step / m.step_time_s;
  if (tflops.size() == times.size()) m.tflops_per_gpu = median(tflops);
  if (mfu.size() == times.size()) m.mfu = median(mfu);
  m.peak_memory_bytes = log.peak_memory_bytes;
  for (const LogStep& s : log.steps)
    if (s.peak_memory_bytes) m.peak_memory_bytes = std::max(m.peak_memory_bytes.value_or(0.0), *s.peak_memory_bytes);
  if (m.peak_memory_bytes) m.peak_memory_what = reader.peak_memory_what;
  // On a cluster of CPU cores some engines' memory figure is not the allocator's (the reader says why).
  if (reader.cpu_memory_not_comparable && m.peak_memory_bytes && plan.cluster.value("cores_per_node", 0) > 0) {
    m.peak_memory_bytes.reset();
    m.memory_not_comparable = reader.cpu_memory_not_comparable;
  }
  m.phases_s = log.phases_s;
  return m;
}

}  // namespace dplan::planner
