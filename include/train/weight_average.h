// The weight average of --ema D: an exponential moving average of the fp32 master weights, updated
// after every optimizer step taken (kernels/ema.h, inside the step's CUDA graph), evaluated in place
// of the weights, and saved in the checkpoint beside them, so that a resume goes on bit for bit.
// Every rank of several holds the same weights after each step, so each keeps the same average
// without communicating. The BN running statistics are not averaged: evaluation uses them as they are.
#pragma once

#include <vector>

#include <cuda_runtime.h>

#include "core/memory.h"
#include "model/params.h"

class WeightAverage {
 public:
  // An average of `params`' weights (not yet started: start_from or load).
  // decay is kept as the flag gave it: the checkpoint records it, and a resume compares it with --ema.
  WeightAverage(const ParamStore& params, double decay);
  double decay() const { return decay_; }
  float* device() const { return average_.as<float>(); }
  // It starts from the network's weights as they are now (a fresh run, or a resume without one) ...
  void start_from(const ParamStore& params, cudaStream_t stream);
  // ... or from a checkpoint's average.
  void load(const std::vector<float>& saved, cudaStream_t stream);
  std::vector<float> download() const;
  // Puts the average into the network's weights and the weights into the average (refreshing the
  // fp16 working copy); twice, and everything is as it was, bit for bit.
  void swap_with(ParamStore& params, cudaStream_t stream);

 private:
  double decay_;
  size_t count_;
  DeviceBuffer average_;
};

// For its scope the network holds the averaged weights (nothing, without an average), and its own
// weights again at the scope's end, an exception's included: what a save then captures is always
// the trained weights.
class AveragedWeightsIn {
 public:
  AveragedWeightsIn(WeightAverage* average, ParamStore& params, cudaStream_t stream);
  ~AveragedWeightsIn();
  AveragedWeightsIn(const AveragedWeightsIn&) = delete;
  AveragedWeightsIn& operator=(const AveragedWeightsIn&) = delete;

 private:
  WeightAverage* average_;
  ParamStore& params_;
  cudaStream_t stream_;
};
