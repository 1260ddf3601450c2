// A reader's refusal in the tests' terms: the InputError it throws, one line.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "dplan/costmodel/errors.h"

namespace dplan::testing {

// The message of the InputError `read` throws, checked to be one line; "(no error)" when it throws
// nothing.
template <typename Read>
std::string one_line_error(Read read) {
  try {
    read();
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    return what;
  }
  return "(no error)";
}

}  // namespace dplan::testing
