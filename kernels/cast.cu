// fp32 <-> fp16 copies: the fp16 working copy of the weights after init or resume, and reading
// fp16 tensors back for tests and checks.
#include "cast.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

__global__ void f32_to_f16(const float* in, __half* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(in[i]);
}

__global__ void f16_to_f32(const __half* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __half2float(in[i]);
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void cast_f32_to_f16(const float* in, void* out, size_t n, cudaStream_t stream) {
  launch_one_wave<f32_to_f16, kThreads>(n, stream, in, static_cast<__half*>(out), n);
  CUDA_CHECK_LAUNCH();
}

void cast_f16_to_f32(const void* in, float* out, size_t n, cudaStream_t stream) {
  launch_one_wave<f16_to_f32, kThreads>(n, stream, static_cast<const __half*>(in), out, n);
  CUDA_CHECK_LAUNCH();
}
