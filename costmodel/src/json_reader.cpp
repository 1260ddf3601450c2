#include "dplan/costmodel/json_io.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <optional>


#include "dplan/costmodel/errors.h"

namespace dplan {

void internal_error(const char* expr, const char* file, int line) {
  throw std::logic_error(std::string("internal error: ") + expr + " failed at " + file + ":" +
                         std::to_string(line));
}

json parse_json_text(const std::string& text, const std::string& name) {
  // Duplicate keys: nlohmann keeps the last silently, so each open object's keys are tracked in
  // the parser's callback, which also bounds the nesting.
  struct Open {
    std::set<std::string> keys;
    std::string key;  // the key whose value is being parsed
  };
  std::vector<Open> open;
  auto pointer = [&] {
    std::string p;
    for (size_t i = 0; i + 1 < open.size(); ++i) p += "/" + quote_for_message(open[i].key, 40);
    return p.empty() ? std::string("/") : p;
  };
  json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw InputError(name + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels; not a dplan input");
    switch (event) {
      case json::parse_event_t::object_start: open.emplace_back(); break;
      case json::parse_event_t::object_end: if (!open.empty()) open.pop_back(); break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open.empty() && !open.back().keys.insert(key).second)
          throw InputError(name + ": " + pointer() + ": key \"" + quote_for_message(key, 40) +
                           "\" appears twice in one object");
        if (!open.empty()) open.back().key = key;
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    // nlohmann's messages: "[json.exception.parse_error.101] parse error at line 3, column 5: ...",
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'".
    std::string what = e.what();
    const auto tag_end = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos) what = what.substr(tag_end + 2);
    throw InputError(name + ": malformed JSON: " + quote_for_message(what, 200));
  }
}

json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

std::string describe_json_value(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number()) return value.dump();
  if (value.is_string()) return "\"" + quote_for_message(value.get<std::string>()) + "\"";
  if (value.is_array()) return "a list";
  return "an object";
}

std::string quote_for_message(const std::string& text, size_t max_chars) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    std::string piece;
    if (c == '\n') piece = "\\n";
    else if (c == '\r') piece = "\\r";
    else if (c == '\t') piece = "\\t";
    else if (c < 0x20 || c >= 0x7f) piece = std::string("\\x") + hex[c >> 4] + hex[c & 15];
    else piece = std::string(1, static_cast<char>(c));
    if (out.size() + piece.size() > max_chars) return out + "...";
    out += piece;
  }
  return out;
}

std::string error_line(const std::string& message) {
  return quote_for_message(message, kMaxErrorLineChars);
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

bool ObjectReader::has_key(const std::string& key) {
  known_.insert(key);
  return object_.find(key) != object_.end();
}

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

std::string did_you_mean(const std::string& given, const std::vector<std::string>& choices) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string g = lower(given);
  // Nearest first; among as near, the one sharing the longest start with it (--tpp: --tp, not --top).
  auto shared_start = [&](const std::string& c) {
    const std::string l = lower(c);
    return static_cast<size_t>(std::mismatch(g.begin(), g.end(), l.begin(), l.end()).first - g.begin());
  };
  const std::string* best = nullptr;
  size_t best_d = 0;
  for (const std::string& c : choices) {
    const size_t d = edit_distance(g, lower(c));
    if (d > 2 || 3 * d >= std::max(g.size(), c.size())) continue;
    if (!best || d < best_d || (d == best_d && shared_start(c) > shared_start(*best))) best = &c, best_d = d;
  }
  return best ? " (did you mean " + *best + "?)" : "";
}

const json& ObjectReader::at(const std::string& key) {
  known_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end()) {
    std::string msg = file_ + ": " + (pointer_.empty() ? "/" : pointer_) + ": missing key \"" + key + "\"";
    for (auto other = object_.begin(); other != object_.end(); ++other)
      if (other.key().size() < key.size() + 3 && edit_distance(other.key(), key) <= 2) {
        msg += " (found \"" + quote_for_message(other.key()) + "\": a misspelling?)";
        break;
      }
    throw InputError(msg);
  }
  return *it;
}

const json& ObjectReader::raw(const std::string& key) { return at(key); }

namespace {
// A finite double whose magnitude is 0 or a normal number: subnormal figures (5e-324) are no
// physical quantity, and dividing by them overflows to inf.
bool is_normal_or_zero(double x) { return std::isfinite(x) && (x == 0 || std::fabs(x) >= DBL_MIN); }

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// The integer in `v`, when it is one within [lo, hi].
std::optional<long long> integer_in(const json& v, long long lo, long long hi) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<unsigned long long>();
    if (u > static_cast<unsigned long long>(hi)) return std::nullopt;
    return static_cast<long long>(u) >= lo ? std::optional<long long>(static_cast<long long>(u)) : std::nullopt;
  }
  if (!v.is_number_integer()) return std::nullopt;
  const auto i = v.get<long long>();
  if (i < lo || i > hi) return std::nullopt;
  return i;
}
}  // namespace

double ObjectReader::number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !is_normal_or_zero(v.get<double>())) fail(key, "a number");
  return v.get<double>();
}

double ObjectReader::positive_number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() > 0) || !is_normal_or_zero(v.get<double>())) fail(key, "a positive number");
  return v.get<double>();
}

double ObjectReader::non_negative_number(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() >= 0) || !is_normal_or_zero(v.get<double>())) fail(key, "a number >= 0");
  return v.get<double>();
}

double ObjectReader::fraction(const std::string& key) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1) || !is_normal_or_zero(v.get<double>()))
    fail(key, "a number between 0 and 1");
  return v.get<double>();
}

double ObjectReader::number_in(const std::string& key, double lo, double hi) {
  const json& v = at(key);
  if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi) || !is_normal_or_zero(v.get<double>()))
    fail(key, "a number from " + number_text(lo) + " to " + number_text(hi));
  return v.get<double>();
}

int ObjectReader::positive_int(const std::string& key) {
  auto i = integer_in(at(key), 1, INT_MAX);
  if (!i) fail(key, "a positive integer up to " + std::to_string(INT_MAX));
  return static_cast<int>(*i);
}

int ObjectReader::non_negative_int(const std::string& key) {
  auto i = integer_in(at(key), 0, INT_MAX);
  if (!i) fail(key, "an integer from 0 to " + std::to_string(INT_MAX));
  return static_cast<int>(*i);
}

long long ObjectReader::int_in(const std::string& key, long long lo, long long hi) {
  auto i = integer_in(at(key), lo, hi);
  if (!i) fail(key, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return *i;
}

std::string ObjectReader::string(const std::string& key) {
  const json& v = at(key);
  if (!v.is_string()) fail(key, "a string");
  const std::string& text = v.get_ref<const std::string&>();
  // Strings end up in tables, file names and error lines.
  if (!is_printable_text(text))
    fail(key, "a string of at most " + std::to_string(kMaxStringChars) + " bytes without control characters");
  return text;
}

bool is_printable_text(const std::string& text) {
  return text.size() <= ObjectReader::kMaxStringChars &&
         std::none_of(text.begin(), text.end(), [](char c) {
           const auto u = static_cast<unsigned char>(c);
           return u < 0x20 || u == 0x7f;
         });
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
    throw InputError(file_ + ": " + (pointer_.empty() ? "/" : pointer_) + ": unknown key \"" + quote_for_message(it.key()) +
                     "\"; valid keys: " + join_choices(valid));
  }
}

}  // namespace dplan
