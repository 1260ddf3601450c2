// The "format_version" check of the files dplan writes and reads back (plan.json, run.json).
#pragma once

#include <string>

#include "dplan/costmodel/errors.h"
#include "dplan/costmodel/json_io.h"

namespace dplan::costmodel {

// The object's format_version, when it is one this dplan reads (`oldest` to `supported`); else
// throws InputError: for a newer one "<file>: /format_version: format 2 is newer than this dplan
// reads (format 1); use a newer dplan", for an older one "<file>: /format_version: expected 1
// (this dplan reads format 1), got 0". `kind` says what the file should be, for one without the
// key at all ("<file>: not a plan.json, which dplan -o writes (it has no \"format_version\")": a
// config.json or another program's JSON passed in its place).
inline int check_format_version(ObjectReader& r, int supported, int oldest = -1, const std::string& kind = "") {
  if (!kind.empty() && !r.has_key("format_version"))
    throw InputError(r.file() + ": not " + kind + " (it has no \"format_version\")");
  if (oldest < 0) oldest = supported;
  const long long version = r.positive_int("format_version");
  if (version > supported)
    throw InputError(r.where("format_version") + ": format " + std::to_string(version) +
                     " is newer than this dplan reads (format " + std::to_string(supported) +
                     "); use a newer dplan, or write the file again with this one");
  if (version < oldest) {
    const std::string reads = oldest == supported ? std::to_string(supported)
                                                  : std::to_string(oldest) + " to " + std::to_string(supported);
    throw InputError(r.where("format_version") + ": expected " + reads + " (this dplan reads format " + reads +
                     "), got " + std::to_string(version));
  }
  return static_cast<int>(version);
}

}  // namespace dplan::costmodel
