// SGD with momentum (Nesterov) and weight decay over the flat parameter buffer, and the loss-scale
// bookkeeping, all decided on the GPU so that a skipped step costs no host synchronisation.
//
// The flat buffer holds conv and linear weights first (n_act of them: their gradients come from
// cuDNN/cuBLAS in the activation type, and they are decayed) and then BN gammas/betas and the
// linear bias (fp32 gradients from our kernels, not decayed).
#include <cstdint>

#include "optimizer.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ float grad_at(const SgdArgs& a, size_t i) {
  return i < a.n_act ? to_float(static_cast<const T*>(a.grad_act)[i]) : a.grad_f32[i - a.n_act];
}

// Per element, whichever loop reaches it: Nesterov SGD on the unscaled gradient, decayed or not.
__device__ __forceinline__ void sgd_element(const SgdArgs& a, float inv_scale, float lr, bool decayed, float grad,
                                            float& w, float& m) {
  float g = grad * inv_scale;
  if (decayed) g += a.weight_decay * w;
  const float buf = a.mom * m + g;
  m = buf;
  w -= lr * (a.nesterov ? g + a.mom * buf : buf);
}

template <int V>
__device__ __forceinline__ void load_f32(const float* p, float (&out)[V]) {
#pragma unroll
  for (int k = 0; k < V / 4; ++k) {
    const float4 q = reinterpret_cast<const float4*>(p)[k];
    out[4 * k] = q.x, out[4 * k + 1] = q.y, out[4 * k + 2] = q.z, out[4 * k + 3] = q.w;
  }
}

template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&in)[V]) {
#pragma unroll
  for (int k = 0; k < V / 4; ++k)
    reinterpret_cast<float4*>(p)[k] = make_float4(in[4 * k], in[4 * k + 1], in[4 * k + 2], in[4 * k + 3]);
}

// Both kernels read the first `vec_elems` elements (a multiple of kVec<T> within n_act, where every
// buffer is 16-byte aligned: vector_elems) 16 bytes of gradient at a time, the rest one by one.
template <class T>
__global__ void check_finite_kernel(SgdArgs a, size_t vec_elems, ScalerState* state) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int V = kVec<T>;
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (size_t v = first; v < vec_elems / V; v += stride) {
    float g[V];
    load_vec(static_cast<const T*>(a.grad_act) + v * V, g);
#pragma unroll
    for (int j = 0; j < V; ++j) bad |= !isfinite(g[j]);
  }
  for (size_t i = vec_elems + first; i < a.n; i += stride) bad |= !isfinite(grad_at<T>(a, i));
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(&state->found_inf, 1);
}

template <class T>
__global__ void sgd_kernel(SgdArgs a, size_t vec_elems, const ScalerState* state) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  if (state->found_inf) return;  // the whole step is skipped
  constexpr int V = kVec<T>;
  const float inv_scale = 1.f / state->scale;
  const float lr = *a.lr;
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = first; v < vec_elems / V; v += stride) {
    const size_t i0 = v * V;
    float g[V], w[V], m[V];
    load_vec(static_cast<const T*>(a.grad_act) + i0, g);
    load_f32(a.w + i0, w);
    load_f32(a.momentum + i0, m);
#pragma unroll
    for (int j = 0; j < V; ++j) sgd_element(a, inv_scale, lr, true, g[j], w[j], m[j]);
    store_f32(a.w + i0, w);
    store_f32(a.momentum + i0, m);
    if (a.w_act) {  // the fp16 working copy, V halves in one store
      __align__(16) __half h[V];
#pragma unroll
      for (int j = 0; j < V; ++j) h[j] = __float2half_rn(w[j]);
      __half* dst = static_cast<__half*>(a.w_act) + i0;
      if constexpr (V == 8) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(h);
      else *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(h);
    }
  }
  for (size_t i = vec_elems + first; i < a.n; i += stride) {
    float w = a.w[i], m = a.momentum[i];
    sgd_element(a, inv_scale, lr, i < a.n_act, grad_at<T>(a, i), w, m);
    a.momentum[i] = m;
    a.w[i] = w;
    if (a.w_act && i < a.n_act) static_cast<__half*>(a.w_act)[i] = __float2half_rn(w);
  }
}

__global__ void loss_scale_kernel(ScalerState* state, bool dynamic, int window) {
  apply_loss_scale_rule(*state, dynamic, window);
}

// How many of the first n_act elements go 16 bytes at a time: all whole vectors of them when every
// buffer the kernels touch there starts 16-byte aligned, else none.
template <class T>
size_t vector_elems(const SgdArgs& a) {
  const void* buffers[] = {a.grad_act, a.w, a.momentum, a.w_act};
  for (const void* p : buffers)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  return a.n_act / kVec<T> * kVec<T>;
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void check_grads_finite(const SgdArgs& a, ScalerState* state, cudaStream_t stream) {
  dispatch_dtype(a.act, [&]<class T>() {
    launch_one_wave_chained<check_finite_kernel<T>, kThreads>(a.n, stream, a, vector_elems<T>(a), state);
  });
  CUDA_CHECK_LAUNCH();
}

void sgd_update(const SgdArgs& a, const ScalerState* state, cudaStream_t stream) {
  dispatch_dtype(a.act, [&]<class T>() {
    launch_one_wave_chained<sgd_kernel<T>, kThreads>(a.n, stream, a, vector_elems<T>(a), state);
  });
  CUDA_CHECK_LAUNCH();
}

void loss_scale_update(ScalerState* state, bool dynamic, int window, cudaStream_t stream) {
  loss_scale_kernel<<<1, 1, 0, stream>>>(state, dynamic, window);
  CUDA_CHECK_LAUNCH();
}
