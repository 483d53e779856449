// Seconds since a point of the program, on the steady clock (which never jumps): start-up phases,
// waits and timed windows measured on the host.
#pragma once

#include <chrono>

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
