// A 3x3 stride-1 convolution with a pad of 1 (the blocks' conv2 but the first of layers 2-4) by the
// trainer's resident 1x1 kernel (kernels/conv1x1_stats.h) with x loaded at each of the 9 taps by a
// 4-D TMA box (kernels/cutlass_taps_mainloop.cuh), for the kernel lab only: whether a kernel of ours
// beats cuDNN's 3x3 conv where cuDNN is slowest (layer1's 64 channels) before it goes near the
// trainer. fp16 NHWC x [n,h,w,c], KRSC w [k,3,3,c], y [n,h,w,k]; with `partials`, y's BN sums too,
// as conv1x1_stats leaves them (conv1x1_partial_rows rows of k each, sums then sums of squares).
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "model/conv.h"

namespace lab {

// "" where this build and GPU run it, else why not (no sm_90; not 3x3/1 with a pad of 1; channels
// not multiples of 64; an image's rows not whole in 128-pixel tiles).
std::string taps_conv_refusal(const ConvGeometry& g);
// Both consumer warpgroups on each tile (the cooperative schedule: ping-pong measured 0.2-2.5 µs
// slower at every shape, H200, 2026-11-30, bench/results/levers-session28-nvidia-h200-2026-11-30.md).
void taps_conv(const ConvGeometry& g, const void* x, const void* w, void* y, float* partials, cudaStream_t stream);

}  // namespace lab
