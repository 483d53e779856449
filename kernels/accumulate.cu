// Gradient accumulation over micro-batches (accumulate.h). Spelled with the _rn intrinsics: an FMA
// contracted from sums + g * scale would round once where NCCL's average rounds twice.
#include "accumulate.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void accumulate_kernel(const T* g, float* sums, size_t n, float scale, bool first) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float term = __fmul_rn(to_float(g[i]), scale);
    sums[i] = first ? term : __fadd_rn(sums[i], term);
  }
}

template <class T>
__global__ void finish_kernel(T* g, const float* sums, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    g[i] = from_float<T>(__fadd_rn(sums[i], __fmul_rn(to_float(g[i]), scale)));
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void accumulate_grads(const void* grads, DType t, float* sums, size_t n, float scale, bool first, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    launch_one_wave<accumulate_kernel<T>, kThreads>(n, stream, static_cast<const T*>(grads), sums, n, scale, first);
  });
  CUDA_CHECK_LAUNCH();
}

void finish_accumulation(void* grads, DType t, const float* sums, size_t n, float scale, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    launch_one_wave<finish_kernel<T>, kThreads>(n, stream, static_cast<T*>(grads), sums, n, scale);
  });
  CUDA_CHECK_LAUNCH();
}
