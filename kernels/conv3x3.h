// Layer1's 3x3 convs (every block's conv2 in the first stage: 64 channels in and out, stride 1, a pad
// of 1) by our resident kernel (kernels/conv1x1_stats_kernel.cuh) with the halo mainloop
// (kernels/cutlass_halo_mainloop.cuh): training's forward with its output's BN statistics, in place
// of cuDNN's ConvStats, and its data gradient with the backward sums of the BN + ReLU before it, in
// place of cuDNN's DgradDreluDbn.
//
// Why: an implicit GEMM of our own that loads each box of x once for three taps, with a row above
// and below, and keeps the filter in shared memory reads a third of the bytes that one loading x at
// each tap does. In the kernel lab (H200, batch 256, 2026-11-30) it ran the conv in 37.3 µs against
// cuDNN's 51.5 and the data gradient in 37.1 against 50.8
// (bench/results/levers-session29-nvidia-h200-2026-11-30.md).
//
// The data gradient of a 3x3 stride-1 conv with a pad of 1 is the same conv of dy by the filter
// turned, w'[c][r][s][k] = w[k][2-r][2-s][c] (conv3x3_turn_filter, once a step after the update).
//
// Hopper only (TMA, wgmma), compiled for sm_90a where the build covers sm_90; elsewhere every shape
// is refused and the network runs cuDNN's patterns.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "kernels/conv1x1_finalize.h"

struct Conv3x3Shape {
  int n, h, w;  // x's images (y's too at stride 1; kernels/conv3x3_stride2.h: y is h / 2 by w / 2)
  int c, k;     // input and output channels
};

// "" where this build and GPU run the shape, else why not: 64 channels in and out (each direction's
// filter held in shared memory), rows of 8 to 32 pixels a multiple of 8, whole in tiles of 128 pixels.
std::string conv3x3_refusal(const Conv3x3Shape& s);
// The rows of partial sums the forward leaves (one per CTA of a column of tiles), as
// conv1x1_partial_rows for its GEMM; and the data gradient's, as conv1x1_dgrad_bn_rows.
int conv3x3_partial_rows(const Conv3x3Shape& s);
int conv3x3_dgrad_partial_rows(const Conv3x3Shape& s);
size_t conv3x3_partials_bytes(const Conv3x3Shape& s);  // the larger of the two, both sums

struct Conv3x3Stats {
  const void* x;  // fp16 NHWC [n, h, w, c]
  const void* w;  // fp16 KRSC [k, 3, 3, c]
  void* y;        // fp16 NHWC [n, h, w, k]
  Conv3x3Shape s;
  // conv3x3_partial_rows() rows of k sums, then as many of sums of squares, for bn_finalize_partials
  // (or the kernel's own finalize); nullptr: y alone.
  float* partials = nullptr;
  Conv1x1Finalize finalize{};
};
// y, and with partials its statistics, on `stream`. A refused shape or a CUDA error throws (Fatal).
void conv3x3_stats(const Conv3x3Stats& a, cudaStream_t stream);

// turned[c][r][s][k] = w[k][2-r][2-s][c], fp16: the filter of the data gradient as a conv of dy.
void conv3x3_turn_filter(const void* w, void* turned, const Conv3x3Shape& s, cudaStream_t stream);

// The data gradient of a conv whose input was relu(bn(x)), with that BN + ReLU's backward sums, as
// conv1x1_dgrad_bn does it for a 1x1 (kernels/conv1x1_dgrad_bn.h: the mask is fp16 x * scale + shift
// > 0; the sums of dz and dz * xhat).
struct Conv3x3DgradBn {
  const void* dy;      // fp16 [n, h, w, k]: the conv's output gradient
  const void* turned;  // fp16 [c, 3, 3, k]: its filter turned (conv3x3_turn_filter)
  void* dz;            // fp16 [n, h, w, c]: out
  const void* x;       // fp16 [n, h, w, c]: the BN's input, its batch mean and 1/std
  const float* mean;
  const float* invstd;
  const void* scale;   // fp16 [c] each: the BN's scale and shift
  const void* shift;
  float* partials;     // conv3x3_dgrad_partial_rows() rows of c sums each of dz and dz * xhat
  Conv3x3Shape s;
  Conv1x1Finalize finalize{};  // with arrivals: the BN backward's finalize in the kernel too
};
void conv3x3_dgrad_bn(const Conv3x3DgradBn& a, cudaStream_t stream);
