// Test helpers shared by the end-to-end tests: a self-removing temp folder, whole-file reads, and
// a child-process runner (fork/exec, no shell) that captures stdout and stderr.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

extern char** environ;

namespace dplan::testing {
namespace fs = std::filesystem;

// A fresh folder under the system temp directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dplan-cli-test-XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

  // Writes `text` to path()/relative (creating folders) and returns the absolute path.
  std::string write(const std::string& relative, const std::string& text) const {
    fs::path p = path_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  fs::path path_;
};

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int status = -1;  // exit status; 128 + signal if the child was killed
  std::string out, err;
};

// Runs `program` with `args` (no shell), stdout and stderr captured through files in a temp dir.
// The environment is this process's, with DPLAN_PROFILES=DPLAN_PROFILES_DIR and then `env` on top.
inline Result run_program(const std::string& program, const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env = {}) {
  TempDir io;
  const std::string out_path = (io.path() / "stdout").string();
  const std::string err_path = (io.path() / "stderr").string();

  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  vars["DPLAN_PROFILES"] = DPLAN_PROFILES_DIR;
  for (const auto& [k, v] : env) vars[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);

  // Everything the child needs is built before fork(): it only opens, dup2s and execs.
  std::vector<char*> argv, envp;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
    ::execve(program.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) REQUIRE(errno == EINTR);
  Result r;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

// Bad input through the dplan binary: exit 2, nothing on stdout, and stderr exactly one line
// "dplan: error: ...". Returns that line without its newline, for the caller to check what it names.
inline std::string require_one_error_line(const Result& r) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  REQUIRE(!r.err.empty());
  CHECK(r.err.back() == '\n');
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("dplan: error: ", 0) == 0);
  return r.err.substr(0, r.err.find('\n'));
}

}  // namespace dplan::testing
