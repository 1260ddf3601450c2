#include "data.h"

#include <fstream>
#include <iterator>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>

namespace dplan::executor {
namespace {
constexpr int64_t kSyntheticSamples = 1 << 16;

uint64_t splitmix64(uint64_t& state) {  // Steele, Lea, Flood 2014
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
}  // namespace

DataSource::DataSource(const std::string& path, int seq_len, int vocab_size, int global_batch, int dp, int dp_rank,
                       uint64_t seed)
    : path_(path), seq_len_(seq_len), vocab_size_(vocab_size), global_batch_(global_batch), dp_(dp),
      dp_rank_(dp_rank), seed_(seed) {
  if (path.empty()) {
    num_samples_ = kSyntheticSamples;
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument("cannot read data file " + path);
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (vocab_size < 256)
      throw std::invalid_argument("byte-level data needs a vocabulary of at least 256 tokens; the model has " +
                                  std::to_string(vocab_size));
    num_samples_ = bytes_.size() > 0 ? (int64_t(bytes_.size()) - 1) / seq_len : 0;
  }
  if (num_samples_ < global_batch)
    throw std::invalid_argument("data file " + path + " holds " + std::to_string(num_samples_) + " sequences of " +
                                std::to_string(seq_len + 1) + " bytes, fewer than the global batch of " +
                                std::to_string(global_batch) + "; give a larger file or a smaller --global-batch");
}

std::string DataSource::describe() const { return path_.empty() ? "synthetic" : path_; }

void DataSource::start_epoch() {
  ++epoch_;
  at::Generator gen = at::detail::createCPUGenerator(seed_ + 1000003ULL * (epoch_ + 1));
  at::Tensor perm = at::randperm(num_samples_, gen, at::kLong);
  const int64_t usable = num_samples_ / global_batch_ * global_batch_;  // whole global batches only
  const int64_t* p = perm.data_ptr<int64_t>();
  order_.clear();
  for (int64_t i = dp_rank_; i < usable; i += dp_) order_.push_back(p[i]);
  cursor_ = 0;
}

void DataSource::seek(const Position& at) {
  const int64_t usable = num_samples_ / global_batch_ * global_batch_;
  if (at.epoch < -1 || at.samples < 0 || at.samples % global_batch_ != 0 || at.samples > usable ||
      (at.epoch == -1 && at.samples != 0))
    throw std::invalid_argument("data position epoch " + std::to_string(at.epoch) + " sample " +
                                std::to_string(at.samples) + " is not one of whole global batches of " +
                                std::to_string(global_batch_) + " in " + std::to_string(usable) + " samples");
  epoch_ = at.epoch - 1;
  order_.clear();
  cursor_ = 0;
  if (at.epoch < 0) return;
  start_epoch();
  cursor_ = static_cast<size_t>(at.samples / dp_);
}

at::Tensor DataSource::sample(int64_t index) const {
  at::Tensor t = at::empty({seq_len_ + 1}, at::kLong);
  int64_t* out = t.data_ptr<int64_t>();
  if (!bytes_.empty()) {
    for (int i = 0; i <= seq_len_; ++i) out[i] = bytes_[size_t(index) * seq_len_ + i];
    return t;
  }
  // Synthetic: arithmetic progressions mod vocab with a tenth of the tokens noise, so there is
  // something to learn and the loss falls.
  uint64_t state = seed_ * 0x100000001B3ULL + uint64_t(index);
  const int64_t start = int64_t(splitmix64(state) % uint64_t(vocab_size_));
  const int64_t stride = 1 + int64_t(splitmix64(state) % 7);
  for (int i = 0; i <= seq_len_; ++i) {
    uint64_t r = splitmix64(state);
    out[i] = (r % 10 == 0) ? int64_t((r >> 8) % uint64_t(vocab_size_)) : (start + stride * i) % vocab_size_;
  }
  return t;
}

std::vector<Batch> DataSource::next_step(int micro_batch) {
  const int per_rank = global_batch_ / dp_;
  if (epoch_ < 0 || cursor_ + per_rank > order_.size()) start_epoch();
  std::vector<Batch> out;
  for (int first = 0; first < per_rank; first += micro_batch) {
    std::vector<at::Tensor> rows;
    for (int j = first; j < first + micro_batch; ++j) rows.push_back(sample(order_[cursor_ + j]));
    at::Tensor both = at::stack(rows);
    out.push_back({both.narrow(1, 0, seq_len_).contiguous(), both.narrow(1, 1, seq_len_).contiguous()});
  }
  cursor_ += per_rank;
  return out;
}

}  // namespace dplan::executor
