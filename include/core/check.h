// Error checks for every CUDA, cuDNN and cuBLAS call.
//
// A failed call throws a `Fatal` (errors.h) carrying the call text, file:line and the library's own
// message, so that main() can print one line and exit, and tests can assert on failures.
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/errors.h"

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t st);

#define CUDA_CHECK(call)                                                            \
  do {                                                                              \
    cudaError_t err_ = (call);                                                      \
    if (err_ != cudaSuccess) throw_cuda_error(err_, #call, __FILE__, __LINE__);     \
  } while (0)

#define CUDNN_CHECK(call)                                                                   \
  do {                                                                                      \
    cudnnStatus_t st_ = (call);                                                             \
    if (st_ != CUDNN_STATUS_SUCCESS) throw_cudnn_error(st_, #call, __FILE__, __LINE__);     \
  } while (0)

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) throw_cublas_error(st_, #call, __FILE__, __LINE__);   \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
