// A 1x1 stride-1 conv in NHWC fp16 with its output's BN statistics, by a kernel of ours: training's
// forward of every block's conv1 and conv3 and layer1's shortcut, in place of cuDNN's fused
// ConvStats and SbrConvStats (model/fused_conv.h). In NHWC such a conv is one GEMM:
// y[m, k] = sum over c of x[m, c] w[k, c], m = N*H*W.
//
// Why a kernel of ours (bench/results/levers-session16-nvidia-h200-2026-11-29.md): each CTA keeps
// one column of 64 output channels and walks down its rows of 128 pixels, so the statistics are
// added in registers across its tiles and reduced once; with a prologue, the previous BN,
// relu(x * scale + shift) per input channel, is applied to x in registers before each wgmma (what
// SbrConvStats does for conv3). Timed alone it took 908 µs a step for the 33 such convs against
// cuDNN's fused patterns 1,083 on an H200; in bin/train the step was 0.4-1.1% faster.
//
// Hopper only: written with CUTLASS's TMA loads and wgmma, compiled for sm_90a where the build
// covers sm_90 (else every shape is refused, and the network runs cuDNN's patterns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "kernels/conv1x1_finalize.h"
#include "kernels/conv1x1_schedule.h"

// The previous block's join as the GEMM reads x: out = relu(x * scale + shift + shortcut), the
// shortcut res as it is (identity) or res * res_scale + res_shift (a projection's BN), from fp32
// coefficients per input channel as bn_apply takes them (kernels/batchnorm.h), computed in fp16; out
// and its ReLU bits (ApplyArgs::relu_bits) stored as bn_apply stores them, by the CTAs of the first
// column of tiles (kernels/cutlass_join_mainloop.cuh). For a block's conv1 in training: the join's
// pass and conv1's read of its output in one kernel. Ping-pong schedule only.
struct Conv1x1Join {
  const void* res = nullptr;  // fp16 [m, c]
  const float* scale = nullptr;
  const float* shift = nullptr;
  const float* res_scale = nullptr;  // both or neither
  const float* res_shift = nullptr;
  void* out = nullptr;        // fp16 [m, c]
  uint8_t* bits = nullptr;    // m * c / 8 bytes
  bool on() const { return out != nullptr; }
};

struct Conv1x1Stats {
  const void* x;  // fp16 [m, c]; with a prologue the previous BN's input
  const void* w;  // fp16 [k, c]: the KRSC filter of a 1x1 conv
  void* y;        // fp16 [m, k]
  int m, k, c;
  // fp16 [c] each, or both null: the previous BN's scale and shift, applied as relu(x * scale + shift).
  const void* scale = nullptr;
  const void* shift = nullptr;
  // conv1x1_partial_rows() rows of k sums, then as many of sums of squares, for bn_finalize_partials
  // (or the kernel's own finalize, below); nullptr: y alone.
  float* partials = nullptr;
  Conv1x1Schedule schedule = Conv1x1Schedule::PingPong;
  // With partials and finalize.arrivals set, the BN finalized too, as bn_finalize_partials would
  // (kernels/conv1x1_finalize.h).
  Conv1x1Finalize finalize{};
  // Set (out given): x is the previous join's first input, and the join is applied instead of a
  // prologue (scale and shift null).
  Conv1x1Join join{};
};

// "" on an sm_90 GPU (H100, H200), else why code compiled for sm_90a alone cannot run on this one:
// this kernel's, and the kernel lab's CUTLASS builds'.
std::string sm90a_gpu_refusal();
// "" where this build and GPU run the shape (m pixels, k output and c input channels), else why not.
std::string conv1x1_stats_refusal(int m, int k, int c);
// The columns of tiles of a GEMM with k output channels (64 each): with the prologue the CTAs of
// every column apply the previous BN to each tile of x they read, so each tile of x k / 64 times.
int conv1x1_columns(int k);
// The rows of partial sums it leaves (one per CTA of a column of tiles), and their bytes, both
// statistics.
int conv1x1_partial_rows(int m, int k);
size_t conv1x1_partials_bytes(int m, int k);
// y, and with partials its statistics, on `stream`. A refused shape or a CUDA error throws (Fatal).
void conv1x1_stats(const Conv1x1Stats& a, cudaStream_t stream);
