#include "dplan/costmodel/json_io.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "dplan/costmodel/errors.h"

namespace dplan {

void internal_error(const char* expr, const char* file, int line) {
  throw std::logic_error(std::string("internal error: ") + expr + " failed at " + file + ":" +
                         std::to_string(line));
}

json read_json_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no such file");
  if (fs::is_directory(path, ec)) throw InputError(path + ": is a directory, expected a JSON file");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot be read");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    std::string what = e.what();
    auto at = what.find("parse error");
    throw InputError(path + ": malformed JSON: " + (at == std::string::npos ? what : what.substr(at)));
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(path + ": folder " + dir.string() + " does not exist");
  std::string tmp_template = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(tmp_template.begin(), tmp_template.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0) throw InputError(path + ": cannot create a temporary file in " + dir.string());
  std::string tmp(name.data());
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n <= 0) {
      ::close(fd);
      std::remove(tmp.c_str());
      throw InputError(path + ": write failed (disk full?)");
    }
    written += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError(path + ": cannot replace the file");
  }
}

std::string describe_json_value(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number()) return value.dump();
  if (value.is_string()) return "\"" + value.get<std::string>() + "\"";
  if (value.is_array()) return "a list";
  return "an object";
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) out += (i + 1 == choices.size()) ? " or " : ", ";
    out += choices[i];
  }
  return out;
}

ObjectReader::ObjectReader(const json& object, std::string file, std::string pointer)
    : object_(object), file_(std::move(file)), pointer_(std::move(pointer)) {
  if (!object_.is_object())
    throw InputError(file_ + ": " + (pointer_.empty() ? "/" : pointer_) +
                     ": expected an object, got " + describe_json_value(object_));
}

std::string ObjectReader::where(const std::string& key) const {
  return file_ + ": " + pointer_ + "/" + key;
}

void ObjectReader::fail(const std::string& key, const std::string& expected) const {
  auto it = object_.find(key);
  std::string got = it == object_.end() ? "nothing" : describe_json_value(*it);
  throw InputError(where(key) + ": expected " + expected + ", got " + got);
}

bool ObjectReader::has(const std::string& key) {
  known_.insert(key);
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

namespace {
// Levenshtein distance, for pointing at the misspelling of a missing key.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}
}  // namespace

const json& ObjectReader::at(const std::string& key) {
  known_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end()) {
    std::string msg = file_ + ": " + (pointer_.empty() ? "/" : pointer_) + ": missing key \"" + key + "\"";
    for (auto other = object_.begin(); other != object_.end(); ++other)
      if (edit_distance(other.key(), key) <= 2) {
        msg += " (found \"" + other.key() + "\": a misspelling?)";
        break;
      }
    throw InputError(msg);
  }
  return *it;
}

const json& ObjectReader::raw(const std::string& key) { return at(key); }

double ObjectReader::number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, "a number");
  return v.get<double>();
}

double ObjectReader::positive_number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) fail(key, "a positive number");
  return v.get<double>();
}

double ObjectReader::non_negative_number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
    fail(key, "a number >= 0");
  return v.get<double>();
}

double ObjectReader::fraction(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1)) fail(key, "a number between 0 and 1");
  return v.get<double>();
}

long long ObjectReader::positive_int(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1) fail(key, "a positive integer");
  return v.get<long long>();
}

long long ObjectReader::non_negative_int(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number_integer() || v.get<long long>() < 0) fail(key, "an integer >= 0");
  return v.get<long long>();
}

std::string ObjectReader::string(const std::string& key) {
  const json& v = at(key);
  if (!v.is_string()) fail(key, "a string");
  return v.get<std::string>();
}

std::string ObjectReader::one_of(const std::string& key, const std::vector<std::string>& choices) {
  const json& v = at(key);
  if (v.is_string())
    for (const auto& c : choices)
      if (v.get<std::string>() == c) return c;
  fail(key, "one of " + join_choices(choices));
}

bool ObjectReader::boolean(const std::string& key) {
  const json& v = at(key);
  if (!v.is_boolean()) fail(key, "true or false");
  return v.get<bool>();
}

ObjectReader ObjectReader::object(const std::string& key) {
  const json& v = at(key);
  if (!v.is_object()) fail(key, "an object");
  return ObjectReader(v, file_, pointer_ + "/" + key);
}

void ObjectReader::ignore(std::initializer_list<const char*> keys) {
  for (const char* k : keys) ignored_.insert(k);
}

void ObjectReader::ignore(const std::string& key) { ignored_.insert(key); }

void ObjectReader::finish() const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (known_.count(it.key()) || ignored_.count(it.key())) continue;
    std::vector<std::string> valid(known_.begin(), known_.end());
    throw InputError(file_ + ": " + (pointer_.empty() ? "/" : pointer_) + ": unknown key \"" + it.key() +
                     "\"; valid keys: " + join_choices(valid));
  }
}

}  // namespace dplan
