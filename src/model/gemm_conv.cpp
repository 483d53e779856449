// bin/predict's 1x1 convs as cuBLASLt GEMMs with the BN in the epilogue (model/gemm_conv.h).
//
// cuBLASLt is column-major: the row-major [M, K] output y (M = N*H*W) is a column-major K x M
// matrix with ld = K, and so on, so the product is written for the transposes:
//   y^T (K x M) = w' (K x C, stored as the column-major C x K matrix w'^T: op T) * x^T (C x M)
// and the epilogue's bias is per row of y^T: per output channel, as the BN's shift is.
#include "model/gemm_conv.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/errors.h"
#include "core/format.h"
#include "core/handles.h"
#include "core/memory.h"
#include "kernels/batchnorm.h"

namespace {

}  // namespace

GemmConv::GemmConv(cublasLtHandle_t lt, FusedPattern p, const ConvGeometry& g, size_t workspace_limit,
                   cudaStream_t stream, const FusedChoice* cached)
    : FusedPlan(p, g) {
  if (!applies(g)) {
    why_ = kNotLtGemm;
    return;
  }
  const bool relu = p != FusedPattern::GemmBn, add_z = p == FusedPattern::GemmBnAddRelu;
  const int64_t M = int64_t(g.n) * g.h * g.w;
  // A = w' (op T), B = x^T, D = y^T
  plan_ = std::make_unique<LtMatmul>(CUBLAS_OP_T, CUBLAS_OP_N, LtShape{uint64_t(g.c), uint64_t(g.k), g.c},
                                     LtShape{uint64_t(g.c), uint64_t(M), g.c}, LtShape{uint64_t(g.k), uint64_t(M), g.k});
  LtMatmul& pl = *plan_;
  const cublasLtEpilogue_t ep = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  pl.set(CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);

  const LtOffers offers = lt_offers(lt, pl, workspace_limit, kLtHeuristics);
  const std::vector<cublasLtMatmulHeuristicResult_t>& found = offers.found;
  const std::vector<int>& usable = offers.usable;
  if (usable.empty()) {
    why_ = offers.why;
    return;
  }
  // A cached index that still names an algorithm with the same workspace is taken as it is: the
  // choice stays as it was made. Otherwise every algorithm offered is timed.
  const int cached_index = cached ? algorithm_number(cached->engine, "lt") : -1;
  if (std::find(usable.begin(), usable.end(), cached_index) != usable.end() &&
      found[cached_index].workspaceSize == cached->workspace) {
    pl.algo = found[cached_index].algo;
    choice_ = *cached;
    from_cache_ = ok_ = true;
    return;
  }
  const size_t ws_bytes = offers.largest_workspace();
  const size_t es = 2, xs = size_t(M) * g.c * es, fs = size_t(g.k) * g.c * es, ys = size_t(M) * g.k * es;
  auto scratch = [](size_t bytes, const char* what) {
    return scratch_buffer(bytes, std::string("cuBLASLt conv autotune ") + what);
  };
  const DeviceBuffer x = scratch(xs, "input"), w = scratch(fs, "filter"), y = scratch(ys, "output"),
                     z = scratch(add_z ? ys : 0, "residual"), b = scratch(size_t(g.k) * es, "bias");
  DeviceBuffer ws(ws_bytes + 256, "cuBLASLt conv autotune workspace");
  const LtFastest best = fastest_offer(pl, offers, stream, kLtTimedRuns, [&](const cublasLtMatmulHeuristicResult_t& o) {
    launch(lt, x.get(), w.get(), b.get(), add_z ? z.get() : nullptr, y.get(), ws.get(), o.workspaceSize, stream);
  });
  choice_.ms = best.ms;
  // Each forward folds the BN's scale into the filter before the GEMM (fold_bn_into_filters): that
  // pass is part of what the GEMM costs against cuDNN's kernel, which reads the scale as it is.
  const DeviceBuffer folded(fs, "cuBLASLt conv autotune folded filter"), scale = scratch(size_t(g.k) * 4, "scale"),
      target(sizeof(FilterFold), "cuBLASLt conv autotune fold");
  const FilterFold fold{w.get(), scale.as<float>(), folded.get(), g.k, g.c};
  CUDA_CHECK(cudaMemcpy(target.get(), &fold, sizeof fold, cudaMemcpyHostToDevice));
  choice_.ms += fastest_ms(stream, kLtTimedRuns,
                           [&] { fold_bn_into_filters(target.as<FilterFold>(), 1, g.filter_count(), stream); });
  choice_.engine = "lt" + std::to_string(best.index);
  choice_.workspace = found[best.index].workspaceSize;
  ok_ = true;
}

GemmConv::~GemmConv() = default;

void GemmConv::run(cublasLtHandle_t lt, const void* x, const void* w_folded, const void* bias, const void* z, void* y,
                   void* ws, size_t ws_bytes, cudaStream_t stream) const {
  if (!ok_) throw Fatal(std::string(fused_pattern_name(pattern_)) + " for conv " + g_.key() + " run though " + why_);
  const bool add_z = pattern_ == FusedPattern::GemmBnAddRelu;
  if (add_z != (z != nullptr))
    throw Fatal(std::string(fused_pattern_name(pattern_)) + ": the residual is " + (add_z ? "missing" : "not read"));
  if (workspace() > ws_bytes)
    throw Fatal(std::string(fused_pattern_name(pattern_)) + " for conv " + g_.key() + " needs " +
                format_bytes(workspace()) + " of workspace, given " + format_bytes(ws_bytes));
  launch(lt, x, w_folded, bias, z, y, ws, workspace(), stream);
}

void GemmConv::launch(cublasLtHandle_t lt, const void* x, const void* w_folded, const void* bias, const void* z,
                      void* y, void* ws, size_t ws_bytes, cudaStream_t stream) const {
  plan_->set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  const float one = 1.f, beta = z ? 1.f : 0.f;
  CUBLAS_CHECK(cublasLtMatmul(lt, plan_->op, &one, w_folded, plan_->a, x, plan_->b, &beta, z ? z : y, plan_->d, y,
                              plan_->d, &plan_->algo, ws, ws_bytes, stream));
}
