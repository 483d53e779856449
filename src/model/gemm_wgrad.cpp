// A 1x1 conv's weight gradient as a cuBLASLt GEMM (model/gemm_wgrad.h).
//
// cuBLASLt is column-major. The row-major KRSC filter gradient [K, C] (R = S = 1) is the
// column-major C x K matrix dw^T, and the product is written for it:
//   dw^T (C x K) = x^T (C x M: x row-major [M, C], op N) * dy (M x K: dy row-major [M, K] is the
//                  column-major K x M matrix dy^T, op T)
// with M = N*H*W the GEMM's reduction.
#include "model/gemm_wgrad.h"

#include <algorithm>

#include "core/check.h"
#include "core/errors.h"
#include "core/format.h"
#include "core/handles.h"
#include "core/memory.h"

namespace {

uint32_t config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what) {
  uint32_t v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return 0;
  return v;
}

}  // namespace

int lane_gemm_sm_target() { return std::max(1, current_device_sms() / kLaneSmShare); }

GemmWgrad::GemmWgrad(cublasLtHandle_t lt, const ConvGeometry& g, size_t workspace_limit, int sm_target,
                     cudaStream_t stream)
    : g_(g) {
  if (!applies(g)) {
    why_ = kNotLtGemm;
    return;
  }
  const int64_t M = int64_t(g.n) * g.h * g.w;
  // A = x^T, B = dy^T (op T), D = dw^T
  plan_ = std::make_unique<LtMatmul>(CUBLAS_OP_N, CUBLAS_OP_T, LtShape{uint64_t(g.c), uint64_t(M), g.c},
                                     LtShape{uint64_t(g.k), uint64_t(M), g.k}, LtShape{uint64_t(g.c), uint64_t(g.k), g.c});
  LtMatmul& pl = *plan_;
  if (sm_target > 0) {
    const int32_t sms = sm_target;
    pl.set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms);
  }

  const LtOffers offers = lt_offers(lt, pl, workspace_limit, kLtHeuristics);
  if (offers.usable.empty()) {
    why_ = offers.why;
    return;
  }
  const DeviceBuffer x = scratch_buffer(size_t(M) * g.c * 2, "cuBLASLt weight gradient autotune input"),
                     dy = scratch_buffer(size_t(M) * g.k * 2, "cuBLASLt weight gradient autotune output gradient"),
                     dw = scratch_buffer(g.filter_count() * 2, "cuBLASLt weight gradient autotune filter gradient");
  DeviceBuffer ws(offers.largest_workspace() + 256, "cuBLASLt weight gradient autotune workspace");
  const LtFastest best = fastest_offer(pl, offers, stream, kLtTimedRuns, [&](const cublasLtMatmulHeuristicResult_t& o) {
    launch(lt, x.get(), dy.get(), dw.get(), ws.get(), o.workspaceSize, stream);
  });
  ms_ = best.ms;
  workspace_ = offers.found[best.index].workspaceSize;
  algorithm_ = "lt" + std::to_string(best.index) + " tile " + std::to_string(config(pl.algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) +
               " split-k " + std::to_string(config(pl.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
  ok_ = true;
}

GemmWgrad::~GemmWgrad() = default;

void GemmWgrad::run(cublasLtHandle_t lt, const void* x, const void* dy, void* dw, void* ws, size_t ws_bytes,
                    cudaStream_t stream) const {
  if (!ok_) throw Fatal("the cuBLASLt weight gradient of conv " + g_.key() + " run though " + why_);
  if (workspace_ > ws_bytes)
    throw Fatal("the cuBLASLt weight gradient of conv " + g_.key() + " needs " + format_bytes(workspace_) +
                " of workspace, given " + format_bytes(ws_bytes));
  launch(lt, x, dy, dw, ws, workspace_, stream);
}

void GemmWgrad::launch(cublasLtHandle_t lt, const void* x, const void* dy, void* dw, void* ws, size_t ws_bytes,
                       cudaStream_t stream) const {
  const float one = 1.f, zero = 0.f;
  CUBLAS_CHECK(cublasLtMatmul(lt, plan_->op, &one, x, plan_->a, dy, plan_->b, &zero, dw, plan_->d, dw, plan_->d,
                              &plan_->algo, ws, ws_bytes, stream));
}
