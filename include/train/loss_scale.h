// The loss-scaling rule, shared by the GPU kernel that applies it every step and by the CPU tests.
//
// As PyTorch's GradScaler: an overflow (any gradient NaN/Inf) skips the step and halves the scale;
// after `window` consecutive good steps the scale doubles. fp32 builds use a fixed scale of 1, and
// there a non-finite step means the run has diverged. A scale that collapses below kMinLossScale
// means the loss itself is NaN/Inf, not an overflow: also divergence.
#pragma once

#include "kernels/optimizer.h"

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
