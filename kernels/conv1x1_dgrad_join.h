// The data gradient of a 1x1 stride-1 conv in NHWC fp16 that also takes the previous block's join
// backward, by a kernel of ours: training's backward of every block's conv1; the first block's
// takes the stem's BN + ReLU so, a join without a shortcut (own-stem-join).
//
// A block's output, out = relu(bn3(a3) + shortcut), feeds the next block twice: its conv1 and its
// shortcut. Its gradient arrives in two parts, conv1's data gradient dx and the shortcut's g, and
// the join's backward needs dz = (dx + g) where the ReLU passed, then per channel the sums of dz and
// dz * xhat (bn3's and, for a projection shortcut, its BN's too) before it can apply. Plain, conv1's
// data gradient writes dx, and a reduction pass reads dx, g, a3, the bits (and the shortcut BN's
// input) to write dz and take the sums. Here the conv's epilogue does that pass's work as dx leaves:
// it reads g, a3 and the bits beside its tile and writes dz over g (or, for a stride-2 shortcut, reads
// g compact from a buffer of its own: g_even), so dx is never stored and the pass is gone; only the
// BN backward's apply remains (bn_backward_from_sums, kernels/batchnorm.h).
//
// dx[m, c] = sum over k of dy[m, k] w[k, c] is one GEMM (m = N*H*W pixels, k the conv's output
// channels, c its input channels), tiled 128 x 64 and resident as the forward's
// (kernels/conv1x1_stats.h). Hopper only, compiled for sm_90a where the build covers sm_90.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "kernels/conv1x1_schedule.h"

struct Conv1x1DgradJoin {
  const void* dy;  // fp16 [m, k]: the conv's output gradient
  const void* w;   // fp16 [k, c]: its KRSC filter
  // fp16 [m, c]: in, the shortcut's part of the gradient of the previous block's output (but see
  // g_even); out, dz.
  void* dz;
  const uint8_t* relu_bits;  // the join's ReLU bits (ApplyArgs::relu_bits), one byte per 8 channels
  const void* x;             // fp16 [m, c]: bn3's input (a3), its batch mean and 1/std
  const float* mean;
  const float* invstd;
  // The projection shortcut's BN: its input, mean and 1/std; all null for an identity shortcut.
  const void* x2 = nullptr;
  const float* mean2 = nullptr;
  const float* invstd2 = nullptr;
  // A stride-2 projection shortcut's part of the gradient, where it is not in dz: compact, fp16
  // [img][(img_h + 1) / 2][(img_w + 1) / 2][c] (the shortcut's data gradient at its output pixels
  // alone), the part at the even rows and columns of dz's img_h x img_w images and zero at the
  // others; dz is then only written. Null: in dz.
  const void* g_even = nullptr;
  int img_h = 0, img_w = 0;
  // The shortcut's part of the gradient, fp16 [m, c], where it is in a buffer of its own (a
  // stride-1 projection shortcut's data gradient that read the join's dz from dz's buffer:
  // Conv1x1DgradDw::dy_x); dz is then only written. Null: in dz (or g_even).
  const void* g = nullptr;
  // conv1x1_dgrad_join_rows() rows of c sums each of dz, dz * xhat and, with a second BN, dz * xhat2
  // (else those rows are not written), for bn_backward_from_sums.
  float* partials;
  int m, k, c;
  // Ping-pong by default: its epilogue reads two or three tiles beside dx and is as long as the
  // mainloop (k up to 512), and the overlap is worth more than cooperative's stages (6 against
  // ping-pong's 3 with a shortcut BN, whose three side tiles take 96 KB of shared memory; 7 against
  // 5 without): all the joins cooperative made the step 1.50% slower at batch 256 (H200,
  // 2026-12-02, bench/results/levers-session44-nvidia-h200-2026-12-02.md), and those where dy has
  // 256 channels or more (4-8 k-tiles a tile) 0.15% slower
  // (bench/results/levers-session45-nvidia-h200-2026-12-02.md).
  Conv1x1Schedule schedule = Conv1x1Schedule::PingPong;
};

// "" where this build and GPU run the shape, else why not.
std::string conv1x1_dgrad_join_refusal(int m, int k, int c);
// The rows of partial sums it leaves, and their bytes (three sums).
int conv1x1_dgrad_join_rows(int m, int c);
size_t conv1x1_dgrad_join_partials_bytes(int m, int c);
// dz and its sums on `stream`. A refused shape or a CUDA error throws (Fatal).
void conv1x1_dgrad_join(const Conv1x1DgradJoin& a, cudaStream_t stream);
