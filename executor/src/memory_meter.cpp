#include "memory_meter.h"

#include <algorithm>

#include <c10/core/Allocator.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>
#ifdef DPLAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dplan::executor {
namespace {

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

}  // namespace

namespace detail {

// Wraps the default CPU allocator. Each block carries its size and kind in a header in front of
// the tensor's bytes (kHeaderBytes, which keeps the base allocator's alignment), so that neither
// allocating nor freeing takes a lock or looks anything up: the counters are atomics. LibTorch's
// raw_allocate() requires a DataPtr's context to equal its data pointer; both are the tensor's
// bytes, and the deleter, one plain function, finds the header in front of them.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base), base_free_(base->raw_deleter()) {}

  // This process's counting allocator, installed as LibTorch's CPU allocator on first use; it
  // lives as long as the process.
  static CountingCpuAllocator* install() {
    if (!installed_) {
      installed_ = new CountingCpuAllocator(c10::GetDefaultCPUAllocator());
      c10::SetCPUAllocator(installed_, /*priority=*/100);
    }
    return installed_;
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  // The meter that counts buffers (null: none; then no allocation is a buffer).
  void attach(MemoryMeter* meter) { meter_ = meter; }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  int64_t peak_other() const { return peak_other_.load(); }
  int64_t host_peak() const { return host_peak_.load(); }
  void reset_peak() {
    peak_.store(current_.load());
    peak_other_.store(current_.load() - buffers());
  }
  // Everything but the buffers may have grown: a buffer was handed back without being freed.
  void buffers_changed() { raise_to(peak_other_, current_.load() - buffers()); }

 private:
  enum Kind : uint32_t { kTensor = 0, kBuffer = 1, kHost = 2 };
  struct Header {
    size_t bytes;  // the tensor's, as asked for
    Kind kind;
  };
  // c10's CPU alignment (gAlignment, 64 bytes): the tensor's bytes stay as aligned as the base's.
  static constexpr size_t kHeaderBytes = 64;
  static_assert(sizeof(Header) <= kHeaderBytes);

  int64_t buffers() const {
    const MemoryMeter* meter = meter_.load(std::memory_order_relaxed);
    return meter ? meter->buffers_.load(std::memory_order_relaxed) : 0;
  }
  static void release(void* data) {
    if (!data) return;
    CountingCpuAllocator* self = installed_;  // the deleter of its blocks only: it is installed
    void* block = static_cast<char*>(data) - kHeaderBytes;
    const Header header = *static_cast<const Header*>(block);
    self->base_free_(block);
    const int64_t bytes = static_cast<int64_t>(header.bytes);
    if (header.kind == kHost) {
      self->host_current_ -= bytes;
      return;
    }
    self->current_ -= bytes;
    // current less buffers cannot grow here (a buffer's release lowers both alike): no peak to raise.
    if (MemoryMeter* meter = self->meter_.load(); header.kind == kBuffer && meter) meter->buffers_ -= bytes;
  }
  c10::DataPtr wrap(size_t n) const {
    if (n == 0) return base_->allocate(0);
    void* block = base_->raw_allocate(n + kHeaderBytes);
    MemoryMeter* meter = meter_.load(std::memory_order_relaxed);
    const bool host = HostScope::active();
    const bool buffer = !host && meter && meter->on_backend_thread();
    *static_cast<Header*>(block) = Header{n, host ? kHost : buffer ? kBuffer : kTensor};
    void* data = static_cast<char*>(block) + kHeaderBytes;
    const c10::Device device(c10::DeviceType::CPU);
    if (host) {
      raise_to(host_peak_, host_current_ += int64_t(n));
      return c10::DataPtr(data, data, &release, device);
    }
    if (buffer) raise_to(meter->buffers_peak_, meter->buffers_ += int64_t(n));
    const int64_t now = (current_ += int64_t(n));
    raise_to(peak_, now);
    raise_to(peak_other_, now - buffers());
    return c10::DataPtr(data, data, &release, device);
  }

  // The installed one, for release(), a plain function (the deleter of every block).
  static inline CountingCpuAllocator* installed_ = nullptr;
  c10::Allocator* base_;
  c10::DeleterFnPtr base_free_;  // frees what base_->raw_allocate gave
  std::atomic<MemoryMeter*> meter_{nullptr};
  mutable std::atomic<int64_t> current_{0}, peak_{0}, peak_other_{0};
  mutable std::atomic<int64_t> host_current_{0}, host_peak_{0};  // HostScope's, apart from the above
};

}  // namespace detail

MemoryMeter::MemoryMeter(int cuda_device) : cuda_device_(cuda_device), training_thread_(std::this_thread::get_id()) {
  if (cuda_device < 0) {
    cpu_ = detail::CountingCpuAllocator::install();
    cpu_->attach(this);
  }
}

MemoryMeter::~MemoryMeter() {
  if (cpu_) cpu_->attach(nullptr);
}

// Tensors a communication backend allocates on its own threads (Gloo stages gathers through flat
// copies there) are buffers too. Intra-op worker threads (inside a parallel region) work for the
// training thread, so theirs are not.
bool MemoryMeter::on_backend_thread() const {
  return CommunicationScope::active() || (std::this_thread::get_id() != training_thread_ && !at::in_parallel_region());
}

int64_t MemoryMeter::current_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return stats.allocated_bytes[0].current;  // index 0: StatType::AGGREGATE
  }
#endif
  return cpu_->current();
}

int64_t MemoryMeter::peak_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return stats.allocated_bytes[0].peak;
  }
#endif
  return cpu_->peak();
}

void MemoryMeter::note_buffer_bytes(int64_t delta) {
  raise_to(buffers_peak_, buffers_ += delta);
  if (delta < 0 && cpu_) cpu_->buffers_changed();
}

int64_t MemoryMeter::peak_buffer_bytes() const { return buffers_peak_.load(); }

int64_t MemoryMeter::peak_excluding_buffers_bytes() const {
#ifdef DPLAN_WITH_CUDA
  // The caching allocator keeps one high-water mark: the buffers' own peak is taken off it.
  if (cuda_device_ >= 0) return peak_bytes() - peak_buffer_bytes();
#endif
  return cpu_->peak_other();
}

void MemoryMeter::reset_peak() {
  buffers_peak_.store(buffers_.load());
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_device_);
    return;
  }
#endif
  cpu_->reset_peak();
}

int64_t MemoryMeter::host_peak_bytes() const { return cpu_ ? cpu_->host_peak() : -1; }

int64_t MemoryMeter::reserved_peak_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) return c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_).reserved_bytes[0].peak;
#endif
  return -1;
}

int64_t MemoryMeter::outside_allocator_bytes() const {
#ifdef DPLAN_WITH_CUDA
  if (cuda_device_ >= 0) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
    const int64_t reserved = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_).reserved_bytes[0].current;
    return static_cast<int64_t>(total_bytes - free_bytes) - reserved;
  }
#endif
  return -1;
}

std::string MemoryMeter::source() const {
  return cuda_device_ >= 0 ? "CUDA caching allocator statistics (allocated bytes)"
                           : "counting CPU allocator (exact tensor bytes)";
}

}  // namespace dplan::executor
