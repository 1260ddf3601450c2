// How a surviving rank names the rank that died. Each rank bumps its counter in the rendezvous
// store every kBeat over its own store connection; a rank whose counter stands still for several
// beats is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "place.h"

namespace dplan::executor {

constexpr auto kBeat = std::chrono::milliseconds(250);
constexpr int kStaleBeats = 6;  // a peer is gone when it missed this many of my own beats

// This rank's beat, on a thread of its own from construction until stop().
class Heartbeat {
 public:
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank);
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  void stop();
  static std::string key(int rank) { return "dplan/heartbeat/" + std::to_string(rank); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  // stop() wakes the thread from its wait between beats: a run ends without waiting out a beat.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Which ranks stopped beating, as a survivor of a failed collective sees them.
struct Diagnosis {
  std::vector<int> stopped;  // in rank order; empty when every peer still beats
  std::string line;          // "rank 3 stopped (no heartbeat for 1500 ms)", or empty
};

// After a collective failed: which other ranks stopped beating, or the first such finding another
// survivor already recorded. Pass a store connection other than the heartbeat thread's.
Diagnosis diagnose(const c10::intrusive_ptr<c10d::Store>& store, const Place& place);

}  // namespace dplan::executor
