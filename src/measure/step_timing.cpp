// Data stall per step from events on the compute stream, read a few steps behind.
#include "measure/step_timing.h"

void StepTiming::begin_step(long step) {
  pairs_.push_back(Pair{step, Event(true), Event(true)});
  pairs_.back().begin.record(stream_);
}

void StepTiming::data_ready() { pairs_.back().ready.record(stream_); }

void StepTiming::read_completed(bool wait) {
  for (Pair& p : pairs_) {
    if (p.ms >= 0) continue;
    if (!wait) {
      const cudaError_t q = cudaEventQuery(p.ready);
      if (q == cudaErrorNotReady) break;  // later ones are not done either
      if (q != cudaSuccess) CUDA_CHECK(q);
    }
    p.ms = p.ready.ms_since(p.begin);
  }
}

double StepTiming::stall_ms(long first, long last, bool wait) {
  read_completed(wait);
  double total = 0;
  for (const Pair& p : pairs_)
    if (p.step >= first && p.step <= last && p.ms >= 0) total += p.ms;
  return total;
}

void StepTiming::drop_before(long first) {
  read_completed(false);
  while (!pairs_.empty() && pairs_.front().step < first && pairs_.front().ms >= 0) pairs_.pop_front();
}
