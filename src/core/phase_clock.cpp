// The start-up phases' clock (phase_clock.h).
#include "core/phase_clock.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/elapsed.h"

void PhaseClock::begin(std::string name) {
  end();
  running_ = std::move(name);
  since_ = std::chrono::steady_clock::now();
  on_ = true;
}

void PhaseClock::end() {
  if (!on_) return;
  phases_.emplace_back(running_, seconds_since(since_));
  on_ = false;
}

std::string PhaseClock::line() const {
  std::string s;
  for (const auto& [name, seconds] : phases_) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.2f s", seconds);
    s += (s.empty() ? "" : ", ") + name + buf;
  }
  return s;
}

double seconds_since_process_start() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces and parentheses itself: the
  // fields are counted from the last ')', after which field 3 (the state) comes.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string skipped;
  for (int field = 3; field < 22; ++field)
    if (!(fields >> skipped)) return -1;
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;  // field 22: start time, in clock ticks after boot
  const long ticks_per_s = sysconf(_SC_CLK_TCK);
  timespec now{};
  if (ticks_per_s <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double since = double(now.tv_sec) + now.tv_nsec * 1e-9 - double(start_ticks) / double(ticks_per_s);
  return since >= 0 ? since : -1;
}
