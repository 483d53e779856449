// Launchers of the all-reduce's clock (kernels/comm_clock.cu): timestamps taken on the GPU by
// one-thread kernels, and a per-step tally of them, so that how long the gradient all-reduce runs
// and how much of it backward leaves exposed is measured in a step replayed as a CUDA graph too
// (an event recorded inside a captured graph cannot be read per replay without a host wait).
#pragma once

#include <cuda_runtime.h>

// Sums over the steps counted while measuring (device memory).
struct CommTally {
  unsigned long long steps;       // steps counted
  unsigned long long exposed_ns;  // end of the last bucket minus end of backward, when positive
  unsigned long long busy_ns;     // the communication stream's time on buckets (start to end of each)
};

// *at = the GPU's global nanosecond clock when the stream reaches this point.
void stamp_time(unsigned long long* at, cudaStream_t stream);
// stamps: [0] the end of backward, then (start, end) of each of `buckets` buckets. When *on is
// non-zero, adds this step to *tally.
void tally_comm_step(const unsigned long long* stamps, int buckets, const int* on, CommTally* tally,
                     cudaStream_t stream);
