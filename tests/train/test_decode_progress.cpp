// DecodeProgress: nothing for a decoding that ends within the delay; a line each delay after it,
// with the count so far, until it ends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/elapsed.h"
#include "support/test_files.h"
#include "train/decode_progress.h"

namespace {

using namespace std::chrono_literals;

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The work lasts until two lines are there (or 30 s, on a machine too loaded to wake the thread).
TEST(DecodeProgress, LongWorkGetsALineEachDelayWithTheCountSoFar) {
  test_files::TempDir dir;
  const std::string path = dir / "out.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::atomic<long> decoded{0};
  {
    const DecodeProgress progress("data: decoding into memory", 12000, [&] { return decoded.load(); }, 30ms, f);
    const auto start = std::chrono::steady_clock::now();
    while (lines_of(contents(path)).size() < 2 && seconds_since(start) < 30) {
      decoded += 1000;
      std::this_thread::sleep_for(10ms);
    }
  }
  std::fclose(f);
  const std::vector<std::string> lines = lines_of(contents(path));
  ASSERT_GE(lines.size(), 2u) << contents(path);
  const std::regex line(R"(data: decoding into memory: ([\d,]+) of 12,000 images \((\d+)%\), \d+ s)");
  std::smatch m;
  for (const std::string& l : lines) EXPECT_TRUE(std::regex_match(l, m, line)) << l;
  ASSERT_TRUE(std::regex_match(lines.back(), m, line));
  EXPECT_NE(m[1].str(), "0") << "the count was not read";
}

TEST(DecodeProgress, WorkThatEndsFirstPrintsNothingAndIsNotHeldUp) {
  test_files::TempDir dir;
  const std::string path = dir / "out.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  const auto start = std::chrono::steady_clock::now();
  { const DecodeProgress progress("never", 10, [] { return 0L; }, 60s, f); }
  EXPECT_LT(seconds_since(start), 5.0) << "the destructor waited for the delay";
  std::fclose(f);
  EXPECT_EQ(contents(path), "");
}

}  // namespace
