// What evaluation does with the recipe's ingredients, on the real network: --ema's averaged weights
// go into the network for an evaluation and come back out bit for bit (the fp16 working copy too),
// also when the evaluation throws. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/cast.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"
#include "train/weight_average.h"

namespace {

using namespace gpu_test;
using ref::Vec;

constexpr int kBatch = 8;

struct Case {
  const char* name;
  DType t;
  Layout l;
};

NetConfig config(const Case& c) {
  NetConfig cfg;
  cfg.batch = kBatch;
  cfg.dtype = c.t;
  cfg.layout = c.l;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, true, size_t(256) << 20};  // deterministic: a pass repeats to the bit
  cfg.conv_api = ConvApi::Graph;
  return cfg;
}

std::vector<uint8_t> bytes_of(const void* device, size_t n) {
  std::vector<uint8_t> host(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost));
  return host;
}

struct Net {
  AutotuneCache cache{"", "eval test"};
  std::unique_ptr<TrainingNetwork> net;
  explicit Net(const NetConfig& cfg) : net(std::make_unique<TrainingNetwork>(cfg, ctx(), cache)) {
    net->init_params(5);
  }
};

// The averaged weights are in the network (master and fp16 working copy) for the scope, and the
// trained ones after it, bit for bit: an exception leaving the scope included.
TEST(GpuWeightAverage, EvaluatedInPlaceAndSwappedBackBitForBit) {
  SKIP_WITHOUT_GPU("the weight average in evaluation");
  Net n(config({"", DType::F16, Layout::NHWC}));
  ParamStore& p = n.net->params();
  const size_t count = p.total(), halves = p.weight_count() * 2;
  WeightAverage average(p, 0.99f);
  average.start_from(p, ctx().stream);
  EXPECT_EQ(bytes_of(average.device(), count * 4), bytes_of(p.master_all(), count * 4)) << "it starts at the weights";

  std::vector<float> other(count);
  for (size_t i = 0; i < count; ++i) other[i] = 0.001f * float(i % 1000) - 0.4f;
  average.load(other, ctx().stream);
  const std::vector<uint8_t> master = bytes_of(p.master_all(), count * 4), working = bytes_of(p.working_copy(), halves);
  DeviceBuffer other_half(halves, "test fp16 average");
  cast_f32_to_f16(average.device(), other_half.get(), p.weight_count(), ctx().stream);
  const std::vector<uint8_t> other_working = bytes_of(other_half.get(), halves);
  {
    const AveragedWeightsIn in(&average, p, ctx().stream);
    std::vector<float> now(count);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(now.data(), p.master_all(), count * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(now, other) << "the network evaluates the average";
    EXPECT_EQ(bytes_of(p.working_copy(), halves), other_working) << "and its fp16 copy";
  }
  EXPECT_EQ(bytes_of(p.master_all(), count * 4), master) << "the trained weights came back";
  EXPECT_EQ(bytes_of(p.working_copy(), halves), working);
  EXPECT_EQ(average.download(), other) << "and the average is itself again";
  try {
    const AveragedWeightsIn in(&average, p, ctx().stream);
    throw std::runtime_error("an image that did not decode");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(bytes_of(p.master_all(), count * 4), master) << "after an exception too";
  EXPECT_EQ(bytes_of(p.working_copy(), halves), working);
  const AveragedWeightsIn none(nullptr, p, ctx().stream);  // no --ema: nothing moves
  EXPECT_EQ(bytes_of(p.master_all(), count * 4), master);
}

}  // namespace
