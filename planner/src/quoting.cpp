// The quoting of exported files (quoting.h): each format's rules once, over one reading of the
// text as UTF-8.
#include "dplan/planner/quoting.h"

#include <cstdio>
#include <string_view>

#include "dplan/costmodel/json_io.h"

namespace dplan::planner {
namespace {

// One character of the text: a Unicode scalar value and its bytes, or a byte that does not
// start a well-formed UTF-8 sequence (overlong forms, surrogates and values past U+10FFFF are not).
struct Character {
  char32_t code_point = 0;
  size_t size_bytes = 1;
  bool utf8 = false;
};

Character character_at(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return {lead, 1, true};
  // The lead byte's length, its payload bits and the least value that length may encode.
  size_t size = 0;
  char32_t cp = 0, min = 0;
  if ((lead & 0xE0) == 0xC0) {
    size = 2, cp = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    size = 3, cp = lead & 0x0F, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    size = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    return {};
  }
  if (at + size > text.size()) return {};
  for (size_t i = 1; i < size; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (byte(at + i) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, size, true};
}

// Characters that every format here may hold as they are: not a control character (C0, DEL,
// C1), not one of YAML's line breaks beyond \n and \r (NEL, U+2028, U+2029), not the byte-order
// mark nor the non-characters YAML refuses (U+FFFE, U+FFFF).
bool printable(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) return false;
  return cp != 0x2028 && cp != 0x2029 && cp != 0xFEFF && cp != 0xFFFE && cp != 0xFFFF;
}

bool all_printable(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const Character c = character_at(text, at);
    if (!c.utf8 || !printable(c.code_point)) return false;
    at += c.size_bytes;
  }
  return true;
}

std::string hex_escape(const char* format, unsigned value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// The escapes TOML basic strings and YAML double-quoted scalars share (JSON's): \" \\ \n \r \t;
// `other` escapes the remaining characters that are not printable; a byte that is not UTF-8
// becomes the text \xNN (an escaped backslash and xNN), which both formats can hold.
template <typename Other>
std::string double_quoted(std::string_view text, Other other) {
  std::string out = "\"";
  for (size_t at = 0; at < text.size();) {
    const Character c = character_at(text, at);
    if (!c.utf8) {
      out += hex_escape("\\\\x%02x", static_cast<unsigned char>(text[at]));
    } else if (c.code_point == '"') {
      out += "\\\"";
    } else if (c.code_point == '\\') {
      out += "\\\\";
    } else if (c.code_point == '\n') {
      out += "\\n";
    } else if (c.code_point == '\r') {
      out += "\\r";
    } else if (c.code_point == '\t') {
      out += "\\t";
    } else if (!printable(c.code_point)) {
      out += other(c.code_point);
    } else {
      out.append(text.substr(at, c.size_bytes));
    }
    at += c.size_bytes;
  }
  return out + "\"";
}

bool bare_shell_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("_./:=@%+,-").find(c) != std::string_view::npos;
}

}  // namespace

std::string comment_text(const std::string& value) { return quote_for_message(value, std::string::npos); }

std::string shell_word(const std::string& value) {
  bool bare = !value.empty();
  for (char c : value) bare = bare && bare_shell_character(c);
  if (bare) return value;
  if (all_printable(value)) {
    std::string out = "'";
    for (char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }
  // bash's ANSI-C quoting: every byte kept, on one line.
  std::string out = "$'";
  for (size_t at = 0; at < value.size();) {
    const Character c = character_at(value, at);
    if (c.utf8 && printable(c.code_point)) {
      if (c.code_point == '\'' || c.code_point == '\\') out += '\\';
      out.append(value, at, c.size_bytes);
    } else if (c.utf8 && c.code_point == '\n') {
      out += "\\n";
    } else if (c.utf8 && c.code_point == '\r') {
      out += "\\r";
    } else if (c.utf8 && c.code_point == '\t') {
      out += "\\t";
    } else {
      for (size_t i = 0; i < c.size_bytes; ++i) out += hex_escape("\\x%02x", static_cast<unsigned char>(value[at + i]));
    }
    at += c.size_bytes;
  }
  return out + "'";
}

std::string toml_string(const std::string& value) {
  // TOML 1.0: \uXXXX for any scalar value; every character `printable` refuses is below U+10000.
  return double_quoted(value, [](char32_t cp) { return hex_escape("\\u%04X", static_cast<unsigned>(cp)); });
}

std::string yaml_string(const std::string& value) {
  if (all_printable(value)) {
    std::string out = "'";
    for (char c : value) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  return double_quoted(value, [](char32_t cp) {
    return cp < 0x100 ? hex_escape("\\x%02X", static_cast<unsigned>(cp)) : hex_escape("\\u%04X", static_cast<unsigned>(cp));
  });
}

std::string safe_word(const std::string& value) {
  std::string out;
  for (size_t at = 0; at < value.size();) {
    const Character c = character_at(value, at);
    const char ch = value[at];
    const bool safe = c.size_bytes == 1 && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                                            (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-');
    out += safe ? ch : '_';
    at += c.size_bytes;
  }
  return out;
}

}  // namespace dplan::planner
