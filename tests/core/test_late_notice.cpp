// LateNotice: its line appears once when the phase outlasts the delay, and never when it ends first.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "core/elapsed.h"
#include "core/late_notice.h"

namespace {

using namespace std::chrono_literals;

// What was written to `f` so far.
std::string contents(FILE* f) {
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}

TEST(LateNotice, APhaseThatOutlastsTheDelayGetsItsLineOnce) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    const LateNotice notice(50ms, "convs: measuring", f);
    std::this_thread::sleep_for(400ms);
  }
  EXPECT_EQ(contents(f), "convs: measuring\n");
  std::fclose(f);
}

TEST(LateNotice, APhaseThatEndsFirstPrintsNothingAndIsNotHeldUp) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const auto start = std::chrono::steady_clock::now();
  { const LateNotice notice(60s, "never", f); }
  EXPECT_LT(seconds_since(start), 5.0) << "the destructor waited for the delay";
  EXPECT_EQ(contents(f), "");
  std::fclose(f);
}

}  // namespace
