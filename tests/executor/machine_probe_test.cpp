// The probe's estimators: a backward timed without its forward, and the slowest rank chosen by its
// whole pass.
#include <chrono>
#include <thread>

// LibTorch (through the probe's header) first: its glog defines CHECK, which must give way to Catch's.
#include "machine_probe.h"
#undef CHECK
#include <catch2/catch.hpp>

using dplan::executor::probe_detail::backward_time_s;
using dplan::executor::probe_detail::slowest_rank;

TEST_CASE("the probe times a backward without its forward", "[executor][probe]") {
  at::Tensor x = at::randn({64, 64}).requires_grad_();
  int forwards = 0;
  auto forward = [&] {
    ++forwards;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow forward, outside the clock
    return x * 2;
  };
  const double s = backward_time_s(forward, at::ones({64, 64}), 0.01);
  CHECK(s > 0);
  // The 20 ms forward stays outside the clock: a 64 x 64 multiply's backward takes well under a
  // millisecond, so this bound holds on any machine not tens of times slower than this one.
  CHECK(s < 0.02);
  CHECK(forwards >= 4);  // a warm-up call and at least 3 timed
  // And the backward ran: x's gradient holds every call's 2s.
  CHECK(x.grad().defined());
  CHECK(x.grad()[0][0].item<double>() == Approx(2.0 * forwards));
}

TEST_CASE("the probe keeps the rank whose whole pass was slowest, not each GEMM's slowest", "[executor][probe]") {
  // Rank 0 is slowest on two GEMMs by a little, rank 1 on the largest by a lot: a step summing
  // them waits for rank 1.
  at::Tensor times = at::tensor({1.1, 1.1, 10.0, 1.0, 1.0, 12.0}, at::kDouble).reshape({2, 3});
  CHECK(slowest_rank(times) == 1);
  times[1][2] = 9.0;
  CHECK(slowest_rank(times) == 0);
  CHECK(slowest_rank(at::tensor({3.0, 1.0}, at::kDouble).reshape({1, 2})) == 0);
}
