// bin/predict's 1x1 stride-1 convs as one cuBLASLt GEMM each, the BN folded into the filter and the
// rest of the BN, the residual and the ReLU in the GEMM's epilogue:
//
//   GemmBn          y = x w'^T + b                      (the projection shortcut of stage 1)
//   GemmBnRelu      y = relu(x w'^T + b)                (conv1 of a block)
//   GemmBnAddRelu   y = relu(x w'^T + b + z)            (conv3: z, the shortcut, read as the GEMM's C)
//
// x is the NHWC input as an [N*H*W, C] matrix, w' the filter [K, C] with the BN's scale folded into
// each row (fold_bn_into_filters), b the BN's shift, y and z [N*H*W, K]; fp16, fp32 accumulation.
// Why: cuDNN's fused conv + BN + add + ReLU kernels read the residual slowly; on an H100 at batch 256
// (bin/predict's autotuning, 2026-11-26) the GEMM reading it as C ran conv3 of stage 1 in 110 µs
// against cuDNN's 142 µs (stage 2: 58 against 76), while for other 1x1 convs the two are within a
// few percent either way. So the network measures both and keeps the faster for each conv
// (InferenceNetwork::plan_convs); nothing is chosen without measuring.
#pragma once

#include <memory>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "model/fused_conv.h"
#include "model/lt_gemm.h"

class GemmConv : public FusedPlan {
 public:
  // Whether a conv is one matrix product (model/lt_gemm.h).
  static bool applies(const ConvGeometry& g) { return conv_is_lt_gemm(g); }

  // Plans the GEMM for `g` (fp16) with pattern p's epilogue (GemmBn, GemmBnRelu or GemmBnAddRelu):
  // cuBLASLt's heuristics' algorithms within `workspace_limit`, each timed on scratch memory on
  // `stream`, the fastest kept (its time with the fold of the filter added, which each forward
  // runs); or, given a `cached` choice (an earlier start's choice()), that algorithm alone when the
  // heuristics still offer it with the same workspace. ok() is false where cuBLASLt offers none.
  GemmConv(cublasLtHandle_t lt, FusedPattern p, const ConvGeometry& g, size_t workspace_limit, cudaStream_t stream,
           const FusedChoice* cached = nullptr);
  ~GemmConv();

  // y = epilogue(x w_folded^T): `bias` fp16 [K]; `z` the residual (GemmBnAddRelu only, else null).
  void run(cublasLtHandle_t lt, const void* x, const void* w_folded, const void* bias, const void* z, void* y,
           void* ws, size_t ws_bytes, cudaStream_t stream) const;

 private:
  // The GEMM with plan_'s algorithm, unchecked: run() after checking, and the timing of each candidate.
  void launch(cublasLtHandle_t lt, const void* x, const void* w_folded, const void* bias, const void* z, void* y,
              void* ws, size_t ws_bytes, cudaStream_t stream) const;
  std::unique_ptr<LtMatmul> plan_;
};
