// The data gradient of a 1x1 stride-1 conv in NHWC fp16 whose input was relu(bn(x)), with that BN
// + ReLU's backward sums, by a kernel of ours: training's backward of every conv3 whose forward ran
// our kernel (kernels/conv1x1_stats.h), with the previous BN in its prologue or reading relu(bn(x))
// stored by a BN pass before it.
//
// The BN backward needs, from the conv's data gradient dx, dz = dx where relu(bn(x)) passed, then
// per channel the sums of dz and dz * xhat before it can apply. cuDNN's DgradDreluDbn pattern does
// that in its epilogue; this is the same work in our resident kernel (the forward's, with B read
// N-major): dz leaves through shared memory in whole rows, x arrives beside it (cp.async, during the
// tile's mainloop), the ReLU mask is the forward prologue's own (fp16 x * scale + shift > 0; where
// the forward read a stored relu(bn(x)), bn_apply computed it with fp32 coefficients, and the two
// tests can differ where x * scale + shift is within the coefficients' fp16 rounding of zero, about
// 2^-12 (|x * scale| + |shift|), as cuDNN's fused patterns' do), and the sums stay in registers
// across a CTA's tiles. The BN backward's finalize and apply follow
// (bn_backward_from_sums, kernels/batchnorm.h), or the kernel's last CTAs finalize and the apply
// alone follows (kernels/conv1x1_finalize.h).
//
// dx[m, c] = sum over k of dy[m, k] w[k, c]: one GEMM (m = N*H*W pixels, k the conv's output
// channels, c its input channels), tiled 128 x 64. Hopper only, compiled for sm_90a where the build
// covers sm_90.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "kernels/conv1x1_finalize.h"
#include "kernels/conv1x1_schedule.h"

struct Conv1x1DgradBn {
  const void* dy;      // fp16 [m, k]: the conv's output gradient
  const void* w;       // fp16 [k, c]: its KRSC filter
  void* dz;            // fp16 [m, c]: out, dz
  const void* x;       // fp16 [m, c]: the BN's input, its batch mean and 1/std
  const float* mean;
  const float* invstd;
  const void* scale;   // fp16 [c] each: the BN's scale and shift as the forward's prologue read them
  const void* shift;
  // conv1x1_dgrad_bn_rows() rows of c sums each of dz and dz * xhat, for bn_backward_from_sums (or
  // the kernel's own finalize, below).
  float* partials;
  int m, k, c;
  // With finalize.arrivals set, the BN's backward finalize too (kernels/conv1x1_finalize.h): its
  // weight gradients and apply coefficients written, so that bn_backward_apply is all that is left.
  Conv1x1Finalize finalize{};
  // Where set, also the conv's weight gradient, dw[k][c] = sum over m of dy[m, k] y[m, c] with y =
  // relu(fp16 x * scale + shift), the input the forward's prologue multiplied, from the same loads
  // of dy (kernels/conv1x1_dgrad_wgrad_kernel.cuh): each CTA writes its part in fp32, a row of k x c
  // for each of conv1x1_dgrad_bn_rows(), which conv1x1_dw_from_partials adds into dw.
  float* dw_partials = nullptr;
  // Where set (with dw_partials), dy is made as it is read, from the join's BN backward that
  // conv3's output gradient is (bn3's apply, bn_backward_apply's pass otherwise): dy holds the
  // join's dz, dy_x bn3's input a3 (fp16 [m, k]), dy_coef bn3's coefficients ([3][k] fp32,
  // BnChannelState::bwd_coef), and the kernel multiplies dy_coef[j] dz + dy_coef[k + j] a3 +
  // dy_coef[2k + j] for output channel j, in fp32 rounded once to fp16 (kernels/conv1x1_dgrad_wgrad_kernel.cuh).
  const void* dy_x = nullptr;
  const float* dy_coef = nullptr;
  // Cooperative by default: with k up to 2048 its mainloop is long and its epilogue reads one tile
  // beside dx, so both warpgroups on each stage (7 stages against ping-pong's 6, by CUTLASS's count
  // for the shared memory left) win over ping-pong's overlap: -0.41% and -0.19% a step at batch
  // 256, -0.08% at 128 (H200, 2026-12-02, bench/results/levers-session44-nvidia-h200-2026-12-02.md).
  // The kernel that takes dw too is cooperative only.
  Conv1x1Schedule schedule = Conv1x1Schedule::Cooperative;
};

// "" where this build and GPU run the shape, else why not.
std::string conv1x1_dgrad_bn_refusal(int m, int k, int c);
// The rows of partial sums it leaves, and their bytes (two sums).
int conv1x1_dgrad_bn_rows(int m, int c);
size_t conv1x1_dgrad_bn_partials_bytes(int m, int c);
// dz and its sums on `stream`. A refused shape or a CUDA error throws (Fatal).
void conv1x1_dgrad_bn(const Conv1x1DgradBn& a, cudaStream_t stream);
// "" where this build and GPU run the shape with the weight gradient too (dw_partials set), else
// why not; and the bytes of its parts.
std::string conv1x1_dgrad_bn_dw_refusal(int m, int k, int c);
size_t conv1x1_dw_partials_bytes(int m, int k, int c);

// A 1x1 stride-1 conv's data gradient as it is (no BN backward: its input is no BN's output to take
// backward here) with its weight gradient from the same loads of dy, dw[k][c] = sum over m of
// dy[m, k] x[m, c], x the conv's stored input: layer1.0's projection shortcut, whose input is the
// stem's output. The same kernel as above with a plain epilogue; its shapes are
// conv1x1_dgrad_bn_dw_refusal()'s and its parts conv1x1_dw_partials_bytes()' and
// conv1x1_dgrad_bn_rows()' (conv1x1_dw_from_partials adds them into dw).
struct Conv1x1DgradDw {
  const void* dy;      // fp16 [m, k]: the conv's output gradient
  const void* w;       // fp16 [k, c]: its KRSC filter
  void* dx;            // fp16 [m, c]: out
  const void* x;       // fp16 [m, c]: the conv's input
  float* dw_partials;  // out: the CTAs' parts of dw
  int m, k, c;
  // Where set, dy is made as it is read from the join's BN backward, as Conv1x1DgradBn's: dy holds
  // the join's dz, dy_x the shortcut BN's input (fp16 [m, k]), dy_coef that BN's coefficients.
  const void* dy_x = nullptr;
  const float* dy_coef = nullptr;
};
// dx and dw's parts on `stream`. A refused shape, a missing tensor or a CUDA error throws (Fatal).
void conv1x1_dgrad_dw(const Conv1x1DgradDw& a, cudaStream_t stream);

// dw (fp16 [k][c], the 1x1 conv's KRSC filter gradient) = the sum of the kernel's `rows` parts, in a
// fixed order, on `stream`.
void conv1x1_dw_from_partials(const float* partials, int rows, int k, int c, void* dw, cudaStream_t stream);
