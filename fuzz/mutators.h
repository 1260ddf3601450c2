// Structure-aware mutation for the fuzz targets (LLVMFuzzerCustomMutator). libFuzzer's own
// mutations change bytes; most of them break the JSON or the nccl-tests table, and the few that
// keep it rarely reach the values the readers have to refuse: 1e308 GB of HBM, a denormal
// bandwidth, 2^31 heads, a key left out, a list a thousand long. Half of the mutations here are
// libFuzzer's (the parsers stay fuzzed); the other half parse the input and change one value, key
// or line of it to such an edge, then write it back.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dplan::fuzz {

// For the JSON targets: one value of the document (a number to an edge of double, int or long
// long, or scaled by a power of ten; a string to another of the document's; a key removed; a
// subtree copied, repeated or replaced by another type). Malformed input gets libFuzzer's
// mutation only.
size_t mutate_json(uint8_t* data, size_t size, size_t max_size, unsigned seed);

// For nccl-tests text: one number of a line to an edge, or a line removed, repeated or moved.
size_t mutate_lines(uint8_t* data, size_t size, size_t max_size, unsigned seed);

}  // namespace dplan::fuzz

// Defines the target's LLVMFuzzerCustomMutator as `mutate`.
#define DPLAN_FUZZ_CUSTOM_MUTATOR(mutate)                                                             \
  extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) { \
    return mutate(data, size, max_size, seed);                                                        \
  }
