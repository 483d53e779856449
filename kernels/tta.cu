// Test-time augmentation: the mirrored batch, and the mean of the two passes' logits.
//
// Both are tiny next to a forward pass (a batch of 32x32 images, a few thousand logits), so they are
// written plainly, one element a thread.
#include "tta.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

// Element i of the output reads the element of the same image, channel and row at column w - 1 - x;
// the column is the innermost index in NCHW and the next-to-innermost (above the channel) in NHWC.
template <class T>
__global__ void flip_kernel(const T* in, T* out, Shape4 s, bool nhwc) {
  const size_t n = s.count();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const long long inner = nhwc ? s.c : 1;  // elements between two columns
    const long long x = static_cast<long long>(i / inner) % s.w;
    out[i] = in[static_cast<long long>(i) + (s.w - 1 - 2 * x) * inner];
  }
}

__global__ void mean_kernel(float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    a[i] = 0.5f * (a[i] + b[i]);
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void flip_horizontal(const void* in, void* out, Shape4 s, DType t, Layout l, cudaStream_t stream) {
  dispatch_dtype(t, [&]<class T>() {
    launch_one_wave<flip_kernel<T>, kThreads>(s.count(), stream, static_cast<const T*>(in), static_cast<T*>(out), s,
                                              l == Layout::NHWC);
  });
  CUDA_CHECK_LAUNCH();
}

void mean_into(float* a, const float* b, size_t n, cudaStream_t stream) {
  launch_one_wave<mean_kernel, kThreads>(n, stream, a, b, n);
  CUDA_CHECK_LAUNCH();
}
