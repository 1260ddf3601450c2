// Training data for one data-parallel rank: a byte-level tokenised text file (token = byte) or a
// seeded synthetic stream. Samples are sequences of seq_len + 1 tokens (inputs and shifted
// targets). Each epoch is a fresh permutation of the samples (seed + epoch), cut to whole global
// batches, and data-parallel rank r reads every dp-th sample from position r: what PyTorch's
// DistributedSampler with set_epoch(epoch) gives. So the samples of one global step are the same
// whatever dp is, which the parity tests rely on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace dplan::executor {

struct Batch {
  at::Tensor inputs, targets;  // [micro_batch, seq_len] int64
};

class DataSource {
 public:
  // path empty: synthetic. Throws std::invalid_argument when the file is missing, unreadable or
  // holds fewer than `global_batch` sequences, or the vocabulary cannot hold the tokens.
  DataSource(const std::string& path, int seq_len, int vocab_size, int global_batch, int dp, int dp_rank,
             uint64_t seed);

  // The micro-batches of the next step for this rank: global_batch / dp samples, in order.
  std::vector<Batch> next_step(int micro_batch);
  int64_t num_samples() const { return num_samples_; }
  int epoch() const { return epoch_; }
  std::string describe() const;
  // Where the stream is, whatever dp is: the epoch (-1 before the first step) and the samples of
  // the global batches read in it. seek() goes back there (a checkpoint's data position); it
  // throws std::invalid_argument when the position is not one of whole global batches.
  struct Position {
    int epoch = -1;
    int64_t samples = 0;
  };
  Position position() const { return {epoch_, static_cast<int64_t>(cursor_) * dp_}; }
  void seek(const Position& at);

 private:
  at::Tensor sample(int64_t index) const;  // [seq_len + 1]
  void start_epoch();

  std::string path_;
  std::vector<uint8_t> bytes_;
  int seq_len_, vocab_size_, global_batch_, dp_, dp_rank_;
  uint64_t seed_;
  int64_t num_samples_ = 0;
  int epoch_ = -1;
  std::vector<int64_t> order_;  // this rank's samples in this epoch
  size_t cursor_ = 0;
};

}  // namespace dplan::executor
