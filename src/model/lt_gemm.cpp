// What the network's cuBLASLt GEMMs share (model/lt_gemm.h).
#include "model/lt_gemm.h"

#include <algorithm>

#include "core/check.h"
#include "core/handles.h"

LtMatmul::LtMatmul(cublasOperation_t op_a, cublasOperation_t op_b, LtShape a_shape, LtShape b_shape,
                   LtShape d_shape)
    : LtMatmul() {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, a_shape.rows, a_shape.cols, a_shape.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, b_shape.rows, b_shape.cols, b_shape.ld));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, CUDA_R_16F, d_shape.rows, d_shape.cols, d_shape.ld));
}

void LtMatmul::set(cublasLtMatmulDescAttributes_t what, const void* value, size_t bytes) const {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, what, value, bytes));
}

LtMatmul::~LtMatmul() {
  if (d) cublasLtMatrixLayoutDestroy(d);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (op) cublasLtMatmulDescDestroy(op);
}

size_t LtOffers::largest_workspace() const {
  size_t bytes = 0;
  for (int i : usable) bytes = std::max(bytes, found[i].workspaceSize);
  return bytes;
}

LtOffers lt_offers(cublasLtHandle_t lt, const LtMatmul& m, size_t workspace_limit, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &workspace_limit, sizeof workspace_limit);
  LtOffers o;
  o.found.resize(count);
  int n = 0;
  const cublasStatus_t st =
      set != CUBLAS_STATUS_SUCCESS
          ? set
          : cublasLtMatmulAlgoGetHeuristic(lt, m.op, m.a, m.b, m.d, m.d, pref, count, o.found.data(), &n);
  cublasLtMatmulPreferenceDestroy(pref);
  o.found.resize(st == CUBLAS_STATUS_SUCCESS ? n : 0);
  for (int i = 0; i < int(o.found.size()); ++i)
    if (o.found[i].state == CUBLAS_STATUS_SUCCESS) o.usable.push_back(i);
  if (o.usable.empty()) o.why = std::string("cuBLASLt offers no algorithm for it (") + cublas_status_name(st) + ")";
  return o;
}

LtFastest fastest_offer(LtMatmul& m, const LtOffers& o, cudaStream_t stream, int runs,
                        const std::function<void(const cublasLtMatmulHeuristicResult_t&)>& launch) {
  LtFastest best;
  for (int i : o.usable) {
    m.algo = o.found[i].algo;
    const float t = fastest_ms(stream, runs, [&] { launch(o.found[i]); });
    if (best.index < 0 || t < best.ms) best = {i, t};
  }
  m.algo = o.found[best.index].algo;
  return best;
}
