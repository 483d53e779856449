// The all-reduce's clock (comm_clock.h): %globaltimer, the GPU's nanosecond clock, is the same on
// every stream of the device, so stamps from the compute and the communication stream compare.
#include "comm_clock.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

__global__ void stamp_kernel(unsigned long long* at) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *at = t;
}

__global__ void tally_kernel(const unsigned long long* stamps, int buckets, const int* on, CommTally* tally) {
  if (*on == 0) return;
  const unsigned long long backward_end = stamps[0], last_end = stamps[2 * buckets];
  unsigned long long busy = 0;
  for (int b = 0; b < buckets; ++b) {
    const unsigned long long start = stamps[1 + 2 * b], end = stamps[2 + 2 * b];
    busy += end > start ? end - start : 0;
  }
  tally->steps += 1;
  tally->exposed_ns += last_end > backward_end ? last_end - backward_end : 0;
  tally->busy_ns += busy;
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void stamp_time(unsigned long long* at, cudaStream_t stream) {
  stamp_kernel<<<1, 1, 0, stream>>>(at);
  CUDA_CHECK_LAUNCH();
}

void tally_comm_step(const unsigned long long* stamps, int buckets, const int* on, CommTally* tally,
                     cudaStream_t stream) {
  tally_kernel<<<1, 1, 0, stream>>>(stamps, buckets, on, tally);
  CUDA_CHECK_LAUNCH();
}
