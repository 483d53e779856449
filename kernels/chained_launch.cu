// The calling thread's switch of chained launches (kernels/chained_launch.h).
#include "kernels/chained_launch.h"

#include <cuda_runtime.h>

#include "core/check.h"

namespace {
// Per thread: each rank of data-parallel training drives its GPU from a thread of its own.
thread_local bool chained = false;
}  // namespace

bool device_chains_launches() {
  int device = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

void set_chained_launches(bool on) { chained = on && device_chains_launches(); }

bool chained_launches() { return chained; }
