// A convolution through cuDNN's graph (backend) API.
//
// Each direction (forward, backward-data, accumulating backward-data, backward-filter) is an
// operation graph of one node; its engine configuration comes from cuDNN's heuristics (the lists
// of modes A and B, one after the other), either the first usable one or, when measured, the
// fastest of the first few of each list. The execution plan is
// finalized once, when the layer is configured, and the variant packs (the pointers of one call) are
// kept and reused while the pointers stay the same, so a call costs one cudnnBackendExecute. The
// legacy cudnnConvolution* calls redo much of this work on every call: about 170 us of host time
// per call on an H100 with cuDNN 9, which left the fp16 trainer waiting on the CPU.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "model/conv.h"

class ConvGraph : public ConvLayer {
 public:
  ConvGraph(const ConvGeometry& g, DType t, Layout l, bool tf32);
  ~ConvGraph() override;
  ConvGraph(const ConvGraph&) = delete;
  ConvGraph& operator=(const ConvGraph&) = delete;

  ConvAlgos search(cudnnHandle_t h, const ConvPolicy& p) override;
  bool use(cudnnHandle_t h, const ConvAlgos& a) override;
  void forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const override;
  void backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, bool accumulate, void* ws,
                     size_t ws_bytes) const override;
  void backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws,
                       size_t ws_bytes) const override;

  // The directions, in the order of the plans.
  enum Op { kForward, kBackwardData, kBackwardDataAccumulate, kBackwardFilter, kOps };
  // A direction's configurations: the rank where mode B's list begins, and how many there are in
  // all (an AlgoChoice's algo is a rank in [0, all)).
  struct ListSizes {
    size_t second, all;
  };
  ListSizes heuristic_lists(Op op, cudnnHandle_t h);
  struct Direction;  // one operation graph, its candidate plans and the chosen one

 private:
  Direction& direction(Op op, cudnnHandle_t h);  // its graph and heuristics, built on first use
  void run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws, size_t ws_bytes) const;

  Layout layout_;
  std::array<std::unique_ptr<Direction>, kOps> dirs_;
};
