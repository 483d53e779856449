// Device and pinned host allocations, and the byte counts of messages.
#include "core/memory.h"

#include <cstdio>

#include <cuda_runtime.h>

#include "core/check.h"

std::string format_bytes(size_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

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
