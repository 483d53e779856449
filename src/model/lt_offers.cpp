// cuBLASLt's heuristics for one GEMM (model/lt_offers.h).
#include "model/lt_offers.h"

#include <algorithm>

#include "core/check.h"

size_t LtOffers::largest_workspace() const {
  size_t bytes = 0;
  for (int i : usable) bytes = std::max(bytes, found[i].workspaceSize);
  return bytes;
}

LtOffers lt_offers(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                   cublasLtMatrixLayout_t c, size_t workspace_limit, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &workspace_limit, sizeof workspace_limit);
  LtOffers o;
  o.found.resize(count);
  int n = 0;
  const cublasStatus_t st = set != CUBLAS_STATUS_SUCCESS
                                ? set
                                : cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, count, o.found.data(), &n);
  cublasLtMatmulPreferenceDestroy(pref);
  o.found.resize(st == CUBLAS_STATUS_SUCCESS ? n : 0);
  for (int i = 0; i < int(o.found.size()); ++i)
    if (o.found[i].state == CUBLAS_STATUS_SUCCESS) o.usable.push_back(i);
  if (o.usable.empty()) o.why = std::string("cuBLASLt offers no algorithm for it (") + cublas_status_name(st) + ")";
  return o;
}
