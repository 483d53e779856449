// PhaseClock: each phase's seconds in the order they ran, and the line that says them; the process's
// age from /proc.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include "core/phase_clock.h"

namespace {

using namespace std::chrono_literals;

TEST(PhaseClock, EachBeginEndsThePhaseBeforeIt) {
  PhaseClock clock;
  clock.begin("data");
  std::this_thread::sleep_for(30ms);
  clock.begin("GPU");
  clock.end();
  clock.end();  // nothing runs: no phase added
  ASSERT_EQ(clock.phases().size(), 2u);
  EXPECT_EQ(clock.phases()[0].first, "data");
  EXPECT_EQ(clock.phases()[1].first, "GPU");
  EXPECT_GE(clock.phases()[0].second, 0.03);
  EXPECT_GE(clock.phases()[1].second, 0.0);
  EXPECT_LT(clock.phases()[1].second, clock.phases()[0].second);
  EXPECT_TRUE(std::regex_match(clock.line(), std::regex(R"(data \d+\.\d\d s, GPU \d+\.\d\d s)"))) << clock.line();
}

TEST(PhaseClock, NothingEndedIsAnEmptyLine) {
  PhaseClock clock;
  EXPECT_EQ(clock.line(), "");
  clock.begin("data");
  EXPECT_EQ(clock.line(), "") << "a phase that runs is not in the line";
}

TEST(PhaseClock, TheProcessAgeGrowsWithTheClock) {
  const double a = seconds_since_process_start();
  ASSERT_GE(a, 0.0) << "/proc/self/stat gave no start time";
  std::this_thread::sleep_for(60ms);
  const double b = seconds_since_process_start();
  EXPECT_GE(b - a, 0.04);  // the start time has 10 ms resolution
  EXPECT_LT(b - a, 5.0);
}

}  // namespace
