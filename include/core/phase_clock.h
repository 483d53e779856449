// Where a start went: the seconds each start-up phase took, for one line at the end of the start-up
// (`start-up: data 0.41 s, GPU 0.35 s, network 0.42 s, ...; 2.10 s since the process began`). Time to
// a trained model counts the start-up, and on several GPUs it is what keeps the time from halving.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

class PhaseClock {
 public:
  // Ends the phase that runs, if one does, and begins `name`.
  void begin(std::string name);
  // Ends the phase that runs (nothing, if none does).
  void end();
  // Each phase ended, with its seconds, in the order they ran.
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  // "data 0.41 s, GPU 0.35 s": the phases ended.
  std::string line() const;

 private:
  std::vector<std::pair<std::string, double>> phases_;
  std::string running_;
  std::chrono::steady_clock::time_point since_{};
  bool on_ = false;
};

// Seconds since this process was started, from /proc/self/stat's start time against CLOCK_BOOTTIME,
// so that the loading of its libraries before main() counts too (10 ms resolution); -1 where /proc
// cannot tell.
double seconds_since_process_start();
