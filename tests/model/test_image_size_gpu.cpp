// The network and the loaders at an image side other than 32 (--image-size 64) and a class count
// other than 10, on the GPU: shapes (the activations grow with the side squared, the parameters only
// with the classes), a forward and backward pass with finite results, steps that learn a fixed batch,
// and both loaders delivering exactly the CPU's normalised batch. Each test skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/handles.h"
#include "core/memory.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "pipeline/loader.h"
#include "support/gpu_test_util.h"

namespace {

constexpr int kBatch = 4, kClasses = 5;

struct Counters {
  LossTotals totals;
  ScalerState scaler;
};

NetConfig config(int side, int classes, DType t, Layout l) {
  NetConfig cfg;
  cfg.batch = kBatch;
  cfg.dtype = t;
  cfg.layout = l;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, false, size_t(256) << 20};
  cfg.classes = classes;
  cfg.image_side = side;
  return cfg;
}

// A network with its batch, labels and counters on the device.
struct Net {
  GpuContext ctx;
  AutotuneCache cache{"", "image-size test"};
  TrainingNetwork net;
  DeviceBuffer images, labels, counters, lr;  // lr: the SGD kernel reads it from device memory
  Net(int side, int classes, DType t, Layout l)
      : net(config(side, classes, t, l), ctx, cache),
        images(size_t(kBatch) * 3 * side * side * dtype_size(t), "test images"),
        labels(kBatch * sizeof(int32_t), "test labels"),
        counters(sizeof(Counters), "test counters"),
        lr(sizeof(float), "test learning rate") {
    net.init_params(3);
    std::vector<float> x(size_t(kBatch) * 3 * side * side);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(2 * to_unit(mix(5, i)) - 1);
    if (t == DType::F32) {
      CUDA_CHECK(cudaMemcpy(images.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    } else {
      std::vector<__half> h(x.size());
      for (size_t i = 0; i < x.size(); ++i) h[i] = __float2half(x[i]);
      CUDA_CHECK(cudaMemcpy(images.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> y(kBatch);
    for (int i = 0; i < kBatch; ++i) y[i] = i % classes;
    CUDA_CHECK(cudaMemcpy(labels.get(), y.data(), y.size() * 4, cudaMemcpyHostToDevice));
    Counters c{};
    c.totals.first_bad_step = -1;
    c.scaler.scale = 1.f;
    CUDA_CHECK(cudaMemcpy(counters.get(), &c, sizeof(c), cudaMemcpyHostToDevice));
  }

  // forward + loss + backward, and an SGD step when rate > 0; the batch's mean loss
  float step(float rate) {
    Counters* c = counters.as<Counters>();
    net.forward(images.get(), true);
    net.loss(labels.as<int32_t>(), &c->totals, &c->scaler.scale, nullptr);
    net.backward();
    if (rate > 0) {
      CUDA_CHECK(cudaMemcpy(lr.get(), &rate, sizeof(rate), cudaMemcpyHostToDevice));
      ParamStore& p = net.params();
      const SgdArgs a{p.master_all(), p.momentum_all(), p.weight_grads_all(), p.vector_grads_all(), p.working_copy(),
                      p.total(), p.weight_count(), p.act(), lr.as<float>(), 0.9f, 0.f, true};
      check_grads_finite(a, &c->scaler, ctx.stream);
      sgd_update(a, &c->scaler, ctx.stream);
      loss_scale_update(&c->scaler, false, 1000, ctx.stream);
    }
    Counters host{};
    CUDA_CHECK(cudaMemcpy(&host, c, sizeof(host), cudaMemcpyDeviceToHost));
    return host.totals.last_loss;
  }
};

// A weight gradient (stored in the activation type) as floats.
std::vector<float> weight_grad(const ParamStore& p, int id) {
  const size_t n = p.tensors()[id].count;
  std::vector<float> out(n);
  if (p.act() == DType::F32) {
    CUDA_CHECK(cudaMemcpy(out.data(), p.weight_grad(id), n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<__half> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p.weight_grad(id), n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = __half2float(h[i]);
  }
  return out;
}

TEST(ImageSizeGpu, ShapesFollowTheSideAndTheClasses) {
  SKIP_WITHOUT_GPU("building the network");
  Net n32(32, 10, DType::F32, Layout::NCHW), n64(64, kClasses, DType::F32, Layout::NCHW);
  // The global pool makes the parameters independent of the side; the classifier has one row a class.
  EXPECT_EQ(n32.net.params().total(), 23520842u);
  EXPECT_EQ(n64.net.params().total(), 23520842u - 5u * (2048 + 1));
  // Every activation is side^2 larger.
  EXPECT_EQ(n64.net.activation_bytes(), 4 * n32.net.activation_bytes());
}

TEST(ImageSizeGpu, ForwardAndBackwardAt64GiveFiniteLogitsAndGradients) {
  SKIP_WITHOUT_GPU("the network at 64x64");
  for (const auto& [t, l] : {std::pair{DType::F32, Layout::NCHW}, std::pair{DType::F16, Layout::NHWC}}) {
    SCOPED_TRACE(std::string(dtype_name(t)) + " " + layout_name(l));
    Net n(64, kClasses, t, l);
    const float loss = n.step(0);
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_NEAR(loss, std::log(double(kClasses)), 2.0) << "a fresh network is near chance";
    std::vector<float> logits(size_t(kBatch) * kClasses);
    CUDA_CHECK(cudaMemcpy(logits.data(), n.net.logits(), logits.size() * 4, cudaMemcpyDeviceToHost));
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    ASSERT_EQ(n.net.params().tensors()[0].name, "conv1.weight");
    const std::vector<float> g = weight_grad(n.net.params(), 0);  // the stem's: the last one backward writes
    double norm = 0;
    for (float v : g) norm += double(v) * v;
    EXPECT_TRUE(std::isfinite(norm));
    EXPECT_GT(norm, 0) << "the gradient reached the stem";
  }
}

TEST(ImageSizeGpu, StepsAt64LearnAFixedBatch) {
  SKIP_WITHOUT_GPU("training at 64x64");
  Net n(64, kClasses, DType::F32, Layout::NCHW);
  const float first = n.step(0.02f);
  float last = first;
  for (int s = 0; s < 25; ++s) last = n.step(0.02f);
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, 0.5f * first) << "25 steps on one batch of 4 should more than halve its loss";
}

// Both loaders at 64x64: what reaches the device is the CPU's normalisation of the assembled batch.
TEST(ImageSizeGpu, LoadersDeliverTheNormalisedBatchAt64) {
  SKIP_WITHOUT_GPU("the loaders' copies");
  const int side = 64;
  const DataSplit s = make_synthetic(24, 8, 9, side);
  const Normalization norm = compute_normalization(s.train);
  for (LoaderKind kind : {LoaderKind::Synchronous, LoaderKind::PinnedRing})
    for (const auto& [t, l] : {std::pair{DType::F32, Layout::NCHW}, std::pair{DType::F16, Layout::NHWC}}) {
      SCOPED_TRACE(std::string(loader_name(kind)) + " " + dtype_name(t) + " " + layout_name(l));
      GpuContext ctx;
      const LoaderConfig c{kind, 8, 2, t, l, norm, s.train.channels, side, ctx.stream};
      std::unique_ptr<BatchLoader> loader = make_loader(c);
      const EpochPlan plan = train_plan(s.train, 8, 4, 0);
      loader->begin_pass(s.train, plan, 0);
      for (int k = 0; k < plan.steps; ++k) {
        loader->get(k);
        const DeviceBatch b = loader->copy(k);
        std::vector<uint8_t> u8(8 * s.train.image_bytes());
        std::vector<int32_t> labels(8), got_labels(8);
        assemble_batch_u8(s.train, plan, k, l, u8.data(), labels.data());
        std::vector<uint8_t> want(size_t(8) * 3 * side * side * dtype_size(t)), got(want.size());
        normalize_batch_cpu(u8.data(), 8, s.train.channels, side, l, norm, t, want.data());
        CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
        CUDA_CHECK(cudaMemcpy(got.data(), b.images, got.size(), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(got_labels.data(), b.labels, 8 * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(got_labels, labels) << "batch " << k;
        if (t == DType::F32) {
          const float* g = reinterpret_cast<const float*>(got.data());
          const float* w = reinterpret_cast<const float*>(want.data());
          for (size_t i = 0; i < got.size() / 4; ++i) ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::abs(w[i]))) << i;
        } else {  // the kernel and the host both round one fp32 value to fp16
          const uint16_t* g = reinterpret_cast<const uint16_t*>(got.data());
          const uint16_t* w = reinterpret_cast<const uint16_t*>(want.data());
          for (size_t i = 0; i < got.size() / 2; ++i) ASSERT_LE(std::abs(int(g[i]) - int(w[i])), 1) << i;
        }
      }
    }
}

}  // namespace
