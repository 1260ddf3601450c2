// The counting CPU allocator (memory_meter.h): exact bytes per tensor, their peak, communication
// buffers and offloaded host memory apart, with the block's size kept in a header in front of it.
#include <thread>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "memory_meter.h"

// Last: glog (through LibTorch) defines a CHECK of its own, which Catch's must replace.
#include <catch2/catch.hpp>

using namespace dplan::executor;

TEST_CASE("memory meter: every CPU tensor's bytes, their peak, buffers and host memory counted exactly",
          "[executor][memory]") {
  torch::set_num_threads(1);
  MemoryMeter meter(-1);  // a test case is a process of its own: the first meter, before its tensors
  const int64_t base = meter.current_bytes();
  meter.reset_peak();
  at::Tensor a = at::empty({1000}, at::kFloat);
  CHECK(meter.current_bytes() == base + 4000);
  CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64 == 0);  // c10's alignment survives the header
  {
    at::Tensor b = at::empty({250}, at::kFloat);
    CHECK(meter.current_bytes() == base + 5000);
  }
  CHECK(meter.current_bytes() == base + 4000);
  CHECK(meter.peak_bytes() == base + 5000);
  at::Tensor none = at::empty({0}, at::kFloat);
  CHECK(meter.current_bytes() == base + 4000);

  meter.reset_peak();
  CHECK(meter.peak_bytes() == base + 4000);
  {
    CommunicationScope scope;
    at::Tensor buffer = at::empty({100}, at::kFloat);  // a backend's staging copy
    CHECK(meter.current_bytes() == base + 4400);
  }
  CHECK(meter.peak_buffer_bytes() == 400);
  CHECK(meter.peak_excluding_buffers_bytes() == base + 4000);
  {
    at::Tensor other;
    std::thread([&] { other = at::empty({25}, at::kFloat); }).join();  // a backend's own thread: a buffer
    CHECK(meter.current_bytes() == base + 4100);
  }
  CHECK(meter.peak_excluding_buffers_bytes() == base + 4000);

  {
    HostScope scope;
    at::Tensor host = at::empty({50}, at::kFloat);  // an offloaded optimizer's: apart from the device's
    CHECK(meter.current_bytes() == base + 4000);
  }
  CHECK(meter.host_peak_bytes() == 200);

  // LibTorch's raw interface (context == data pointer) goes through the same header.
  c10::Allocator* cpu = c10::GetCPUAllocator();
  void* raw = cpu->raw_allocate(64);
  CHECK(meter.current_bytes() == base + 4064);
  cpu->raw_deleter()(raw);
  CHECK(meter.current_bytes() == base + 4000);
  a.reset();
  CHECK(meter.current_bytes() == base);
}
