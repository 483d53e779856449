// A 1x1 stride-1 conv's weight gradient as one cuBLASLt GEMM, with the GPU share it may take bounded.
//
//   dw [K, C] = dy^T x       x: the NHWC input as an [N*H*W, C] matrix, dy: the output's gradient
//                            [N*H*W, K]; fp16 in and out, fp32 accumulation.
//
// Why not cuDNN's plan: in training these GEMMs run on the weight gradients' lane beside the chain
// of data gradients. cuDNN's fastest plans for them are cuBLAS split-K kernels of 128-132 CTAs that
// hold every SM of an H200 for 40-95 µs, and our persistent data-gradient convs, which need whole
// SMs, wait for them (bench/results/levers-session30-nvidia-h200-2026-11-30.md). cuBLASLt takes a
// target SM count for its heuristics (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET): with fewer than the
// device has, it offers kernels sized to leave the rest free.
#pragma once

#include <memory>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "model/lt_gemm.h"

// The lane's plans target half the device's SMs. Measured at the step on an H200 (132 SMs,
// 2026-11-30, bench/ab.py, 3 rounds each; bench/results/levers-session31-nvidia-h200-2026-11-30.md):
// against cuDNN's plans, targets of 132 / 100 / 66 SMs gave batch 128 -0.37% / -0.43% / -1.70% a
// step and batch 256 -0.04% / -0.34% / -0.60%; against 66, targets of 88 / 48 / 33 / 16 gave
// +1.06% / -0.12% / +0.69% / +5.86% (batch 128) and +0.55% / +0.95% / +0.60% / +4.48% (batch 256);
// the device's SMs for layers 3-4 only, +0.88% and +0.80%: every shape takes half.
constexpr int kLaneSmShare = 2;  // the device's SMs divided by this
// The workspace a plan may take: cuBLASLt's split-K partial sums (at most a few MB at batch 256).
constexpr size_t kLaneGemmWorkspace = size_t(64) << 20;
// Half the current device's SMs (at least one).
int lane_gemm_sm_target();

class GemmWgrad {
 public:
  static bool applies(const ConvGeometry& g) { return conv_is_lt_gemm(g); }

  // Plans dw for `g` within `workspace_limit`: cuBLASLt's heuristics for `sm_target` SMs (0: the
  // device's), each algorithm offered timed on scratch memory on `stream`, the fastest kept.
  // ok() is false where cuBLASLt offers none (why() says so).
  GemmWgrad(cublasLtHandle_t lt, const ConvGeometry& g, size_t workspace_limit, int sm_target, cudaStream_t stream);
  ~GemmWgrad();
  GemmWgrad(const GemmWgrad&) = delete;
  GemmWgrad& operator=(const GemmWgrad&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  float ms() const { return ms_; }                // the chosen algorithm's time alone
  size_t workspace() const { return workspace_; }  // what run() needs
  const std::string& algorithm() const { return algorithm_; }  // "lt<i> tile <t> split-k <s>"

  // dw = dy^T x; throws Fatal when not ok() or when ws_bytes < workspace().
  void run(cublasLtHandle_t lt, const void* x, const void* dy, void* dw, void* ws, size_t ws_bytes,
           cudaStream_t stream) const;

 private:
  void launch(cublasLtHandle_t lt, const void* x, const void* dy, void* dw, void* ws, size_t ws_bytes,
              cudaStream_t stream) const;
  ConvGeometry g_;
  std::unique_ptr<LtMatmul> plan_;
  bool ok_ = false;
  std::string why_, algorithm_;
  float ms_ = 0;
  size_t workspace_ = 0;
};
