#include "mutators.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace dplan::fuzz {
namespace {
using json = nlohmann::json;
using Random = std::minstd_rand;

size_t pick(Random& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

size_t put(const std::string& text, uint8_t* data, size_t size, size_t max_size) {
  if (text.size() > max_size || text.empty()) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, text.data(), text.size());
  return text.size();
}

// Numbers at the edges the readers must hold: signs, zero, denormals, double's and the integer
// types' limits, and the unit conversions' (x 1e9 GB, x 2^30 GiB, x 1e-6 us) overflow and underflow.
json edge_number(Random& rng) {
  static const std::vector<json> edges = {
      json(0), json(-1), json(1), json(2), json(3), json(7), json(0.5), json(-0.0), json(1.0),
      json(5e-324), json(1e-320), json(2.2250738585072014e-308), json(1e-300), json(1e-30), json(1e-9),
      json(1e9), json(1e30), json(1e300), json(1e308), json(1.7976931348623157e308), json(-1e308),
      json(4096), json(4097), json(65536), json(2147483647), json(2147483648LL), json(-2147483648LL),
      json(4294967295LL), json(4294967296LL), json(4294967297LL), json(9007199254740993LL),
      json(9223372036854775807LL), json(std::numeric_limits<long long>::min()),
      json(9223372036854775808ULL), json(18446744073709551615ULL), json(2147483648.0), json(1e19)};
  return edges[pick(rng, edges.size())];
}

json changed_number(const json& v, Random& rng) {
  const double x = v.get<double>();
  switch (pick(rng, 6)) {
    case 0: case 1: return edge_number(rng);
    case 2: {  // a power of ten larger or smaller
      const double y = x * std::pow(10.0, static_cast<double>(pick(rng, 641)) - 320);
      return std::isfinite(y) ? json(y) : edge_number(rng);
    }
    case 3: return v.is_number_integer() ? json(x) : json(static_cast<long long>(std::fmod(x, 9e18)));  // 1 <-> 1.0
    case 4: return json(-x);
    default: {  // one more or less, or the next double towards zero
      if (!v.is_number_integer()) return json(std::nextafter(x, 0.0));
      const long long n = v.get<long long>();
      if (n == std::numeric_limits<long long>::max() || n == std::numeric_limits<long long>::min()) return edge_number(rng);
      return json(n + (pick(rng, 2) ? 1 : -1));
    }
  }
}

// Every value of the document, depth first, for picking one.
void collect(json& v, std::vector<json*>& all) {
  all.push_back(&v);
  if (v.is_object() || v.is_array())
    for (auto& child : v) collect(child, all);
}

void collect_keys_and_strings(const json& v, std::vector<std::string>& keys, std::vector<std::string>& strings) {
  if (v.is_string()) strings.push_back(v.get<std::string>());
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it) {
      keys.push_back(it.key());
      collect_keys_and_strings(it.value(), keys, strings);
    }
  if (v.is_array())
    for (const auto& child : v) collect_keys_and_strings(child, keys, strings);
}

void mutate_value(json& doc, Random& rng) {
  std::vector<json*> all;
  collect(doc, all);
  std::vector<std::string> keys, strings;
  collect_keys_and_strings(doc, keys, strings);
  json& v = *all[pick(rng, all.size())];
  const json other = *all[pick(rng, all.size())];  // a copy: v may contain it
  switch (pick(rng, 8)) {
    case 0:  // a value of its own kind
      if (v.is_number()) v = changed_number(v, rng);
      else if (v.is_string() && !strings.empty()) v = strings[pick(rng, strings.size())];
      else if (v.is_boolean()) v = !v.get<bool>();
      else v = edge_number(rng);
      break;
    case 1:  // numbers again: the most common value and the readers' most checked one
      if (v.is_number()) v = changed_number(v, rng);
      else if (v.is_object() && !v.empty()) {
        auto it = std::next(v.begin(), static_cast<long>(pick(rng, v.size())));
        it.value() = it.value().is_number() ? changed_number(it.value(), rng) : edge_number(rng);
      }
      break;
    case 2:  // a key left out, or an element
      if (v.is_object() && !v.empty()) v.erase(std::next(v.begin(), static_cast<long>(pick(rng, v.size()))));
      else if (v.is_array() && !v.empty()) v.erase(v.begin() + static_cast<long>(pick(rng, v.size())));
      break;
    case 3:  // a key added: one of the document's (a key of another object, or a misspelling)
      if (v.is_object() && !keys.empty()) {
        std::string key = keys[pick(rng, keys.size())];
        if (pick(rng, 4) == 0 && !key.empty()) key[pick(rng, key.size())] ^= 1;
        v[key] = other;
      }
      break;
    case 4:  // another kind of value
      switch (pick(rng, 6)) {
        case 0: v = nullptr; break;
        case 1: v = json::array(); break;
        case 2: v = json::object(); break;
        case 3: v = "x"; break;
        case 4: v = true; break;
        default: v = other; break;
      }
      break;
    case 5:  // a list repeated: long tables
      if (v.is_array() && !v.empty()) {
        const json element = v[pick(rng, v.size())];
        const size_t times = size_t{1} << pick(rng, 11);
        for (size_t i = 0; i < times; ++i) v.push_back(element);
      }
      break;
    case 6:  // a subtree copied over another
      v = other;
      break;
    default:  // a string: empty, long, or with bytes that need escaping
      if (v.is_string()) {
        switch (pick(rng, 3)) {
          case 0: v = ""; break;
          case 1: v = std::string(size_t{1} << pick(rng, 13), 'a'); break;
          default: v = v.get<std::string>() + std::string("\n\x1b[31m\t\x01", 8); break;
        }
      }
      break;
  }
}

}  // namespace

size_t mutate_json(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  Random rng(seed);
  if (pick(rng, 2) == 0) return LLVMFuzzerMutate(data, size, max_size);
  json doc = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return LLVMFuzzerMutate(data, size, max_size);
  const size_t changes = 1 + pick(rng, 3);
  for (size_t i = 0; i < changes; ++i) mutate_value(doc, rng);
  std::string text;
  try {
    text = doc.dump(pick(rng, 2) ? 1 : -1);
  } catch (const json::exception&) {  // a string that is not UTF-8
    return LLVMFuzzerMutate(data, size, max_size);
  }
  return put(text, data, size, max_size);
}

size_t mutate_lines(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  Random rng(seed);
  if (pick(rng, 2) == 0 || size == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<std::string> lines;
  std::string text(reinterpret_cast<const char*>(data), size);
  for (size_t start = 0; start <= text.size();) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::string& line = lines[pick(rng, lines.size())];
  switch (pick(rng, 4)) {
    case 0: case 1: {  // one whitespace-separated token that starts like a number, to an edge
      static const char* edges[] = {"0", "-1", "1", "0.0", "1e-320", "4.9e-324", "1e-300", "1e300", "1e308",
                                    "1.8e308", "2147483648", "9223372036854775808", "nan", "inf", "-0.0",
                                    "0x1p-1074", "1.5", "99999999999999999999", "123.4"};
      std::vector<std::pair<size_t, size_t>> numbers;  // begin, length
      for (size_t i = 0; i < line.size();) {
        const size_t b = line.find_first_not_of(" \t", i);
        if (b == std::string::npos) break;
        const size_t e = std::min(line.find_first_of(" \t", b), line.size());
        if (std::isdigit(static_cast<unsigned char>(line[b])) || line[b] == '-' || line[b] == '.') numbers.push_back({b, e - b});
        i = e;
      }
      if (numbers.empty()) return LLVMFuzzerMutate(data, size, max_size);
      const auto [b, n] = numbers[pick(rng, numbers.size())];
      line.replace(b, n, edges[pick(rng, std::size(edges))]);
      break;
    }
    case 2: {  // a line repeated (rank lines, result rows)
      const std::string copy = line;
      const size_t at = pick(rng, lines.size());
      const size_t times = size_t{1} << pick(rng, 9);
      lines.insert(lines.begin() + static_cast<long>(at), times, copy);
      break;
    }
    default:  // a line removed
      if (lines.size() > 1) lines.erase(lines.begin() + static_cast<long>(pick(rng, lines.size())));
      break;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
  return put(out, data, size, max_size);
}

}  // namespace dplan::fuzz
