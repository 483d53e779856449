// Launchers of test-time augmentation (kernels/tta.cu): --tta-flip scores each test image by the
// mean of its logits and of its horizontal mirror's (train/step.h).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/types.h"

// out = in with every row of every image reversed (x -> w - 1 - x), for a batch of shape s in type t
// and layout l; out and in are different buffers.
void flip_horizontal(const void* in, void* out, Shape4 s, DType t, Layout l, cudaStream_t stream);
// a[i] = (a[i] + b[i]) / 2 for i < n: the mean of two passes' logits, into the first.
void mean_into(float* a, const float* b, size_t n, cudaStream_t stream);
