// The weight average: its update after each optimizer step, and the swap that evaluates it.
//
// Both are memory-bound passes over the flat fp32 buffers (every buffer starts 256-byte aligned:
// cudaMalloc), 16 bytes a thread at a time, the tail of n % 4 values one by one.
#include <cstdint>
#include <string>

#include "ema.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

__global__ void ema_update_kernel(float* average, const float* weights, size_t n, float decay,
                                  const long long* step, const ScalerState* scaler) {
  if (scaler && scaler->found_inf) return;  // the step was skipped: the weights did not move
  const float d = ema_decay_at(decay, *step), e = 1.f - d;
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = first; v < n / 4; v += stride) {
    float4 a = reinterpret_cast<const float4*>(average)[v];
    const float4 w = reinterpret_cast<const float4*>(weights)[v];
    a.x = d * a.x + e * w.x, a.y = d * a.y + e * w.y, a.z = d * a.z + e * w.z, a.w = d * a.w + e * w.w;
    reinterpret_cast<float4*>(average)[v] = a;
  }
  for (size_t i = n / 4 * 4 + first; i < n; i += stride) average[i] = d * average[i] + e * weights[i];
}

__global__ void swap_kernel(float* a, float* b, size_t n) {
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = first; v < n / 4; v += stride) {
    const float4 x = reinterpret_cast<const float4*>(a)[v];
    reinterpret_cast<float4*>(a)[v] = reinterpret_cast<const float4*>(b)[v];
    reinterpret_cast<float4*>(b)[v] = x;
  }
  for (size_t i = n / 4 * 4 + first; i < n; i += stride) {
    const float x = a[i];
    a[i] = b[i];
    b[i] = x;
  }
}

void check_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw Fatal(std::string(what) + ": buffers must be 16-byte aligned");
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void ema_update(float* average, const float* weights, size_t n, float decay, const long long* step,
                const ScalerState* scaler, cudaStream_t stream) {
  check_aligned(average, "ema_update");
  check_aligned(weights, "ema_update");
  launch_one_wave<ema_update_kernel, kThreads>(n / 4 + 1, stream, average, weights, n, decay, step, scaler);
  CUDA_CHECK_LAUNCH();
}

void swap_values(float* a, float* b, size_t n, cudaStream_t stream) {
  check_aligned(a, "swap_values");
  check_aligned(b, "swap_values");
  launch_one_wave<swap_kernel, kThreads>(n / 4 + 1, stream, a, b, n);
  CUDA_CHECK_LAUNCH();
}
