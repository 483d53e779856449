// The GPU work of one training step: forward, loss, backward, optimizer step and loss-scale update;
// and of one evaluation batch: forward and loss.
//
// One function enqueues it all on the network's stream. The eager step calls it and the graph step
// captures it (step_graph.h), so both run the same kernels with the same arguments; what changes
// from step to step is read from device memory (StepTargets), never baked into the arguments.
#pragma once

#include <cuda_runtime.h>

#include "kernels/ema.h"
#include "dist/grad_accumulation.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/tta.h"
#include "model/training_network.h"
#include "pipeline/loader.h"
#include "train/step_graph.h"

// Where the step's results and its varying inputs live, all in device memory.
struct StepTargets {
  LossTotals* totals;        // the epoch's training totals (loss, accuracy, first bad step)
  ScalerState* scaler;       // the loss scaler: its scale multiplies the loss gradient
  const StepParams* params;  // this step's learning rate, index and loss-history slot
  float* loss_history;       // one loss per step of the epoch (--loss-log)
  float* average = nullptr;  // the weight average (--ema; train/weight_average.h), or nullptr: none
};

// The step's constants for the whole run: the optimizer's, and the recipe's ingredients.
struct StepSettings {
  float momentum;
  float weight_decay;
  bool nesterov;
  bool dynamic_loss_scale;   // fp16: an overflow skips the step and halves the scale
  int loss_scale_window;     // good steps before the scale doubles
  float label_smoothing = 0.f;  // of the loss's target (--label-smoothing)
  float ema_decay = 0.f;        // of the weight average (--ema), where StepTargets has one
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
// "backward" and "optimizer step" (which updates the weight average too, where there is one);
// `batch` is where the batch already is, or will be when the enqueued work reaches it. With
// accumulation, one micro-batch of it: every one runs forward and backward, the first records the
// step's loss, all but the last add their gradients to the sums ("accumulate") and stop there, and
// the last goes on to the optimizer step.
void enqueue_train_step(TrainingNetwork& net, const DeviceBatch& batch, const StepTargets& targets,
                        const StepSettings& settings, cudaStream_t stream, const Accumulation& acc = {});

// Evaluation with --tta-flip: each batch and its horizontal mirror go through the network, and the
// loss and accuracy are those of the mean of the two passes' logits (logits, not softmax outputs:
// as airbench averages them, and the one loss kernel serves). What it needs beside the network: the
// mirrored batch and the first pass's logits.
struct FlipEvaluation {
  explicit FlipEvaluation(const NetConfig& cfg);
  Shape4 images;           // the batch's shape
  DeviceBuffer mirrored;   // the batch, mirrored, in the network's type and layout
  DeviceBuffer logits;     // the first pass's logits
};

// Enqueues the forward pass (BN with its running statistics) and the loss of an evaluation batch,
// adding to `totals` (device memory); with `flip` (not nullptr), of the batch and its mirror.
void enqueue_eval_step(TrainingNetwork& net, const DeviceBatch& batch, LossTotals* totals, FlipEvaluation* flip,
                       cudaStream_t stream);
