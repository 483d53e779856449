// LateNotice: its line appears once when the phase outlasts the delay, and never when it ends first.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "core/elapsed.h"
#include "core/late_notice.h"
#include "support/test_files.h"

namespace {

using namespace std::chrono_literals;

// What the notice has written to `path` so far (read through a handle of its own, so the reads
// never move the position the notice writes at).
std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The phase lasts until the line is there (or 30 s, on a machine too loaded to wake the thread),
// so the test fails only when the line never comes, or comes more than once.
TEST(LateNotice, APhaseThatOutlastsTheDelayGetsItsLineOnce) {
  test_files::TempDir dir;
  const std::string path = dir / "out.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  {
    const LateNotice notice(50ms, "convs: measuring", f);
    const auto start = std::chrono::steady_clock::now();
    while (contents(path).empty() && seconds_since(start) < 30) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(100ms);  // time for a second line, were there one
  }
  std::fclose(f);
  EXPECT_EQ(contents(path), "convs: measuring\n");
}

TEST(LateNotice, APhaseThatEndsFirstPrintsNothingAndIsNotHeldUp) {
  test_files::TempDir dir;
  const std::string path = dir / "out.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  const auto start = std::chrono::steady_clock::now();
  { const LateNotice notice(60s, "never", f); }
  EXPECT_LT(seconds_since(start), 5.0) << "the destructor waited for the delay";
  std::fclose(f);
  EXPECT_EQ(contents(path), "");
}

}  // namespace
