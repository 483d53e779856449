// A CUDA graph captured from a stream and replayed: RAII over the executable graph.
//
// capture() records what a function enqueues on a stream, without running any of it; launch()
// runs the recording with one call. Capturing again work of the same shape (the same kinds of
// nodes in the same order, other arguments) updates the executable graph in place with
// cudaGraphExecUpdate, which costs far less than a new instantiation; work the update refuses (other
// nodes) is instantiated anew. The idea is tiny-cuda-nn's CudaGraph (include/tiny-cuda-nn/cuda_graph.h).
// Before instantiating, memsets of zeros into a range whose owner keeps it zero are dropped and
// the other memsets run as kernels (core/graph_memsets.h).
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "core/errors.h"
#include "core/graph_memsets.h"

// The work could not be captured or instantiated: it made a call that stream capture forbids (a
// synchronising copy, an allocation, the legacy default stream), or the driver refused the graph.
// Nothing of the attempted capture ran, the stream is out of capture mode, and the executable graph
// held before, if any, is gone (a failed update leaves it unusable).
struct GraphCaptureError : Fatal {
  using Fatal::Fatal;
};

class CudaGraph {
 public:
  // How the executable graph came about in the latest capture.
  enum class Instantiation { New, Updated };

  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Captures what `enqueue` puts on `stream` and makes it the graph that launch() runs.
  // Thread-local capture mode: only the calling thread is barred from calls that would break the
  // capture, so other threads (the pinned loader's workers, which wait on their copy stream's events
  // and start copies on it) go on as before; a forbidden call on this thread fails inside `enqueue`
  // and becomes a GraphCaptureError. Other exceptions from `enqueue` pass through unchanged.
  Instantiation capture(cudaStream_t stream, const std::function<void()>& enqueue);
  // Enqueues the whole graph on `stream`. Throws a Fatal when nothing was captured.
  void launch(cudaStream_t stream) const;
  bool ready() const { return exec_ != nullptr; }
  // Nodes (kernels, copies, memsets) of the latest capture, as instantiated.
  size_t nodes() const { return nodes_; }
  // The ranges whose memsets later captures drop (their owners keep them zero between uses).
  void drop_memsets_into(std::vector<ZeroedRange> r) { zeroed_ = std::move(r); }
  // The ranges whose memsets later captures move to the graph's start (hoist_memsets_to_start).
  void hoist_memsets_from(std::vector<ZeroedRange> r) { hoisted_ranges_ = std::move(r); }
  // Memsets the latest capture dropped, and moved to its start (neither counted in nodes()).
  size_t memsets_dropped() const { return memsets_dropped_; }
  size_t memsets_hoisted() const { return memsets_hoisted_; }
  // Memsets the latest capture runs as kernels, and how many kernels (not counted in nodes()).
  MemsetRewrite memsets_as_kernels() const { return memsets_as_kernels_; }
  // Drops the executable graph; the next capture instantiates anew.
  void reset();

 private:
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  std::vector<ZeroedRange> zeroed_;
  std::vector<ZeroedRange> hoisted_ranges_;
  size_t memsets_dropped_ = 0, memsets_hoisted_ = 0;
  MemsetRewrite memsets_as_kernels_;
};
