// Is there a GPU to run on? Asked before anything else touches CUDA.
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
