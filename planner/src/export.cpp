// dplan export: the checks, the shared pieces of every engine's files, the dplan-worker launches
// (torchrun, Slurm) and the writing of an export folder. The engines' own files are in
// export_megatron.cpp, export_torchtitan.cpp and export_deepspeed.cpp (DeepSpeed and Accelerate).
#include "dplan/planner/export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"
#include "dplan/planner/quoting.h"
#include "dplan/planner/report.h"
#include "export_engines.h"

namespace dplan::planner {
using namespace costmodel;

namespace {

// README.export: the one file every export writes. Its first words and its list of the files the
// export wrote are read back by write_export: --force replaces only the files listed there.
constexpr const char* kReadmeName = "README.export";
constexpr const char* kReadmeFirstWords = "dplan export --to ";
constexpr const char* kFilesHeading = "files:";
constexpr const char* kListIndent = "  ";
constexpr size_t kMaxReadmeBytes = size_t{1} << 20;

}  // namespace

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
  o << comment << kReadmeFirstWords << to_string(in.engine) << " of " << comment_text(in.plan_name) << " ("
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
  o << "\n" << kFilesHeading << "\n";
  for (const ExportFile& f : files) o << kListIndent << f.name << "\n";
  o << kListIndent << kReadmeName << "\n";
  const bool one_node = launch_shape(in.plan).nodes == 1;
  o << "\n" << (!where.empty() ? where : one_node ? "run (one node):" : "run (on every node):") << "\n  " << launch_line
    << "\n";
  if (!notes.empty()) {
    o << "\nnotes:\n";
    for (const std::string& n : notes) o << "  - " << n << "\n";
  }
  o << "\nThe files are dplan's mapping of the plan (docs/export.md); `dplan check " << shell_word(in.plan_name) << " --engine "
    << to_string(in.engine) << "` applies the engine's rules again.\n";
  return ExportFile{kReadmeName, o.str(), false};
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

namespace {

// The files an earlier export wrote into `folder`: those its README.export lists under "files:",
// when that README.export is one dplan wrote (it starts with "dplan export --to "). None else.
std::set<std::string> earlier_export_files(const std::filesystem::path& folder) {
  const std::string path = (folder / kReadmeName).string();
  // Not through a link, and never waiting on a FIFO: only a regular file is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) <= kMaxReadmeBytes) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  std::set<std::string> files;
  if (text.rfind(kReadmeFirstWords, 0) != 0) return files;
  std::istringstream in(text);
  bool listing = false;
  for (std::string line; std::getline(in, line);) {
    if (listing && line.rfind(kListIndent, 0) != 0) break;
    if (listing) files.insert(line.substr(std::strlen(kListIndent)));
    listing = listing || line == kFilesHeading;
  }
  return files;
}

// `text` with every `from` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

}  // namespace

std::vector<std::string> write_export(const Exported& exported, const std::string& dir, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) throw InputError("the export folder (-o) is empty");
  // "out/" and "out//" name out itself: a link there is refused as for "out" (lstat of "out/"
  // would follow it).
  std::string folder_text = dir;
  while (folder_text.size() > 1 && folder_text.back() == '/') folder_text.pop_back();
  const fs::path folder(folder_text);
  struct stat st {};
  const bool existed = ::lstat(folder.c_str(), &st) == 0;
  if (existed && !S_ISDIR(st.st_mode))
    throw InputError(folder_text + ": is a " + file_kind(st.st_mode) + ", not a folder; give -o a folder to write the files into");

  // Every path is checked before anything is written. --force replaces only what an earlier
  // export wrote (its README.export lists it), never a file of the user's.
  const OutputKind kind{"file of this export", [](const std::string&) { return false; }};
  const std::set<std::string> earlier = existed ? earlier_export_files(folder) : std::set<std::string>{};
  std::vector<std::string> paths;
  for (const ExportFile& f : exported.files) {
    const std::string path = (folder / f.name).string();
    const bool present = ::lstat(path.c_str(), &st) == 0;
    if (!force && present && S_ISREG(st.st_mode) && !is_input_file(path))
      throw InputError(path + ": exists; give --force to replace the export's files, or another -o folder");
    if (existed) check_output_path(path, kind, true);  // links, folders, devices and the command's inputs: never
    if (present && !earlier.count(f.name))
      throw InputError(path + ": exists and is no file of an earlier export (" + kReadmeName +
                       " here does not list it); --force replaces only those: move it away, or give another -o folder");
    paths.push_back(path);
  }

  // The folder, and the missing folders above it, are made now and removed again if the export fails.
  fs::path made;
  for (fs::path p = folder; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(folder, ec);
  if (!fs::is_directory(folder, ec)) throw InputError(folder_text + ": cannot be made a folder: " + ec.message());
  const auto remove_made = [&] {
    if (made.empty()) return;
    for (fs::path p = folder;; p = p.parent_path()) {
      fs::remove(p, ec);  // empty folders only
      if (p == made || p == p.parent_path() || p.empty()) break;
    }
  };

  // Each file is written complete into a private folder inside `folder` first; only then are
  // they renamed into place, one after another, the files they replace kept (hard links in the
  // private folder) until the last is in, so that a failure at any point leaves the earlier
  // export whole (or no export) and no temporary.
  std::string staging_template = (folder / ".dplan-export-XXXXXX").string();
  if (::mkdtemp(staging_template.data()) == nullptr) {
    const int err = errno;
    remove_made();
    throw InputError(folder_text + ": cannot write in it: " + std::strerror(err));
  }
  const fs::path staging(staging_template);
  const auto fail = [&](const std::string& what) {  // throws
    fs::remove_all(staging, ec);
    remove_made();
    throw InputError(replace_all(what, staging.string(), folder_text) + "; nothing was written in " + folder_text);
  };
  const auto kept = [&](const ExportFile& f) { return staging / (".kept-" + f.name); };
  try {
    for (const ExportFile& f : exported.files) {
      const fs::path staged = staging / f.name;
      write_file_atomically(staged.string(), f.content);
      if (!f.executable) continue;
      // Executable wherever readable (the umask's choice of readers stays).
      const fs::perms p = fs::status(staged, ec).permissions();
      fs::perms x = fs::perms::owner_exec;
      if ((p & fs::perms::group_read) != fs::perms::none) x |= fs::perms::group_exec;
      if ((p & fs::perms::others_read) != fs::perms::none) x |= fs::perms::others_exec;
      fs::permissions(staged, x, fs::perm_options::add, ec);
      if (ec) throw InputError(staged.string() + ": cannot make it executable: " + ec.message());
    }
    for (size_t i = 0; i < paths.size(); ++i)
      if (::lstat(paths[i].c_str(), &st) == 0 && ::link(paths[i].c_str(), kept(exported.files[i]).c_str()) != 0) {
        fs::copy_file(paths[i], kept(exported.files[i]), ec);  // a file system without hard links
        if (ec) throw InputError(paths[i] + ": cannot keep the earlier file while replacing it: " + ec.message());
      }
  } catch (const InputError& e) {
    fail(e.what());
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    if (::rename((staging / exported.files[i].name).c_str(), paths[i].c_str()) == 0) continue;
    const int err = errno;
    // Put back what was replaced; remove what was new.
    for (size_t j = 0; j < i; ++j)
      if (fs::exists(kept(exported.files[j]), ec))
        ::rename(kept(exported.files[j]).c_str(), paths[j].c_str());
      else
        ::unlink(paths[j].c_str());
    fail(paths[i] + ": cannot move it into place: " + std::strerror(err));
  }
  fs::remove_all(staging, ec);
  return paths;
}

}  // namespace dplan::planner
