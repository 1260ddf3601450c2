// The quoting layer of exported files (planner/include/dplan/planner/quoting.h), read back by each
// format's own parser: bash for shell words, python3's tomllib and yaml for TOML strings and YAML
// scalars. Every value comes back as it went in (a byte that is not UTF-8 as the text \xNN in
// TOML and YAML, which cannot hold it), and comments stay one line of printable ASCII.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "dplan/planner/quoting.h"
#include "process.h"

using namespace dplan::planner;
using dplan::testing::Result;
using dplan::testing::run_program;
using dplan::testing::TempDir;

namespace {

const std::vector<std::string> kValues = {
    "plain-name_1.0",
    "",
    "it's \"quoted\" \\ back\\",
    "$(touch INJECTED) `touch INJECTED` ; | & > < * ? [a] {b,c} ~ !x #c",
    "line\nbreak\r\ttab\x01\x1b[2J\x7f",
    "no",
    "yes",
    "true",
    "null",
    "~",
    "1e3",
    "-",
    "? x",
    ": y",
    "#c",
    " lead and trail ",
    "caf\xc3\xa9 \xe6\xa8\xa1 \xf0\x9f\x98\x80",
    "nel\xc2\x85ls\xe2\x80\xa8ps\xe2\x80\xa9" "bom\xef\xbb\xbf" "c1\xc2\x9b",
    "bad\xff\xfe\xe6\xa8x\xed\xa0\x80\xc0\xaf",
};

}  // namespace

TEST_CASE("shell_word: bash reads every value back as one word, byte for byte, on one line", "[export][quoting]") {
  std::string script = "printf '%s\\0'";
  for (const std::string& v : kValues) {
    const std::string word = shell_word(v);
    CAPTURE(v, word);
    CHECK(word.find('\n') == std::string::npos);
    CHECK(word.find('\r') == std::string::npos);
    script += " " + word;
  }
  CHECK(shell_word("plain-name_1.0") == "plain-name_1.0");
  CHECK(shell_word("a b") == "'a b'");
  CHECK(shell_word("it's") == "'it'\\''s'");
  CHECK(shell_word("p\nq") == "$'p\\nq'");
  const Result r = run_program("/bin/bash", {"-c", script});
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::vector<std::string> back;
  for (size_t at = 0; at < r.out.size();) {
    const size_t end = r.out.find('\0', at);
    REQUIRE(end != std::string::npos);
    back.push_back(r.out.substr(at, end - at));
    at = end + 1;
  }
  CHECK(back == kValues);
}

TEST_CASE("toml_string and yaml_string: tomllib and PyYAML read every value back as a string", "[export][quoting]") {
  TempDir dir;
  std::string toml, yaml;
  for (size_t i = 0; i < kValues.size(); ++i) {
    toml += "v" + std::to_string(i) + " = " + toml_string(kValues[i]) + "\n";
    yaml += "v" + std::to_string(i) + ": " + yaml_string(kValues[i]) + "\n";
  }
  CHECK(yaml_string("no") == "'no'");
  CHECK(toml_string("a\"b\\c\n") == "\"a\\\"b\\\\c\\n\"");
  const std::string toml_path = dir.write("values.toml", toml);
  const std::string yaml_path = dir.write("values.yaml", yaml);
  std::vector<std::string> args = {"python3", "-c",
                                   "import sys, tomllib, yaml\n"
                                   "t = tomllib.load(open(sys.argv[1], 'rb'))\n"
                                   "y = yaml.safe_load(open(sys.argv[2], 'rb'))\n"
                                   "bad = 0\n"
                                   "for i, v in enumerate(sys.argv[3:]):\n"
                                   "    want = v.encode('utf-8', 'surrogateescape').decode('utf-8', 'backslashreplace')\n"
                                   "    for fmt, got in (('toml', t['v%d' % i]), ('yaml', y['v%d' % i])):\n"
                                   "        if got != want:\n"
                                   "            bad += 1\n"
                                   "            print(fmt, i, repr(got), '!=', repr(want))\n"
                                   "print(len(t), len(y))\n"
                                   "sys.exit(1 if bad else 0)\n",
                                   toml_path, yaml_path};
  args.insert(args.end(), kValues.begin(), kValues.end());
  const Result r = run_program("/usr/bin/env", args);
  INFO(toml << yaml << r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.out == std::to_string(kValues.size()) + " " + std::to_string(kValues.size()) + "\n");
}

TEST_CASE("comment_text is one line of printable ASCII, and safe_word a word of letters, digits, dots, underscores and dashes", "[export][quoting]") {
  for (const std::string& v : kValues) {
    const std::string c = comment_text(v);
    CAPTURE(v, c);
    for (unsigned char ch : c) CHECK((ch >= 0x20 && ch < 0x7f));
    const std::string w = safe_word(v);
    CHECK(w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos);
  }
  CHECK(comment_text("p\ntouch INJECTED\n.json") == "p\\ntouch INJECTED\\n.json");
  CHECK(safe_word("llama-3-8b") == "llama-3-8b");
  CHECK(safe_word("a b/$(x)") == "a_b___x_");
  CHECK(safe_word("caf\xc3\xa9\xff") == "caf__");
}
