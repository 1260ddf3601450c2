#include "phase_clock.h"

#include <algorithm>

namespace dplan::executor {

void PhaseClock::charge(Clock::time_point now) {
  Phase current = stack_.empty() ? Phase::overhead : stack_.back();
  totals_[static_cast<int>(current)] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void PhaseClock::start_step() {
  if (sync_) sync_();
  std::lock_guard<std::mutex> lock(mutex_);
  totals_.fill(0);
  stack_.clear();
  step_start_ = last_ = Clock::now();
}

std::array<double, kNumPhases> PhaseClock::end_step() {
  if (sync_) sync_();
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  charge(now);
  std::array<double, kNumPhases> out = totals_;
  double step = std::chrono::duration<double>(now - step_start_).count();
  double named = 0;
  for (int i = 0; i < kNumPhases; ++i)
    if (i != static_cast<int>(Phase::overhead)) named += out[i];
  out[static_cast<int>(Phase::overhead)] = std::max(0.0, step - named);
  return out;
}

bool PhaseClock::within(Phase p) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::find(stack_.begin(), stack_.end(), p) != stack_.end();
}

void PhaseClock::push(Phase p) {
  if (sync_) sync_();
  std::lock_guard<std::mutex> lock(mutex_);
  charge(Clock::now());
  stack_.push_back(p);
}

void PhaseClock::pop() {
  if (sync_) sync_();
  std::lock_guard<std::mutex> lock(mutex_);
  charge(Clock::now());
  if (!stack_.empty()) stack_.pop_back();
}

}  // namespace dplan::executor
