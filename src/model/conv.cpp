// Convolutions through cuDNN's legacy API, and the chooser that configures every conv layer.
#include "model/conv.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/check.h"
#include "core/elapsed.h"
#include "model/conv_graph.h"
#include "core/memory.h"

namespace {

cudnnDataType_t cudnn_type(DType t) { return t == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF; }
cudnnTensorFormat_t cudnn_format(Layout l) { return l == Layout::NCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC; }

enum Direction { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

}  // namespace

std::string ConvGeometry::key() const {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "n%d.c%d.h%d.w%d.k%d.r%d.s%d.p%d", n, c, h, w, k, r, stride, pad);
  return buf;
}

size_t ConvLayer::workspace_bytes() const {
  return std::max({algos_.fwd.workspace, algos_.bwd_data.workspace, algos_.bwd_filter.workspace});
}

Conv2d::Conv2d(const ConvGeometry& g, DType t, Layout l, bool tf32) : ConvLayer(g, t, tf32) {
  const cudnnDataType_t dt = cudnn_type(t);
  const cudnnTensorFormat_t fmt = cudnn_format(l);
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, fmt, dt, g.n, g.c, g.h, g.w));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, fmt, dt, g.n, g.k, g.out_h(), g.out_w()));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, dt, fmt, g.k, g.c, g.r, g.r));
  // fp16 runs on tensor cores; fp32 may use TF32 tensor cores unless --no-tf32 (FMA only).
  const cudnnMathType_t math = t == DType::F16 ? CUDNN_TENSOR_OP_MATH : (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
  for (auto& cd : conv_) {
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&cd));
    // fp32 accumulation for both precisions
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(cd, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(cd, math));
  }
}

Conv2d::~Conv2d() {
  for (auto cd : conv_)
    if (cd) cudnnDestroyConvolutionDescriptor(cd);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  if (y_) cudnnDestroyTensorDescriptor(y_);
  if (x_) cudnnDestroyTensorDescriptor(x_);
}

bool Conv2d::use(cudnnHandle_t, const ConvAlgos& a) {
  // A cached choice naming an algorithm or math type this cuDNN does not have (a corrupt or hand-
  // edited file) is refused, so the shape is searched again rather than failing at its first call.
  auto valid = [](const AlgoChoice& c, int algorithms) {
    const int algo = algorithm_number(c.algo);
    return algo >= 0 && algo < algorithms && c.math >= 0 && c.math <= int(CUDNN_FMA_MATH);
  };
  if (!valid(a.fwd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT) || !valid(a.bwd_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT) ||
      !valid(a.bwd_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT))
    return false;
  algos_ = a;
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_[kFwd], static_cast<cudnnMathType_t>(a.fwd.math)));
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_[kBwdData], static_cast<cudnnMathType_t>(a.bwd_data.math)));
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_[kBwdFilter], static_cast<cudnnMathType_t>(a.bwd_filter.math)));
  return true;
}

void Conv2d::forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const {
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, x_, x, w_, w, conv_[kFwd],
                                      static_cast<cudnnConvolutionFwdAlgo_t>(algorithm_number(algos_.fwd.algo)), ws,
                                      ws_bytes, &zero, y_, y));
}

void Conv2d::backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, void* ws,
                           size_t ws_bytes) const {
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, w_, w, y_, dy, conv_[kBwdData],
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithm_number(algos_.bwd_data.algo)),
                                           ws, ws_bytes, &zero, x_, dx));
}

void Conv2d::backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws,
                             size_t ws_bytes) const {
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, x_, x, y_, dy, conv_[kBwdFilter],
                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(algorithm_number(algos_.bwd_filter.algo)),
                                             ws, ws_bytes, &zero, w_, dw));
}

// ---- algorithm choice ---------------------------------------------------------------------------
namespace {

struct LegacyDescs {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv[3];
};

// The first result (cuDNN sorts them, fastest or most promising first) that ran, fits the
// workspace, is deterministic when asked, and keeps fp32 off tensor cores under --no-tf32.
template <class Perf>
AlgoChoice pick(const Perf* perf, int count, const ConvPolicy& p, bool fma_only, bool measured,
                const char* direction, const ConvGeometry& g) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > p.workspace_limit) continue;
    if (p.deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (fma_only && (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) continue;
    // CUDNN_DEFAULT_MATH still permits TF32 on Ampere and later: under --no-tf32 only FMA will do.
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : r.mathType;
    return {std::to_string(int(r.algo)), static_cast<int>(math), r.memory, measured ? r.time : -1.f};
  }
  throw Fatal(std::string("cuDNN offers no usable ") + direction + " algorithm for conv " + g.key() +
              (p.deterministic ? " (deterministic)" : "") + " within a workspace of " +
              format_bytes(p.workspace_limit) + "; try a larger --workspace-mb");
}

ConvAlgos heuristic_algos(cudnnHandle_t h, const ConvGeometry& g, const LegacyDescs& c, const ConvPolicy& p,
                          bool fma_only) {
  ConvAlgos a;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.x, c.w, c.conv[kFwd], c.y,
                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, fwd));
  a.fwd = pick(fwd, n, p, fma_only, false, "forward", g);
  cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w, c.y, c.conv[kBwdData], c.x,
                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, bd));
  a.bwd_data = pick(bd, n, p, fma_only, false, "backward-data", g);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x, c.y, c.conv[kBwdFilter], c.w,
                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, bf));
  a.bwd_filter = pick(bf, n, p, fma_only, false, "backward-filter", g);
  return a;
}

ConvAlgos measured_algos(cudnnHandle_t h, const ConvGeometry& g, const LegacyDescs& c, DType t, const ConvPolicy& p,
                         bool fma_only) {
  const size_t es = dtype_size(t);
  const DeviceBuffer x = scratch_buffer(g.input().count() * es, "autotune input " + g.key());
  const DeviceBuffer y = scratch_buffer(g.output().count() * es, "autotune output " + g.key());
  const DeviceBuffer w = scratch_buffer(g.filter_count() * es, "autotune filter " + g.key());
  DeviceBuffer ws(p.workspace_limit, "autotune workspace (--workspace-mb)");
  ConvAlgos a;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, c.x, x.get(), c.w, w.get(), c.conv[kFwd],
                                                     c.y, y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, fwd,
                                                     ws.get(), ws.bytes()));
  a.fwd = pick(fwd, n, p, fma_only, true, "forward", g);
  cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, c.w, w.get(), c.y, y.get(), c.conv[kBwdData],
                                                          c.x, x.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n,
                                                          bd, ws.get(), ws.bytes()));
  a.bwd_data = pick(bd, n, p, fma_only, true, "backward-data", g);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, c.x, x.get(), c.y, y.get(), c.conv[kBwdFilter],
                                                            c.w, w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n,
                                                            bf, ws.get(), ws.bytes()));
  a.bwd_filter = pick(bf, n, p, fma_only, true, "backward-filter", g);
  return a;
}

}  // namespace

ConvAlgos Conv2d::search(cudnnHandle_t h, const ConvPolicy& p) {
  const LegacyDescs d{x_, y_, w_, {conv_[0], conv_[1], conv_[2]}};
  if (p.policy == AlgoPolicy::Heuristic) return heuristic_algos(h, g_, d, p, fma_only());
  // The first search of a process also pays for loading each candidate's kernels (CUDA loads
  // modules lazily), which can rank a slow algorithm first: measure twice, keep the second.
  measured_algos(h, g_, d, t_, p, fma_only());
  return measured_algos(h, g_, d, t_, p, fma_only());
}

std::unique_ptr<ConvLayer> make_conv(ConvApi api, const ConvGeometry& g, DType t, Layout l, bool tf32) {
  if (api == ConvApi::Graph) return std::make_unique<ConvGraph>(g, t, l, tf32);
  return std::make_unique<Conv2d>(g, t, l, tf32);
}

AlgoChooser::AlgoChooser(cudnnHandle_t h, const ConvPolicy& p, AutotuneCache* cache)
    : h_(h), p_(p), cache_(cache) {}

void AlgoChooser::configure(ConvLayer& conv) {
  const std::string key = conv.geometry().key();
  if (const ConvAlgos* hit = cache_ ? cache_->find(key) : nullptr)
    if (conv.use(h_, *hit)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const ConvAlgos a = conv.search(h_, p_);
  if (p_.policy == AlgoPolicy::Autotune) {
    search_s_ += seconds_since(t0);
    ++searched_;
  }
  if (!conv.use(h_, a)) throw Fatal("cuDNN rejected the algorithms it chose for conv " + key);
  if (cache_) cache_->put(key, a);
}
