// A line for the user when a start-up phase runs long: a first start measures every conv shape's
// algorithms and fused plans (about a minute for bin/predict's runtime-compiled engines), during
// which nothing else is printed, and a silent minute reads as a hang.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

// How long a start-up phase runs before the programs say what it is doing.
constexpr std::chrono::seconds kLateNoticeDelay{5};

// Prints `line` and a newline to `out` (flushed), once, from a thread of its own, if the object
// still lives `delay` after its creation; destroyed earlier (the phase is over), it prints nothing.
// The destructor waits for that thread. (The line is made by the caller beforehand: the thread
// reads nothing the phase may be changing.)
class LateNotice {
 public:
  LateNotice(std::chrono::milliseconds delay, std::string line, FILE* out = stdout);
  ~LateNotice();
  LateNotice(const LateNotice&) = delete;
  LateNotice& operator=(const LateNotice&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};
