// The training step as one CUDA graph: what changes from one step to the next (kept in device
// memory, so that a replayed graph sees it), when the graph must be captured again, and the graph.
//
// A graph replays the kernels, their arguments and the copies exactly as they were captured, so
// everything a step reads that changes between steps must be device memory the graph reads:
//   - StepParams (learning rate, step index, loss-history slot): one 16-byte copy from a pinned
//     host slot before every step, eager or replayed (StepParamsOnDevice);
//   - the loss scale: device memory already (ScalerState), updated by the step itself;
//   - the batch: the loaders write every batch into the same two device buffers, before the graph
//     (the pinned loader's normalisation kernel, which runs anyway, reads its rotating staging
//     buffers and writes one fixed images buffer; the labels are copied into one fixed buffer), so
//     one graph serves every batch with no copy beyond that pass; a graph per ring slot would only
//     multiply the captures. The graph is bound to those pointers (StepShape) and captured again
//     should they change.
// Evaluation, and a batch of another size, run eagerly; the eager path and the graph run the same
// enqueue function (train/step.h).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/cuda_graph.h"
#include "core/handles.h"
#include "core/memory.h"
#include "train/schedule.h"

// ---- the per-step parameter block ---------------------------------------------------------------
// Read by the step's kernels from device memory; its layout is fixed (tests/train/test_step_graph.cpp).
struct StepParams {
  long long step;  // 0-based index of this step in the whole run (the loss kernel's first_bad_step)
  float lr;        // this step's learning rate (the SGD kernel)
  int loss_slot;   // where this step's loss lands in the loss history: its index in the epoch
};
static_assert(sizeof(StepParams) == 16, "StepParams is copied to the GPU as 16 bytes");

// The parameters of step `step`, the `step_in_epoch`-th of its epoch: the learning rate is the
// schedule's, rounded to float as the kernel uses it.
StepParams make_step_params(long step, int step_in_epoch, const LrSchedule& schedule);

// One StepParams block in device memory, written before each step by one cudaMemcpyAsync on the
// compute stream from a ring of pinned host slots. A slot is rewritten only after the copy that
// read it has run (an event per slot): the host enqueues steps ahead of the GPU, and a single slot
// would be overwritten before its copy ran.
class StepParamsOnDevice {
 public:
  explicit StepParamsOnDevice(cudaStream_t stream);
  // Where the kernels read the current step's parameters (the same address for every step).
  const StepParams* device() const { return dev_.as<StepParams>(); }
  // Enqueues the copy of `p` on the stream: it is what every kernel enqueued after it sees.
  void upload(const StepParams& p);

 private:
  static constexpr int kSlots = 8;  // more than the steps the host can run ahead (the loader's ring holds 3)
  cudaStream_t stream_;
  DeviceBuffer dev_;
  PinnedBuffer host_;
  std::vector<Event> copied_;
  int next_ = 0;
};

// ---- when to capture ----------------------------------------------------------------------------
// What a captured graph is bound to: the batch size and the buffers its kernels read the batch from.
struct StepShape {
  int rows;
  const void* images;
  const void* labels;
  bool operator==(const StepShape& o) const { return rows == o.rows && images == o.images && labels == o.labels; }
};

enum class StepAction { Eager, Capture, Replay };

// Eager steps of the graph's shape before the first capture. The first step loads the kernels'
// modules (CUDA loads them lazily, at first launch) and has cuDNN and cuBLAS set up their per-plan
// and per-handle state; none of that may happen inside a capture. The second is a margin for
// libraries that finish settling on a second call; two eager steps cost nothing measurable.
constexpr int kStepGraphWarmupSteps = 2;

// The decision for each training step, kept apart from CUDA so that it is tested on the CPU.
//   - graphs off (build or --no-cuda-graph): every step eager;
//   - a step whose batch size is not the graph's (a partial batch): eager, the graph is kept;
//   - the first `warmup` steps of the graph's size: eager;
//   - then capture (and launch) once, and replay every later step;
//   - capture again when the batch buffers changed, or after an evaluation pass (invalidate()):
//     evaluation runs the same layers eagerly in inference mode, and re-capturing after it (an
//     update of the executable graph, cheap when the work is unchanged) keeps the graph from ever
//     depending on what evaluation leaves behind, at the cost of one capture per epoch.
class StepGraphPlan {
 public:
  StepGraphPlan(bool enabled, int graph_rows, int warmup);
  // The action for the next training step; Capture means "capture, then launch".
  StepAction next(const StepShape& s);
  void invalidate() { valid_ = false; }
  // Capturing failed: every step runs eagerly from now on.
  void disable() { enabled_ = false; }
  bool enabled() const { return enabled_; }
  int warmup() const { return warmup_; }
  int captures() const { return captures_; }

 private:
  bool enabled_;
  int graph_rows_, warmup_;
  int eager_steps_ = 0;  // of the graph's size, before the first capture
  int captures_ = 0;
  bool valid_ = false;   // a graph captured for captured_ may be replayed
  StepShape captured_{};
};

// ---- the graph ----------------------------------------------------------------------------------
class StepGraph {
 public:
  // `rows`: the training batch. `graphs`: the build replays the step as a graph (OPT_CUDA_GRAPH);
  // `enabled`: and this run does (not --no-cuda-graph). Builds with graphs give cuBLAS a workspace
  // of its own, in both cases (the .cpp says why).
  StepGraph(GpuContext& ctx, int rows, bool graphs, bool enabled);
  // One training step whose GPU work `enqueue` puts on the stream, run as plan() decides, inside
  // NVTX ranges "capture step graph" and "step graph" where it captures and launches. A capture that
  // fails prints one warning and runs this step, and every later one, eagerly.
  void run(long step, const StepShape& shape, const std::function<void()>& enqueue);
  // An evaluation pass ran: the next training step captures again.
  void after_evaluation() { plan_.invalidate(); }
  // Memory the step's code keeps zero between uses (TrainingNetwork::statistics_kept_zero): the captured
  // graph drops the memsets into it.
  void drop_memsets_into(ZeroedRange r) { graph_.drop_memsets_into({r}); }
  // Memory only the work after each of its memsets writes within a step
  // (TrainingNetwork::zeroed_at_step_start): the captured graph zeroes it once, at its start.
  void hoist_memsets_from(std::vector<ZeroedRange> r) { graph_.hoist_memsets_from(std::move(r)); }
  size_t memsets_dropped() const { return graph_.memsets_dropped(); }
  size_t memsets_hoisted() const { return graph_.memsets_hoisted(); }
  const StepGraphPlan& plan() const { return plan_; }
  // For the start-up line: how this run's steps are run.
  std::string describe() const;

 private:
  cudaStream_t stream_;
  bool graphs_;
  StepGraphPlan plan_;
  CudaGraph graph_;
  DeviceBuffer cublas_workspace_;
};
