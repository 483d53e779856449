// Launchers of gradient accumulation over micro-batches (kernels/accumulate.cu): --accumulate N sums
// the gradients of N micro-batches in fp32 before one optimizer step (dist/grad_accumulation.h).
//
// Each micro-batch's gradient is scaled by 1/N before it is added, as NCCL's ncclAvg scales each
// rank's input by 1/ranks before it sums (its PreMulSum): after micro-batches 0..N-1
//   sums = g0 / N + g1 / N + ... (in this order, each term and sum rounded once in fp32)
// and with N = 2 that is, bit for bit, what NCCL averages from two ranks holding g0 and g1 in fp32
// (two terms add the same in either order).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/types.h"

// sums = grads * scale (first micro-batch) or sums + grads * scale; grads: n of type t.
void accumulate_grads(const void* grads, DType t, float* sums, size_t n, float scale, bool first, cudaStream_t stream);
// The last micro-batch: grads = sums + grads * scale, written in the gradients' type t.
void finish_accumulation(void* grads, DType t, const float* sums, size_t n, float scale, cudaStream_t stream);
