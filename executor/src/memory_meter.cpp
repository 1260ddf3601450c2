#include "memory_meter.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>
#ifdef DPLAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dplan::executor {
namespace {

// Wraps the default CPU allocator. Some LibTorch code calls raw_allocate(), which requires the
// DataPtr's context to equal its data pointer, so each block's inner DataPtr lives in a table
// keyed by the data pointer, and the deleter is one plain function.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) { self_ = this; }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* data) {
    if (!data) return;
    Block block;
    {
      std::lock_guard<std::mutex> lock(self_->mutex_);
      auto it = self_->blocks_.find(data);
      if (it == self_->blocks_.end()) return;
      block = std::move(it->second);
      self_->blocks_.erase(it);
    }
    self_->current_ -= int64_t(block.bytes);
  }  // the inner DataPtr frees the memory through the default allocator here
  c10::DataPtr wrap(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    c10::Device device = inner.device();
    if (!data) return inner;  // zero bytes
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[data] = Block{std::move(inner), n};
    }
    int64_t now = (current_ += int64_t(n));
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return c10::DataPtr(data, data, &release, device);
  }

  static inline CountingCpuAllocator* self_ = nullptr;
  c10::Allocator* base_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Block> blocks_;
  mutable std::atomic<int64_t> current_{0}, peak_{0};
};

CountingCpuAllocator* cpu_counter() {
  static CountingCpuAllocator* counter = [] {
    auto* c = new CountingCpuAllocator(c10::GetDefaultCPUAllocator());  // lives as long as the process
    c10::SetCPUAllocator(c, /*priority=*/100);
    return c;
  }();
  return counter;
}
}  // namespace

MemoryMeter::MemoryMeter(int cuda_device) : cuda_device_(cuda_device) {
  if (cuda_device < 0) cpu_counter();
}

int64_t MemoryMeter::current_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return stats.allocated_bytes[0].current;  // index 0: StatType::AGGREGATE
  }
#endif
  return cpu_counter()->current();
}

int64_t MemoryMeter::peak_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return stats.allocated_bytes[0].peak;
  }
#endif
  return cpu_counter()->peak();
}

void MemoryMeter::reset_peak() {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_device_);
    return;
  }
#endif
  cpu_counter()->reset_peak();
}

std::string MemoryMeter::source() const {
  return cuda_device_ >= 0 ? "CUDA caching allocator statistics (allocated bytes)"
                           : "counting CPU allocator (exact tensor bytes)";
}

}  // namespace dplan::executor
