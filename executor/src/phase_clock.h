// Exclusive wall time per phase of a training step, in the phases the cost model predicts
// (costmodel/phases.h). Phases nest (a tensor-parallel all-reduce inside forward, a recomputed
// forward inside backward): time is charged to the innermost open phase, so per step the phases
// add up to the step's wall time, with "overhead" the remainder.
// One clock per training process, shared by its threads rather than one per thread: on CUDA the
// autograd engine runs backward on its own thread, and the caller only waits for it, so at any
// moment one thread is doing the step's work. The worker owns it; the model's pieces reach it
// through their ParallelContext (gpt.h).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dplan/costmodel/phases.h"

namespace dplan::executor {

using costmodel::kNumPhases;
using costmodel::Phase;

class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;

  // `sync` is called at each phase switch before the time is read (e.g. a CUDA device
  // synchronize, so asynchronous kernels are charged to the phase that launched them). Empty:
  // nothing.
  explicit PhaseClock(std::function<void()> sync = {}) : sync_(std::move(sync)) {}
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  void start_step();                 // zeroes the totals; time until the first push is "overhead"
  std::array<double, kNumPhases> end_step();  // seconds per phase; "overhead" is the remainder
  void push(Phase p);
  void pop();
  // Whether `p` is open, innermost or around it (what runs inside a recompute is recompute's).
  bool within(Phase p);

 private:
  void charge(Clock::time_point now);
  std::mutex mutex_;
  std::function<void()> sync_;
  std::vector<Phase> stack_;
  std::array<double, kNumPhases> totals_{};
  Clock::time_point last_{}, step_start_{};
};

// RAII: the enclosed code's time goes to `phase` on `clock` (less any nested phase's).
class PhaseScope {
 public:
  PhaseScope(PhaseClock& clock, Phase p) : clock_(clock) { clock_.push(p); }
  ~PhaseScope() { clock_.pop(); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseClock& clock_;
};

}  // namespace dplan::executor
