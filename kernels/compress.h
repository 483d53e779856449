// Launchers of the int8 gradient compression with error feedback (kernels/compress.cu): what the
// ranks all-reduce in place of their fp16/fp32 weight gradients with --grad-compression int8
// (dist/grad_compression.h holds the plan and the order of the calls).
//
// A bucket's n gradients are cut into chunks of `chunk` elements; each chunk has one scale that
// every rank agrees on. Per element of rank r, with S the loss scale (1 without loss scaling) and
// the residual r kept unscaled between steps (so a change of S between steps does not change it):
//   e = g + r * S                                        the gradient plus what was not sent before
//   int8_absmax:      chunk_max = max |e| over the chunk (NaN counts as +inf), then the caller
//                     all-reduces it with ncclMax: M, the same on every rank
//   int8_quantize:    step = M / L, q = rint(e / step) in [-L, L], residual = (e - q * step) / S
//                     (L = levels = floor(127 / world): the sum of `world` ranks' q fits in int8)
//   ncclSum of q over the ranks (exact: integers within [-127, 127])
//   int8_dequantize:  g = (sum * step) / world, the average, in the gradients' type
// A chunk whose M is not finite (an fp16 overflow on some rank) sends zeros, keeps its residual as
// it was, and comes back as NaN, so every rank's loss scaler skips the step. M = 0 sends zeros.
// Every operation is one IEEE-rounded fp32 operation (no FMA contraction), so a CPU reference gives
// the same bits (tests/kernels/test_compress_gpu.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/types.h"

// Largest number of ranks whose int8 sum cannot overflow with at least one level each side.
constexpr int kInt8MaxWorld = 127;
// The quantization levels each side of zero for `world` ranks: floor(127 / world).
inline int int8_levels(int world) { return 127 / world; }

// grads: n gradients of type t; residual: n floats; loss_scale: device memory, or nullptr for 1.
// chunk_max: one float per chunk of `chunk` elements (the last one may be shorter).
void int8_absmax(const void* grads, DType t, const float* residual, size_t n, int chunk, const float* loss_scale,
                 float* chunk_max, cudaStream_t stream);
// Quantizes with the agreed chunk_max into q (n int8) and updates the residual in place.
void int8_quantize(const void* grads, DType t, float* residual, size_t n, int chunk, const float* loss_scale,
                   const float* chunk_max, int levels, int8_t* q, cudaStream_t stream);
// The ranks' summed q back to the average gradient, written over grads (type t).
void int8_dequantize(const int8_t* q_sum, size_t n, int chunk, const float* chunk_max, int levels, int world,
                     void* grads, DType t, cudaStream_t stream);
