// Files in and out: the checks every input and every output of dplan goes through
// (json_io.h owns the rules; docs/cli.md "Input files" and "Output files" state them).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"

namespace dplan {
namespace {
// The (device, inode) of every file this process read: its inputs, which an output must not replace.
struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator<(const FileId& o) const { return dev != o.dev ? dev < o.dev : ino < o.ino; }
};
std::mutex g_inputs_mutex;
std::set<FileId>& inputs() {
  static std::set<FileId> ids;
  return ids;
}

std::string read_all(int fd, const std::string& path) {
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(path + ": cannot be read: " + std::strerror(errno));
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxInputBytes)
      throw InputError(path + ": larger than " + std::to_string(kMaxInputBytes >> 20) + " MiB; not a dplan input");
  }
}

// The temporary name a write has linked and not yet renamed, for the signal handler to remove.
// Written before the handler is installed, read only by the handler.
char g_pending_tmp[PATH_MAX];
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
struct sigaction g_previous[sizeof kCleanupSignals / sizeof kCleanupSignals[0]];

void remove_pending_and_reraise(int sig) {
  if (g_pending_tmp[0]) ::unlink(g_pending_tmp);  // async-signal-safe
  for (size_t i = 0; i < std::size(kCleanupSignals); ++i)
    if (kCleanupSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  ::raise(sig);
}

// While alive, a catchable signal removes the temporary name before the process acts on it.
class PendingTemporary {
 public:
  explicit PendingTemporary(const std::string& tmp) {
    std::snprintf(g_pending_tmp, sizeof g_pending_tmp, "%s", tmp.c_str());
    struct sigaction sa {};
    sa.sa_handler = remove_pending_and_reraise;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kCleanupSignals); ++i) ::sigaction(kCleanupSignals[i], &sa, &g_previous[i]);
  }
  ~PendingTemporary() {
    for (size_t i = 0; i < std::size(kCleanupSignals); ++i) ::sigaction(kCleanupSignals[i], &g_previous[i], nullptr);
    g_pending_tmp[0] = '\0';
  }
  PendingTemporary(const PendingTemporary&) = delete;
  PendingTemporary& operator=(const PendingTemporary&) = delete;
};

void write_all(int fd, const std::string& text, const std::string& path) {
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw InputError(path + ": write failed: " + std::strerror(n < 0 ? errno : ENOSPC));
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) throw InputError(path + ": write failed: " + std::strerror(errno));
}

mode_t file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(path + ": folder " + dir.string() + " does not exist");
  static std::atomic<unsigned> counter{0};
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                                  std::to_string(counter++)))
                              .string();
  // O_TMPFILE: the data goes into a file with no name, so a kill (even SIGKILL) before the link
  // leaves nothing behind. File systems without it get a named temporary from the start.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, file_mode());
  const bool unnamed = fd >= 0;
  std::optional<PendingTemporary> pending;
  if (!unnamed) {
    pending.emplace(tmp);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, file_mode());
    if (fd < 0) {
      const int err = errno;
      throw InputError(path + ": cannot write in " + dir.string() + ": " + std::strerror(err));
    }
  }
  try {
    write_all(fd, text, path);
    if (unnamed) {
      const std::string self = "/proc/self/fd/" + std::to_string(fd);
      pending.emplace(tmp);
      if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
        throw InputError(path + ": cannot write in " + dir.string() + ": " + std::strerror(errno));
    }
    ::close(fd);
    fd = -1;
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw InputError(path + ": cannot replace the file: " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
}

namespace {
// `remember`: record the file as one of this process's inputs (not when only peeking at an
// existing output).
std::string read_regular_file(const std::string& path, bool remember) {
  if (path == "-") {
    if (::isatty(STDIN_FILENO)) throw InputError("-: standard input is a terminal; pipe or redirect a file into it");
    return read_all(STDIN_FILENO, "-");
  }
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked on what was opened.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw InputError(path + ": no such file");
    throw InputError(path + ": cannot be read: " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(path + ": cannot be read: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a folder, expected a file");
  if (!S_ISREG(st.st_mode))
    throw InputError(path + ": is a " + file_kind(st.st_mode) + ", expected a regular file");
  if (static_cast<unsigned long long>(st.st_size) > kMaxInputBytes)
    throw InputError(path + ": " + std::to_string(st.st_size >> 20) + " MiB, larger than " +
                     std::to_string(kMaxInputBytes >> 20) + " MiB; not a dplan input");
  if (remember) {
    std::lock_guard<std::mutex> lock(g_inputs_mutex);
    inputs().insert(FileId{st.st_dev, st.st_ino});
  }
  return read_all(fd, path);
}
}  // namespace

std::string read_text_file(const std::string& path) { return read_regular_file(path, true); }

std::string file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "folder";
  if (S_ISFIFO(mode)) return "FIFO (named pipe)";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symbolic link";
  return "special file";
}

bool is_input_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  std::lock_guard<std::mutex> lock(g_inputs_mutex);
  return inputs().count(FileId{st.st_dev, st.st_ino}) > 0;
}


void check_output_path(const std::string& path, const OutputKind& kind, bool force) {
  namespace fs = std::filesystem;
  if (path.empty()) throw InputError("the output path is empty");
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      throw InputError(path + ": is a symbolic link; dplan does not write through links: give the file's own path");
    if (!S_ISREG(st.st_mode))
      throw InputError(path + ": is a " + file_kind(st.st_mode) + "; -o takes the path of a regular file to write");
    if (is_input_file(path))
      throw InputError(path + ": is one of this command's inputs; write the " + kind.what + " to another path");
    if (!force) {
      std::string text;
      try {
        text = read_regular_file(path, false);
      } catch (const InputError&) {
      }
      if (!kind.written_by_dplan || !kind.written_by_dplan(text))
        throw InputError(path + ": exists and is not a " + kind.what +
                         " dplan wrote; give --force to replace it, or another path");
    }
  } else if (errno != ENOENT) {
    throw InputError(path + ": cannot be checked: " + std::strerror(errno));
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(path + ": folder " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(path + ": folder " + dir.string() + " is not writable");
}

OutputKind json_output_kind(std::string what, std::function<void(const json& file)> read) {
  return OutputKind{std::move(what), [read = std::move(read)](const std::string& text) {
                      try {
                        read(parse_json_text(text, "-o"));
                        return true;
                      } catch (const InputError&) {
                        return false;
                      }
                    }};
}

void write_output_file(const std::string& path, const std::string& text, const OutputKind& kind, bool force) {
  check_output_path(path, kind, force);
  write_file_atomically(path, text);
}

}  // namespace dplan
