// Launchers of the global average pool (kernels/pooling.cu).
#pragma once

#include <cuda_runtime.h>

#include "core/types.h"

// Global average pool: x [N,C,H,W] in layout -> y [N,C] row-major, both of type t.
void global_avgpool_forward(const void* x, Shape4 s, DType t, Layout l, void* y, cudaStream_t stream);
void global_avgpool_backward(const void* dy, Shape4 s, DType t, Layout l, void* dx, cudaStream_t stream);
