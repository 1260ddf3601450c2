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

// read_text_file, then parse_json_text.
json read_json_file(const std::string& path);

// Writes `text` to `path` atomically: a temporary file in the same folder, then rename(2), so a
// reader never sees half a file and an existing file is replaced only by a complete one.
// Throws InputError if the folder is not writable.
void write_file_atomically(const std::string& path, const std::string& text);

// Reads one JSON object strictly. Every key asked for (required or optional) is remembered;
// finish() throws if the object holds any other key, listing the valid ones. Errors read
// "<file>: <json pointer>: <what was expected>, got <what was found>".
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string file, std::string pointer = "");

  double number(const std::string& key);                       // any finite number
  double positive_number(const std::string& key);              // > 0
  double non_negative_number(const std::string& key);          // >= 0
  double fraction(const std::string& key);                     // in [0, 1]
  long long positive_int(const std::string& key);              // integer >= 1
  long long non_negative_int(const std::string& key);          // integer >= 0
  std::string string(const std::string& key);
  std::string one_of(const std::string& key, const std::vector<std::string>& choices);
  bool boolean(const std::string& key);
  ObjectReader object(const std::string& key);
  const json& raw(const std::string& key);                     // marks the key as known

  bool has(const std::string& key);                            // present and not null; marks key valid
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

}  // namespace dplan
