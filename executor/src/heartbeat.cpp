#include "heartbeat.h"

#include <cstdint>
#include <exception>
#include <sstream>
#include <vector>

namespace dplan::executor {

Heartbeat::Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank) : store_(std::move(store)), rank_(rank) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      try {
        store_->add(key(rank_), 1);
      } catch (const std::exception&) {
        // Keep trying: a beat that stopped while this rank still runs would name it as dead. If
        // the store is gone for good, the main thread finds out in its next collective.
      }
      lock.lock();
      wake_.wait_for(lock, kBeat, [this] { return stop_; });
    }
  });
}

void Heartbeat::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

std::string describe(const std::vector<int>& stopped) {
  std::string names;
  for (int r : stopped) names += (names.empty() ? "" : ", ") + std::to_string(r);
  return (stopped.size() == 1 ? "rank " : "ranks ") + names + " stopped (no heartbeat for " +
         std::to_string(kStaleBeats * kBeat.count()) + " ms)";
}

}  // namespace

Diagnosis diagnose(const c10::intrusive_ptr<c10d::Store>& store, const Place& place) {
  try {
    // A survivor that already named the culprit wrote it down; agree with it.
    std::vector<int64_t> before(place.world), after(place.world);
    for (int r = 0; r < place.world; ++r) before[r] = store->add(Heartbeat::key(r), 0);
    // The window is counted in my own beats, not on the wall clock: when the machine stalls (a busy
    // host, a paused VM), my heartbeat stalls with everyone else's, and a peer that was merely not
    // scheduled yet is not taken for dead. If my own beat has stopped, the wall clock decides.
    const auto cap = std::chrono::steady_clock::now() + kBeat * kStaleBeats * 4;
    do std::this_thread::sleep_for(kBeat);
    while (store->add(Heartbeat::key(place.rank), 0) - before[place.rank] < kStaleBeats &&
           std::chrono::steady_clock::now() < cap);
    for (int r = 0; r < place.world; ++r) after[r] = store->add(Heartbeat::key(r), 0);
    std::string mine;
    for (int r = 0; r < place.world; ++r) {
      if (r == place.rank || after[r] != before[r]) continue;
      if (!mine.empty()) mine += ' ';
      mine += std::to_string(r);
    }
    if (mine.empty()) return {};
    // The first survivor to name a culprit records it (as "1 2"); later ones (whose peers exited in
    // the cascade) report that root cause instead of everyone who has left since.
    std::vector<uint8_t> expected, desired(mine.begin(), mine.end());
    std::vector<uint8_t> got = store->compareSet("dplan/first_failure", expected, desired);
    Diagnosis d;
    std::istringstream first(std::string(got.begin(), got.end()));
    for (int r; first >> r;) d.stopped.push_back(r);
    d.line = describe(d.stopped);
    return d;
  } catch (const std::exception&) {
    if (!place.run_dir.empty()) return {{}, "the rendezvous store in " + place.run_dir + " is unreadable"};
    if (place.rank == 0) return {};  // it serves the store
    return {{0}, "the rendezvous store on rank 0 (" + place.master_addr + ":" + std::to_string(place.master_port) +
                     ") is unreachable: rank 0 stopped"};
  }
}

}  // namespace dplan::executor
