// dplan export: the checks, the shared pieces of every engine's files, the dplan-worker launches
// (torchrun, Slurm) and the writing of an export folder. The engines' own files are in
// export_megatron.cpp, export_torchtitan.cpp and export_deepspeed.cpp (DeepSpeed and Accelerate).
#include "dplan/planner/export.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/planner/quoting.h"
#include "dplan/planner/report.h"
#include "export_engines.h"

namespace dplan::planner {
using namespace costmodel;

namespace detail {

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string header(const ExportInput& in, const std::string& comment) {
  const Plan& plan = in.plan;
  const LaunchShape s = launch_shape(plan);
  std::ostringstream o;
  o << comment << "dplan export --to " << to_string(in.engine) << " of " << comment_text(in.plan_name) << " ("
    << comment_text(plan.model.name) << ")\n";
  o << comment << "spellings: " << engine_version(in.engine) << "\n";
  // describe_layout wraps its line: one line here, every line of a file's header is a comment.
  std::string layout = describe_layout(plan.model, plan.training, plan.parallel);
  for (size_t nl; (nl = layout.find('\n')) != std::string::npos;) {
    size_t next = nl + 1;
    while (next < layout.size() && layout[next] == ' ') ++next;
    layout.replace(nl, next - nl, ", ");
  }
  o << comment << "layout: " << layout << "\n";
  o << comment << "launch: " << s.nodes << (s.nodes == 1 ? " node" : " nodes") << " x " << s.per_node
    << (s.gpus ? " GPUs" : " processes (CPU ranks)") << " = " << s.world << " ranks\n";
  return o.str();
}

std::string script_preamble(const ExportInput& in) {
  return "#!/usr/bin/env bash\n" + header(in, "# ") +
         "set -euo pipefail\n"
         "here=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n";
}

std::string torchrun_command(const LaunchShape& shape) {
  const std::string address = shape.nodes == 1 ? "${MASTER_ADDR:-127.0.0.1}"
                                                : "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}";
  return "torchrun --nnodes " + std::to_string(shape.nodes) + " --nproc_per_node " + std::to_string(shape.per_node) +
         " --rdzv_backend c10d --rdzv_endpoint \"" + address + ":${MASTER_PORT:-29400}\" --rdzv_id \"${RUN_ID:-dplan}\"" +
         " --redirects 1 --tee 1";
}

ExportFile readme(const ExportInput& in, const std::vector<ExportFile>& files, const std::string& launch_line,
                  const std::vector<std::string>& notes, const std::string& where) {
  std::ostringstream o;
  o << header(in, "");
  o << "\nfiles:\n";
  for (const ExportFile& f : files) o << "  " << f.name << "\n";
  o << "  README.export\n";
  const bool one_node = launch_shape(in.plan).nodes == 1;
  o << "\n" << (!where.empty() ? where : one_node ? "run (one node):" : "run (on every node):") << "\n  " << launch_line
    << "\n";
  if (!notes.empty()) {
    o << "\nnotes:\n";
    for (const std::string& n : notes) o << "  - " << n << "\n";
  }
  o << "\nThe files are dplan's mapping of the plan (docs/export.md); `dplan check " << shell_word(in.plan_name) << " --engine "
    << to_string(in.engine) << "` applies the engine's rules again.\n";
  return ExportFile{"README.export", o.str(), false};
}

// ---------------------------------------------------------------------------------------------
// dplan-worker under torchrun and Slurm: a copy of the plan beside the script.

Exported export_torchrun(const ExportInput& in) {
  const LaunchShape s = launch_shape(in.plan);
  std::ostringstream o;
  o << script_preamble(in);
  o << "# Run on every node (" << s.nodes << " in all); torchrun's c10d rendezvous at MASTER_ADDR:MASTER_PORT joins them.\n"
       "# dplan-worker reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from torchrun\n"
       "# (DPLAN_WORKER: its path, default dplan-worker on PATH; RUN_JSON: where rank 0 writes run.json).\n";
  o << "exec " << torchrun_command(s)
    << " --no_python \"${DPLAN_WORKER:-dplan-worker}\" \"$here/plan.json\" -o \"${RUN_JSON:-run.json}\" \"$@\"\n";
  Exported e;
  e.files.push_back({"plan.json", in.plan_text, false});
  const std::string launch = descriptor(in.engine).launch_file;
  e.files.push_back({launch, o.str(), true});
  e.launch_line = std::string(s.nodes == 1 ? "" : "MASTER_ADDR=<first node> ") + "./" + launch +
                  " [dplan-worker options, e.g. --steps 20]";
  e.files.push_back(readme(in, e.files, e.launch_line,
                           {"dplan-worker is built by this repository (./setup.sh --executor); put it on PATH or set "
                            "DPLAN_WORKER"}));
  return e;
}

Exported export_slurm(const ExportInput& in) {
  const LaunchShape s = launch_shape(in.plan);
  std::ostringstream o;
  o << "#!/usr/bin/env bash\n";
  // sbatch splits its #SBATCH lines itself, with no quoting a shell would honour: a safe word.
  o << "#SBATCH --job-name=dplan-" << safe_word(in.plan.model.name) << "\n";
  o << "#SBATCH --nodes=" << s.nodes << "\n";
  o << "#SBATCH --ntasks-per-node=" << s.per_node << "\n";
  if (s.gpus) o << "#SBATCH --gpus-per-node=" << s.per_node << "\n";
  o << header(in, "# ");
  o << "set -euo pipefail\n";
  o << "# sbatch runs a copy of this script from its spool folder: find the exported folder through the\n"
       "# job's command (scontrol), else the script's own folder, else the submit folder.\n"
       "script=${BASH_SOURCE[0]}\n"
       "if [[ -n ${SLURM_JOB_ID:-} ]] && command -v scontrol >/dev/null; then\n"
       "  command_path=$(scontrol show job \"$SLURM_JOB_ID\" | sed -n 's/^ *Command=\\([^ ]*\\).*/\\1/p' | head -n 1)\n"
       "  # Command= is the path as typed to sbatch, relative to the folder sbatch ran in (SLURM_SUBMIT_DIR),\n"
       "  # not to the job's working folder (--chdir).\n"
       "  if [[ -n $command_path && $command_path != /* && -n ${SLURM_SUBMIT_DIR:-} ]]; then\n"
       "    command_path=$SLURM_SUBMIT_DIR/$command_path\n"
       "  fi\n"
       "  if [[ -n $command_path && -f $command_path ]]; then script=$command_path; fi\n"
       "fi\n"
       "here=$(cd \"$(dirname \"$script\")\" && pwd)\n"
       "if [[ ! -f $here/plan.json && -n ${SLURM_SUBMIT_DIR:-} ]]; then here=$SLURM_SUBMIT_DIR; fi\n";
  o << "# dplan-worker reads SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, and MASTER_ADDR / MASTER_PORT.\n"
       "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
       "export MASTER_ADDR\n"
       "export MASTER_PORT=${MASTER_PORT:-29500}\n";
  o << "srun \"${DPLAN_WORKER:-dplan-worker}\" \"$here/plan.json\" -o \"${RUN_JSON:-run.json}\" \"$@\"\n";
  Exported e;
  e.files.push_back({"plan.json", in.plan_text, false});
  const std::string launch = descriptor(in.engine).launch_file;
  e.files.push_back({launch, o.str(), true});
  e.launch_line = "sbatch " + launch + " [dplan-worker options, e.g. --steps 20]";
  e.files.push_back(readme(in, e.files, e.launch_line,
                           {"dplan-worker must be on PATH on every node (or set DPLAN_WORKER, exported to the job)",
                            std::string("the job asks for ") + std::to_string(s.nodes) + " node(s) x " +
                                std::to_string(s.per_node) + " tasks" +
                                (s.gpus ? " and as many GPUs per node" : " (CPU ranks: no GPUs requested)")},
                           "submit (once; Slurm starts the tasks on every node):"));
  return e;
}

}  // namespace detail

Exported export_plan(const Plan& plan, Engine engine, const std::string& plan_text, const std::string& plan_name) {
  const RuleReport report = check_engine_rules(plan, engine);
  if (!report.ok()) {
    std::string lines;
    for (size_t i = 0; i < report.failures.size(); ++i) lines += (i ? "\n" : "") + report.failures[i];
    throw InputError(lines);
  }
  return descriptor(engine).export_files(detail::ExportInput{plan, engine, plan_text, plan_name});
}

std::string default_export_dir(const std::string& plan_path, Engine engine) {
  const std::filesystem::path p(plan_path);
  return (p.parent_path() / (p.stem().string() + "-" + to_string(engine))).string();
}

std::vector<std::string> write_export(const Exported& exported, const std::string& dir, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) throw InputError("the export folder (-o) is empty");
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw InputError(dir + ": is a " + file_kind(st.st_mode) + ", not a folder; give -o a folder to write the files into");
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw InputError(dir + ": cannot be made a folder: " + ec.message());
  // No file an export writes is recognised as replaceable: an existing one needs --force.
  const OutputKind kind{"file of this export", [](const std::string&) { return false; }};
  std::vector<std::string> paths;
  for (const ExportFile& f : exported.files) {
    const std::string path = (fs::path(dir) / f.name).string();
    if (!force && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && !is_input_file(path))
      throw InputError(path + ": exists; give --force to replace the export's files, or another -o folder");
    check_output_path(path, kind, true);  // links, folders, devices and the command's inputs: never
    paths.push_back(path);
  }
  for (size_t i = 0; i < exported.files.size(); ++i) {
    write_file_atomically(paths[i], exported.files[i].content);
    if (exported.files[i].executable) {
      // Executable wherever readable (the umask's choice of readers stays).
      const fs::perms p = fs::status(paths[i]).permissions();
      fs::perms x = fs::perms::owner_exec;
      if ((p & fs::perms::group_read) != fs::perms::none) x |= fs::perms::group_exec;
      if ((p & fs::perms::others_read) != fs::perms::none) x |= fs::perms::others_exec;
      fs::permissions(paths[i], x, fs::perm_options::add);
    }
  }
  return paths;
}

}  // namespace dplan::planner
