// The network and the loaders at image sides other than 32 (--image-size 64, and Fashion-MNIST's 28,
// whose stages 28, 14, 7, 4 do not all halve evenly) and a class count other than 10, on the GPU:
// shapes (the activations grow with the side squared, the parameters only with the classes), a
// forward and backward pass with finite results, the forward against the CPU reference at sides
// that do not halve evenly, steps that learn a fixed batch, and both loaders delivering exactly the
// CPU's normalised batch. Each test skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/handles.h"
#include "core/memory.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "kernels/batchnorm.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "model/autotune_cache.h"
#include "model/resnet50_spec.h"
#include "model/training_network.h"
#include "pipeline/loader.h"
#include "support/gpu_test_util.h"

namespace {

constexpr int kBatch = 4, kClasses = 5;

struct Counters {
  LossTotals totals;
  ScalerState scaler;
};

// How the network is built: the seed ladder's fp32 NCHW, fp32 or fp16 NHWC, or bin/train's build
// (fp16 NHWC through the graph API, batch norm fused into the convs).
struct Build {
  const char* name;
  DType t;
  Layout l;
  ConvApi api = ConvApi::Legacy;
  bool fused = false;
};
const Build kFp32Nchw{"fp32 NCHW", DType::F32, Layout::NCHW};
const Build kFp32Nhwc{"fp32 NHWC", DType::F32, Layout::NHWC};
const Build kFp16Nhwc{"fp16 NHWC", DType::F16, Layout::NHWC};
const Build kTrainBuild{"fp16 NHWC fused", DType::F16, Layout::NHWC, ConvApi::Graph, true};

NetConfig config(int side, int classes, const Build& b, int batch) {
  NetConfig cfg;
  cfg.batch = batch;
  cfg.dtype = b.t;
  cfg.layout = b.l;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, false, size_t(256) << 20};
  cfg.conv_api = b.api;
  cfg.fused_bn = b.fused;
  cfg.classes = classes;
  cfg.image_side = side;
  return cfg;
}

// A network with its batch, labels and counters on the device; `x` is the batch as uploaded, in the
// build's layout.
struct Net {
  GpuContext ctx;
  AutotuneCache cache{"", "image-size test"};
  TrainingNetwork net;
  std::vector<float> x;
  DeviceBuffer images, labels, counters, lr;  // lr: the SGD kernel reads it from device memory
  Net(int side, int classes, const Build& b, int batch = kBatch)
      : net(config(side, classes, b, batch), ctx, cache),
        x(size_t(batch) * 3 * side * side),
        images(x.size() * dtype_size(b.t), "test images"),
        labels(batch * sizeof(int32_t), "test labels"),
        counters(sizeof(Counters), "test counters"),
        lr(sizeof(float), "test learning rate") {
    net.init_params(3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(2 * to_unit(mix(5, i)) - 1);
    if (b.t == DType::F32) {
      CUDA_CHECK(cudaMemcpy(images.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    } else {
      std::vector<__half> h(x.size());
      for (size_t i = 0; i < x.size(); ++i) h[i] = __float2half(x[i]);
      CUDA_CHECK(cudaMemcpy(images.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % classes;
    CUDA_CHECK(cudaMemcpy(labels.get(), y.data(), y.size() * 4, cudaMemcpyHostToDevice));
    Counters c{};
    c.totals.first_bad_step = -1;
    c.scaler.scale = b.t == DType::F16 ? 1024.f : 1.f;  // as bin/train starts: small fp16 gradients survive
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

// The logits without the fc bias (as TrainingNetwork::logits() holds them) of ResNet-50's training
// forward, in double on the CPU (support/reference.h): the spec the network is built from, walked
// with the network's own parameters (its fp32 master copy), on the batch `x` (NCHW).
ref::Vec reference_logits(const NetConfig& cfg, const ParamStore& p, const ref::Vec& x) {
  std::vector<float> master(p.total());
  CUDA_CHECK(cudaMemcpy(master.data(), p.master_all(), master.size() * 4, cudaMemcpyDeviceToHost));
  std::map<std::string, const ParamTensor*> by_name;
  for (const ParamTensor& t : p.tensors()) by_name[t.name] = &t;
  auto values = [&](const std::string& name) {  // PyTorch order: conv filters KCRS
    const ParamTensor& t = *by_name.at(name);
    ref::Vec v(t.count);
    for (size_t e = 0; e < t.count; ++e) v[e] = master[t.offset + filter_storage_index(t, e, cfg.layout)];
    return v;
  };
  auto conv = [&](const ConvSpec& c, const ref::Vec& in) {
    const ConvGeometry& g = c.g;
    return ref::conv2d_forward({g.n, g.c, g.h, g.w, g.k, g.r, g.r, g.stride, g.pad}, in, values(c.name + ".weight"));
  };
  auto bn = [&](const BnSpec& b, const Shape4& s, const ref::Vec& in) {
    return ref::bn_train_forward({s.n, s.c, s.h, s.w}, in, values(b.name + ".weight"), values(b.name + ".bias"),
                                 double(kBnEps)).y;
  };
  const NetSpec spec = resnet50_spec(cfg);
  ref::Vec a = ref::relu(bn(spec.stem_bn, spec.stem.g.output(), conv(spec.stem, x)));
  for (const BlockSpec& b : spec.blocks) {
    const ref::Vec m1 = ref::relu(bn(b.b1, b.mid1, conv(b.c1, a)));
    const ref::Vec m2 = ref::relu(bn(b.b2, b.mid2, conv(b.c2, m1)));
    const ref::Vec shortcut = b.down ? bn(*b.bdown, b.out, conv(*b.down, a)) : a;
    a = ref::relu(ref::add(bn(b.b3, b.out, conv(b.c3, m2)), shortcut));
  }
  const Shape4 last = spec.blocks.back().out;
  const ref::Vec features = ref::avgpool_forward({last.n, last.c, last.h, last.w}, a);
  return ref::linear_forward(last.n, spec.features, spec.classes, features, values("fc.weight"));
}

TEST(ImageSizeGpu, ShapesFollowTheSideAndTheClasses) {
  SKIP_WITHOUT_GPU("building the network");
  Net n32(32, 10, kFp32Nchw), n64(64, kClasses, kFp32Nchw);
  // The global pool makes the parameters independent of the side; the classifier has one row a class.
  EXPECT_EQ(n32.net.params().total(), 23520842u);
  EXPECT_EQ(n64.net.params().total(), 23520842u - 5u * (2048 + 1));
  // Every activation is side^2 larger.
  EXPECT_EQ(n64.net.activation_bytes(), 4 * n32.net.activation_bytes());
}

void forward_and_backward_are_finite(int side, const Build& b) {
  SCOPED_TRACE(std::string(b.name) + " at " + std::to_string(side) + "x" + std::to_string(side));
  Net n(side, kClasses, b);
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

TEST(ImageSizeGpu, ForwardAndBackwardAt64GiveFiniteLogitsAndGradients) {
  SKIP_WITHOUT_GPU("the network at 64x64");
  for (const Build& b : {kFp32Nchw, kFp16Nhwc}) forward_and_backward_are_finite(64, b);
}

// The NCHW builds refuse 28 (Network::check_image_side); the NHWC ones run it, bin/train's too.
TEST(ImageSizeGpu, ForwardAndBackwardAt28GiveFiniteLogitsAndGradients) {
  SKIP_WITHOUT_GPU("the network at 28x28");
  for (const Build& b : {kFp32Nhwc, kFp16Nhwc, kTrainBuild}) forward_and_backward_are_finite(28, b);
}

// At sides whose stages do not all halve evenly (28: 28, 14, 7, 4; 12: 12, 6, 3, 2) the forward is
// the CPU reference's: fp32 with TF32 off as closely as the parity test holds it to PyTorch's float64,
// bin/train's fused fp16 build as closely as that test holds its logits. The fp16 build is held to it
// at 28 only: at 12 with a batch of 2, layer4's BNs normalise over 8 values a channel, where fp16's
// rounding moves the batch variance enough to put the logits 7% off (H200, 2026-11-27), while fp32
// there matches to 1e-3: the geometry is right, the statistics too few for fp16.
TEST(ImageSizeGpu, ForwardAtSidesThatDoNotHalveEvenlyMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU("the network against the CPU reference");
  constexpr int kReferenceBatch = 2;  // the reference runs ResNet-50 in double on one core
  for (const int side : {12, 28})
    for (const auto& [b, bound] : {std::pair{kFp32Nhwc, 1e-3}, std::pair{kTrainBuild, 3e-2}}) {
      if (side == 12 && b.t == DType::F16) continue;
      SCOPED_TRACE(std::string(b.name) + " at " + std::to_string(side) + "x" + std::to_string(side));
      Net n(side, kClasses, b, kReferenceBatch);
      n.net.forward(n.images.get(), true);
      CUDA_CHECK(cudaStreamSynchronize(n.ctx.stream));
      std::vector<float> logits(size_t(kReferenceBatch) * kClasses);
      CUDA_CHECK(cudaMemcpy(logits.data(), n.net.logits(), logits.size() * 4, cudaMemcpyDeviceToHost));
      const ref::Dims d{kReferenceBatch, 3, side, side};
      const ref::Vec x = gpu_test::quantize(b.t, ref::Vec(n.x.begin(), n.x.end()));  // as uploaded, in b.l
      const ref::Vec want = reference_logits(n.net.config(), n.net.params(), b.l == Layout::NHWC ? ref::nhwc_to_nchw(d, x) : x);
      EXPECT_CLOSE(ref::Vec(logits.begin(), logits.end()), want, bound);
    }
}

void steps_learn_a_fixed_batch(int side, const Build& b) {
  SCOPED_TRACE(std::string(b.name) + " at " + std::to_string(side) + "x" + std::to_string(side));
  Net n(side, kClasses, b);
  const float first = n.step(0.02f);
  float last = first;
  for (int s = 0; s < 25; ++s) last = n.step(0.02f);
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, 0.5f * first) << "25 steps on one batch of 4 should more than halve its loss";
}

TEST(ImageSizeGpu, StepsAt64LearnAFixedBatch) {
  SKIP_WITHOUT_GPU("training at 64x64");
  steps_learn_a_fixed_batch(64, kFp32Nchw);
}

TEST(ImageSizeGpu, StepsAt28LearnAFixedBatch) {
  SKIP_WITHOUT_GPU("training at 28x28");
  for (const Build& b : {kFp32Nhwc, kTrainBuild}) steps_learn_a_fixed_batch(28, b);
}

// Both loaders: what reaches the device is the CPU's normalisation of the assembled batch.
void loaders_deliver_the_normalised_batch(const Dataset& train) {
  const int side = train.side;
  const Normalization norm = compute_normalization(train);
  for (LoaderKind kind : {LoaderKind::Synchronous, LoaderKind::PinnedRing})
    for (const auto& [t, l] : {std::pair{DType::F32, Layout::NCHW}, std::pair{DType::F16, Layout::NHWC}}) {
      SCOPED_TRACE(std::string(loader_name(kind)) + " " + dtype_name(t) + " " + layout_name(l));
      GpuContext ctx;
      const LoaderConfig c{kind, 8, 2, t, l, norm, train.channels, side, ctx.stream};
      std::unique_ptr<BatchLoader> loader = make_loader(c);
      const EpochPlan plan = train_plan(train, 8, 4, 0);
      loader->begin_pass(train, plan, 0);
      for (int k = 0; k < plan.steps; ++k) {
        loader->get(k);
        const DeviceBatch b = loader->copy(k);
        std::vector<uint8_t> u8(8 * train.image_bytes());
        std::vector<int32_t> labels(8), got_labels(8);
        assemble_batch_u8(train, plan, k, l, u8.data(), labels.data());
        std::vector<uint8_t> want(size_t(8) * 3 * side * side * dtype_size(t)), got(want.size());
        normalize_batch_cpu(u8.data(), 8, train.channels, side, l, norm, t, want.data());
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

TEST(ImageSizeGpu, LoadersDeliverTheNormalisedBatchAt64) {
  SKIP_WITHOUT_GPU("the loaders' copies");
  loaders_deliver_the_normalised_batch(make_synthetic(24, 8, 9, 64).train);
}

// Fashion-MNIST at --image-size 28: grey, unpadded, cropped with a pad of 3 (crop_pad_for).
TEST(ImageSizeGpu, LoadersDeliverTheNormalisedBatchOfGreyImagesAt28) {
  SKIP_WITHOUT_GPU("the loaders' copies");
  const int n = 24;
  std::vector<uint8_t> images{0, 0, 8, 3, 0, 0, 0, n, 0, 0, 0, 28, 0, 0, 0, 28}, labels{0, 0, 8, 1, 0, 0, 0, n};
  for (int i = 0; i < n * 28 * 28; ++i) images.push_back(static_cast<uint8_t>(mix(7, uint64_t(i)) >> 56));
  for (int i = 0; i < n; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  const Dataset train = parse_idx(images.data(), images.size(), "images", labels.data(), labels.size(), "labels", 28);
  ASSERT_EQ(train_plan(train, 8, 4, 0).crop_pad, 3);
  loaders_deliver_the_normalised_batch(train);
}

}  // namespace
