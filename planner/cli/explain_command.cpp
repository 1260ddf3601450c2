#include "explain_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/units.h"
#include "dplan/planner/explain.h"
#include "dplan/planner/report.h"

namespace dplan::cli {
using namespace costmodel;
using namespace planner;

void add_explain_options(CLI::App& command, ExplainArgs& args) {
  command.add_option("plan", args.plan_path, "plan.json written by dplan -o")->required();
  command.add_option("--cluster", args.cluster,
                     "cluster profile name or path to explain on (default: the profile the plan names)");
  command.add_option("--headroom", args.headroom_fraction,
                     "fraction of HBM a changed plan must leave free")
      ->capture_default_str()
      ->check(CLI::Range(0.0, kMaxHeadroomFraction));
  command.add_option("--top", args.top, "how many changes to show")->capture_default_str()->check(CLI::Range(1, 100));
  command.add_flag("--json", args.json, "print JSON");
}

int run_explain(const ExplainArgs& args, const ProfileStore& store) {
  const Plan plan = read_plan(args.plan_path);  // strict: a foreign file is one error line
  PlanCase c;
  c.model = plan.model;
  c.cluster = args.cluster ? store.load_cluster(*args.cluster) : plan_cluster(plan, args.plan_path, store);
  c.training = plan.training;
  c.parallel = plan.parallel;
  c.overlap = plan.overlap;
  c.headroom_fraction = args.headroom_fraction;
  const Estimated e = estimate_case(c);
  const MfuBreakdown breakdown = explain_time(e.time);
  const std::vector<Suggestion> suggestions = suggest_changes(c, e.time, static_cast<size_t>(args.top));

  // The stored prediction is the cost model's answer when the plan was written; today's may differ.
  const double stored_step_s = plan.prediction.value("step_time_s", 0.0);
  const bool differs = !(std::abs(stored_step_s - e.time.step_time_s) <= 1e-9 * e.time.step_time_s);
  char note[256] = "";
  if (differs)
    std::snprintf(note, sizeof note,
                  "the plan's stored prediction (%.3f s per step) differs from today's estimate (%.3f s): the cost "
                  "model or the cluster changed since it was written; this explains today's",
                  stored_step_s, e.time.step_time_s);

  if (args.json) {
    json suggestion_list = json::array();
    for (const Suggestion& s : suggestions) suggestion_list.push_back(to_json(s));
    json out = {{"plan", args.plan_path},
                {"estimate_flags", estimate_flags(c)},
                {"headroom_fraction", c.headroom_fraction},
                {"fits", e.memory.fits},
                {"peak_bytes", e.memory.peak_bytes},
                {"stored_step_time_s", stored_step_s},
                {"step_time_s", e.time.step_time_s},
                {"tokens_per_s", e.time.tokens_per_s},
                {"explain", to_json(breakdown)},
                {"suggestions", suggestion_list}};
    if (differs) out["note"] = note;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << plan.model.name << " on " << c.parallel.world_size() << " x " << c.cluster.gpu.name << " ("
            << c.cluster.name << ")\nlayout  " << describe_layout(c.model, c.training, c.parallel) << "\n";
  if (differs) std::cout << "note: " << note << "\n";
  if (const std::string unprobed = unprobed_profile_note(c.cluster); !unprobed.empty())
    std::cout << "! " << unprobed << "\n";
  std::printf("memory: worst stage needs %.1f of %.1f GiB; plans keep %.0f %% of HBM free (--headroom %g)%s\n",
              e.memory.peak_bytes / kGiB, e.memory.capacity_bytes / kGiB, 100 * c.headroom_fraction,
              c.headroom_fraction, e.memory.fits ? "" : ": this plan does not fit");
  std::printf("throughput: %.0f tokens/s, step %.3f s\n\n", e.time.tokens_per_s, e.time.step_time_s);
  std::cout << std::flush << explain_table(breakdown, suggestions, &c);
  return 0;
}

}  // namespace dplan::cli
