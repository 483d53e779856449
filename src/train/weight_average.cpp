// The weight average of --ema (weight_average.h): its start, its checkpointed state and its swap.
#include "train/weight_average.h"

#include <cstdio>
#include <exception>

#include "core/check.h"
#include "kernels/ema.h"

WeightAverage::WeightAverage(const ParamStore& params, double decay)
    : decay_(decay), count_(params.total()), average_(params.total() * sizeof(float), "weight average (--ema)") {}

void WeightAverage::start_from(const ParamStore& params, cudaStream_t stream) {
  CUDA_CHECK(cudaMemcpyAsync(device(), params.master_all(), count_ * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

void WeightAverage::load(const std::vector<float>& saved, cudaStream_t stream) {
  if (saved.size() != count_)
    throw Fatal("weight average of " + std::to_string(saved.size()) + " values for " + std::to_string(count_) +
                " parameters");
  CUDA_CHECK(cudaMemcpyAsync(device(), saved.data(), count_ * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // `saved` may go once this returns
}

std::vector<float> WeightAverage::download() const {
  std::vector<float> v(count_);
  CUDA_CHECK(cudaMemcpy(v.data(), device(), count_ * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

void WeightAverage::swap_with(ParamStore& params, cudaStream_t stream) {
  swap_values(params.master_all(), device(), count_, stream);
  params.refresh_working_copy(stream);
}

AveragedWeightsIn::AveragedWeightsIn(WeightAverage* average, ParamStore& params, cudaStream_t stream)
    : average_(average), params_(params), stream_(stream) {
  if (average_) average_->swap_with(params_, stream_);
}

AveragedWeightsIn::~AveragedWeightsIn() {
  if (!average_) return;
  try {
    average_->swap_with(params_, stream_);
  } catch (const std::exception& e) {  // a GPU that fails here has failed the run already
    std::fprintf(stderr, "warning: the weights could not be swapped back after evaluating the average: %s\n", e.what());
  }
}
