// The quoting of the files dplan export writes: one function per format. No text from a plan, a
// file name or a model name reaches an exported file except through one of these (numbers are
// written as numbers; dplan's own spellings are constants). docs/export.md, "Quoting", says what
// each gives; the tests feed them newlines, quotes, $(...), backticks, backslashes and bytes
// that are not UTF-8 (tests/planner/quoting_test.cpp, tests/cli/export_injection_test.cpp).
#pragma once

#include <string>

namespace dplan::planner {

// Text for a comment (shell, TOML, YAML, megatron.args) or a line of README.export: one line of
// printable ASCII whatever the value holds, so that it can neither end the comment nor break a
// parser that wants UTF-8. quote_for_message's escapes (\n, \r, \t, \xNN for every other control
// byte and every byte outside ASCII), never cut.
std::string comment_text(const std::string& value);

// One bash word that expands to exactly `value`: bare when it is non-empty and made of
// [A-Za-z0-9_./:=@%+,-] alone; '...' (a quote as '\'') when every character is printable; else
// $'...' with \n, \r, \t, \', \\ and \xNN, so that it stays on one line and keeps every byte.
std::string shell_word(const std::string& value);

// A TOML basic string, quotes included, that reads back as `value`: ", \ and control characters
// escaped (\", \\, \n, \uXXXX, ...). A byte that is not UTF-8 (TOML files must be) is written as
// the four characters \xNN.
std::string toml_string(const std::string& value);

// A YAML scalar that both YAML 1.1 (PyYAML, which accelerate reads its config with) and 1.2 read
// back as the string `value`, never as a boolean, number or null ('no' stays a string): '...'
// (a quote doubled) when every character is printable, else "..." with \", \\, \n, \xNN and
// \uXXXX escapes, YAML's line breaks (U+0085, U+2028, U+2029) included. A byte that is not UTF-8
// is written as the four characters \xNN.
std::string yaml_string(const std::string& value);

// A word of [A-Za-z0-9._-] alone, for a place that takes no quoting at all (the value of
// `#SBATCH --job-name=`, which sbatch splits itself): every other character becomes '_'.
std::string safe_word(const std::string& value);

}  // namespace dplan::planner
