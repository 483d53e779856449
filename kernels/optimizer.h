// Launchers of the optimizer and loss-scaling kernels (kernels/optimizer.cu), and the loss-scaling
// rule the kernel applies every step, which the CPU tests check on its own.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/types.h"

// Dynamic loss scaling decided on the GPU: no host sync, an overflow skips the step.
struct ScalerState {
  float scale;              // the loss is multiplied by this before backward
  int good_steps;           // finite steps since the last change
  int found_inf;            // set by the gradient check of this step
  int skipped_steps;        // total skipped
  int diverged;             // fp32: a non-finite step stops training; fp16: scale collapsed
};

// The loss-scaling rule. As PyTorch's GradScaler: an overflow (any gradient NaN/Inf) skips the step
// and halves the scale; after `window` consecutive good steps the scale doubles. fp32 builds use a
// fixed scale of 1, and there a non-finite step means the run has diverged. A scale that collapses
// below kMinLossScale means the loss itself is NaN/Inf, not an overflow: also divergence.
constexpr float kMinLossScale = 1.0f / 1024;
constexpr float kMaxLossScale = 16777216.0f;  // 2^24

HOST_DEVICE inline void apply_loss_scale_rule(ScalerState& s, bool dynamic, int window) {
  if (!dynamic) {
    if (s.found_inf) {
      s.skipped_steps += 1;
      s.diverged = 1;
    }
    s.found_inf = 0;
    return;
  }
  if (s.found_inf) {
    s.scale *= 0.5f;
    s.good_steps = 0;
    s.skipped_steps += 1;
    if (s.scale < kMinLossScale) s.diverged = 1;
  } else if (++s.good_steps >= window) {
    if (s.scale * 2.0f <= kMaxLossScale) s.scale *= 2.0f;
    s.good_steps = 0;
  }
  s.found_inf = 0;
}

struct SgdArgs {
  float* w;                 // fp32 master weights, n
  float* momentum;          // n
  const void* grad_act;     // grads of the first n_act params (conv/linear weights), type act
  const float* grad_f32;    // grads of the remaining n - n_act params (BN, bias)
  void* w_act;              // fp16 copy of the first n_act weights, or nullptr
  size_t n, n_act;
  DType act;
  const float* lr;          // device memory: the step's learning rate (a replayed graph reads each step's)
  float mom, weight_decay;  // decay applies to the first n_act params only
  bool nesterov;
};
// Sets state->found_inf when any gradient is NaN/Inf.
void check_grads_finite(const SgdArgs& a, ScalerState* state, cudaStream_t stream);
// Unscales and applies Nesterov SGD unless found_inf; writes the fp16 copy.
void sgd_update(const SgdArgs& a, const ScalerState* state, cudaStream_t stream);
// Applies the scaling rule (apply_loss_scale_rule) and clears found_inf for the next step.
void loss_scale_update(ScalerState* state, bool dynamic, int window, cudaStream_t stream);
