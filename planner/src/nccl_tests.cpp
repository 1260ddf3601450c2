#include "dplan/planner/nccl_tests.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "fit.h"

namespace dplan::planner {
namespace {
using costmodel::ClusterSpec;
using costmodel::Collective;
using dplan::InputError;

const std::map<std::string, Collective>& tests() {
  static const std::map<std::string, Collective> t = {{"all_reduce_perf", Collective::all_reduce},
                                                      {"all_gather_perf", Collective::all_gather},
                                                      {"reduce_scatter_perf", Collective::reduce_scatter},
                                                      {"alltoall_perf", Collective::all_to_all},
                                                      {"sendrecv_perf", Collective::send_recv}};
  return t;
}

std::string test_names() {
  std::string s;
  for (const auto& [name, op] : tests()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

bool parse_number(const std::string& token, double& value) {
  try {
    size_t used = 0;
    value = std::stod(token, &used);
    return used == token.size() && std::isfinite(value);
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<detail::ClusterParameter> parameters_for(const ClusterSpec& base, const NcclTestsRun& run) {
  std::vector<detail::ClusterParameter> p;
  if (run.nodes > 1) {
    p.push_back({"inter_node.efficiency", [](ClusterSpec& c) -> double& { return c.nic_efficiency_fraction; }, {0.02, 1.0}});
    p.push_back({"inter_node.half_bandwidth", [](ClusterSpec& c) -> double& { return c.inter_node_half_bandwidth_bytes; },
                 {1e3, 1e10}});
    p.push_back({"inter_node.latency", [](ClusterSpec& c) -> double& { return c.inter_node_latency_s; }, {1e-8, 1e-3}});
    return p;
  }
  p.push_back({"intra_node.efficiency", [](ClusterSpec& c) -> double& { return c.intra_node.efficiency_fraction; }, {0.02, 1.0}});
  p.push_back({"intra_node.half_bandwidth", [](ClusterSpec& c) -> double& { return c.intra_node.half_bandwidth_bytes; },
               {1e3, 1e10}});
  p.push_back({"intra_node.latency", [](ClusterSpec& c) -> double& { return c.intra_node.latency_s; }, {1e-8, 1e-3}});
  if (base.nvls && run.collective == Collective::all_reduce) {
    p.push_back({"intra_node.nvls_efficiency", [](ClusterSpec& c) -> double& { return c.nvls_efficiency_fraction; }, {0.02, 1.0}});
    p.push_back({"intra_node.nvls_half_bandwidth", [](ClusterSpec& c) -> double& { return c.nvls_half_bandwidth_bytes; },
                 {1e3, 1e10}});
  }
  return p;
}

std::vector<double> model_times(const ClusterSpec& c, const NcclTestsRun& run) {
  costmodel::Network net(c, run.ranks);
  std::vector<double> t;
  for (const auto& r : run.rows) t.push_back(net.cost(run.collective, r.bytes, {run.ranks, 1}).time_s);
  return t;
}

std::vector<double> measured_times(const NcclTestsRun& run) {
  std::vector<double> t;
  for (const auto& r : run.rows) t.push_back(r.time_s);
  return t;
}

// One line that is no header or comment: a result row added to `run` (or counted as skipped, with
// a size or time of 0 or wrong values), or nothing where it is no result row. Throws InputError for
// a row without its figures or with figures no machine measures.
void read_result_row(const std::string& line, const std::string& where, NcclTestsRun& run) {
  // size count type redop root time algbw busbw #wrong ...: the first token with a decimal point
  // after the type is the out-of-place time (redop and root are words or integers).
  std::istringstream tokens(line);
  std::vector<std::string> t{std::istream_iterator<std::string>(tokens), std::istream_iterator<std::string>()};
  double size = 0;
  if (t.size() < 8 || !parse_number(t[0], size)) return;  // not a result row
  size_t i = 3;
  while (i < t.size() && t[i].find('.') == std::string::npos) ++i;
  double time_us = 0, algbw = 0, busbw = 0, wrong = 0;
  if (i + 3 >= t.size() || !parse_number(t[i], time_us) || !parse_number(t[i + 1], algbw) ||
      !parse_number(t[i + 2], busbw))
    throw InputError(where + ": a result row without time, algbw and busbw: \"" + quote_for_message(line) + "\"");
  const bool wrong_ok = parse_number(t[i + 3], wrong);
  if (size <= 0 || time_us <= 0 || (wrong_ok && wrong > 0)) {
    ++run.skipped_rows;
    return;
  }
  // No machine moves a petabyte in one collective, takes three hours for one, or sustains
  // 10 PB/s: such a row is a corrupt file, and its figures would overflow the fit.
  if (size > 1e15 || time_us > 1e10 || algbw > 1e7 || busbw < 0 || busbw > 1e7)
    throw InputError(where +
                     ": a result row outside what a machine measures (size up to 1e15 B, time up to 1e10 us, "
                     "bandwidths 0 to 1e7 GB/s): \"" + quote_for_message(line) + "\"");
  run.rows.push_back({size, time_us * 1e-6, busbw * 1e9});
}

// The collective: as given, else as the file's "Collective test starting:" line names it.
Collective collective_of(const std::string& file, const std::optional<std::string>& test,
                         std::optional<Collective> collective) {
  if (collective) return *collective;
  if (test && tests().count(*test)) return tests().at(*test);
  throw InputError(file + ": " + (test ? "the test " + *test + " is not one of " + test_names()
                                       : "no \"# Collective test starting:\" line names the test") +
                   "; give --collective all_reduce|all_gather|reduce_scatter|all_to_all|send_recv");
}

}  // namespace

NcclTestsRun parse_nccl_tests(const std::string& text, const std::string& file, std::optional<Collective> collective) {
  NcclTestsRun run;
  run.file = file;
  static const std::regex rank_line(R"(^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+))");
  static const std::regex test_line(R"(Collective test starting:\s*(\S+))");
  std::set<std::string> hosts;
  std::optional<std::string> test;
  std::istringstream lines(text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    std::smatch m;
    if (std::regex_search(line, m, rank_line)) {
      ++run.ranks;
      hosts.insert(m[1]);
      continue;
    }
    if (std::regex_search(line, m, test_line)) test = m[1];
    if (line.empty() || line[0] == '#') continue;
    read_result_row(line, file + ":" + std::to_string(line_no), run);
  }
  run.collective = collective_of(file, test, collective);
  if (run.ranks == 0)
    throw InputError(file + ": no \"#  Rank r Group g Pid p on HOST device ...\" lines: is this nccl-tests output?");
  if (run.rows.empty())
    throw InputError(file + ": no result rows (size count type ... time algbw busbw #wrong) with a positive size and "
                            "no wrong values");
  run.nodes = static_cast<int>(hosts.size());
  return run;
}

TierFit fit_link_tier(const ClusterSpec& profile, const NcclTestsRun& run) {
  ClusterSpec base = profile;
  base.intra_node.measured.clear();  // the model's figures are fitted, not an
                                     // earlier import's timings
  if (run.ranks < 2)
    throw InputError(run.file + ": " + std::to_string(run.ranks) + " rank: a collective needs 2 or more");
  if (run.nodes == 1 && run.ranks > base.gpus_per_node)
    throw InputError(run.file + ": " + std::to_string(run.ranks) + " ranks on one host, but " + base.name + " has " +
                     std::to_string(base.gpus_per_node) + " GPUs per node; pick the cluster profile of that node");
  if (run.nodes > 1 && run.ranks != run.nodes * base.gpus_per_node)
    throw InputError(run.file + ": " + std::to_string(run.ranks) + " ranks on " + std::to_string(run.nodes) +
                     " hosts, but " + base.name + " has " + std::to_string(base.gpus_per_node) +
                     " GPUs per node; import a run that uses every GPU of each node");
  const std::vector<detail::ClusterParameter> params = parameters_for(base, run);
  if (run.rows.size() < params.size())
    throw InputError(run.file + ": " + std::to_string(run.rows.size()) + " sizes cannot determine " +
                     std::to_string(params.size()) + " parameters; run nccl-tests over a range of sizes (-b 1M -e 8G -f 2)");

  TierFit fit;
  fit.tier = run.nodes > 1 ? "inter_node" : "intra_node";
  const std::vector<double> measured = measured_times(run);
  const std::vector<double> before = model_times(base, run);
  const ClusterSpec c = detail::fit_cluster(
      base, params, [&](const ClusterSpec& trial) { return detail::rms_log_error(model_times(trial, run), measured); });
  for (const auto& p : params) fit.parameters.push_back(p.name);
  const std::vector<double> after = model_times(c, run);
  for (size_t i = 0; i < run.rows.size(); ++i)
    fit.rows.push_back({run.rows[i].bytes, run.rows[i].time_s, before[i], after[i]});
  fit.rms_log_error_before = detail::rms_log_error(before, measured);
  fit.rms_log_error_after = detail::rms_log_error(after, measured);
  fit.cluster = c;
  return fit;
}

}  // namespace dplan::planner
