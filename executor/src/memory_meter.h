// Bytes of tensor memory in use and their high-water mark. On CPU a counting allocator is
// installed through c10::SetCPUAllocator before any tensor exists: it wraps the default allocator
// and counts every tensor allocation exactly. On CUDA the caching allocator's own statistics
// (allocated bytes, current and peak) are read instead.
//
// The worker owns one meter and hands it to the model's pieces through their ParallelContext
// (gpt.h). LibTorch's CPU allocator is a process-wide hook: the counting allocator installed there
// outlives any meter (tensors it made may outlive one) and reports to the meter attached to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace dplan::executor {

namespace detail {
class CountingCpuAllocator;
}

// A flag of the calling thread, set while a scope of this kind lives on it (scopes nest): what the
// thread allocates meanwhile is counted as that kind. Each kind is its own Tag.
template <typename Tag>
class ThreadScope {
 public:
  ThreadScope() : outer_(!active_) { active_ = true; }
  ~ThreadScope() {
    if (outer_) active_ = false;
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  static bool active() { return active_; }

 private:
  static inline thread_local bool active_ = false;
  bool outer_;
};

// What the thread allocates counts as communication buffers: the temporaries a backend makes on
// the caller's thread as a collective starts (LibTorch 2.x's Gloo reduce-scatter copies its input
// there, before its own thread takes over).
class CommunicationScope : public ThreadScope<CommunicationScope> {};

// What the thread allocates is host memory of an offloaded optimizer (its fp32 weights, moments
// and gradient copy, and the step's temporaries), counted apart from the device's bytes. On CPU,
// where "device" and host are the same RAM, this is what keeps the two apart; on CUDA those
// tensors are pinned or pageable host memory, which the CUDA caching allocator's statistics never
// see.
class HostScope : public ThreadScope<HostScope> {};

class MemoryMeter {
 public:
  // cuda_device < 0: CPU (installs the counting allocator on the first meter and attaches this
  // one to it; construct it first thing, before any tensor, on the training thread).
  explicit MemoryMeter(int cuda_device);
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;

  int64_t current_bytes() const;
  int64_t peak_bytes() const;   // since the last reset_peak()
  void reset_peak();
  // Communication buffers (ZeRO's gathered parameters, unsharded gradient buckets, pipeline
  // send/receive tensors) are counted apart: their owner reports each allocation (+) and release
  // (-) here, and on CPU whatever a backend's own threads allocate counts too; the meter keeps the
  // buffers' high-water mark and, on CPU exactly, that of everything else (activations).
  void note_buffer_bytes(int64_t delta);
  int64_t peak_buffer_bytes() const;            // since the last reset_peak()
  int64_t peak_excluding_buffers_bytes() const;  // since the last reset_peak()
  std::string source() const;
  // The high-water mark, over the run, of host memory allocated under a HostScope (optimizer
  // offload). Exact on CPU (the counting allocator); on CUDA -1 (not metered: run.json then
  // reports the host tensors' own bytes).
  int64_t host_peak_bytes() const;
  // CUDA: the caching allocator's reserved bytes at their peak since the last reset_peak(); -1 on
  // the CPU (the counting allocator reserves nothing beyond what tensors hold).
  int64_t reserved_peak_bytes() const;
  // CUDA: the device memory in use (cudaMemGetInfo: total less free) beyond what the caching
  // allocator holds now: the CUDA context, the libraries' workspaces (cuBLAS, cuDNN), NCCL's
  // buffers; and another process's, should one share the device. -1 on the CPU.
  int64_t outside_allocator_bytes() const;

 private:
  friend class detail::CountingCpuAllocator;
  // Whether the calling thread is a communication backend's, or inside a CommunicationScope (its
  // allocations are buffers).
  bool on_backend_thread() const;

  int cuda_device_;
  detail::CountingCpuAllocator* cpu_ = nullptr;  // CPU: the installed counting allocator
  std::thread::id training_thread_;
  // Bytes held in communication buffers, and their high-water mark since the last reset.
  std::atomic<int64_t> buffers_{0}, buffers_peak_{0};
};

}  // namespace dplan::executor
