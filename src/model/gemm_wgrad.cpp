// A 1x1 conv's weight gradient as a cuBLASLt GEMM (model/gemm_wgrad.h).
//
// cuBLASLt is column-major. The row-major KRSC filter gradient [K, C] (R = S = 1) is the
// column-major C x K matrix dw^T, and the product is written for it:
//   dw^T (C x K) = x^T (C x M: x row-major [M, C], op N) * dy (M x K: dy row-major [M, K] is the
//                  column-major K x M matrix dy^T, op T)
// with M = N*H*W the GEMM's reduction.
#include "model/gemm_wgrad.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/errors.h"
#include "core/format.h"
#include "core/handles.h"
#include "core/memory.h"
#include "model/lt_offers.h"

namespace {

constexpr int kHeuristics = 8;  // algorithms asked of cuBLASLt's heuristics, each timed
constexpr int kTimedRuns = 3;

uint32_t config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what) {
  uint32_t v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return 0;
  return v;
}

}  // namespace

int lane_gemm_sm_target() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(1, sms / kLaneSmShare);
}

struct GemmWgrad::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, dy = nullptr, dw = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (dw) cublasLtMatrixLayoutDestroy(dw);
    if (dy) cublasLtMatrixLayoutDestroy(dy);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmWgrad::GemmWgrad(cublasLtHandle_t lt, const ConvGeometry& g, size_t workspace_limit, int sm_target,
                     cudaStream_t stream)
    : g_(g), plan_(std::make_unique<Plan>()) {
  if (!applies(g)) {
    why_ = "not a 1x1 stride-1 conv with channels in multiples of 8";
    return;
  }
  const int64_t M = int64_t(g.n) * g.h * g.w;
  Plan& pl = *plan_;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&pl.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_T;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (sm_target > 0) {
    const int32_t sms = sm_target;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl.x, CUDA_R_16F, g.c, M, g.c));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl.dy, CUDA_R_16F, g.k, M, g.k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&pl.dw, CUDA_R_16F, g.c, g.k, g.c));

  const LtOffers offers = lt_offers(lt, pl.op, pl.x, pl.dy, pl.dw, workspace_limit, kHeuristics);
  if (offers.usable.empty()) {
    why_ = offers.why;
    return;
  }
  const std::vector<cublasLtMatmulHeuristicResult_t>& found = offers.found;
  const DeviceBuffer x = scratch_buffer(size_t(M) * g.c * 2, "cuBLASLt weight gradient autotune input"),
                     dy = scratch_buffer(size_t(M) * g.k * 2, "cuBLASLt weight gradient autotune output gradient"),
                     dw = scratch_buffer(g.filter_count() * 2, "cuBLASLt weight gradient autotune filter gradient");
  DeviceBuffer ws(offers.largest_workspace() + 256, "cuBLASLt weight gradient autotune workspace");
  int best = -1;
  for (int i : offers.usable) {
    pl.algo = found[i].algo;
    const float t = fastest_ms(stream, kTimedRuns,
                               [&] { launch(lt, x.get(), dy.get(), dw.get(), ws.get(), found[i].workspaceSize, stream); });
    if (best < 0 || t < ms_) best = i, ms_ = t;
  }
  pl.algo = found[best].algo;
  workspace_ = found[best].workspaceSize;
  algorithm_ = "lt" + std::to_string(best) + " tile " + std::to_string(config(pl.algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) +
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
  CUBLAS_CHECK(cublasLtMatmul(lt, plan_->op, &one, x, plan_->x, dy, plan_->dy, &zero, dw, plan_->dw, dw, plan_->dw,
                              &plan_->algo, ws, ws_bytes, stream));
}
