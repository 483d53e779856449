// A batch-norm layer's per-channel state as the kernels see it, and its constants: apart from
// kernels/batchnorm.h so that the kernels built on CUTLASS (our 1x1 convs, which finalize a BN
// themselves: kernels/conv1x1_finalize.h) can take it without core/types.h, whose Layout clashes
// with CUTLASS's.
#pragma once

constexpr float kBnEps = 1e-5f;
constexpr float kBnMomentum = 0.1f;  // running = (1 - m) * running + m * batch (PyTorch's convention)

struct BnChannelState {     // per-channel fp32 vectors of one BN layer, each of length C
  const float* gamma;
  const float* beta;
  float* running_mean;
  float* running_var;
  float* save_mean;         // batch mean (training) for backward
  float* save_invstd;       // 1/sqrt(var + eps)
  float* scale;             // gamma * invstd     (what apply multiplies by)
  float* shift;             // beta - mean * scale
  float* bwd_coef;          // 3*C: dx = k_dz * dz + k_x * x + k_c
};
