// What cuBLASLt's heuristics offer for one GEMM: the algorithms it returns, in its order, and which
// of them it can run. Shared by the GEMMs planned from them (model/gemm_conv.h, model/gemm_wgrad.h),
// each of which times the usable ones and keeps the fastest.
#pragma once

#include <string>
#include <vector>

#include <cublasLt.h>

struct LtOffers {
  std::vector<cublasLtMatmulHeuristicResult_t> found;  // as returned: an algorithm's index is its name ("lt<i>")
  std::vector<int> usable;                             // indices into found that cuBLASLt can run
  std::string why;                                     // where none is usable, why
  size_t largest_workspace() const;                    // of the usable ones
};

// Up to `count` algorithms for D = op(A) op(B) (C and D alike: `c`), each within `workspace_limit`.
LtOffers lt_offers(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                   cublasLtMatrixLayout_t c, size_t workspace_limit, int count);
