// GpuWarmUp (core/gpu_warm_up.h): cudaFree(0) on a thread makes the device's primary context, which
// every thread of the process then shares.
#include "core/gpu_warm_up.h"

#include <cuda_runtime.h>

namespace {

void make_context(int local_rank) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // no GPU: require_cuda_device() says so on the main thread
    return;
  }
  const int device = devices == 1 ? 0 : local_rank;
  if (device >= devices || cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess)
    cudaGetLastError();  // device_for_local_rank() or the first CUDA call says what is wrong
}

}  // namespace

GpuWarmUp::GpuWarmUp(int local_rank) : thread_(make_context, local_rank) {}

void GpuWarmUp::wait() {
  if (thread_.joinable()) thread_.join();
}
