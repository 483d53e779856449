// What evaluation does with the recipe's ingredients, on the real network: --tta-flip scores each
// batch by the mean of the logits of it and of its mirror, equal to the two passes done by hand; and
// --ema's averaged weights go into the network for an evaluation and come back out bit for bit (the
// fp16 working copy too), also when the evaluation throws. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cast.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"
#include "train/step.h"
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

Vec floats_of(const float* device, size_t n) {
  std::vector<float> host(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
  return Vec(host.begin(), host.end());
}

struct Net {
  AutotuneCache cache{"", "eval test"};
  std::unique_ptr<TrainingNetwork> net;
  explicit Net(const NetConfig& cfg) : net(std::make_unique<TrainingNetwork>(cfg, ctx(), cache)) {
    net->init_params(5);
  }
};

class GpuFlipEvaluation : public testing::TestWithParam<Case> {};

// Loss and accuracy of the flip evaluation against softmax cross-entropy (the CPU reference) of the
// mean of two forward passes made by hand: the batch, and the batch mirrored on the host.
TEST_P(GpuFlipEvaluation, EqualsTheMeanOfTheTwoPassesDoneByHand) {
  SKIP_WITHOUT_GPU("the flip evaluation");
  const Case c = GetParam();
  const NetConfig cfg = config(c);
  Net n(cfg);
  TrainingNetwork& net = *n.net;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{kBatch, 3, 32, 32};
  const Vec x = quantize(c.t, random_normal(rng, d.count()));
  const DeviceTensor images = upload_activation(x, d, c.t, c.l);
  const DeviceTensor mirrored = upload_activation(ref::flip_horizontal(d, x), d, c.t, c.l);
  std::vector<int32_t> labels(kBatch);
  for (int i = 0; i < kBatch; ++i) labels[i] = i == kBatch - 1 ? -1 : int32_t(rng() % 10);  // and a padding row
  DeviceBuffer labels_d(kBatch * sizeof(int32_t), "test labels");
  CUDA_CHECK(cudaMemcpy(labels_d.get(), labels.data(), labels_d.bytes(), cudaMemcpyHostToDevice));
  // BN running statistics near the batch's, so that evaluation's activations stay in range.
  for (int i = 0; i < 20; ++i) net.forward(images.get(), true);

  const size_t logits = size_t(kBatch) * cfg.classes;
  net.forward(images.get(), false);
  const Vec a = floats_of(net.logits(), logits);
  net.forward(mirrored.get(), false);
  const Vec b = floats_of(net.logits(), logits);
  Vec mean(logits);
  for (size_t i = 0; i < logits; ++i) mean[i] = 0.5 * (a[i] + b[i]);
  const ParamTensor& fc_bias = net.params().tensors().back();
  ASSERT_EQ(fc_bias.name, "fc.bias");
  const Vec bias = floats_of(net.params().master_all() + fc_bias.offset, fc_bias.count);
  const ref::XentResult want = ref::softmax_xent(kBatch, cfg.classes, mean, bias, labels, 1.0);
  const ref::XentResult plain = ref::softmax_xent(kBatch, cfg.classes, a, bias, labels, 1.0);

  DeviceBuffer totals_d(2 * sizeof(LossTotals), "test totals");
  CUDA_CHECK(cudaMemset(totals_d.get(), 0, totals_d.bytes()));
  LossTotals* totals = totals_d.as<LossTotals>();
  FlipEvaluation flip(cfg);
  const DeviceBatch batch{images.get(), labels_d.as<int32_t>()};
  enqueue_eval_step(net, batch, totals, &flip, ctx().stream);
  enqueue_eval_step(net, batch, totals + 1, nullptr, ctx().stream);
  LossTotals got[2];
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(got, totals, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got[0].count, static_cast<unsigned long long>(kBatch - 1)) << "the padding row counts nowhere";
  EXPECT_NEAR(got[0].loss_sum, want.loss_sum, 1e-4 * want.loss_sum) << "the flip evaluation's loss";
  EXPECT_EQ(got[0].correct, static_cast<unsigned long long>(want.correct));
  EXPECT_NEAR(got[1].loss_sum, plain.loss_sum, 1e-4 * plain.loss_sum) << "without the flip: the batch alone";
  EXPECT_GT(std::abs(want.loss_sum - plain.loss_sum), 1e-3 * plain.loss_sum)
      << "the mirror changed nothing: the test cannot tell the two evaluations apart";
  EXPECT_EQ(images.download(), to_layout(c.l, d, x)) << "the batch itself is left as it was";
}

INSTANTIATE_TEST_SUITE_P(Builds, GpuFlipEvaluation,
                         testing::Values(Case{"fp32_NCHW", DType::F32, Layout::NCHW},
                                         Case{"fp16_NHWC", DType::F16, Layout::NHWC}),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

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
