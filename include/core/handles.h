// RAII owners for CUDA streams and events and the cuDNN / cuBLAS / cuBLASLt handles.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>

#include "core/check.h"

// Whose waiting blocks the GPU starts first when kernels of several streams wait for free SMs:
// First is the device's greatest stream priority, Normal its default (and least) one.
enum class StreamPriority { Normal, First };

class Stream {
 public:
  // blocking = true gives a stream that synchronises with the legacy default stream, which is what
  // the baseline's plain cudaMemcpy relies on; the loader's copy stream is non-blocking.
  explicit Stream(bool blocking = true, StreamPriority priority = StreamPriority::Normal) {
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&s_, blocking ? cudaStreamDefault : cudaStreamNonBlocking,
                                            priority == StreamPriority::First ? greatest : least));
  }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = true) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  operator cudaEvent_t() const { return e_; }
  void record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
  // Milliseconds from `start` to this event; both must have completed.
  float ms_since(const Event& start) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

// The fastest of `runs` timed runs of f() on `stream` (CUDA events), after one untimed warm-up run
// (loads kernels, builds caches): how autotuning compares candidates.
float fastest_ms(cudaStream_t stream, int runs, const std::function<void()>& f);

class CudnnHandle {
 public:
  CudnnHandle() { CUDNN_CHECK(cudnnCreate(&h_)); }
  ~CudnnHandle() { cudnnDestroy(h_); }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return h_; }
  operator cudnnHandle_t() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() { CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }
  operator cublasHandle_t() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

class CublasLtHandle {
 public:
  CublasLtHandle() { CUBLAS_CHECK(cublasLtCreate(&h_)); }
  ~CublasLtHandle() { cublasLtDestroy(h_); }
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  cublasLtHandle_t get() const { return h_; }
  operator cublasLtHandle_t() const { return h_; }

 private:
  cublasLtHandle_t h_ = nullptr;
};

// The GPU context a network runs in: one compute stream, with the library handles bound to it
// (cuBLASLt takes the stream with each call). The stream goes first: in training it carries the
// chain of data gradients, whose persistent conv kernels need whole SMs, and the weight gradients'
// stream beside it (model/training_network_state.h, Lane) has slack. Where blocks of both wait for SMs,
// the chain's start first: batch 128 -0.41% and -0.43% a step in two calls, faster in every round;
// batch 256 -0.53% and +0.11% (H200, 2026-11-30, bench/results/levers-session30-nvidia-h200-2026-11-30.md).
struct GpuContext {
  Stream stream{true, StreamPriority::First};
  CudnnHandle cudnn;
  CublasHandle cublas;
  CublasLtHandle cublas_lt;
  GpuContext() {
    CUDNN_CHECK(cudnnSetStream(cudnn, stream));
    CUBLAS_CHECK(cublasSetStream(cublas, stream));
  }
};

// Throws a one-line InputError when no usable CUDA device is present.
void require_cuda_device();
// True when a CUDA device can be used (for tests that skip without one).
bool cuda_device_available();
// The current device's SMs (what the lane's SM targets are shares of).
int current_device_sms();
