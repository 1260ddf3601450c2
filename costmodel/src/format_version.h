// The "format_version" check of the files dplan writes and reads back (plan.json, run.json).
#pragma once

#include <string>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

// Throws InputError "<file>: /format_version: expected 1 (this dplan reads format 1), got 2"
// unless the object's format_version is `supported`.
inline void check_format_version(ObjectReader& r, int supported) {
  const long long version = r.positive_int("format_version");
  if (version != supported)
    throw InputError(r.where("format_version") + ": expected " + std::to_string(supported) + " (this dplan reads format " +
                     std::to_string(supported) + "), got " + std::to_string(version));
}

}  // namespace dplan::costmodel
