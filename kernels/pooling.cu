// Global average pooling: [N, C, H, W] in either layout to [N, C] row-major, and its gradient.
#include "pooling.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T, Layout L>
__global__ void avgpool_forward(const T* x, Shape4 s, T* y) {
  const int HW = s.h * s.w;
  const size_t outputs = size_t(s.n) * s.c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < outputs; i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / s.c, c = i % s.c;
    float sum = 0;
    for (int p = 0; p < HW; ++p)  // NHWC: neighbouring threads read neighbouring channels
      sum += to_float(x[L == Layout::NCHW ? (n * s.c + c) * HW + p : (n * HW + p) * s.c + c]);
    y[i] = from_float<T>(sum / HW);
  }
}

template <class T, Layout L>
__global__ void avgpool_backward(const T* dy, Shape4 s, T* dx) {
  const int HW = s.h * s.w;
  const float inv = 1.f / HW;
  const size_t total = s.count();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / (size_t(s.c) * HW);
    const size_t c = L == Layout::NCHW ? (i / HW) % s.c : i % s.c;
    dx[i] = from_float<T>(to_float(dy[n * s.c + c]) * inv);
  }
}

template <class F>
void by_layout(Layout l, F&& f) {
  if (l == Layout::NCHW) f.template operator()<Layout::NCHW>();
  else f.template operator()<Layout::NHWC>();
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void global_avgpool_forward(const void* x, Shape4 s, DType t, Layout l, void* y, cudaStream_t stream) {
  dispatch_dtype(t, [&]<class T>() {
    by_layout(l, [&]<Layout L>() {
      launch_one_wave<avgpool_forward<T, L>, kThreads>(size_t(s.n) * s.c, stream, static_cast<const T*>(x), s,
                                                       static_cast<T*>(y));
    });
  });
  CUDA_CHECK_LAUNCH();
}

void global_avgpool_backward(const void* dy, Shape4 s, DType t, Layout l, void* dx, cudaStream_t stream) {
  dispatch_dtype(t, [&]<class T>() {
    by_layout(l, [&]<Layout L>() {
      launch_one_wave<avgpool_backward<T, L>, kThreads>(s.count(), stream, static_cast<const T*>(dy), s,
                                                        static_cast<T*>(dx));
    });
  });
  CUDA_CHECK_LAUNCH();
}
