// The steady-state window: --profile-steps steps after --warmup-steps, timed with CUDA events on the
// compute stream, bracketed by cudaProfilerStart/Stop (nsys's capture range) and recorded by --trace.
#pragma once

#include <memory>
#include <string>

#include "core/handles.h"
#include "measure/step_timing.h"
#include "measure/trace.h"

class SteadyStateWindow {
 public:
  // Steps [first, first + steps) in all; trace_path "" records no trace.
  SteadyStateWindow(cudaStream_t stream, long first, long steps, const std::string& trace_path);
  bool opens_at(long step) const { return step == first_; }
  bool closes_at(long step) const { return step == last_; }
  bool is_open() const { return open_; }
  long first() const { return first_; }
  bool done() const { return done_; }

  void open();
  // `steps_done`: steps in all when it closes (the run may end inside the window).
  void close(long steps_done, StepTiming& timing);

  // Results, once closed: steps timed (0 if the window never closed), GPU time, data stall, and the
  // trace's GPU busy % (NaN without --trace).
  long timed_steps() const { return done_ ? last_ - first_ + 1 : 0; }
  double ms() const { return ms_; }
  double stall_ms() const { return stall_ms_; }
  double gpu_busy_pct() const { return busy_pct_; }
  // The window's bounds on the host's wall clock, in milliseconds since the Unix epoch (0 until it
  // opens and closes): what lets a sampler of the GPU's power outside the process (bench/ab.py
  // --clocks) keep the samples of the window alone.
  long long unix_start_ms() const { return unix_start_ms_; }
  long long unix_end_ms() const { return unix_end_ms_; }

 private:
  cudaStream_t stream_;
  long first_, last_;
  std::string trace_path_;
  std::unique_ptr<CuptiTrace> trace_;
  Event start_, end_;
  bool open_ = false, done_ = false;
  double ms_ = 0, stall_ms_ = 0, busy_pct_;
  long long unix_start_ms_ = 0, unix_end_ms_ = 0;
};
