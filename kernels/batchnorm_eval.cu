// Evaluation-mode batch norm: scale and shift from the running statistics, one BN a launch or
// all of bin/predict's at once, and the BN scales folded into the filters of the convs that run as
// cuBLASLt GEMMs.
#include "batchnorm_common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

// Channel c's evaluation scale and shift, stored and returned (every load before the stores).
__device__ __forceinline__ Coefs eval_coef(const BnChannelState& bn, int c) {
  const ForwardInputs in = load_forward_inputs(bn, c);
  const float scale = in.gamma * rsqrtf(in.running_var + kBnEps);
  const float shift = in.beta - in.running_mean * scale;
  bn.scale[c] = scale;
  bn.shift[c] = shift;
  return {scale, shift};
}

__global__ void eval_coefs(BnChannelState bn, int C, __half* scale_h, __half* shift_h) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) store_half_coefs(eval_coef(bn, c), c, scale_h, shift_h);
}

// grid.y: one BN each.
__global__ void eval_coefs_all(const BnEvalTarget* targets) {
  const BnEvalTarget& t = targets[blockIdx.y];
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= t.channels) return;
  store_half_coefs(eval_coef(t.st, c), c, static_cast<__half*>(t.scale_h), static_cast<__half*>(t.shift_h));
}

// grid.y: one filter each; grid-stride over its k * c values, 8 at a time (16-byte loads and stores)
// where c is a multiple of 8 and both filters are 16-byte aligned, as the network's are.
__global__ void fold_filters(const FilterFold* targets) {
  const FilterFold& t = targets[blockIdx.y];
  const size_t n = size_t(t.k) * t.c;
  const __half* w = static_cast<const __half*>(t.w);
  __half* out = static_cast<__half*>(t.w_folded);
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, step = size_t(gridDim.x) * blockDim.x;
  if (t.c % 8 == 0 && (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out)) % 16 == 0) {
    for (size_t v = first; v < n / 8; v += step) {
      uint4 raw = reinterpret_cast<const uint4*>(w)[v];
      const float s = t.scale[v * 8 / t.c];
      __half2* h = reinterpret_cast<__half2*>(&raw);
      for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(__low2float(h[j]) * s, __high2float(h[j]) * s);
      reinterpret_cast<uint4*>(out)[v] = raw;
    }
    return;
  }
  for (size_t i = first; i < n; i += step) out[i] = __float2half_rn(__half2float(w[i]) * t.scale[i / t.c]);
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void bn_forward_eval_coefs(const BnChannelState& bn, int channels, cudaStream_t stream, void* scale_h,
                           void* shift_h) {
  eval_coefs<<<channel_blocks(channels), 128, 0, stream>>>(bn, channels, static_cast<__half*>(scale_h),
                                                           static_cast<__half*>(shift_h));
  CUDA_CHECK_LAUNCH();
}

void bn_forward_eval_coefs_all(const BnEvalTarget* targets, int count, int max_channels, cudaStream_t stream) {
  if (count == 0) return;
  eval_coefs_all<<<dim3(channel_blocks(max_channels), count), 128, 0, stream>>>(targets);
  CUDA_CHECK_LAUNCH();
}

void fold_bn_into_filters(const FilterFold* targets, int count, size_t max_elements, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned blocks = std::min(grid_for((max_elements + 7) / 8, kThreads), 1024u);
  fold_filters<<<dim3(blocks, count), kThreads, 0, stream>>>(targets);
  CUDA_CHECK_LAUNCH();
}
