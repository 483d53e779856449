// What the network's cuBLASLt GEMMs share (model/gemm_conv.h: bin/predict's 1x1 convs with their
// BN; model/gemm_wgrad.h: training's 1x1 weight gradients): which convs are one matrix product, the
// descriptors of one product, what cuBLASLt's heuristics offer for it, and the fastest offer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "model/conv.h"

// Whether a conv is a plain matrix product in NHWC: 1x1, stride 1, no padding; and channels in
// multiples of 8, so that every row of its input, output and filter starts 16-byte aligned, as
// cuBLASLt's fp16 kernels assume (the network's are multiples of 64).
inline bool conv_is_lt_gemm(const ConvGeometry& g) {
  return g.r == 1 && g.stride == 1 && g.pad == 0 && g.c % 8 == 0 && g.k % 8 == 0;
}
constexpr const char* kNotLtGemm = "not a 1x1 stride-1 conv with channels in multiples of 8";

// How many algorithms each GEMM asks of cuBLASLt's heuristics, and how often each is timed.
constexpr int kLtHeuristics = 8;
constexpr int kLtTimedRuns = 3;

// A column-major fp16 matrix: rows x cols, consecutive columns ld elements apart.
struct LtShape {
  uint64_t rows, cols;
  int64_t ld;
};

// One product D = alpha op(A) op(B) + beta C (C read in D's layout), computed in fp32: its
// descriptor, the fp16 layouts of A, B and D, and the algorithm it runs; the descriptors are
// destroyed with it.
struct LtMatmul {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtMatmul(cublasOperation_t op_a, cublasOperation_t op_b, LtShape a_shape, LtShape b_shape, LtShape d_shape);
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul();
  // One attribute of the descriptor (an epilogue, a bias pointer, an SM target).
  void set(cublasLtMatmulDescAttributes_t what, const void* value, size_t bytes) const;

 private:
  LtMatmul() = default;  // the one the public constructor delegates to, so a throw in it still destroys
};

struct LtOffers {
  std::vector<cublasLtMatmulHeuristicResult_t> found;  // as returned: an algorithm's index is its name ("lt<i>")
  std::vector<int> usable;                             // indices into found that cuBLASLt can run
  std::string why;                                     // where none is usable, why
  size_t largest_workspace() const;                    // of the usable ones
};

// Up to `count` algorithms for m, each within `workspace_limit`.
LtOffers lt_offers(cublasLtHandle_t lt, const LtMatmul& m, size_t workspace_limit, int count);

// The usable offer that ran fastest: m.algo is set to each in turn and launch(offer) runs it once,
// timed by fastest_ms(stream, runs, ...); m.algo is left at the fastest. Needs an offer usable.
struct LtFastest {
  int index = -1;
  float ms = 0;
};
LtFastest fastest_offer(LtMatmul& m, const LtOffers& o, cudaStream_t stream, int runs,
                        const std::function<void(const cublasLtMatmulHeuristicResult_t&)>& launch);
