// One CUPTI recording (trace.h) of a real kernel, two memcpys and an NVTX phase, its summary and its
// Chrome JSON read back (GPU; skips without one).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/handles.h"
#include "measure/profiling.h"
#include "measure/trace.h"
#include "trace_test_util.h"

namespace {

using namespace trace_test;  // parse_json, Json, Rows, find_event

TEST(TraceGpu, RecordsKernelMemcpyAndPhase) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: the CUPTI trace needs a GPU";
  name_this_thread("main");
  CuptiTrace trace;
  CublasHandle cublas;  // created before the window: its set-up is not what is traced
  const int n = 1 << 20;
  float* raw = nullptr;
  CUDA_CHECK(cudaMalloc(&raw, n * sizeof(float)));
  std::unique_ptr<float, decltype(&cudaFree)> d(raw, &cudaFree);
  std::vector<float> h(n, 1.0f);

  trace.start();
  {
    NvtxRange phase("scale on GPU", phase_color::kCyan);
    CUDA_CHECK(cudaMemcpy(d.get(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    const float alpha = 2.0f;
    CUBLAS_CHECK(cublasSscal(cublas, n, &alpha, d.get(), 1));  // a kernel without nvcc in tests/
    CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  trace.stop();
  EXPECT_EQ(h[0], 2.0f);

  const TraceSummary s = trace.summary();
  EXPECT_GT(s.gpu_busy_pct, 0.0);
  EXPECT_LE(s.gpu_busy_pct, 100.0);
  EXPECT_GT(s.window_ms, 0.0);
  ASSERT_FALSE(s.top_kernels.empty());
  EXPECT_EQ(s.dropped_records, 0u);

  const std::string path = ::testing::TempDir() + "trace_gpu_" + std::to_string(::getpid()) + ".json";
  trace.write_chrome_json(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  const Json events = parse_json(text.str()).at("traceEvents");
  const Rows rows(events);
  int kernels = 0, h2d = 0, d2h = 0, memcpy_calls = 0;
  for (const Json& e : events.items) {
    if (e.at("ph").str != "X") continue;
    const std::string cat = e.at("cat").str, name = e.at("name").str;
    if (cat == "kernel") {
      ++kernels;
      EXPECT_EQ(rows.row(e).substr(0, 13), "GPU 0/stream ");
    }
    if (name == "memcpy HtoD") {
      ++h2d;
      EXPECT_EQ(e.at("args").at("bytes").number, static_cast<double>(n * sizeof(float)));
    }
    if (name == "memcpy DtoH") ++d2h;
    if (name == "cudaMemcpy") {
      ++memcpy_calls;
      EXPECT_EQ(rows.row(e), "CPU/main");
    }
  }
  EXPECT_GE(kernels, 1);
  EXPECT_EQ(h2d, 1);
  EXPECT_EQ(d2h, 1);
  EXPECT_EQ(memcpy_calls, 2);
  const Json* phase = find_event(events, "scale on GPU");
  ASSERT_NE(phase, nullptr);
  EXPECT_EQ(rows.row(*phase), "CPU/main");
}

}  // namespace
