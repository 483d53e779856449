// A 2-D convolution through cuDNN (forward, backward-data, backward-filter), no bias.
//
// Layout and precision come from the descriptors it is built with: NCHW filters are KCRS, NHWC
// filters are KRSC. Algorithms are chosen once per distinct shape by an AlgoChooser, either from
// cuDNN's heuristics (the _v7 queries) or by measuring them (cudnnFind*AlgorithmEx) with the results
// cached in memory and in a file.
#pragma once

#include <string>

#include <cudnn.h>

#include "autotune_cache.h"
#include "kernels.h"
#include "types.h"

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
};

class Conv2d {
 public:
  Conv2d(const ConvGeometry& g, DType t, Layout l, bool tf32);
  ~Conv2d();
  Conv2d(const Conv2d&) = delete;
  Conv2d& operator=(const Conv2d&) = delete;

  const ConvGeometry& geometry() const { return g_; }
  // Applies chosen algorithms (and their math types) to this layer.
  void set_algorithms(const ConvAlgos& a);
  const ConvAlgos& algorithms() const { return algos_; }
  size_t workspace_bytes() const;

  void forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const;
  // dx = conv^T(dy), or dx += conv^T(dy) when accumulate (the block input's second gradient path).
  void backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, bool accumulate,
                     void* ws, size_t ws_bytes) const;
  void backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws,
                       size_t ws_bytes) const;

  // Descriptors for the algorithm queries.
  cudnnTensorDescriptor_t x_desc() const { return x_; }
  cudnnTensorDescriptor_t y_desc() const { return y_; }
  cudnnFilterDescriptor_t w_desc() const { return w_; }
  cudnnConvolutionDescriptor_t conv_desc(int direction) const { return conv_[direction]; }
  cudnnMathType_t default_math() const { return math_; }

 private:
  ConvGeometry g_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_[3] = {};  // fwd, bwd data, bwd filter: each its own math type
  cudnnMathType_t math_;
  ConvAlgos algos_;
};

// Chooses algorithms for each distinct shape: from the cache when it has them, else from the
// heuristics or by measurement. Measuring needs device scratch buffers, which it allocates itself.
class AlgoChooser {
 public:
  AlgoChooser(cudnnHandle_t h, const ConvPolicy& p, AutotuneCache* cache);
  ConvAlgos choose(const Conv2d& conv, DType t);
  double search_seconds() const { return search_s_; }
  int searched() const { return searched_; }
  int from_cache() const { return cached_; }

 private:
  cudnnHandle_t h_;
  ConvPolicy p_;
  AutotuneCache* cache_;
  double search_s_ = 0;
  int searched_ = 0, cached_ = 0;
};
