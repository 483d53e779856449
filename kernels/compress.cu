// int8 gradient compression with error feedback (compress.h says what each step computes). One
// block per chunk: the chunk's scale is read once, and the absmax is one block reduction. The
// arithmetic is spelled with the _rn intrinsics: nvcc would otherwise contract e - q * step into an
// FMA, and the CPU reference could not reproduce the bits.
#include "compress.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float scale_of(const float* loss_scale) { return loss_scale ? *loss_scale : 1.f; }

// The gradient plus the residual, at the current loss scale.
template <class T>
__device__ __forceinline__ float with_residual(const T* g, const float* r, size_t i, float s) {
  return __fadd_rn(to_float(g[i]), __fmul_rn(r[i], s));
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;  // valid in thread 0
}

template <class T>
__global__ void absmax_kernel(const T* g, const float* r, size_t n, int chunk, const float* loss_scale, float* out) {
  const size_t begin = size_t(blockIdx.x) * chunk, end = min(n, begin + chunk);
  const float s = scale_of(loss_scale);
  float m = 0.f;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float e = with_residual(g, r, i, s);
    m = fmaxf(m, isnan(e) ? INFINITY : fabsf(e));  // fmaxf drops a NaN: it must win instead
  }
  m = block_max(m);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <class T>
__global__ void quantize_kernel(const T* g, float* r, size_t n, int chunk, const float* loss_scale,
                                const float* chunk_max, float levels, int8_t* q) {
  const size_t begin = size_t(blockIdx.x) * chunk, end = min(n, begin + chunk);
  const float s = scale_of(loss_scale);
  const float m = chunk_max[blockIdx.x];
  if (!isfinite(m)) {  // an overflow somewhere: nothing is sent, the residual stays
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) q[i] = 0;
    return;
  }
  const float step = __fdiv_rn(m, levels);
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float e = with_residual(g, r, i, s);
    float v = 0.f;
    if (step > 0.f) v = fminf(fmaxf(rintf(__fdiv_rn(e, step)), -levels), levels);
    q[i] = static_cast<int8_t>(v);
    r[i] = __fdiv_rn(__fsub_rn(e, __fmul_rn(v, step)), s);
  }
}

template <class T>
__global__ void dequantize_kernel(const int8_t* q, size_t n, int chunk, const float* chunk_max, float levels,
                                  float world, T* g) {
  const size_t begin = size_t(blockIdx.x) * chunk, end = min(n, begin + chunk);
  const float m = chunk_max[blockIdx.x];
  const float step = isfinite(m) ? __fdiv_rn(m, levels) : NAN;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads)
    g[i] = from_float<T>(step > 0.f || isnan(step) ? __fdiv_rn(__fmul_rn(float(q[i]), step), world) : 0.f);
}

unsigned chunks(size_t n, int chunk) { return static_cast<unsigned>((n + chunk - 1) / chunk); }

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void int8_absmax(const void* grads, DType t, const float* residual, size_t n, int chunk, const float* loss_scale,
                 float* chunk_max, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    absmax_kernel<T><<<chunks(n, chunk), kThreads, 0, stream>>>(static_cast<const T*>(grads), residual, n, chunk,
                                                                 loss_scale, chunk_max);
  });
  CUDA_CHECK_LAUNCH();
}

void int8_quantize(const void* grads, DType t, float* residual, size_t n, int chunk, const float* loss_scale,
                   const float* chunk_max, int levels, int8_t* q, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    quantize_kernel<T><<<chunks(n, chunk), kThreads, 0, stream>>>(static_cast<const T*>(grads), residual, n, chunk,
                                                                   loss_scale, chunk_max, float(levels), q);
  });
  CUDA_CHECK_LAUNCH();
}

void int8_dequantize(const int8_t* q_sum, size_t n, int chunk, const float* chunk_max, int levels, int world,
                     void* grads, DType t, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    dequantize_kernel<T><<<chunks(n, chunk), kThreads, 0, stream>>>(q_sum, n, chunk, chunk_max, float(levels),
                                                                     float(world), static_cast<T*>(grads));
  });
  CUDA_CHECK_LAUNCH();
}
