// Error channels of dplan.
// Bad input (a file, a flag, an impossible layout) throws dplan::InputError at the parse or
// validate boundary; the message says where, what was expected and what was found, e.g.
// "profiles/x.json: /gpu/hbm_gb: expected a positive number, got -80". The CLI catches it once,
// prints "dplan: error: <message>" and exits 2. Broken invariants (our bugs) use DPLAN_CHECK,
// which stays on in Release builds.
#pragma once

#include <stdexcept>
#include <string>

namespace dplan {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void internal_error(const char* expr, const char* file, int line);

}  // namespace dplan

#define DPLAN_CHECK(cond) \
  ((cond) ? static_cast<void>(0) : ::dplan::internal_error(#cond, __FILE__, __LINE__))
