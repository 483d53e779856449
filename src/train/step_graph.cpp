// The per-step parameter block, the capture plan and the step graph (step_graph.h).
#include "train/step_graph.h"

#include <cstdio>

#include "core/check.h"
#include "core/format.h"
#include "measure/profiling.h"

StepParams make_step_params(long step, int step_in_epoch, const LrSchedule& schedule) {
  return {step, static_cast<float>(schedule.at(step)), step_in_epoch};
}

// ---- StepParamsOnDevice -------------------------------------------------------------------------
StepParamsOnDevice::StepParamsOnDevice(cudaStream_t stream)
    : stream_(stream),
      dev_(sizeof(StepParams), "step parameters"),
      host_(kSlots * sizeof(StepParams), "step parameter slots") {
  for (int i = 0; i < kSlots; ++i) copied_.emplace_back(false);
}

void StepParamsOnDevice::upload(const StepParams& p) {
  Event& copied = copied_[next_];
  StepParams* slot = host_.as<StepParams>() + next_;
  next_ = (next_ + 1) % kSlots;
  // The copy reads the slot when the GPU reaches it, not now: wait until the last copy from this
  // slot has run (immediately, unless the host is kSlots steps ahead; an unrecorded event is done).
  CUDA_CHECK(cudaEventSynchronize(copied));
  *slot = p;
  CUDA_CHECK(cudaMemcpyAsync(dev_.get(), slot, sizeof(StepParams), cudaMemcpyHostToDevice, stream_));
  copied.record(stream_);
}

// ---- StepGraphPlan ------------------------------------------------------------------------------
StepGraphPlan::StepGraphPlan(bool enabled, int graph_rows, int warmup)
    : enabled_(enabled), graph_rows_(graph_rows), warmup_(warmup) {}

StepAction StepGraphPlan::next(const StepShape& s) {
  if (!enabled_ || s.rows != graph_rows_) return StepAction::Eager;
  if (captures_ == 0 && eager_steps_ < warmup_) {
    ++eager_steps_;
    return StepAction::Eager;
  }
  if (valid_ && s == captured_) return StepAction::Replay;
  captured_ = s;
  valid_ = true;
  ++captures_;
  return StepAction::Capture;
}

// ---- StepGraph ----------------------------------------------------------------------------------
namespace {
// Left to itself, cuBLAS takes its workspace from a pool it keeps per stream and allocates into it
// when a stream first needs one; older versions grew memory with every capture that did (PyTorch
// sets a workspace of its own for that reason). One buffer, set before the first step, keeps
// allocations out of the capture, and gives the eager and the graph step the same workspace, so
// that both pick the same GEMM kernels: a --no-cuda-graph run stays bit-identical. It holds as long
// as nobody calls cublasSetStream again (which resets it). 32 MiB: cuBLAS's recommendation for Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

std::string count_text(size_t n) { return with_commas(static_cast<long long>(n)); }
}  // namespace

StepGraph::StepGraph(GpuContext& ctx, int rows, bool graphs, bool enabled)
    : stream_(ctx.stream), graphs_(graphs), plan_(graphs && enabled, rows, kStepGraphWarmupSteps) {
  if (!graphs) return;
  cublas_workspace_ = DeviceBuffer(kCublasWorkspaceBytes, "cuBLAS workspace (CUDA graph builds)");
  CUBLAS_CHECK(cublasSetWorkspace(ctx.cublas, cublas_workspace_.get(), cublas_workspace_.bytes()));
}

void StepGraph::run(long step, const StepShape& shape, const std::function<void()>& enqueue) {
  const StepAction action = plan_.next(shape);
  if (action == StepAction::Eager) {
    enqueue();
    return;
  }
  if (action == StepAction::Capture) {
    NvtxRange r("capture step graph", phase_color::kGrey);
    try {
      if (graph_.capture(stream_, enqueue) == CudaGraph::Instantiation::New) {
        const MemsetRewrite k = graph_.memsets_as_kernels();
        std::printf("step graph: captured at step %ld, %s nodes (%s memsets dropped: their bytes are zero; "
                    "%s zeroed at the start; %s run as %s kernels), replayed from here on\n",
                    step, count_text(graph_.nodes()).c_str(), count_text(graph_.memsets_dropped()).c_str(),
                    count_text(graph_.memsets_hoisted()).c_str(), count_text(k.memsets).c_str(),
                    count_text(k.kernels).c_str());
      }
    } catch (const GraphCaptureError& e) {
      plan_.disable();
      std::fflush(stdout);
      std::fprintf(stderr, "warning: the training step cannot run as a CUDA graph (%s); every step runs eagerly from here on\n",
                   e.what());
      enqueue();  // nothing of the failed capture ran
      return;
    }
  }
  NvtxRange r("step graph", phase_color::kTeal);
  graph_.launch(stream_);
}

std::string StepGraph::describe() const {
  if (!graphs_) return "eager, every kernel launched from the host";
  if (!plan_.enabled()) return "eager, every kernel launched from the host (--no-cuda-graph)";
  return "one CUDA graph (forward, loss, backward, optimizer step), captured after " + std::to_string(plan_.warmup()) +
         " eager steps and replayed; captured again after each evaluation";
}
