// SGD with momentum (Nesterov) and weight decay over the flat parameter buffer, and the loss-scale
// bookkeeping, all decided on the GPU so that a skipped step costs no host synchronisation.
//
// The flat buffer holds conv and linear weights first (n_act of them: their gradients come from
// cuDNN/cuBLAS in the activation type, and they are decayed) and then BN gammas/betas and the
// linear bias (fp32 gradients from our kernels, not decayed).
#include "common.cuh"
#include "kernels.h"
#include "train/loss_scale.h"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ float grad_at(const SgdArgs& a, size_t i) {
  return i < a.n_act ? to_float(static_cast<const T*>(a.grad_act)[i]) : a.grad_f32[i - a.n_act];
}

template <class T>
__global__ void check_finite_kernel(SgdArgs a, ScalerState* state) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < a.n; i += size_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(grad_at<T>(a, i));
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(&state->found_inf, 1);
}

template <class T>
__global__ void sgd_kernel(SgdArgs a, const ScalerState* state) {
  if (state->found_inf) return;  // the whole step is skipped
  const float inv_scale = 1.f / state->scale;
  const float lr = *a.lr;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < a.n; i += size_t(gridDim.x) * blockDim.x) {
    float w = a.w[i];
    float g = grad_at<T>(a, i) * inv_scale;
    if (i < a.n_act) g += a.weight_decay * w;
    const float buf = a.mom * a.momentum[i] + g;
    a.momentum[i] = buf;
    w -= lr * (a.nesterov ? g + a.mom * buf : buf);
    a.w[i] = w;
    if (a.w_act && i < a.n_act) static_cast<__half*>(a.w_act)[i] = __float2half_rn(w);
  }
}

__global__ void loss_scale_kernel(ScalerState* state, bool dynamic, int window) {
  apply_loss_scale_rule(*state, dynamic, window);
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void check_grads_finite(const SgdArgs& a, ScalerState* state, cudaStream_t stream) {
  dispatch_dtype(a.act, [&]<class T>() {
    check_finite_kernel<T><<<grid_for(a.n, kThreads), kThreads, 0, stream>>>(a, state);
  });
  CUDA_CHECK_LAUNCH();
}

void sgd_update(const SgdArgs& a, const ScalerState* state, cudaStream_t stream) {
  dispatch_dtype(a.act, [&]<class T>() {
    sgd_kernel<T><<<grid_for(a.n, kThreads), kThreads, 0, stream>>>(a, state);
  });
  CUDA_CHECK_LAUNCH();
}

void loss_scale_update(ScalerState* state, bool dynamic, int window, cudaStream_t stream) {
  loss_scale_kernel<<<1, 1, 0, stream>>>(state, dynamic, window);
  CUDA_CHECK_LAUNCH();
}
