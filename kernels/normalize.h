// Launcher of the input normalization (kernels/normalize.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/types.h"

// uint8 batch [N, in_channels, side, side] in layout -> (x/255 - mean)/std as type t with 3
// channels; grey input is replicated to all three.
struct NormalizeParams {
  float scale[3];   // 1 / (255 * std)
  float shift[3];   // -mean / std
};
void normalize_u8(const uint8_t* in, int n, int in_channels, int side, Layout l, const NormalizeParams& p,
                  void* out, DType t, cudaStream_t stream);
