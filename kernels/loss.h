// Launchers of the softmax cross-entropy (kernels/loss.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/types.h"

// Running totals kept on the GPU (on-device loss accumulation reads them rarely).
struct LossTotals {
  double loss_sum;
  unsigned long long correct;
  unsigned long long count;
  float last_loss;           // mean loss of the latest batch
  float last_good_loss;      // the latest finite one
  long long first_bad_step;  // first step whose loss was NaN/Inf, -1 if none
};

// Softmax cross-entropy, mean over the valid samples (label >= 0), in one single-block kernel:
// adds the bias to logits in place, accumulates loss/accuracy into totals and, when dlogits is not
// null, writes dlogits = (softmax - target) * loss_scale / valid and dbias (fp32, overwritten).
// The target is the label's one-hot vector, or with label smoothing e (0 <= e < 1) as PyTorch's
// CrossEntropyLoss(label_smoothing=e) has it: 1 - e + e/classes at the label, e/classes elsewhere;
// the loss is -sum(target * log softmax). loss_scale and step (the step index a non-finite loss is
// recorded as the first bad step) are read from device memory, so that a step replayed as a CUDA
// graph uses its own; nullptr: a scale of 1, and no step recorded (evaluation). At most
// kSoftmaxMaxClasses classes.
constexpr int kSoftmaxMaxClasses = 16;
void softmax_xent(float* logits, const float* bias, const int32_t* labels, int n, int classes,
                  void* dlogits, DType dlogits_type, float* dbias, const float* loss_scale, float label_smoothing,
                  LossTotals* totals, const long long* step, cudaStream_t stream);
// history[*slot] = totals->last_loss: keeps each step's loss for --loss-log without a sync, at a
// slot read from device memory (a replayed graph writes where its own step belongs).
void record_loss(const LossTotals* totals, const int* slot, float* history, cudaStream_t stream);
