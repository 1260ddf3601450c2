// The heartbeat's thread (heartbeat.h) and a rank's start-up clock (startup_clock.h).
#include <chrono>
#include <cstdlib>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "heartbeat.h"
#include "startup_clock.h"

// Last: glog (through LibTorch) defines a CHECK of its own, which Catch's must replace.
#include <catch2/catch.hpp>

using namespace dplan::executor;

TEST_CASE("heartbeat: beats into the store, and stop() ends it without waiting out a beat", "[executor][heartbeat]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Heartbeat beat(store, 3);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (store->add(Heartbeat::key(3), 0) < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(store->add(Heartbeat::key(3), 0) >= 2);  // it beat at least twice
  const auto t0 = std::chrono::steady_clock::now();
  beat.stop();
  // A beat is 250 ms: a stop that waited it out would take up to that long.
  CHECK(std::chrono::steady_clock::now() - t0 < kBeat / 2);
  const int64_t after = store->add(Heartbeat::key(3), 0);
  std::this_thread::sleep_for(kBeat * 2);
  CHECK(store->add(Heartbeat::key(3), 0) == after);  // stopped for good
}

TEST_CASE("startup clock: the parts in order, the launch when the launcher recorded it, and their total",
          "[executor][startup]") {
  ::unsetenv(kLaunchTimeEnv);
  {
    StartupClock clock;
    clock.mark("setup");
    clock.mark("model");
    const nlohmann::json j = clock.to_json();
    CHECK_FALSE(j.contains("launch_to_main"));  // another launcher: unknown
    CHECK(j.at("total").get<double>() == j.at("setup").get<double>() + j.at("model").get<double>());
  }
  ::setenv(kLaunchTimeEnv, std::to_string(steady_now_ns() - 50'000'000).c_str(), 1);  // 50 ms ago
  {
    StartupClock clock;
    clock.mark("setup");
    const nlohmann::json j = clock.to_json();
    CHECK(j.at("launch_to_main").get<double>() >= 0.05);
    CHECK(j.at("launch_to_main").get<double>() < 5);
    CHECK(j.at("total").get<double>() >= j.at("launch_to_main").get<double>());
  }
  for (const char* bad : {"soon", "-5", "12abc", ""}) {  // not a reading of this machine's clock: left out
    ::setenv(kLaunchTimeEnv, bad, 1);
    CHECK_FALSE(StartupClock().to_json().contains("launch_to_main"));
  }
  ::setenv(kLaunchTimeEnv, std::to_string(steady_now_ns() + 1'000'000'000).c_str(), 1);  // in the future
  CHECK_FALSE(StartupClock().to_json().contains("launch_to_main"));
  ::unsetenv(kLaunchTimeEnv);
}
