// A convolution through cuDNN's graph API (cudnn-frontend; src/model/cudnn/conv_graph.cpp).
//
// Each direction (forward, backward-data, backward-filter) is a graph of one operation whose
// execution plan is chosen by the plan picker (every engine configuration timed when autotuning,
// else the heuristics' first) and built once, when the layer is configured; a call is then one
// execute of that plan. The legacy cudnnConvolution* calls redo much of this work on every call:
// about 170 us of host time per call on an H100 with cuDNN 9, which left the fp16 trainer waiting on
// the CPU. Layers of the same shape share their built plans.
#pragma once

#include <array>
#include <memory>

#include "model/conv.h"

struct PlannedGraph;

class ConvGraph : public ConvLayer {
 public:
  ConvGraph(const ConvGeometry& g, DType t, Layout l, bool tf32);
  ~ConvGraph() override;
  ConvGraph(const ConvGraph&) = delete;
  ConvGraph& operator=(const ConvGraph&) = delete;

  ConvAlgos search(cudnnHandle_t h, const ConvPolicy& p) override;
  bool use(cudnnHandle_t h, const ConvAlgos& a) override;
  void forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const override;
  void backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, void* ws,
                     size_t ws_bytes) const override;
  void backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws,
                       size_t ws_bytes) const override;

  enum Op { kForward, kBackwardData, kBackwardFilter, kOps };

 private:
  void run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws, size_t ws_bytes) const;

  Layout layout_;
  std::array<std::shared_ptr<const PlannedGraph>, kOps> plans_;
};
