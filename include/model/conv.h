// A 2-D convolution through cuDNN (forward, backward-data, backward-filter), no bias.
//
// Layout and precision come from the descriptors it is built with: NCHW filters are KCRS, NHWC
// filters are KRSC. Two implementations share one interface (ConvLayer):
//   Conv2d     cuDNN's cudnnConvolution* calls, algorithms from the _v7 heuristics or measured with
//              cudnnFind*AlgorithmEx (src/model/conv.cpp);
//   ConvGraph  cuDNN's graph API through cudnn-frontend (src/model/cudnn/conv_graph.cpp): each
//              direction a graph of one operation whose execution plan the plan picker chooses and
//              builds once, when the layer is configured; a call is then one execute of that plan.
//              The legacy calls redo much of this work on every call: about 170 us of host time per
//              call on an H100 with cuDNN 9, which left the fp16 trainer waiting on the CPU. Layers
//              of the same shape share their built plans.
// An AlgoChooser configures each layer once per distinct shape, from the cache when it has the
// shape, else by the layer's own search (heuristics or measurement).
#pragma once

#include <array>
#include <memory>
#include <string>

#include <cudnn.h>

#include "model/autotune_cache.h"
#include "core/types.h"

struct ConvGeometry {
  int n, c, h, w;       // input
  int k, r;             // output channels, square filter size
  int stride, pad;
  int out_h() const { return (h + 2 * pad - r) / stride + 1; }
  int out_w() const { return (w + 2 * pad - r) / stride + 1; }
  Shape4 input() const { return {n, c, h, w}; }
  Shape4 output() const { return {n, k, out_h(), out_w()}; }
  size_t filter_count() const { return size_t(k) * c * r * r; }
  std::string key() const;  // "n128.c64.h32.w32.k64.r3.s1.p1"
};

struct ConvPolicy {
  AlgoPolicy policy = AlgoPolicy::Heuristic;
  bool deterministic = false;
  size_t workspace_limit = size_t(1) << 30;
  // The SMs the weight gradient's plan is chosen for (cuDNN's SM-count target), 0: the device's.
  // Graph API only (ConvGraph; the legacy calls take none): training's weight gradients run on a
  // stream of their own beside the data gradients (TrainingNetwork, LaneCudnnSms).
  int wgrad_sm_target = 0;
  // The suffix that keeps choices made under such a target apart in the autotune cache.
  std::string cache_suffix() const;
};

// What the network asks of a convolution, whichever cuDNN API runs it.
class ConvLayer {
 public:
  enum Op { kForward, kBackwardData, kBackwardFilter, kOps };  // the directions, as ConvAlgos indexes them
  static const char* op_name(Op op);                             // "forward", "backward-data", ...

  virtual ~ConvLayer() = default;
  ConvLayer(const ConvLayer&) = delete;
  ConvLayer& operator=(const ConvLayer&) = delete;
  const ConvGeometry& geometry() const { return g_; }
  // fp32 without TF32: only full-precision (FMA) kernels may be chosen.
  bool fma_only() const { return t_ == DType::F32 && !tf32_; }

  // Finds algorithms for this shape: cuDNN's heuristics, or measured when p.policy is Autotune.
  virtual ConvAlgos search(cudnnHandle_t h, const ConvPolicy& p) = 0;
  // Makes this layer run with `a` (from search() or from the cache, both under `p`); false when `a`
  // cannot be used here (a stale cache entry), so that the caller searches instead.
  virtual bool use(cudnnHandle_t h, const ConvAlgos& a, const ConvPolicy& p) = 0;
  const ConvAlgos& algorithms() const { return algos_; }
  size_t workspace_bytes() const;

  void forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const {
    run(kForward, h, x, w, y, ws, ws_bytes);
  }
  // dx = conv^T(dy).
  void backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, void* ws, size_t ws_bytes) const {
    run(kBackwardData, h, dx, w, dy, ws, ws_bytes);
  }
  void backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws, size_t ws_bytes) const {
    run(kBackwardFilter, h, x, dw, dy, ws, ws_bytes);
  }

 protected:
  ConvLayer(const ConvGeometry& g, DType t, bool tf32) : g_(g), t_(t), tf32_(tf32) {}
  // One direction, its tensors named as the forward pass has them: x (or dx), w (or dw), y (or dy).
  virtual void run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws,
                   size_t ws_bytes) const = 0;
  ConvGeometry g_;
  DType t_;
  bool tf32_;
  ConvAlgos algos_;
};

// The layer for `api`.
std::unique_ptr<ConvLayer> make_conv(ConvApi api, const ConvGeometry& g, DType t, Layout l, bool tf32);

// cuDNN's legacy entry points: descriptors built once, an algorithm enum per direction.
class Conv2d : public ConvLayer {
 public:
  Conv2d(const ConvGeometry& g, DType t, Layout l, bool tf32);
  ~Conv2d() override;

  ConvAlgos search(cudnnHandle_t h, const ConvPolicy& p) override;
  bool use(cudnnHandle_t h, const ConvAlgos& a, const ConvPolicy& p) override;

 private:
  void run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws, size_t ws_bytes) const override;
  // cuDNN's ranking of each direction's algorithms, by its heuristics or measured; the first the policy allows.
  ConvAlgos ranked(cudnnHandle_t h, const ConvPolicy& p, bool measure) const;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_[kOps] = {};  // one per direction: each its own math type
};

struct PlannedGraph;

// cuDNN's graph API (cudnn-frontend): each direction's plan, built once.
class ConvGraph : public ConvLayer {
 public:
  ConvGraph(const ConvGeometry& g, DType t, Layout l, bool tf32) : ConvLayer(g, t, tf32), layout_(l) {}

  ConvAlgos search(cudnnHandle_t h, const ConvPolicy& p) override;
  bool use(cudnnHandle_t h, const ConvAlgos& a, const ConvPolicy& p) override;

 private:
  void run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws, size_t ws_bytes) const override;
  // The key under which layers share a built plan.
  std::string plan_key(Op op, cudnnHandle_t h, const std::string& engine, int sm_target) const;

  Layout layout_;
  std::array<std::shared_ptr<const PlannedGraph>, kOps> plans_;
  std::array<std::shared_ptr<const PlannedGraph>, kOps> searched_;  // search()'s plans, for use() to keep
};

// Configures layers, one distinct shape at a time: from the cache when it has the shape, else by
// the layer's search (whose result goes into the cache).
class AlgoChooser {
 public:
  AlgoChooser(cudnnHandle_t h, const ConvPolicy& p, AutotuneCache* cache) : h_(h), p_(p), cache_(cache) {}
  void configure(ConvLayer& conv);
  double search_seconds() const { return search_s_; }
  int searched() const { return searched_; }

 private:
  cudnnHandle_t h_;
  ConvPolicy p_;
  AutotuneCache* cache_;
  double search_s_ = 0;
  int searched_ = 0;
};
