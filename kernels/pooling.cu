// Global average pooling: [N, C, H, W] in either layout to [N, C] row-major, and its gradient.
#include "pooling.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T, Layout L>
__global__ void avgpool_forward(const T* x, Shape4 s, T* y) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
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
  chain_wait();  // launched chained (kernels/chained_launch.h)
  const int HW = s.h * s.w;
  const float inv = 1.f / HW;
  const size_t total = s.count();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / (size_t(s.c) * HW);
    const size_t c = L == Layout::NCHW ? (i / HW) % s.c : i % s.c;
    dx[i] = from_float<T>(to_float(dy[n * s.c + c]) * inv);
  }
}

// NHWC with whole 16-byte vectors of channels (C a multiple of kVec<T>, every buffer 16-byte
// aligned): a thread a vector. Why: the element kernels above ran the backward's 16.7 MB at batch
// 256 (layer4's 2048 x 4 x 4) in 27.6 us, an element and a 64-bit divide a thread (H200,
// 2026-11-30 trace, bench/results/levers-session37-nvidia-h200-2026-11-30.md).
template <class T>
__global__ void avgpool_forward_vec(const T* x, Shape4 s, T* y) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int V = kVec<T>;
  const unsigned HW = s.h * s.w, CV = s.c / V, outputs = unsigned(s.n) * CV;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < outputs; i += gridDim.x * blockDim.x) {
    const unsigned n = i / CV, cv = i % CV;
    const T* at = x + size_t(n) * HW * s.c + size_t(cv) * V;
    float sum[V] = {}, v[V];
    for (unsigned p = 0; p < HW; ++p) {
      load_vec(at + size_t(p) * s.c, v);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[j] += v[j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] /= HW;
    store_vec(y + size_t(i) * V, sum);
  }
}

template <class T>
__global__ void avgpool_backward_vec(const T* dy, Shape4 s, T* dx) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int V = kVec<T>;
  const unsigned HW = s.h * s.w, CV = s.c / V;
  const size_t vectors = s.count() / V;
  const float inv = 1.f / HW;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors; i += size_t(gridDim.x) * blockDim.x) {
    const unsigned n = unsigned(i / (size_t(HW) * CV)), cv = unsigned(i % CV);
    float g[V];
    load_vec(dy + (size_t(n) * CV + cv) * V, g);
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] *= inv;
    store_vec(dx + i * V, g);
  }
}

template <class T>
bool vectorizable(Shape4 s, Layout l, const void* a, const void* b) {
  return l == Layout::NHWC && s.c % kVec<T> == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(b) % 16 == 0;
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
    const auto* in = static_cast<const T*>(x);
    auto* out = static_cast<T*>(y);
    if (vectorizable<T>(s, l, x, y)) {
      launch_one_wave_chained<avgpool_forward_vec<T>, kThreads>(size_t(s.n) * s.c / kVec<T>, stream, in, s, out);
      return;
    }
    by_layout(l, [&]<Layout L>() {
      launch_one_wave_chained<avgpool_forward<T, L>, kThreads>(size_t(s.n) * s.c, stream, in, s, out);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void global_avgpool_backward(const void* dy, Shape4 s, DType t, Layout l, void* dx, cudaStream_t stream) {
  dispatch_dtype(t, [&]<class T>() {
    const auto* in = static_cast<const T*>(dy);
    auto* out = static_cast<T*>(dx);
    if (vectorizable<T>(s, l, dy, dx)) {
      launch_one_wave_chained<avgpool_backward_vec<T>, kThreads>(s.count() / kVec<T>, stream, in, s, out);
      return;
    }
    by_layout(l, [&]<Layout L>() {
      launch_one_wave_chained<avgpool_backward<T, L>, kThreads>(s.count(), stream, in, s, out);
    });
  });
  CUDA_CHECK_LAUNCH();
}
