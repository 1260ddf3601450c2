// A rank's part of a global tensor (GlobalSlice): what the model builds each parameter with and
// what a checkpoint stores beside it. Free of LibTorch, so the checkpoint's readers (and their fuzz
// target) use it too.
#pragma once

#include <cstdint>
#include <vector>

namespace dplan::executor {

// Which part of the global tensor (the whole parameter under its global name, as a one-rank run holds
// it) a rank's tensor is: along `dim`, the global tensor is cut into sections (one, or the query,
// key and value rows of the fused QKV weight), each padded with zeros to `padded` (the vocabulary
// to a multiple of tp) and split into `parts` equal chunks, of which this rank holds chunk `index`
// of every section, concatenated in section order. parts 1: the whole tensor. Checkpoints store
// each tensor with its slice, so a loader can rebuild the global tensor and cut any rank's part.
struct GlobalSlice {
  struct Section {
    int64_t length = 0, padded = 0;
    bool operator==(const Section&) const = default;
  };
  std::vector<int64_t> shape;  // the global tensor's shape (unpadded)
  int dim = 0;
  int parts = 1, index = 0;
  std::vector<Section> sections;  // along dim; empty: one section, the whole dim, unpadded
  std::vector<Section> sections_or_whole() const {
    return sections.empty() ? std::vector<Section>{{shape.at(dim), shape.at(dim)}} : sections;
  }
  bool operator==(const GlobalSlice&) const = default;
};

}  // namespace dplan::executor
