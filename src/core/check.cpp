// The messages of failed CUDA, cuDNN and cuBLAS calls (check.h).
#include "core/check.h"

#include <cstdio>

namespace {
std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " at " + file + ":" + std::to_string(line);
}
}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  std::string msg = "CUDA error " + std::string(cudaGetErrorName(err)) + " (" +
                    cudaGetErrorString(err) + ") in " + where(call, file, line);
  if (err == cudaErrorMemoryAllocation)
    msg += "; the GPU is out of memory: try a smaller --batch or --workspace-mb";
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    msg += "; this program needs an NVIDIA GPU with a working driver";
  cudaGetLastError();  // clear the sticky non-fatal error so cleanup can still run
  throw Fatal(msg);
}

void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string msg = "cuDNN error " + std::string(cudnnGetErrorString(st)) + " in " +
                    where(call, file, line);
  if (detail[0]) msg += ": " + std::string(detail);
  if (st == CUDNN_STATUS_ALLOC_FAILED)
    msg += "; the GPU is out of memory: try a smaller --batch or --workspace-mb";
  throw Fatal(msg);
}

const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  std::string msg = "cuBLAS error " + std::string(cublas_status_name(st)) + " in " +
                    where(call, file, line);
  if (st == CUBLAS_STATUS_ALLOC_FAILED)
    msg += "; the GPU is out of memory: try a smaller --batch";
  throw Fatal(msg);
}
