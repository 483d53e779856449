// Tests of threaded code run their scenario under a watchdog, so that a deadlock fails the test
// instead of hanging the suite. Header-only, shared by the ring and egress pipeline tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>

namespace test_threads {

// Runs `scenario` on another thread; fails (and abandons the thread) if it has not ended in time.
inline void run_with_watchdog(const std::function<void()>& scenario, int seconds = 30) {
  auto done = std::make_shared<std::future<void>>(std::async(std::launch::async, scenario));
  if (done->wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    // A hung scenario cannot be joined; leak its future so its destructor does not wait forever.
    new std::shared_ptr<std::future<void>>(done);
    FAIL() << "the scenario did not finish within " << seconds << " s: deadlock or hang";
  }
  done->get();
}

}  // namespace test_threads
