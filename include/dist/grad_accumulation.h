// Gradient accumulation over micro-batches (--accumulate N): N forward/backward passes of --batch
// images each, their gradients summed in fp32, then one all-reduce and one optimizer step. Fewer
// all-reduces per image: the network's traffic per image drops N times.
//
// A step's micro-batches are the slices of its global batch (data/augment.h's EpochPlan): micro-batch
// j of rank r takes slice j * ranks + r of the step's ranks * N slices, so `--accumulate N` on one GPU
// sees, slice for slice, the images (and their crops and flips) that `--gpus N` gives its N ranks,
// and batch norm normalises over the same --batch images. Each micro-batch's gradient is scaled by
// 1/N and summed in fp32 in micro-batch order (kernels/accumulate.h): with N = 2 in an fp32 build
// that is, bit for bit, the average NCCL makes of two ranks' gradients, so `--accumulate 2` on one
// GPU trains as `--gpus 2` does. Against one batch of N x --batch images it cannot be equal, by
// design as in PyTorch: batch norm's statistics are those of each micro-batch, not of the whole.
//
// Only the last micro-batch reduces: with several ranks, each bucket's sums are folded into its
// gradients on the communication stream just before its all-reduce (DataParallel), so the
// all-reduce still overlaps the last backward; on one GPU they are folded after backward.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/memory.h"
#include "data/augment.h"
#include "model/params.h"

// Where one micro-batch sits in its step.
struct MicroBatch {
  int index = 0, count = 1;
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
  bool accumulates() const { return count > 1; }
};

// The loader's batch index of micro-batch j of step k (of an epoch plan cut in micro-batches of
// --batch per rank).
inline long micro_batch_index(long step_in_epoch, int j, int count) { return step_in_epoch * count + j; }
// A rank's plan of an epoch (its part of a global batch of --batch x ranks: Ranks::my_part) cut to
// `steps` optimizer steps of `count` micro-batches each: the samples of a last, incomplete step are
// dropped with the rest of the pass's remainder.
EpochPlan micro_batch_plan(EpochPlan rank_plan, int steps, int count);

class GradAccumulation {
 public:
  GradAccumulation(const ParamStore& params, int micro_batches);
  int micro_batches() const { return count_; }
  // After a micro-batch's backward, but for the last: its gradients added to the sums (the first
  // replaces them), on `stream`.
  void add(const MicroBatch& m, cudaStream_t stream);
  // The last micro-batch: gradients = sums + its own, over `w_count` weight gradients from
  // `w_offset` and `v_count` vector gradients from `v_offset` (a bucket's ranges).
  void finish(size_t w_offset, size_t w_count, size_t v_offset, size_t v_count, cudaStream_t stream);
  // The same over every gradient (one GPU: no buckets).
  void finish_all(cudaStream_t stream);

 private:
  const ParamStore& params_;
  int count_;
  float scale_;
  DeviceBuffer weight_sums_, vector_sums_;
};
