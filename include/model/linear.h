// The classifier: y = x W^T (+ bias, added by the loss kernel) through cuBLAS.
//
// Row-major tensors as PyTorch has them: x [N, in], W [out, in], y [N, out] fp32 logits. x, W and
// the gradients dW, dx are in the activation type; fp16 runs on tensor cores with fp32 accumulation.
#pragma once

#include <cublas_v2.h>

#include "core/types.h"

struct LinearShape {
  int n, in, out;
};

void linear_forward(cublasHandle_t h, LinearShape s, DType t, bool tf32, const void* x, const void* w,
                    float* y);
// dW = dy^T x (overwritten) and dx = dy W (overwritten); dy in the activation type.
void linear_backward(cublasHandle_t h, LinearShape s, DType t, bool tf32, const void* x, const void* w,
                     const void* dy, void* dw, void* dx);
