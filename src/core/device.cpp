// Is there a GPU to run on? Asked before anything else touches CUDA. And timing on it.
#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/handles.h"

bool cuda_device_available() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) cudaGetLastError();
  return err == cudaSuccess && n > 0;
}

void require_cuda_device() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw InputError(std::string("no CUDA device found (") + cudaGetErrorString(err) +
                     "); this trainer needs an NVIDIA GPU with a working driver");
  }
  if (n == 0) throw InputError("no CUDA device found; this trainer needs an NVIDIA GPU");
}

float fastest_ms(cudaStream_t stream, int runs, const std::function<void()>& f) {
  Event start, stop;
  f();
  float best = -1;
  for (int i = 0; i < runs; ++i) {
    start.record(stream);
    f();
    stop.record(stream);
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    const float t = stop.ms_since(start);
    best = best < 0 ? t : std::min(best, t);
  }
  return best;
}
