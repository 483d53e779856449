// Opening and closing the steady-state window, and what it measured.
#include "train/window.h"

#include <cuda_profiler_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace {
long long unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

SteadyStateWindow::SteadyStateWindow(cudaStream_t stream, long first, long steps, const std::string& trace_path)
    : stream_(stream), first_(first), last_(first + steps - 1), trace_path_(trace_path), busy_pct_(NAN) {
  if (!trace_path_.empty()) trace_ = std::make_unique<CuptiTrace>();
}

void SteadyStateWindow::open() {
  // Open it on an idle GPU. The host runs a step or more ahead, and work launched before the window
  // would otherwise run inside it: timed by the window's events, but not recorded by --trace (CUPTI
  // records only what is launched while it records), so the trace would count that time as idle
  // and read a lower GPU busy % than nsys on the same binary.
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaProfilerStart());
  if (trace_) trace_->start();
  unix_start_ms_ = unix_now_ms();
  start_.record(stream_);
  open_ = true;
}

void SteadyStateWindow::close(long steps_done, StepTiming& timing) {
  end_.record(stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  unix_end_ms_ = unix_now_ms();
  CUDA_CHECK(cudaProfilerStop());
  open_ = false;
  done_ = true;
  ms_ = end_.ms_since(start_);
  stall_ms_ = timing.stall_ms(first_, steps_done - 1, true);
  last_ = steps_done - 1;  // the steps actually in it
  if (!trace_) return;
  trace_->stop();
  const TraceSummary t = trace_->summary();
  busy_pct_ = t.gpu_busy_pct;
  trace_->write_chrome_json(trace_path_);
  std::printf("trace: %s written (open it in https://ui.perfetto.dev)\n%s", trace_path_.c_str(), t.report().c_str());
}
