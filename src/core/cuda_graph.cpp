// Capturing, updating, instantiating and launching a CUDA graph (cuda_graph.h).
#include "core/cuda_graph.h"

#include <memory>
#include <string>
#include <type_traits>

#include "core/check.h"

namespace {

// The captured (not executable) graph: only needed until it is instantiated or applied as an update.
struct GraphDeleter {
  void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
};
using CapturedGraph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// Ends the capture of `stream` whatever state it is in; returns the graph, or null when the capture
// was invalidated (the status says why). The failed calls' errors are cleared, so that the next
// launch check does not report them again.
CapturedGraph end_capture(cudaStream_t stream, cudaError_t& status) {
  cudaGraph_t g = nullptr;
  status = cudaStreamEndCapture(stream, &g);
  if (status != cudaSuccess) cudaGetLastError();
  return CapturedGraph(status == cudaSuccess ? g : nullptr);
}

}  // namespace

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  nodes_ = 0;
  memsets_dropped_ = 0;
  memsets_hoisted_ = 0;
  memsets_as_kernels_ = {};
}

CudaGraph::Instantiation CudaGraph::capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaError_t ended = cudaSuccess;
  try {
    enqueue();
  } catch (const std::exception& e) {
    end_capture(stream, ended);  // a partial graph, if any, is dropped
    // A call that capture forbids invalidates the capture: that is why `enqueue` failed.
    if (ended == cudaErrorStreamCaptureInvalidated) {
      reset();
      throw GraphCaptureError(std::string("stream capture failed: ") + e.what());
    }
    throw;
  }
  CapturedGraph graph = end_capture(stream, ended);
  if (!graph) {
    reset();
    throw GraphCaptureError("stream capture failed: cudaStreamEndCapture returned " + cuda_error_text(ended));
  }
  memsets_dropped_ = 0;
  for (const ZeroedRange& r : zeroed_) memsets_dropped_ += drop_memsets_of_zeroed_range(graph.get(), r);
  memsets_hoisted_ = hoist_memsets_to_start(graph.get(), hoisted_ranges_);
  memsets_as_kernels_ = memsets_to_kernels(graph.get());
  CUDA_CHECK(cudaGraphGetNodes(graph.get(), nullptr, &nodes_));
  if (exec_) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec_, graph.get(), &info) == cudaSuccess) return Instantiation::Updated;
    cudaGetLastError();  // the update was refused (other nodes): not an error, instantiate instead
    cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }
  // Each kernel node keeps the priority of the stream it was captured from (core/handles.h,
  // StreamPriority); without the flag every node would take the priority of the stream the graph
  // is launched into.
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph.get(), cudaGraphInstantiateFlagUseNodePriority);
  if (made != cudaSuccess) {
    cudaGetLastError();
    exec_ = nullptr;
    nodes_ = 0;
    throw GraphCaptureError("cudaGraphInstantiate returned " + cuda_error_text(made));
  }
  return Instantiation::New;
}

void CudaGraph::launch(cudaStream_t stream) const {
  if (!exec_) throw Fatal("internal error: CudaGraph::launch before a successful capture");
  CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}
