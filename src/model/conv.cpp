// Convolutions through cuDNN's legacy API, and the chooser that configures every conv layer.
#include "model/conv.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/memory.h"

std::string ConvGeometry::key() const {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "n%d.c%d.h%d.w%d.k%d.r%d.s%d.p%d", n, c, h, w, k, r, stride, pad);
  return buf;
}

const char* ConvLayer::op_name(Op op) {
  return op == kForward ? "forward" : op == kBackwardData ? "backward-data" : "backward-filter";
}

size_t ConvLayer::workspace_bytes() const {
  return std::max({algos_.fwd.workspace, algos_.bwd_data.workspace, algos_.bwd_filter.workspace});
}

Conv2d::Conv2d(const ConvGeometry& g, DType t, Layout l, bool tf32) : ConvLayer(g, t, tf32) {
  const cudnnDataType_t dt = t == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF;
  const cudnnTensorFormat_t fmt = l == Layout::NCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
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

bool Conv2d::use(cudnnHandle_t, const ConvAlgos& a, const ConvPolicy&) {
  // A cached choice naming an algorithm or math type this cuDNN does not have (a corrupt or hand-
  // edited file) is refused, so the shape is searched again rather than failing at its first call.
  const int algorithms[kOps] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};
  for (int op = 0; op < kOps; ++op) {
    const int algo = algorithm_number(a[op].algo);
    if (algo < 0 || algo >= algorithms[op] || a[op].math < 0 || a[op].math > int(CUDNN_FMA_MATH)) return false;
  }
  algos_ = a;
  for (int op = 0; op < kOps; ++op)
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv_[op], static_cast<cudnnMathType_t>(a[op].math)));
  return true;
}

void Conv2d::run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws,
                 size_t ws_bytes) const {
  const float one = 1.f, zero = 0.f;
  const int algo = algorithm_number(algos_[op].algo);
  if (op == kForward)
    CUDNN_CHECK(cudnnConvolutionForward(h, &one, x_, x, w_, w, conv_[op], cudnnConvolutionFwdAlgo_t(algo), ws,
                                        ws_bytes, &zero, y_, const_cast<void*>(y)));
  else if (op == kBackwardData)
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, w_, w, y_, y, conv_[op], cudnnConvolutionBwdDataAlgo_t(algo),
                                             ws, ws_bytes, &zero, x_, const_cast<void*>(x)));
  else
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, x_, x, y_, y, conv_[op], cudnnConvolutionBwdFilterAlgo_t(algo),
                                               ws, ws_bytes, &zero, w_, const_cast<void*>(w)));
}

// ---- algorithm choice ---------------------------------------------------------------------------
namespace {

// The first result (cuDNN sorts them, fastest or most promising first) that ran, fits the
// workspace, is deterministic when asked, and keeps fp32 off tensor cores under --no-tf32.
template <class Perf>
AlgoChoice pick(const Perf* perf, int count, const ConvPolicy& p, bool fma_only, bool measured,
                ConvLayer::Op op, const ConvGeometry& g) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > p.workspace_limit) continue;
    if (p.deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (fma_only && (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) continue;
    // CUDNN_DEFAULT_MATH still permits TF32 on Ampere and later: under --no-tf32 only FMA will do.
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : r.mathType;
    return {std::to_string(int(r.algo)), static_cast<int>(math), r.memory, measured ? r.time : -1.f};
  }
  throw Fatal(std::string("cuDNN offers no usable ") + ConvLayer::op_name(op) + " algorithm for conv " + g.key() +
              (p.deterministic ? " (deterministic)" : "") + " within a workspace of " +
              format_bytes(p.workspace_limit) + "; try a larger --workspace-mb");
}

}  // namespace

ConvAlgos Conv2d::ranked(cudnnHandle_t h, const ConvPolicy& p, bool measure) const {
  const size_t es = measure ? dtype_size(t_) : 0;  // the heuristics run nothing
  const DeviceBuffer x = scratch_buffer(g_.input().count() * es, "autotune input " + g_.key());
  const DeviceBuffer y = scratch_buffer(g_.output().count() * es, "autotune output " + g_.key());
  const DeviceBuffer w = scratch_buffer(g_.filter_count() * es, "autotune filter " + g_.key());
  const DeviceBuffer ws(measure ? p.workspace_limit : 0, "autotune workspace (--workspace-mb)");
  const int kFwdCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT, kDataCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            kFilterCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  ConvAlgos a;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kFwdCount];
  if (measure)
    CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, x_, x.get(), w_, w.get(), conv_[kForward], y_, y.get(),
                                                       kFwdCount, &n, fwd, ws.get(), ws.bytes()));
  else
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_[kForward], y_, kFwdCount, &n, fwd));
  a.fwd = pick(fwd, n, p, fma_only(), measure, kForward, g_);
  cudnnConvolutionBwdDataAlgoPerf_t bd[kDataCount];
  if (measure)
    CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, w_, w.get(), y_, y.get(), conv_[kBackwardData], x_,
                                                            x.get(), kDataCount, &n, bd, ws.get(), ws.bytes()));
  else
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_[kBackwardData], x_, kDataCount, &n, bd));
  a.bwd_data = pick(bd, n, p, fma_only(), measure, kBackwardData, g_);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kFilterCount];
  if (measure)
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, x_, x.get(), y_, y.get(), conv_[kBackwardFilter], w_,
                                                              w.get(), kFilterCount, &n, bf, ws.get(), ws.bytes()));
  else
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_[kBackwardFilter], w_, kFilterCount, &n, bf));
  a.bwd_filter = pick(bf, n, p, fma_only(), measure, kBackwardFilter, g_);
  return a;
}

ConvAlgos Conv2d::search(cudnnHandle_t h, const ConvPolicy& p) {
  if (p.policy == AlgoPolicy::Heuristic) return ranked(h, p, false);
  // The first search of a process also pays for loading each candidate's kernels (CUDA loads
  // modules lazily), which can rank a slow algorithm first: measure twice, keep the second.
  ranked(h, p, true);
  return ranked(h, p, true);
}

std::unique_ptr<ConvLayer> make_conv(ConvApi api, const ConvGeometry& g, DType t, Layout l, bool tf32) {
  if (api == ConvApi::Graph) return std::make_unique<ConvGraph>(g, t, l, tf32);
  return std::make_unique<Conv2d>(g, t, l, tf32);
}

std::string ConvPolicy::cache_suffix() const {
  return wgrad_sm_target > 0 ? ".wgrad-sms" + std::to_string(wgrad_sm_target) : std::string();
}

void AlgoChooser::configure(ConvLayer& conv) {
  const std::string key = conv.geometry().key() + p_.cache_suffix();
  if (const ConvAlgos* hit = cache_ ? cache_->find(key) : nullptr)
    if (conv.use(h_, *hit, p_)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const ConvAlgos a = conv.search(h_, p_);
  if (p_.policy == AlgoPolicy::Autotune) {
    search_s_ += seconds_since(t0);
    ++searched_;
  }
  if (!conv.use(h_, a, p_)) throw Fatal("cuDNN rejected the algorithms it chose for conv " + key);
  if (cache_) cache_->put(key, a);
}
