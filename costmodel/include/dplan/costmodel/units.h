// Byte units, defined once for every reader, writer and report. Binary multiples (IEC 80000-13:
// KiB = 2^10, MiB = 2^20, GiB = 2^30 bytes) for memory and message sizes; the decimal GB = 1e9 bytes
// for vendor capacities and bandwidths ("80 GB" of HBM, "450 GB/s"), as datasheets print them
// (profiles/README.md, "Units").
#pragma once

namespace dplan {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * kKiB;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGB = 1e9;

}  // namespace dplan
