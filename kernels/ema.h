// Launchers of the weight average's kernels (kernels/ema.cu), and the decay rule the update applies,
// which the CPU tests check on its own.
//
// --ema D keeps an exponential moving average of the fp32 master weights, updated after every
// optimizer step that was taken (inside the step's CUDA graph), and evaluates and saves it.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/types.h"
#include "kernels/optimizer.h"

// The decay of the update after step `step` (0-based): D, but lower early on, as TensorFlow's
// ExponentialMovingAverage with num_updates has it, min(D, (1 + step) / (10 + step)), so that the
// average forgets the random initial weights within the first steps, whatever D.
HOST_DEVICE inline float ema_decay_at(float decay, long long step) {
  const float t = static_cast<float>(step);
  const float warm = (1.f + t) / (10.f + t);
  return warm < decay ? warm : decay;
}

// average = d * average + (1 - d) * weights over n floats, d = ema_decay_at(decay, *step), unless the
// scaler's found_inf says this step was skipped (fp16 overflow): then nothing changes, as the weights
// did not. step and scaler are device memory, so a step replayed as a CUDA graph reads its own.
void ema_update(float* average, const float* weights, size_t n, float decay, const long long* step,
                const ScalerState* scaler, cudaStream_t stream);
// Exchanges a[i] and b[i] for every i < n: the averaged weights go into the network for evaluation
// and come back out, bit for bit, with no third buffer.
void swap_values(float* a, float* b, size_t n, cudaStream_t stream);
