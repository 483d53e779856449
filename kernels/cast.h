// Launchers of the fp32 <-> fp16 casts (kernels/cast.cu).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

void cast_f32_to_f16(const float* in, void* out, size_t n, cudaStream_t stream);
void cast_f16_to_f32(const void* in, float* out, size_t n, cudaStream_t stream);
