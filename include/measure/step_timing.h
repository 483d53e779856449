// Data stall measured on the GPU's own clock.
//
// For each step, an event before "get batch" and one after "copy batch", both on the compute
// stream: the time between them is time the compute stream spent with nothing to do but wait for
// the batch (a busy GPU reaches the first event late, so overlap is not counted). Events are read
// a few steps behind, never forcing a synchronisation in steady state.
#pragma once

#include <deque>

#include "core/handles.h"

class StepTiming {
 public:
  explicit StepTiming(cudaStream_t s) : stream_(s) {}
  void begin_step(long step);   // before "get batch"
  void data_ready();            // after "copy batch"
  // Adds the stall of every completed step in [first, last] to the total; with wait, all of them.
  double stall_ms(long first, long last, bool wait);
  // Forgets steps before `first`.
  void drop_before(long first);

 private:
  struct Pair {
    long step;
    Event begin, ready;
    double ms = -1;  // -1 until read
  };
  void read_completed(bool wait);
  cudaStream_t stream_;
  std::deque<Pair> pairs_;
};
