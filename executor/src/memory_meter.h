// Bytes of tensor memory in use and their high-water mark. On CPU a counting allocator is
// installed through c10::SetCPUAllocator before any tensor exists: it wraps the default allocator
// and counts every tensor allocation exactly. On CUDA the caching allocator's own statistics
// (allocated bytes, current and peak) are read instead.
#pragma once

#include <cstdint>
#include <string>

namespace dplan::executor {

class MemoryMeter {
 public:
  // cuda_device < 0: CPU (installs the counting allocator; call once, first thing).
  explicit MemoryMeter(int cuda_device);
  int64_t current_bytes() const;
  int64_t peak_bytes() const;   // since the last reset_peak()
  void reset_peak();
  // Communication buffers (ZeRO's gathered parameters, unsharded gradient buckets, pipeline
  // send/receive tensors) are counted apart: their owner reports each allocation (+) and release
  // (-) here, and on CPU whatever a backend's own threads allocate counts too; the meter keeps the
  // buffers' high-water mark and, on CPU exactly, that of everything else (activations).
  // Construct the meter on the training thread.
  static void note_buffer_bytes(int64_t delta);
  int64_t peak_buffer_bytes() const;            // since the last reset_peak()
  int64_t peak_excluding_buffers_bytes() const;  // since the last reset_peak()
  std::string source() const;

 private:
  int cuda_device_;
};

}  // namespace dplan::executor
