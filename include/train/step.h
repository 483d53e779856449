// The GPU work of one training step: forward, loss, backward, optimizer step and loss-scale update;
// and of one evaluation batch: forward and loss.
//
// One function enqueues it all on the network's stream. The eager step calls it and the graph step
// captures it (step_graph.h), so both run the same kernels with the same arguments; what changes
// from step to step is read from device memory (StepTargets), never baked into the arguments.
#pragma once

#include <cuda_runtime.h>

#include "dist/grad_accumulation.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "model/training_network.h"
#include "pipeline/loader.h"
#include "train/step_graph.h"

// Where the step's results and its varying inputs live, all in device memory.
struct StepTargets {
  LossTotals* totals;        // the epoch's training totals (loss, accuracy, first bad step)
  ScalerState* scaler;       // the loss scaler: its scale multiplies the loss gradient
  const StepParams* params;  // this step's learning rate, index and loss-history slot
  float* loss_history;       // one loss per step of the epoch (--loss-log)
};

// The optimizer's constants for the whole run.
struct SgdSettings {
  float momentum;
  float weight_decay;
  bool nesterov;
  bool dynamic_loss_scale;   // fp16: an overflow skips the step and halves the scale
  int loss_scale_window;     // good steps before the scale doubles
};

// With --accumulate: which micro-batch of its step this is, and the sums of the step's gradients.
// `folded_by_buckets`: data parallelism folds the sums into each bucket before its all-reduce
// (dist/data_parallel.h); on one GPU the last micro-batch folds them after backward.
struct Accumulation {
  MicroBatch micro;
  GradAccumulation* sums = nullptr;
  bool folded_by_buckets = false;
};

// Enqueues one training step on `stream` (the network's), inside the NVTX ranges "forward",
// "backward" and "optimizer step"; `batch` is where the batch already is, or will be when the
// enqueued work reaches it. With accumulation, one micro-batch of it: every one runs forward and
// backward, the first records the step's loss, all but the last add their gradients to the sums
// ("accumulate") and stop there, and the last goes on to the optimizer step.
void enqueue_train_step(TrainingNetwork& net, const DeviceBatch& batch, const StepTargets& targets, const SgdSettings& sgd,
                        cudaStream_t stream, const Accumulation& acc = {});

// Enqueues the forward pass (BN with its running statistics) and the loss of an evaluation batch,
// adding to `totals` (device memory).
void enqueue_eval_step(TrainingNetwork& net, const DeviceBatch& batch, LossTotals* totals);
