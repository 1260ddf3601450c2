// The shipped profiles, loaded once per test binary (tests reach data through DPLAN_PROFILES_DIR,
// a CMake-defined absolute path).
#pragma once

#include "dplan/planner/profiles.h"

namespace dplan::testing {

inline const planner::ProfileStore& store() {
  static const planner::ProfileStore s(DPLAN_PROFILES_DIR);
  return s;
}

}  // namespace dplan::testing
