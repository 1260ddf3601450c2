// Reading the engines' training logs (the formats and their sources: engine_logs.h).
#include "dplan/planner/engine_logs.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <cstdlib>
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

// The text's lines, every one (line i of the log is element i - 1), whatever its length: the
// scanners below read each line once, left to right, with no recursion.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
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

// --- scanning a line --------------------------------------------------------------------------
// Each pattern below is read by a Scan that moves left to right and never back: reading a line
// costs time linear in its length and constant stack (std::regex's matcher recurses per character
// and backtracks, quadratically on a pattern such as "[Rank R].*memory (MB)").

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

class Scan {
 public:
  Scan(std::string_view text, size_t at) : text_(text), at_(std::min(at, text.size())) {}
  size_t at() const { return at_; }
  bool at_end() const { return at_ == text_.size(); }
  // Consumes `literal` if the text continues with it.
  bool literal(std::string_view literal) {
    if (text_.substr(at_, literal.size()) != literal) return false;
    at_ += literal.size();
    return true;
  }
  // Consumes the longest run of characters `in` accepts (possibly none) and returns it.
  template <typename Pred>
  std::string_view run(Pred in) {
    const size_t begin = at_;
    while (at_ < text_.size() && in(text_[at_])) ++at_;
    return text_.substr(begin, at_ - begin);
  }
  size_t spaces() { return run(is_space).size(); }
  std::string_view digits() { return run(is_digit); }
  std::string_view token() { return run([](char c) { return !is_space(c); }); }

 private:
  std::string_view text_;
  size_t at_;
};

// Tries `match` (a Scan from just after the occurrence) at each occurrence of `word` in `line`,
// left to right, and returns the first result it gives. With `continues`, an occurrence that
// follows a character `continues` accepts is skipped (a word boundary).
template <typename Match>
auto first_match(std::string_view line, std::string_view word, Match match, bool (*continues)(char) = nullptr)
    -> decltype(match(std::declval<Scan&>())) {
  for (size_t at = line.find(word); at != std::string_view::npos; at = line.find(word, at + 1)) {
    if (continues && at > 0 && continues(line[at - 1])) continue;
    Scan s(line, at + word.size());
    if (auto found = match(s)) return found;
  }
  return std::nullopt;
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
// DeepSpeed's DeepSpeedConfig.print (deepspeed/runtime/config.py) both print "  name .... value":
// the line ends in a name ([a-z_][a-z0-9_]*, at the line's start or after a blank), one space,
// dots, one space, the value (no blanks) and trailing blanks. Read from the end.
void read_dump(const std::string& line, std::map<std::string, std::string>& dump) {
  if (line.find(" ..") == std::string::npos) return;
  size_t end = line.size();
  while (end > 0 && is_space(line[end - 1])) --end;
  size_t value = end;
  while (value > 0 && !is_space(line[value - 1])) --value;
  if (value == end || value < 2 || line[value - 1] != ' ' || line[value - 2] != '.') return;
  size_t dots = value - 1;
  while (dots > 0 && line[dots - 1] == '.') --dots;
  if (dots < 2 || line[dots - 1] != ' ') return;
  const size_t name_end = dots - 1;
  size_t name = name_end;
  auto name_char = [](char c) { return (c >= 'a' && c <= 'z') || c == '_' || is_digit(c); };
  while (name > 0 && name_char(line[name - 1])) --name;
  if (name == name_end || is_digit(line[name]) || (name > 0 && !is_space(line[name - 1]))) return;
  dump.emplace(line.substr(name, name_end - name), line.substr(value, end - value));  // the first one counts
}

std::optional<long long> dumped_int(const std::map<std::string, std::string>& dump, const std::string& key) {
  auto it = dump.find(key);
  if (it == dump.end()) return std::nullopt;
  return whole(it->second);  // "None" and the like: not stated
}

// --- the engines' lines ------------------------------------------------------------------------

// Megatron's "iteration N/ M |" (after a word boundary): N and where the fields begin.
struct MegatronIteration {
  std::string_view step;
  size_t fields_at = 0;
};
std::optional<MegatronIteration> megatron_iteration(std::string_view line) {
  return first_match(
      line, "iteration",
      [](Scan& s) -> std::optional<MegatronIteration> {
        if (!s.spaces()) return std::nullopt;
        const std::string_view step = s.digits();
        if (step.empty() || !s.literal("/")) return std::nullopt;
        s.spaces();
        if (s.digits().empty()) return std::nullopt;
        s.spaces();
        if (!s.literal("|")) return std::nullopt;
        return MegatronIteration{step, s.at()};
      },
      is_word);
}

bool megatron_number_char(char c) { return is_digit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'; }

// report_memory's "[Rank R] ... memory (MB) | allocated: A | max allocated: X |": X of the last
// such run of fields after the line's first "[Rank R]".
std::optional<std::string_view> megatron_max_allocated(std::string_view line) {
  std::optional<size_t> after_rank = first_match(line, "[Rank ", [](Scan& s) -> std::optional<size_t> {
    if (s.digits().empty() || !s.literal("]")) return std::nullopt;
    return s.at();
  });
  if (!after_rank) return std::nullopt;
  std::optional<std::string_view> last;
  const std::string_view fields = "memory (MB) | allocated: ";
  for (size_t at = line.find(fields, *after_rank); at != std::string_view::npos; at = line.find(fields, at + 1)) {
    Scan s(line, at + fields.size());
    if (s.run(megatron_number_char).empty() || !s.literal(" | max allocated: ")) continue;
    const std::string_view max_allocated = s.run(megatron_number_char);
    if (!max_allocated.empty() && s.literal(" |")) last = max_allocated;
  }
  return last;
}

// torchtitan's "step: N  loss: L  [grad_norm: G  ]memory: X GiB(P%)  tps: T  tflops: F  mfu: M%"
// ("step:" not after a lower-case letter or '_'; mfu "N/A" at HEAD under quantisation).
struct TitanStep {
  std::string_view step, loss, memory_gib, tps, tflops, mfu;
};
std::optional<TitanStep> titan_step(std::string_view line) {
  return first_match(
      line, "step:",
      [](Scan& s) -> std::optional<TitanStep> {
        TitanStep t;
        auto field = [&](std::string_view name) {
          if (!s.literal(name)) return false;
          s.spaces();
          return true;
        };
        auto decimal = [](char c) { return is_digit(c) || c == '.'; };
        s.spaces();
        t.step = s.digits();
        if (t.step.empty() || !s.spaces() || !field("loss:")) return std::nullopt;
        t.loss = s.token();
        if (t.loss.empty() || !s.spaces()) return std::nullopt;
        if (field("grad_norm:") && (s.token().empty() || !s.spaces())) return std::nullopt;
        if (!field("memory:")) return std::nullopt;
        t.memory_gib = s.run(decimal);
        if (t.memory_gib.empty()) return std::nullopt;
        s.spaces();
        if (!s.literal("GiB(") || s.run(decimal).empty() || !s.literal("%)") || !s.spaces() || !field("tps:"))
          return std::nullopt;
        t.tps = s.run([](char c) { return is_digit(c) || c == ','; });
        if (t.tps.empty() || !s.spaces() || !field("tflops:")) return std::nullopt;
        t.tflops = s.run([](char c) { return is_digit(c) || c == ',' || c == '.'; });
        if (t.tflops.empty() || !s.spaces() || !field("mfu:")) return std::nullopt;
        if (s.literal("N/A")) return t;  // mfu stays empty
        t.mfu = s.run(decimal);
        if (t.mfu.empty() || !s.literal("%")) return std::nullopt;
        return t;
      },
      [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
}

// DeepSpeed's ThroughputTimer line: "epoch=E/micro_step=M/global_step=N,
// RunningAvgSamplesPerSec=X, CurrSamplesPerSec=Y, MemAllocated=AGB, MaxMemAllocated=BGB".
struct DeepSpeedThroughput {
  std::string_view global_step, samples_per_s, max_allocated_gb;
};
std::optional<DeepSpeedThroughput> deepspeed_throughput(std::string_view line) {
  return first_match(line, "epoch=", [](Scan& s) -> std::optional<DeepSpeedThroughput> {
    DeepSpeedThroughput t;
    auto up_to_comma = [](char c) { return c != ','; };
    auto decimal = [](char c) { return is_digit(c) || c == '.'; };
    if (s.digits().empty() || !s.literal("/micro_step=") || s.digits().empty() || !s.literal("/global_step="))
      return std::nullopt;
    t.global_step = s.digits();
    if (t.global_step.empty() || !s.literal(", RunningAvgSamplesPerSec=") || s.run(up_to_comma).empty() ||
        !s.literal(", CurrSamplesPerSec="))
      return std::nullopt;
    t.samples_per_s = s.run(up_to_comma);
    if (t.samples_per_s.empty() || !s.literal(", MemAllocated=") || s.run(decimal).empty() ||
        !s.literal("GB, MaxMemAllocated="))
      return std::nullopt;
    t.max_allocated_gb = s.run(decimal);
    if (t.max_allocated_gb.empty() || !s.literal("GB")) return std::nullopt;
    return t;
  });
}

// DeepSpeed's _report_progress: "step=N, skipped=S, lr=" (after a word boundary).
bool deepspeed_progress(std::string_view line) {
  return first_match(
             line, "step=",
             [](Scan& s) -> std::optional<bool> {
               if (s.digits().empty() || !s.literal(", skipped=") || s.digits().empty() || !s.literal(", lr="))
                 return std::nullopt;
               return true;
             },
             is_word)
      .has_value();
}

// The value `text` (as the log wrote it, in the log's unit) times `to_unit`, in the figure's
// range; else InputError naming the file, the line (index + 1), the field and the text.
double logged_value(const EngineLog& log, size_t index, std::string_view field, std::string_view text,
                    const LoggedFigure& figure, double to_unit = 1) {
  const std::optional<double> v = number(std::string(text));
  const double value = v ? *v * to_unit : 0;
  if (v && in_range(value, figure)) return value;
  throw InputError(log.file + ":" + std::to_string(index + 1) + ": " + std::string(field) + " " +
                   quote_for_message(std::string(text)) + " is not " + figure.what + " (" + range_text(figure) +
                   "); a log that states it is refused");
}

// The field `key` of a line's '|'-separated fields, in the figure's range; nullopt when absent.
std::optional<double> logged_field(const EngineLog& log, size_t index, const std::map<std::string, std::string>& fields,
                                   const std::string& key, const LoggedFigure& figure, double to_unit = 1) {
  auto it = fields.find(key);
  if (it == fields.end()) return std::nullopt;
  return logged_value(log, index, key + ":", it->second, figure, to_unit);
}

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
      if (!v || (into && (larger ? *v <= *into : *v >= *into))) return false;
      into = v;
      return true;
    };
    const bool slower_time = keep(k.time_s, s.time_s, true);
    const bool slower_tokens = keep(k.tokens_per_s_per_gpu, s.tokens_per_s_per_gpu, false);
    const bool slower_samples = keep(k.samples_per_s, s.samples_per_s, false);
    if (slower_time || slower_tokens || slower_samples) k.line = s.line;  // the line the step time comes from
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
  constexpr std::string_view kName = "train_micro_batch_size_per_gpu";
  for (const auto& line : lines) {
    // After a blank: the name, one space, dots (maybe none), maybe a space, digits, blanks to the end.
    std::optional<std::string_view> value =
        first_match(line, kName, [&](Scan& s) -> std::optional<std::string_view> {
          const size_t name_at = s.at() - kName.size();
          if (name_at == 0 || !is_space(line[name_at - 1]) || !s.literal(" ")) return std::nullopt;
          s.run([](char c) { return c == '.'; });
          s.literal(" ");
          const std::string_view digits = s.digits();
          s.spaces();
          if (digits.empty() || !s.at_end()) return std::nullopt;
          return digits;
        });
    if (value) return whole(std::string(*value));
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
         (line.find("skipped=") != std::string::npos && deepspeed_progress(line));
}

// The readers: one LogStep per complete step line.

void read_megatron_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps) {
  std::map<std::string, std::string> dump;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    read_dump(line, dump);
    if (line.find("memory (MB)") != std::string::npos) {
      if (std::optional<std::string_view> max_allocated = megatron_max_allocated(line)) {
        const double bytes = logged_value(log, i, "max allocated (MB):", *max_allocated, kLoggedMemory, kMiB);
        log.peak_memory_bytes = std::max(log.peak_memory_bytes.value_or(0.0), bytes);
        continue;
      }
    }
    if (line.find("iteration") == std::string::npos) continue;
    std::optional<MegatronIteration> iteration = megatron_iteration(line);
    if (!iteration) continue;
    // Complete: every field closed by " |" (training_log ends each field so), the time among them.
    const std::string rest = trim(std::string_view(line).substr(iteration->fields_at));
    if (rest.empty() || rest.back() != '|') continue;
    const std::map<std::string, std::string> fields = bar_fields(rest);
    std::optional<double> time_s = logged_field(log, i, fields, "elapsed time per iteration (ms)", kLoggedStepTime, 1e-3);
    if (!time_s) continue;
    std::optional<long long> step = whole(std::string(iteration->step));
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.line = static_cast<long long>(i) + 1;
    s.time_s = time_s;
    s.tflops_per_gpu = logged_field(log, i, fields, "throughput per GPU (TFLOP/s/GPU)", kLoggedTflops);
    s.loss = logged_field(log, i, fields, "lm loss", kLoggedLoss);
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
  // The count after "global batch size " (or before " tokens per train step"), first on the line.
  auto count_after = [](const std::string& line, std::string_view words) -> std::optional<long long> {
    std::optional<std::string_view> digits =
        first_match(line, words, [](Scan& s) -> std::optional<std::string_view> {
          std::string_view d = s.digits();
          return d.empty() ? std::nullopt : std::optional(d);
        });
    return digits ? whole(std::string(*digits)) : std::nullopt;
  };
  auto count_before = [](const std::string& line, std::string_view words) -> std::optional<long long> {
    for (size_t at = line.find(words); at != std::string::npos; at = line.find(words, at + 1)) {
      size_t begin = at;
      while (begin > 0 && is_digit(line[begin - 1])) --begin;
      if (begin < at) return whole(line.substr(begin, at - begin));
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.find("Trainer is initialized with") != std::string::npos) {
      if (auto b = count_after(line, "global batch size ")) log.global_batch = b;
      if (auto n = count_after(line, "sequence length ")) log.seq_len = n;
      if (auto t = count_before(line, " tokens per train step")) log.tokens_per_step = t;
      continue;
    }
    if (line.find("tps:") == std::string::npos) continue;
    std::optional<TitanStep> t = titan_step(line);
    if (!t) continue;
    std::optional<long long> step = whole(std::string(t->step));
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.line = static_cast<long long>(i) + 1;
    s.loss = logged_value(log, i, "loss:", t->loss, kLoggedLoss);
    s.peak_memory_bytes = logged_value(log, i, "memory (GiB):", t->memory_gib, kLoggedMemory, kGiB);
    s.tokens_per_s_per_gpu = logged_value(log, i, "tps:", t->tps, kLoggedRate);
    s.tflops_per_gpu = logged_value(log, i, "tflops:", t->tflops, kLoggedTflops);
    if (!t->mfu.empty()) s.mfu_percent = logged_value(log, i, "mfu (%):", t->mfu, kLoggedMfu);
    steps.push_back(s);
  }
}


void read_deepspeed_log(const std::vector<std::string>& lines, EngineLog& log, std::vector<LogStep>& steps) {
  std::map<std::string, std::string> dump;
  std::vector<std::map<std::string, double>> timer_lines;  // global timers, ms, in order
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    read_dump(line, dump);
    if (size_t t = line.find("time (ms) |"); t != std::string::npos) {
      const std::map<std::string, std::string> fields = bar_fields(std::string_view(line).substr(t + 9));
      // The per-step (global) timers; the micro-step ones are named *_microstep.
      if (!fields.count("fwd") && !fields.count("bwd") && !fields.count("step")) continue;
      std::map<std::string, double> timers;  // ms
      for (const auto& [k, v] : fields) timers[k] = logged_value(log, i, k + " (ms):", v, kLoggedPhaseTime, 1e-3) * 1e3;
      timer_lines.push_back(timers);
      continue;
    }
    if (line.find("SamplesPerSec=") == std::string::npos) continue;
    std::optional<DeepSpeedThroughput> t = deepspeed_throughput(line);
    if (!t) continue;
    std::optional<long long> step = whole(std::string(t->global_step));
    if (!step) continue;
    LogStep s;
    s.step = *step;
    s.line = static_cast<long long>(i) + 1;
    s.samples_per_s = logged_value(log, i, "CurrSamplesPerSec:", t->samples_per_s, kLoggedRate);
    // "GB" = 1024^3 bytes
    s.peak_memory_bytes = logged_value(log, i, "MaxMemAllocated (GB):", t->max_allocated_gb, kLoggedMemory, kGiB);
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

bool in_range(double value, const LoggedFigure& figure) {
  return std::isfinite(value) && (figure.min_included ? value >= figure.min_value : value > figure.min_value) &&
         value <= figure.max_value;
}

std::string range_text(const LoggedFigure& figure) {
  if (figure.min_value == kLoggedLoss.min_value && figure.max_value == kLoggedLoss.max_value) return "a finite number";
  char text[128];
  std::snprintf(text, sizeof text, figure.min_included ? "%g to %g%s%s" : "above %g and at most %g%s%s",
                figure.min_value, figure.max_value, *figure.unit ? " " : "", figure.unit);
  return text;
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
    if (!in_range(t, kLoggedStepTime)) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", t);
      throw InputError(log.file + ":" + std::to_string(s.line) + ": step " + std::to_string(s.step) + "'s rate gives " +
                       kLoggedStepTime.what + " of " + seconds + " s for " + plan_file + "'s " +
                       (reader.step_time == StepTime::from_global_samples_per_s
                            ? std::to_string(global_batch) + " samples"
                            : std::to_string(static_cast<long long>(tokens_per_step)) + " tokens over " +
                                  std::to_string(world) + " GPUs") +
                       " per step (" + range_text(kLoggedStepTime) + "); a log that states it is refused");
    }
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
