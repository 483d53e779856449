// A batch norm's per-channel finalize, once a channel's sums over the batch are added: the forward's
// statistics, scale and shift from the sums of x and x^2, and the backward's weight gradients and
// apply coefficients from the sums of dz and dz * xhat. Shared by the finalize kernels
// (batchnorm_stats.cu, batchnorm_backward.cu) and our 1x1 convs, whose last CTA of a column of
// tiles finalizes the column itself (kernels/conv1x1_finalize.h).
#pragma once

#include <cuda_fp16.h>

#include "kernels/batchnorm_state.h"

namespace trainer_kernels {  // why: kernels/common.cuh

// The per-channel code is all latency: a channel's few loads and stores, one thread each. Each
// reads its inputs before its first store. The compiler cannot move a load above a store through
// another pointer (they might alias), so a load written after a store is issued only there, and the
// loads and stores would alternate, each a round trip to memory (a 3.3 µs finalize_sums on an H100;
// 1.6 µs with the loads first).
struct ForwardInputs {
  float gamma, beta, running_mean, running_var;
};
struct Coefs {  // a channel's scale and shift
  float scale, shift;
};
// The fp16 copies of a channel's scale and shift, for a fused conv whose prologue reads fp16; none
// where scale_h is null.
__device__ __forceinline__ void store_half_coefs(const Coefs& k, int c, __half* scale_h, __half* shift_h) {
  if (!scale_h) return;
  scale_h[c] = __float2half_rn(k.scale);
  shift_h[c] = __float2half_rn(k.shift);
}
__device__ __forceinline__ ForwardInputs load_forward_inputs(const BnChannelState& bn, int c) {
  return {bn.gamma[c], bn.beta[c], bn.running_mean[c], bn.running_var[c]};
}

// Channel c's batch mean and (biased) variance over M values -> save_mean, save_invstd, scale,
// shift and the running statistics (unbiased variance, PyTorch's momentum convention); returns
// scale and shift.
__device__ inline Coefs store_batch_stats(const BnChannelState& bn, int c, const ForwardInputs& in, double mean,
                                         double var, double M) {
  const float invstd = static_cast<float>(1.0 / sqrt(var + kBnEps));
  bn.save_mean[c] = static_cast<float>(mean);
  bn.save_invstd[c] = invstd;
  const float scale = in.gamma * invstd, shift = in.beta - static_cast<float>(mean) * scale;
  bn.scale[c] = scale;
  bn.shift[c] = shift;
  const double unbiased = M > 1 ? var * M / (M - 1) : var;
  bn.running_mean[c] = static_cast<float>((1.0 - kBnMomentum) * in.running_mean + kBnMomentum * mean);
  bn.running_var[c] = static_cast<float>((1.0 - kBnMomentum) * in.running_var + kBnMomentum * unbiased);
  return {scale, shift};
}

// Channel c's statistics from the sums of x and x^2 over M values (`in` loaded before any store):
// the variance as E[x^2] - E[x]^2, in double; then what store_batch_stats and store_half_coefs write.
__device__ inline void finalize_channel_from_sums(const BnChannelState& bn, int c, const ForwardInputs& in, double s1,
                                                  double s2, double M, __half* scale_h, __half* shift_h) {
  const double mean = s1 / M;
  double var = s2 / M - mean * mean;
  if (var < 0) var = 0;
  const Coefs k = store_batch_stats(bn, c, in, mean, var, M);
  store_half_coefs(k, c, scale_h, shift_h);
}

// What the backward's finalize reads of channel c, loaded before the first store.
struct BackwardInputs {
  float invstd, gamma, mean;
};
__device__ __forceinline__ BackwardInputs load_backward_inputs(const BnChannelState& bn, int c) {
  return {bn.save_invstd[c], bn.gamma[c], bn.save_mean[c]};
}

// Channel c's (of C) backward from the sums of dz (dbeta) and dz * xhat (dgamma) over M values: the
// weight gradients, and dx = a*dz + k_x*x + k_c with a = gamma*invstd, k_x = -a*invstd*dgamma/M,
// k_c = -a*dbeta/M - k_x*mean (the usual formula, expanded so the apply needs no xhat) in bwd_coef.
__device__ inline void finalize_backward_channel(const BnChannelState& bn, const BackwardInputs& in, float* dgamma_out,
                                                 float* dbeta_out, int C, int c, double dgamma, double dbeta, double M) {
  dbeta_out[c] = static_cast<float>(dbeta);
  dgamma_out[c] = static_cast<float>(dgamma);
  const double invstd = in.invstd;
  const double a = double(in.gamma) * invstd;
  const double kx = -a * invstd * dgamma / M;
  const double kc = -a * dbeta / M - kx * in.mean;
  bn.bwd_coef[c] = static_cast<float>(a);
  bn.bwd_coef[C + c] = static_cast<float>(kx);
  bn.bwd_coef[2 * C + c] = static_cast<float>(kc);
}

}  // namespace trainer_kernels
