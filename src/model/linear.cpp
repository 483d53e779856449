// cuBLAS is column-major: a row-major [r, c] matrix is a column-major c x r one with ld = c, so
// each product below is written for the transposes.
#include "model/linear.h"

#include "core/check.h"

namespace {
cudaDataType_t cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16F; }
cublasComputeType_t compute_type(DType t, bool tf32) {
  return t == DType::F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}
}  // namespace

void linear_forward(cublasHandle_t h, LinearShape s, DType t, bool tf32, const void* x, const void* w,
                    float* y) {
  const float one = 1.f, zero = 0.f;
  // y^T (out x N) = W (out x in, i.e. (W^T)^T) * x^T (in x N)
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.n, s.in, &one, w, cuda_type(t), s.in, x,
                            cuda_type(t), s.in, &zero, y, CUDA_R_32F, s.out, compute_type(t, tf32),
                            CUBLAS_GEMM_DEFAULT));
}

void linear_backward(cublasHandle_t h, LinearShape s, DType t, bool tf32, const void* x, const void* w,
                     const void* dy, void* dw, void* dx) {
  const float one = 1.f, zero = 0.f;
  // dW^T (in x out) = x^T (in x N) * dy (N x out)
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, s.in, s.out, s.n, &one, x, cuda_type(t), s.in, dy,
                            cuda_type(t), s.out, &zero, dw, cuda_type(t), s.in, compute_type(t, tf32),
                            CUBLAS_GEMM_DEFAULT));
  // dx^T (in x N) = W^T (in x out) * dy^T (out x N)
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.in, s.n, s.out, &one, w, cuda_type(t), s.in, dy,
                            cuda_type(t), s.out, &zero, dx, cuda_type(t), s.in, compute_type(t, tf32),
                            CUBLAS_GEMM_DEFAULT));
}
