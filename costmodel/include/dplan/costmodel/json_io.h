// Reading and writing JSON files with the error messages users need, and a strict object reader
// that rejects unknown keys (listing the valid ones), names missing keys, and checks ranges.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dplan {

using json = nlohmann::json;

// Reads the whole file at `path` as text. The path must name a regular file (a FIFO, folder or
// device is refused: reading one could block or never end) of at most kMaxInputBytes. Each file
// read is remembered as one of this process's inputs (see check_output_path).
// Throws InputError naming the file.
std::string read_text_file(const std::string& path);
inline constexpr size_t kMaxInputBytes = size_t{256} << 20;

// Parses JSON text strictly: malformed text, a number outside double's range (1e400) and a key
// that appears twice in one object are all InputError "<name>: ..." (with line and column).
json parse_json_text(const std::string& text, const std::string& name);

inline constexpr int kMaxJsonDepth = 64;

// read_text_file, then parse_json_text.
json read_json_file(const std::string& path);

// "regular file", "FIFO (named pipe)", "character device", ... for an st_mode.
std::string file_kind(unsigned mode);

// Whether `path` is (the same inode as) a file this process has read through read_text_file.
bool is_input_file(const std::string& path);

// Writes `text` to `path` atomically: an unnamed file in the same folder (O_TMPFILE), linked
// under a temporary name and renamed over `path` once complete, so a reader never sees half a
// file, and a kill at any moment leaves either the old file or the new one and no temporary
// (a catchable signal between link and rename removes the temporary name before dying).
// Throws InputError if the folder is not writable or the disk is full.
void write_file_atomically(const std::string& path, const std::string& text);

// The rules for a file a command writes (-o): see docs/cli.md, "Output files".
//   - the folder must exist and be writable;
//   - a symbolic link, folder, FIFO or device at the path is refused, --force or not;
//   - one of the command's own inputs (a file read through read_text_file) is refused, --force or not;
//   - an existing regular file is replaced only with `force`, or when `written_by_dplan` says its
//     text is a file dplan wrote of the same kind (a plan over a plan, a run record over a run record).
// Throws InputError naming the path, what is there and what to do.
struct OutputKind {
  std::string what;                                             // "plan", "run record", ...
  std::function<bool(const std::string& text)> written_by_dplan;  // recognises an earlier one
};
void check_output_path(const std::string& path, const OutputKind& kind, bool force);

// An OutputKind that recognises an earlier file of its kind by reading it with `read`, the
// format's strict reader: a file `read` accepts is one dplan wrote.
OutputKind json_output_kind(std::string what, std::function<void(const json& file)> read);

// check_output_path, then write_file_atomically.
void write_output_file(const std::string& path, const std::string& text, const OutputKind& kind, bool force);

// Reads one JSON object strictly. Every key asked for (required or optional) is remembered;
// finish() throws if the object holds any other key, listing the valid ones. Errors read
// "<file>: <json pointer>: <what was expected>, got <what was found>".
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string file, std::string pointer = "");

  // Numbers: never inf, NaN or subnormal (5e-324 is no physical figure, and 1/x overflows).
  double number(const std::string& key);                       // any such number
  double positive_number(const std::string& key);              // > 0
  double non_negative_number(const std::string& key);          // >= 0
  double fraction(const std::string& key);                     // in [0, 1]
  double number_in(const std::string& key, double lo, double hi);  // in [lo, hi]
  // Integers: checked against the range before any narrowing (2^31 is refused, not wrapped).
  int positive_int(const std::string& key);                    // 1 .. INT_MAX
  int non_negative_int(const std::string& key);                // 0 .. INT_MAX
  long long int_in(const std::string& key, long long lo, long long hi);
  std::string string(const std::string& key);                  // no control characters, bounded
  static constexpr size_t kMaxStringChars = 4096;
  std::string one_of(const std::string& key, const std::vector<std::string>& choices);
  bool boolean(const std::string& key);
  ObjectReader object(const std::string& key);
  const json& raw(const std::string& key);                     // marks the key as known

  bool has(const std::string& key);                            // present and not null; marks key valid
  bool has_key(const std::string& key);                        // present, null or not; marks key valid
  // Marks keys as valid without reading them (metadata that does not change any estimate).
  void ignore(std::initializer_list<const char*> keys);
  void ignore(const std::string& key);

  // Throws InputError if the object holds a key nobody asked for.
  void finish() const;

  const std::string& file() const { return file_; }
  std::string where(const std::string& key) const;             // "<file>: <pointer>/<key>"
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;

 private:
  const json& at(const std::string& key);
  const json& object_;
  std::string file_;
  std::string pointer_;
  std::set<std::string> known_;    // keys read: listed as the valid ones
  std::set<std::string> ignored_;  // keys accepted without being read
};

// Text a file may hold where dplan prints or uses it: at most ObjectReader::kMaxStringChars bytes,
// no control characters (newlines, terminal escape sequences).
bool is_printable_text(const std::string& text);

// "got ..." text for a JSON value in error messages: numbers and strings as written (strings
// escaped and shortened by quote_for_message), other kinds by name.
std::string describe_json_value(const json& value);

// Text a user supplied, made safe for a one-line error message: control characters and bytes
// outside printable ASCII escaped (\n, \x1b), and cut to at most `max_chars` with "...".
std::string quote_for_message(const std::string& text, size_t max_chars = 80);

// An error line as printed: made one line (newlines and control characters escaped) and bounded
// to kMaxErrorLineChars.
std::string error_line(const std::string& message);
inline constexpr size_t kMaxErrorLineChars = 1000;

// "a, b or c"
std::string join_choices(const std::vector<std::string>& choices);

// Levenshtein distance between two strings.
size_t edit_distance(const std::string& a, const std::string& b);
// " (did you mean b?)" for the choice nearest `given` (case aside) when it is a likely misspelling
// of it (at most 2 edits, and fewer than a third of the longer one's characters); "" otherwise.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices);

}  // namespace dplan
