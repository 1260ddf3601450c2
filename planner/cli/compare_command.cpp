// Printing only: the comparison itself (parsing, mapping, errors) is planner::compare_files.
#include "compare_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/phases.h"
#include "dplan/planner/compare.h"
#include "dplan/planner/engines.h"
#include "dplan/costmodel/units.h"

namespace dplan::cli {
namespace {
using planner::ComparedValue;
using planner::Comparison;
using planner::StageMemoryComparison;

const std::map<std::string, std::string> kMemoryLabels = {
    {"weights", "weights"},        {"gradients", "gradients"},
    {"optimizer", "optimizer"},    {"activations", "activations (+ logits)"},
    {"buffers", "buffers"},        {"peak", "peak (- reserve) *"},
    {"host", "host (offloaded optimizer)"},
};

// A phase's row: its label (costmodel/phases.h), with the phases a format-1 run.json timed inside it.
std::string phase_label(const planner::NamedComparison& p) {
  const std::optional<costmodel::Phase> phase = costmodel::phase_from_name(p.name);
  std::string out = phase ? std::string(costmodel::label(*phase)) : p.name;
  for (size_t i = 0; i < p.includes.size(); ++i) {
    const std::optional<costmodel::Phase> inside = costmodel::phase_from_name(p.includes[i]);
    out += (i == 0 ? " (+ " : ", ") + (inside ? std::string(costmodel::label(*inside)) : p.includes[i]);
  }
  return p.includes.empty() ? out : out + ")";
}

std::string label(const std::map<std::string, std::string>& labels, const std::string& name) {
  auto it = labels.find(name);
  return it == labels.end() ? name : it->second;
}

// "+12.3" or "n/a" (measured 0).
std::string percent(const ComparedValue& v) {
  std::optional<double> e = v.rel_error();
  if (!e) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f", 100 * *e);
  return buf;
}

std::string row(const std::string& what, const std::string& predicted, const std::string& measured,
                const std::string& error) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-26s %16s %16s %8s\n", what.c_str(), predicted.c_str(), measured.c_str(),
                error.c_str());
  return buf;
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

// One unit for every memory table, from the largest value shown: KiB, MiB or GiB.
struct MemoryUnit {
  const char* name;
  double bytes;
  int decimals;
};
MemoryUnit memory_unit(const Comparison& c) {
  double largest = 0;
  for (const auto& s : c.memory)
    for (const auto& m : s.components) largest = std::max({largest, m.value.predicted, m.value.measured});
  if (c.peak_memory_bytes) largest = std::max({largest, c.peak_memory_bytes->predicted, c.peak_memory_bytes->measured});
  if (largest < kMiB) return {"KiB", kKiB, 1};
  if (largest < kGiB) return {"MiB", kMiB, 3};
  return {"GiB", kGiB, 3};
}

// "0-3" or "0, 2, 4, 6": ranks in runs.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

const ComparedValue& component(const StageMemoryComparison& s, const std::string& name) {
  for (const auto& m : s.components)
    if (m.name == name) return m.value;
  DPLAN_CHECK(false && "every stage has every component");
  return s.components.front().value;
}

std::string summary(const Comparison& c) {
  std::ostringstream o;
  o << "summary: step time " << percent(c.step_time_s) << " % (" << fixed(1e3 * c.step_time_s.predicted, 2)
    << " ms predicted, " << fixed(1e3 * c.step_time_s.measured, 2) << " ms measured)";
  // The phase whose prediction is furthest off in milliseconds explains most of the step error.
  const planner::NamedComparison* gap = nullptr;
  for (const auto& p : c.phases)
    if (p.measured && (!gap || std::abs(p.value.predicted - p.value.measured) >
                                    std::abs(gap->value.predicted - gap->value.measured)))
      gap = &p;
  if (gap)
    o << "; largest phase gap " << gap->name << " ("
      << (gap->value.predicted >= gap->value.measured ? "+" : "")
      << fixed(1e3 * (gap->value.predicted - gap->value.measured), 2) << " ms)";
  // Memory: the stage with the highest measured peak is the one that decides whether a layout fits.
  const StageMemoryComparison* worst = nullptr;
  for (const auto& s : c.memory)
    if (!worst || component(s, "peak").measured > component(*worst, "peak").measured) worst = &s;
  if (worst) {
    std::string e = percent(component(*worst, "peak"));
    o << "; peak memory " << e << (e == "n/a" ? "" : " %") << " on stage " << worst->stage
      << ", the stage with the highest measured peak";
  }
  if (c.peak_memory_bytes) {
    std::string e = percent(*c.peak_memory_bytes);
    o << "; peak memory " << e << (e == "n/a" ? "" : " %") << " (the log's largest " << c.peak_memory_what
      << " against stage " << c.peak_memory_stage << ")";
  }
  return o.str() + "\n";
}

std::string report(const Comparison& c, const CompareArgs& args) {
  std::ostringstream o;
  o << args.plan_path << " vs " << args.run_path << ": tp " << c.tp << " · pp " << c.pp << " · dp " << c.dp << " · cp "
    << c.cp;
  if (c.ep > 1) o << " · ep " << c.ep;
  if (c.vpp > 1) o << " · vpp " << c.vpp;
  if (c.measured_steps > 0)
    o << ", median of " << c.measured_steps << " measured "
      << (c.format == planner::LogFormat::run ? "steps" : "step lines (the first " +
                                                             std::to_string(planner::kWarmupLogLines) +
                                                             " left out as warm-up)");
  o << "\nread as --format " << planner::to_string(c.format) << ": " << c.measured_by;
  o << "\n\n" << row("step time by phase", "predicted (ms)", "measured (ms)", "error %");
  // Phases neither predicted nor measured (cp comm without cp, offload without offload: at most
  // the microseconds of a collective of one rank, which print as 0.00 ms) are left out of the
  // table; --json has every one.
  auto shows = [](double seconds) { return 1e3 * seconds >= 0.005; };
  for (const auto& p : c.phases)
    if (shows(p.value.predicted) || (p.measured && shows(p.value.measured)))
      o << row(phase_label(p), fixed(1e3 * p.value.predicted, 2),
               p.measured ? fixed(1e3 * p.value.measured, 2) : "not measured", p.measured ? percent(p.value) : "");
  o << row(c.step_time_from_rate ? "step (from the rate)" : "step", fixed(1e3 * c.step_time_s.predicted, 2),
           fixed(1e3 * c.step_time_s.measured, 2), percent(c.step_time_s));
  o << row("tokens/s", fixed(c.tokens_per_s.predicted, 0), fixed(c.tokens_per_s.measured, 0), percent(c.tokens_per_s));
  if (c.tflops_per_gpu)
    o << row("TFLOP/s per GPU", fixed(c.tflops_per_gpu->predicted, 2), fixed(c.tflops_per_gpu->measured, 2),
             percent(*c.tflops_per_gpu));
  if (c.mfu)
    o << row("MFU %", fixed(100 * c.mfu->predicted, 2), fixed(100 * c.mfu->measured, 2), percent(*c.mfu));

  const MemoryUnit unit = memory_unit(c);
  const std::string predicted_header = std::string("predicted (") + unit.name + ")";
  const std::string measured_header = std::string("measured (") + unit.name + ")";
  for (const auto& s : c.memory) {
    o << "\nmemory per GPU, stage " << s.stage << " (ranks " << rank_list(s.ranks)
      << "; measured: the largest of those ranks)\n"
      << row("component", predicted_header, measured_header, "error %");
    for (const auto& m : s.components)
      o << row(label(kMemoryLabels, m.name), fixed(m.value.predicted / unit.bytes, unit.decimals),
               fixed(m.value.measured / unit.bytes, unit.decimals), percent(m.value));
  }
  if (c.format != planner::LogFormat::run) {
    if (c.peak_memory_bytes) {
      o << "\nmemory per GPU: the log's largest " << c.peak_memory_what << " against stage " << c.peak_memory_stage
        << ", the stage with the largest predicted peak\n"
        << row("component", predicted_header, measured_header, "error %")
        << row("peak (- reserve) *", fixed(c.peak_memory_bytes->predicted / unit.bytes, unit.decimals),
               fixed(c.peak_memory_bytes->measured / unit.bytes, unit.decimals), percent(*c.peak_memory_bytes))
        << "* predicted peak = total - reserve: the reserve is framework overhead (CUDA context) outside the "
           "allocator's count\n"
        << "memory per stage and component (weights, gradients, optimizer, activations, buffers): not measured\n";
    } else if (!c.memory_not_comparable.empty()) {
      o << "\nmemory: not measured (" << c.memory_not_comparable << ")\n";
    } else {
      o << "\nmemory: not measured (the log reports none)\n";
    }
  }
  if (!c.memory.empty())
    o << "* predicted peak = total - reserve (" << fixed(c.memory.front().predicted_reserve_bytes / unit.bytes, 1)
      << " " << unit.name << "): the reserve is framework overhead the executor's allocator does not see\n";
  if (!c.flops.empty()) {
    // Summed over the ranks: a rank's routed experts follow its tokens' choices, the sum does not.
    o << "\nmatrix-multiply FLOPs per step, all " << c.flops.size() << " ranks (GFLOP; --json: per rank)\n"
      << row("part", "predicted", "counted", "error %");
    for (auto which : {&planner::RankFlopsComparison::forward, &planner::RankFlopsComparison::recompute}) {
      const bool recomputed = which == &planner::RankFlopsComparison::recompute;
      for (size_t i = 0; i < (c.flops.front().*which).size(); ++i) {
        ComparedValue sum;
        for (const auto& f : c.flops) {
          sum.predicted += (f.*which)[i].value.predicted;
          sum.measured += (f.*which)[i].value.measured;
        }
        if (sum.predicted == 0 && sum.measured == 0) continue;
        const std::string& part = (c.flops.front().*which)[i].name;
        o << row(recomputed ? part + " (recomputed)" : part, fixed(sum.predicted / 1e9, 4), fixed(sum.measured / 1e9, 4),
                 percent(sum));
      }
    }
  }
  o << "\n" << summary(c);
  return o.str();
}

}  // namespace

void add_compare_options(CLI::App& command, CompareArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
  std::string logs;  // the engines whose logs dplan reads, as the engine table lists them
  for (const planner::EngineDescriptor& d : planner::engines())
    if (d.log) logs += (logs.empty() ? "" : ", ") + std::string(d.display_name);
  command.add_option("run", args.run_path,
                     "run.json written by dplan run -o, or an engine's training log (" + logs + "; docs/compare.md)")
      ->required();
  command.add_option("--format", args.format,
                     "what the measurement file is: " + join_choices(planner::log_format_names()) +
                         " (default: told by content)");
  command.add_flag("--json", args.json, "print JSON");
}

int run_compare(const CompareArgs& args) {
  std::optional<planner::LogFormat> format;
  if (!args.format.empty()) format = planner::log_format_from_string(args.format);
  Comparison c = planner::compare_files(args.plan_path, args.run_path, format);
  if (args.json)
    std::cout << planner::to_json(c).dump(2) << "\n";
  else
    std::cout << report(c, args);
  return 0;
}

}  // namespace dplan::cli
