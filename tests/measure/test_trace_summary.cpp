// The trace summary (trace.h) on synthetic records: GPU busy % as the union over streams, the window,
// the longest gaps with the phase they fall in, the top kernels, the report; and kernel demangling.
#include <gtest/gtest.h>

#include <string>

#include "measure/trace.h"
#include "trace_test_util.h"

namespace {

using namespace trace_test;  // kernel, copy_h2d, range, kMain, kLoader

TEST(TraceSummary, BusyPercentIsTheUnionOverTwoStreams) {
  TraceData d;
  d.gpu = {kernel("a", 0, 100, 7), kernel("a", 300, 400, 7), kernel("b", 50, 150, 13),
           kernel("b", 350, 380, 13), copy_h2d(600, 700, 4096, 13)};
  // Union: [0,150] + [300,400] + [600,700] = 350 us of 700 us.
  const TraceSummary s = summarize(d);
  EXPECT_NEAR(s.window_ms, 0.7, 1e-12);
  EXPECT_NEAR(s.gpu_busy_pct, 50.0, 1e-9);
}

TEST(TraceSummary, BusyPercentOfDisjointAndNestedIntervals) {
  TraceData disjoint;
  disjoint.gpu = {kernel("a", 0, 100, 7), kernel("b", 200, 300, 13)};
  EXPECT_NEAR(summarize(disjoint).gpu_busy_pct, 200.0 / 3.0, 1e-9);

  TraceData nested;  // one long kernel hides a short one on another stream
  nested.gpu = {kernel("long", 0, 1000, 7), kernel("short", 100, 200, 13), kernel("same", 0, 1000, 14)};
  EXPECT_NEAR(summarize(nested).gpu_busy_pct, 100.0, 1e-9);
  EXPECT_TRUE(summarize(nested).longest_gaps.empty());
}

TEST(TraceSummary, WindowIsFirstGpuStartToLastGpuEnd) {
  TraceData d;
  // The last to start is not the last to end; host records outside the GPU span do not count.
  d.gpu = {kernel("late", 100, 200, 13), kernel("long", 20, 900, 7)};
  d.ranges = {range("step 1", kMain, 0, 2000)};
  d.api_calls = {{"cudaLaunchKernel", kMain, us(5), us(6), 1}};
  const TraceSummary s = summarize(d);
  EXPECT_NEAR(s.window_ms, 0.88, 1e-12);
  EXPECT_NEAR(s.gpu_busy_pct, 100.0, 1e-9);
}

TEST(TraceSummary, EmptyTraceHasNoWindow) {
  const TraceSummary s = summarize(TraceData{});
  EXPECT_EQ(s.window_ms, 0.0);
  EXPECT_EQ(s.gpu_busy_pct, 0.0);
  EXPECT_TRUE(s.longest_gaps.empty());
  EXPECT_TRUE(s.top_kernels.empty());
  EXPECT_NE(s.report().find("no GPU activity"), std::string::npos);
}

TEST(TraceSummary, LongestGapsWithTheirPhase) {
  TraceData d;
  d.main_thread = kMain;
  // Gaps: 10@10, 30@30, 80@70, 240@160, 10@410, 5@425, 5@440 (length@start, us).
  d.gpu = {kernel("k", 0, 10),    kernel("k", 20, 30),   kernel("k", 60, 70),   kernel("k", 150, 160),
           kernel("k", 400, 410), kernel("k", 420, 425), kernel("k", 430, 440), kernel("k", 445, 450)};
  d.ranges = {
      range("step 3", kMain, 0, 405),
      range("forward", kMain, 0, 15),
      range("loss stats", kMain, 25, 60),  // nested in "step 3": the gap at 30 is "loss stats"
      range("optimizer step", kMain, 100, 170),
      range("sgd update", kMain, 150, 165),  // innermost of two open at 160
      range("step 4", kMain, 405, 1000),
      range("get batch", kLoader, 150, 420),  // another thread: never the phase
  };
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.longest_gaps.size(), 5u);
  const struct {
    double start_ms, length_ms;
    const char* phase;
  } want[] = {{0.160, 0.240, "sgd update"},
              {0.070, 0.080, "after loss stats"},
              {0.030, 0.030, "loss stats"},
              {0.010, 0.010, "forward"},
              {0.410, 0.010, "after optimizer step"}};
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(s.longest_gaps[i].start_ms, want[i].start_ms, 1e-12);
    EXPECT_NEAR(s.longest_gaps[i].length_ms, want[i].length_ms, 1e-12);
    EXPECT_EQ(s.longest_gaps[i].phase, want[i].phase);
  }
}

TEST(TraceSummary, GapWithNoRangeSaysSo) {
  TraceData d;
  d.main_thread = kMain;
  d.gpu = {kernel("k", 0, 10), kernel("k", 20, 30)};
  d.ranges = {range("get batch", kLoader, 0, 30), range("step 1", kMain, 0, 30)};
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  EXPECT_EQ(s.longest_gaps[0].phase, "no range");
}

TEST(TraceSummary, TopKernelsByTotalTime) {
  TraceData d;
  d.gpu = {kernel("b", 0, 10),  kernel("b", 10, 20), kernel("b", 20, 30), kernel("a", 30, 45),
           kernel("a", 45, 60), kernel("c", 60, 100), copy_h2d(100, 300, 1 << 20, 13)};
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.top_kernels.size(), 3u);  // the memcpy is not a kernel
  EXPECT_EQ(s.top_kernels[0].name, "c");
  EXPECT_EQ(s.top_kernels[0].count, 1);
  EXPECT_NEAR(s.top_kernels[0].total_ms, 0.040, 1e-12);
  EXPECT_NEAR(s.top_kernels[0].pct, 40.0, 1e-9);
  EXPECT_EQ(s.top_kernels[1].name, "a");  // ties with "b" on time: by name
  EXPECT_EQ(s.top_kernels[1].count, 2);
  EXPECT_NEAR(s.top_kernels[1].pct, 30.0, 1e-9);
  EXPECT_EQ(s.top_kernels[2].name, "b");
  EXPECT_EQ(s.top_kernels[2].count, 3);
  EXPECT_NEAR(s.top_kernels[2].total_ms, 0.030, 1e-12);
}

TEST(TraceSummary, KeepsTheTenLongestKernels) {
  TraceData d;
  for (int i = 0; i < 12; ++i) d.gpu.push_back(kernel("k" + std::to_string(i), i * 100, i * 100 + 1 + i));
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.top_kernels.size(), 10u);
  EXPECT_EQ(s.top_kernels.front().name, "k11");
  EXPECT_EQ(s.top_kernels.back().name, "k2");
}

TEST(TraceSummary, ReportNamesTheNumbers) {
  TraceData d;
  d.main_thread = kMain;
  d.gpu = {kernel("void conv<float>(float const*)", 0, 100), kernel("relu", 300, 400)};
  d.ranges = {range("loss stats", kMain, 50, 350)};
  d.dropped_records = 3;
  const std::string r = summarize(d).report();
  EXPECT_NE(r.find("GPU busy 50.0%"), std::string::npos) << r;
  EXPECT_NE(r.find("0.40 ms window"), std::string::npos) << r;
  EXPECT_NE(r.find("loss stats"), std::string::npos) << r;
  EXPECT_NE(r.find("void conv<float>(float const*)"), std::string::npos) << r;
  EXPECT_NE(r.find("dropped 3 records"), std::string::npos) << r;
}

TEST(TraceDemangle, ReadableKernelNames) {
  EXPECT_EQ(demangle("_Z6kernelPfi"), "kernel(float*, int)");
  EXPECT_EQ(demangle("_Z4convIfEvPKT_"), "void conv<float>(float const*)");
  EXPECT_EQ(demangle("f"), "f");  // a C-named kernel is not the type "float"
  EXPECT_EQ(demangle("_Z!!"), "_Z!!");
  EXPECT_EQ(demangle(nullptr), "");
}

}  // namespace
