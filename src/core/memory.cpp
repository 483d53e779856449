// Device and pinned host allocations, with messages that say what, how much and how much is free.
#include "core/memory.h"

#include <cuda_runtime.h>

#include "core/check.h"

void* DeviceMemory::allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Fatal("out of GPU memory: " + what + " needs " + format_bytes(bytes) + " but only " +
                format_bytes(free_b) + " of " + format_bytes(total_b) +
                " are free; try a smaller --batch or --workspace-mb");
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaMalloc", __FILE__, __LINE__);
  return p;
}

void DeviceMemory::release(void* p) { cudaFree(p); }

void* PinnedHostMemory::allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Fatal("could not pin " + format_bytes(bytes) + " of host memory for " + what + ": " +
                cudaGetErrorString(err));
  }
  return p;
}

void PinnedHostMemory::release(void* p) { cudaFreeHost(p); }

DeviceBuffer scratch_buffer(size_t bytes, const std::string& what) {
  DeviceBuffer b(bytes, what);
  if (bytes) CUDA_CHECK(cudaMemset(b.get(), 0x3C, bytes));
  return b;
}
