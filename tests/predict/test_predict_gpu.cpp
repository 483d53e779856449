// bin/predict's pieces on the GPU, against the trainer's (each test skips, with its reason, without a
// GPU): the network built for inference has the tensors Network::tensor_layout() describes and no
// training state; a model restored from a checkpoint predicts exactly what the trainer's evaluation
// counts as correct, also with its filters converted to the other layout; the features are the pooled
// activations the classifier reads (they reproduce its logits); and every rung of the egress ladder
// delivers, in batch order, the very bytes a synchronous copy after each batch reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kernels/cast.h"
#include "kernels/loss.h"
#include "model/fused_conv.h"
#include "model/gemm_conv.h"
#include "model/inference_network.h"
#include "model/training_network.h"
#include "model/resnet50_spec.h"
#include "pipeline/egress_copy.h"
#include "predict/outputs.h"
#include "predict/weights.h"
#include "support/gpu_test_util.h"
#include "train/checkpointing.h"

namespace {

constexpr int kBatch = 32, kBatches = 5, kClasses = 10;
constexpr size_t kImage = 3 * 32 * 32;

NetConfig config(Layout layout) {
  NetConfig cfg;
  cfg.batch = kBatch;
  cfg.dtype = DType::F32;
  cfg.layout = layout;
  cfg.tf32 = false;  // full fp32: the comparisons below are exact or within 1e-4
  cfg.conv = {AlgoPolicy::Heuristic, true, size_t(256) << 20};
  cfg.conv_api = ConvApi::Legacy;
  cfg.classes = kClasses;
  return cfg;
}

// Random images (NCHW, and the same in NHWC) and labels, kBatches batches resident on the GPU.
struct Batches {
  std::vector<DeviceBuffer> nchw, nhwc, labels;
  Dataset data;  // the labels again, for process_batch
  Batches() {
    std::mt19937 rng(11);
    std::normal_distribution<float> pixel(0.f, 1.f);
    data.count = kBatch * kBatches;
    for (int k = 0; k < kBatches; ++k) {
      std::vector<float> x(kBatch * kImage), y(x.size());
      for (float& v : x) v = pixel(rng);
      for (int n = 0; n < kBatch; ++n)
        for (size_t c = 0; c < 3; ++c)
          for (size_t p = 0; p < 1024; ++p) y[n * kImage + p * 3 + c] = x[n * kImage + c * 1024 + p];
      std::vector<int32_t> l(kBatch);
      for (int32_t& v : l) {
        v = static_cast<int32_t>(rng() % kClasses);
        data.labels.push_back(static_cast<uint8_t>(v));
      }
      nchw.emplace_back(x.size() * 4, "test images");
      nhwc.emplace_back(y.size() * 4, "test images");
      labels.emplace_back(l.size() * 4, "test labels");
      CUDA_CHECK(cudaMemcpy(nchw.back().get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(nhwc.back().get(), y.data(), y.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(labels.back().get(), l.data(), l.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  const void* images(Layout l, int k) const { return (l == Layout::NCHW ? nchw : nhwc)[k].get(); }
};

template <class T>
std::vector<T> download(const void* p, size_t count) {
  std::vector<T> v(count);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

class PredictGpu : public testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU("bin/predict's network and egress");
    ctx_ = std::make_unique<GpuContext>();
    cache_ = std::make_unique<AutotuneCache>("", "predict-test NCHW");
    cache_nhwc_ = std::make_unique<AutotuneCache>("", "predict-test NHWC");
    batches_ = std::make_unique<Batches>();
  }

  // One algorithm cache per layout: its entries are keyed by shape alone, and an NCHW choice given
  // to an NHWC conv is refused by cuDNN (CUDNN_STATUS_NOT_SUPPORTED, seen on the H100).
  AutotuneCache& cache_of(Layout l) { return l == Layout::NCHW ? *cache_ : *cache_nhwc_; }
  std::unique_ptr<TrainingNetwork> training_net(Layout l) {
    return std::make_unique<TrainingNetwork>(config(l), *ctx_, cache_of(l));
  }
  std::unique_ptr<InferenceNetwork> inference_net(Layout l) {
    return std::make_unique<InferenceNetwork>(config(l), *ctx_, cache_of(l));
  }

  // A trained-looking model: initialised, with BN running statistics moved by a few training
  // forwards, captured as bin/train would save it.
  Checkpoint trained_checkpoint(TrainingNetwork& a) {
    a.init_params(5);
    for (int k = 0; k < kBatches; ++k) a.forward(batches_->images(Layout::NCHW, k), true);
    CUDA_CHECK(cudaDeviceSynchronize());
    CheckpointMeta m;
    m.layout = "NCHW";
    return capture_checkpoint(a, m);
  }

  // Images of batch k that process_batch counts as correct, from the network's logits.
  long correct_from_logits(const Network& n, int k, const std::vector<float>& bias) {
    OutputFormat f;
    f.batch = kBatch;
    f.classes = kClasses;
    f.bias = bias;
    f.class_names.assign(kClasses, "c");
    std::vector<uint32_t> images(kBatch);
    for (int r = 0; r < kBatch; ++r) images[r] = static_cast<uint32_t>(k * kBatch + r);
    const std::vector<float> logits = download<float>(n.logits(), size_t(kBatch) * kClasses);
    const BatchResult b = process_batch(f, batches_->data, images.data(), kBatch, logits.data());
    long correct = 0;
    for (int c = 0; c < kClasses; ++c) correct += b.confusion[c * kClasses + c];
    return correct;
  }

  // The logits of n's last forward.
  static ref::Vec logits_of(const Network& n) {
    const std::vector<float> l = download<float>(n.logits(), size_t(kBatch) * kClasses);
    return ref::Vec(l.begin(), l.end());
  }

  // Batch k (NHWC) through the fp32 network `exact` and, cast to fp16, through the fp16 networks
  // `plain` and `other`: the relative errors of plain's and of other's logits against exact's.
  std::pair<double, double> fp16_errors(InferenceNetwork& exact, InferenceNetwork& plain, InferenceNetwork& other,
                                        int k) {
    DeviceBuffer half_images(kBatch * kImage * 2, "fp16 test images");
    const void* images = batches_->images(Layout::NHWC, k);
    cast_f32_to_f16(static_cast<const float*>(images), half_images.get(), kBatch * kImage, ctx_->stream);
    exact.forward(images);
    plain.forward(half_images.get());
    other.forward(half_images.get());
    const ref::Vec want = logits_of(exact);
    return {ref::rel_error(logits_of(plain), want), ref::rel_error(logits_of(other), want)};
  }

  std::unique_ptr<GpuContext> ctx_;
  std::unique_ptr<AutotuneCache> cache_, cache_nhwc_;
  std::unique_ptr<Batches> batches_;
};

std::vector<float> fc_bias(const Checkpoint& c) {
  const ParamTensor& b = Network::tensor_layout(kClasses).params.back();
  return std::vector<float>(c.master.begin() + b.offset, c.master.begin() + b.offset + b.count);
}

TEST_F(PredictGpu, NetworkHasTheTensorLayout) {
  const std::unique_ptr<TrainingNetwork> n = training_net(Layout::NCHW);
  const TensorLayout l = Network::tensor_layout(kClasses);
  const std::vector<ParamTensor>& got = n->params().tensors();
  ASSERT_EQ(got.size(), l.params.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, l.params[i].name);
    EXPECT_EQ(got[i].shape, l.params[i].shape) << got[i].name;
    EXPECT_EQ(got[i].kind, l.params[i].kind) << got[i].name;
    EXPECT_EQ(got[i].offset, l.params[i].offset) << got[i].name;
  }
  std::vector<std::string> running;
  size_t count = 0;
  for (const auto& [name, channels] : l.bns) {
    running.push_back(name + ".running_mean");
    running.push_back(name + ".running_var");
    count += 2 * size_t(channels);
  }
  EXPECT_EQ(n->running_stats_names(), running);
  EXPECT_EQ(n->running_stats_count(), count);
}

TEST_F(PredictGpu, InferenceNetworkKeepsNoTrainingState) {
  size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  std::unique_ptr<InferenceNetwork> inference = inference_net(Layout::NCHW);
  CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  std::unique_ptr<TrainingNetwork> training = training_net(Layout::NCHW);
  CUDA_CHECK(cudaMemGetInfo(&free2, &total));
  EXPECT_LT(free0 - free1, free1 - free2) << "inference must need less memory than training";
  EXPECT_EQ(inference->params().momentum_all(), nullptr);
  EXPECT_THROW(inference->params().weight_grad(0), Fatal);
  inference->init_params(1);  // works without momentum
  inference->forward(batches_->images(Layout::NCHW, 0));
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_F(PredictGpu, PredictionsCountWhatTheTrainersEvaluationCounts) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  const Checkpoint c = trained_checkpoint(*a);
  // The trainer's evaluation: forward with running statistics, the loss kernel counts correct ones.
  DeviceBuffer totals(sizeof(LossTotals), "eval totals");
  CUDA_CHECK(cudaMemset(totals.get(), 0, sizeof(LossTotals)));
  for (int k = 0; k < kBatches; ++k) {
    a->forward(batches_->images(Layout::NCHW, k), false);
    a->loss(batches_->labels[k].as<int32_t>(), totals.as<LossTotals>(), nullptr, nullptr);
  }
  const LossTotals eval = download<LossTotals>(totals.get(), 1)[0];
  ASSERT_EQ(eval.count, unsigned(kBatch * kBatches));
  // bin/predict's path: a network built for inference, restored without momentum.
  std::unique_ptr<InferenceNetwork> b = inference_net(Layout::NCHW);
  restore_checkpoint(*b, c, ctx_->stream);
  long correct = 0;
  for (int k = 0; k < kBatches; ++k) {
    b->forward(batches_->images(Layout::NCHW, k));
    correct += correct_from_logits(*b, k, fc_bias(c));
  }
  EXPECT_EQ(correct, long(eval.correct));
  // The same checkpoint in an NHWC build: filters rearranged on the host, logits within fp32 error.
  Checkpoint nhwc = c;
  nhwc.master = convert_filters(c.master, Network::tensor_layout(kClasses), Layout::NCHW, Layout::NHWC);
  std::unique_ptr<InferenceNetwork> h = inference_net(Layout::NHWC);
  restore_checkpoint(*h, nhwc, ctx_->stream);
  for (int k = 0; k < kBatches; ++k) {
    b->forward(batches_->images(Layout::NCHW, k));
    h->forward(batches_->images(Layout::NHWC, k));
    const std::vector<float> want = download<float>(b->logits(), size_t(kBatch) * kClasses);
    const std::vector<float> got = download<float>(h->logits(), size_t(kBatch) * kClasses);
    EXPECT_CLOSE(ref::Vec(got.begin(), got.end()), ref::Vec(want.begin(), want.end()), 1e-4);
  }
}

TEST_F(PredictGpu, FeaturesAreWhatTheClassifierReads) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  const Checkpoint c = trained_checkpoint(*a);
  std::unique_ptr<InferenceNetwork> b = inference_net(Layout::NCHW);
  restore_checkpoint(*b, c, ctx_->stream);
  b->forward(batches_->images(Layout::NCHW, 2));
  const int F = b->feature_count();
  ASSERT_EQ(F, 2048);
  const std::vector<float> feat = download<float>(b->features(), size_t(kBatch) * F);
  const std::vector<float> logits = download<float>(b->logits(), size_t(kBatch) * kClasses);
  const ParamTensor& w = Network::tensor_layout(kClasses).params[Network::tensor_layout(kClasses).params.size() - 2];
  ASSERT_EQ(w.name, "fc.weight");
  ref::Vec want(size_t(kBatch) * kClasses);
  for (int n = 0; n < kBatch; ++n)
    for (int k = 0; k < kClasses; ++k) {
      double s = 0;
      for (int j = 0; j < F; ++j) s += double(feat[size_t(n) * F + j]) * c.master[w.offset + size_t(k) * F + j];
      want[size_t(n) * kClasses + k] = s;
    }
  EXPECT_CLOSE(ref::Vec(logits.begin(), logits.end()), want, 1e-4);
  for (float v : feat) ASSERT_GE(v, 0.f) << "averages of ReLU outputs";
}

// bin/predict's fp16 build with fused batch norm: each BN (running statistics), the residual add and
// the ReLU in the epilogue of the conv before them gives the logits of the same network run with the
// plain convs and our BN passes, within fp16 rounding. The two round in different places (the plain
// convs store their output in fp16 before the BN, the epilogues after it), so each is measured
// against the network in fp32: the fused one may stray from it at most twice as far as the plain
// one (on an H100: 0.12-0.13% and 0.14-0.15% relative error in the logits).
TEST_F(PredictGpu, BatchNormInTheConvEpiloguesGivesTheUnfusedLogits) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  Checkpoint c = trained_checkpoint(*a);
  c.master = convert_filters(c.master, Network::tensor_layout(kClasses), Layout::NCHW, Layout::NHWC);
  AutotuneCache half_cache("", "predict-test fp16 NHWC graph");
  auto half_net = [&](bool fused) {
    NetConfig cfg = config(Layout::NHWC);
    cfg.dtype = DType::F16;
    cfg.conv_api = ConvApi::Graph;
    cfg.conv.deterministic = false;  // fusion is off under --deterministic
    cfg.fused_bn = fused;
    auto n = std::make_unique<InferenceNetwork>(cfg, *ctx_, half_cache);
    restore_checkpoint(*n, c, ctx_->stream);
    return n;
  };
  const std::unique_ptr<InferenceNetwork> plain = half_net(false), fused = half_net(true);
  // Fused or not, inference stores each conv's BN output alone: per image of side s, the stem's 64
  // s^2 values, conv1's and conv2's outputs of the 16 blocks (1048 s^2), the blocks' outputs (256,
  // 512, 1024, 2048 channels at s, s/2, s/4, s/8, in 3, 4, 6, 3 blocks: 1760 s^2) and the 4
  // projection shortcuts' (256 + 128 + 64 + 32 = 480 s^2), in fp16; no conv output before its BN.
  const size_t side2 = 32 * 32;
  EXPECT_EQ(fused->activation_bytes(), size_t(kBatch) * (64 + 1048 + 1760 + 480) * side2 * 2);
  EXPECT_EQ(plain->activation_bytes(), fused->activation_bytes());
  const FusionReport& r = fused->fusion_report();
  EXPECT_EQ(r.tried, 53) << "the stem conv and the 52 convs of the blocks";
  if (r.fused == 0) GTEST_SKIP() << "cuDNN fused no conv here: " << fusion_report_lines(r).back();
  std::printf("[ fusion ] %s\n", fusion_report_lines(r)[0].c_str());
  const std::unique_ptr<InferenceNetwork> exact = inference_net(Layout::NHWC);  // fp32, no TF32
  restore_checkpoint(*exact, c, ctx_->stream);
  for (int k = 0; k < kBatches; ++k) {
    const auto [plain_error, fused_error] = fp16_errors(*exact, *plain, *fused, k);
    std::printf("[ fp16 ] batch %d: relative error against fp32, plain %.4f, fused %.4f\n", k, plain_error, fused_error);
    EXPECT_LE(plain_error, 1e-2) << "the plain fp16 network against fp32, batch " << k;
    EXPECT_LE(fused_error, 2 * plain_error + 1e-3) << "the fused fp16 network against fp32 (plain: " << plain_error
                                                   << "), batch " << k;
    const std::vector<uint16_t> fa = download<uint16_t>(fused->features(), size_t(kBatch) * fused->feature_count());
    for (uint16_t h : fa) ASSERT_FALSE((h & 0x8000) && (h & 0x7fff)) << "pooled ReLU outputs are never negative";
  }
}

// bin/predict's 1x1 convs as cuBLASLt GEMMs with the BN folded into the filter (model/gemm_conv.h),
// every one of them: the autotune cache is given, for each 1x1 stride-1 shape, the GEMM's own measured
// choice made to look far faster than cuDNN's (which is how a measured choice is kept from start to
// start), so the network runs all 33 as GEMMs. Its logits stray from the fp32 network's no further
// than the fp16 network's with plain convs and our BN passes does (twice that, as for the cuDNN
// epilogues above), and a second forward after the weights change folds the new ones.
TEST_F(PredictGpu, GemmConvsWithTheBnFoldedInGiveTheUnfusedLogits) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  Checkpoint c = trained_checkpoint(*a);
  c.master = convert_filters(c.master, Network::tensor_layout(kClasses), Layout::NCHW, Layout::NHWC);
  AutotuneCache cache("", "predict-test GEMM convs");
  NetConfig cfg = config(Layout::NHWC);
  cfg.dtype = DType::F16;
  cfg.conv_api = ConvApi::Graph;
  cfg.conv.policy = AlgoPolicy::Autotune;
  cfg.conv.deterministic = false;  // fusion is off under --deterministic
  cfg.fused_bn = true;
  int gemm_convs = 0;
  auto prefer_gemm = [&](const ConvSpec& conv, FusedPattern p) {
    if (!GemmConv::applies(conv.g)) return;
    ++gemm_convs;
    const std::string key = fused_cache_key(p, conv.g);
    if (cache.find_fused(key)) return;
    const GemmConv measured(ctx_->cublas_lt, p, conv.g, cfg.conv.workspace_limit, ctx_->stream);
    ASSERT_TRUE(measured.ok()) << measured.why();
    FusedChoice choice = measured.choice();
    choice.ms = 1e-6f;  // "measured" far faster than the alternative
    choice.unfused_ms = 1e3f;
    cache.put_fused(key, choice);
  };
  for (const BlockSpec& b : resnet50_spec(cfg).blocks) {
    prefer_gemm(b.c1, FusedPattern::GemmBnRelu);
    prefer_gemm(b.c3, FusedPattern::GemmBnAddRelu);
    if (b.down) prefer_gemm(*b.down, FusedPattern::GemmBn);
  }
  EXPECT_EQ(gemm_convs, 33) << "conv1 and conv3 of the 16 blocks, and stage 1's projection shortcut";
  auto half_net = [&](bool fused, AutotuneCache& k) {
    NetConfig h = cfg;
    h.fused_bn = fused;
    auto n = std::make_unique<InferenceNetwork>(h, *ctx_, k);
    restore_checkpoint(*n, c, ctx_->stream);
    return n;
  };
  AutotuneCache plain_cache("", "predict-test GEMM convs, plain");
  const std::unique_ptr<InferenceNetwork> plain = half_net(false, plain_cache), gemms = half_net(true, cache);
  const FusionReport& r = gemms->fusion_report();
  std::printf("[ fusion ] %s\n", fusion_report_lines(r)[0].c_str());
  EXPECT_EQ(r.gemms, gemm_convs);
  EXPECT_NE(fusion_report_lines(r)[0].find(std::to_string(gemm_convs) + " as cuBLASLt GEMMs"), std::string::npos);
  const std::unique_ptr<InferenceNetwork> exact = inference_net(Layout::NHWC);  // fp32, no TF32
  restore_checkpoint(*exact, c, ctx_->stream);
  auto compare = [&](int k, const char* when) {
    const auto [plain_error, gemm_error] = fp16_errors(*exact, *plain, *gemms, k);
    std::printf("[ fp16 ] batch %d, %s: relative error against fp32, plain %.4f, GEMMs %.4f\n", k, when, plain_error,
                gemm_error);
    EXPECT_LE(plain_error, 1e-2) << when << ", batch " << k;
    EXPECT_LE(gemm_error, 2 * plain_error + 1e-3) << when << " (plain: " << plain_error << "), batch " << k;
  };
  for (int k = 0; k < 2; ++k) compare(k, "as restored");
  // Other weights and running statistics in all three: the folded filters follow them.
  std::unique_ptr<TrainingNetwork> b = training_net(Layout::NCHW);
  b->init_params(9);
  for (int k = 0; k < kBatches; ++k) b->forward(batches_->images(Layout::NCHW, kBatches - 1 - k), true);
  CUDA_CHECK(cudaDeviceSynchronize());
  CheckpointMeta m;
  m.layout = "NCHW";
  c = capture_checkpoint(*b, m);
  c.master = convert_filters(c.master, Network::tensor_layout(kClasses), Layout::NCHW, Layout::NHWC);
  for (InferenceNetwork* n : {plain.get(), gemms.get(), exact.get()}) restore_checkpoint(*n, c, ctx_->stream);
  compare(2, "after other weights were restored");
}

// Autotuning, each fused pattern's measured plan goes into the autotune cache, and the network
// built again takes every plan cuDNN accepted from there instead of timing the candidates again
// (bin/predict's start, H100: fused patterns chosen in 8.4 s before the cache, 1.0-1.7 s with it),
// makes the same fused-or-plain choice for every conv (its first try at this test, re-timing our BN
// passes, fused 51 of 53 convs and then 53), and gives the same logits bit for bit: the same engines.
TEST_F(PredictGpu, FusedPlansComeBackFromTheAutotuneCache) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  Checkpoint c = trained_checkpoint(*a);
  c.master = convert_filters(c.master, Network::tensor_layout(kClasses), Layout::NCHW, Layout::NHWC);
  AutotuneCache cache("", "predict-test fused plans");
  auto build = [&] {
    NetConfig cfg = config(Layout::NHWC);
    cfg.dtype = DType::F16;
    cfg.conv_api = ConvApi::Graph;
    cfg.conv.policy = AlgoPolicy::Autotune;
    cfg.conv.deterministic = false;  // fusion is off under --deterministic
    cfg.fused_bn = true;
    auto n = std::make_unique<InferenceNetwork>(cfg, *ctx_, cache);
    restore_checkpoint(*n, c, ctx_->stream);
    return n;
  };
  const std::unique_ptr<InferenceNetwork> first = build();
  const FusionReport r1 = first->fusion_report();
  if (r1.fused == 0) GTEST_SKIP() << "cuDNN fused no conv here: " << fusion_report_lines(r1).back();
  EXPECT_EQ(r1.plans_cached, 0);
  EXPECT_TRUE(cache.changed());
  int refused_by_cudnn = 0;  // convs, not plans: 0 where cuDNN took every pattern
  for (const FusionRefusal& f : r1.refused) refused_by_cudnn += f.why != kSlowerThanUnfused;

  const std::unique_ptr<InferenceNetwork> second = build();
  const FusionReport r2 = second->fusion_report();
  std::printf("[ fusion ] first:  %s\n[ fusion ] second: %s\n", fusion_report_lines(r1)[0].c_str(),
              fusion_report_lines(r2)[0].c_str());
  EXPECT_EQ(r2.plans, r1.plans);
  EXPECT_GT(r2.plans_cached, 0);
  if (refused_by_cudnn == 0) {
    EXPECT_EQ(r2.plans_cached, r2.plans) << "every plan was accepted, so every one is cached";
  }
  EXPECT_EQ(r2.tried, r1.tried);

  EXPECT_EQ(r2.fused, r1.fused);
  ASSERT_EQ(r2.refused.size(), r1.refused.size());
  for (size_t i = 0; i < r1.refused.size(); ++i) {
    EXPECT_EQ(r2.refused[i].layer, r1.refused[i].layer);
    EXPECT_EQ(r2.refused[i].why, r1.refused[i].why);
  }
  DeviceBuffer half_images(kBatch * kImage * 2, "fp16 test images");
  cast_f32_to_f16(static_cast<const float*>(batches_->images(Layout::NHWC, 0)), half_images.get(), kBatch * kImage,
                  ctx_->stream);
  first->forward(half_images.get());
  const std::vector<float> l1 = download<float>(first->logits(), size_t(kBatch) * kClasses);
  second->forward(half_images.get());
  const std::vector<float> l2 = download<float>(second->logits(), size_t(kBatch) * kClasses);
  EXPECT_EQ(l1, l2) << "the cached plans run the engines that were measured";
  // The fastest engines are no less exact than the plain convs with our BN passes (the bound of
  // BatchNormInTheConvEpiloguesGivesTheUnfusedLogits): speed is never bought with precision.
  AutotuneCache plain_cache("", "predict-test fused plans, plain");
  NetConfig plain_cfg = config(Layout::NHWC);
  plain_cfg.dtype = DType::F16;
  plain_cfg.conv_api = ConvApi::Graph;
  InferenceNetwork plain(plain_cfg, *ctx_, plain_cache);
  restore_checkpoint(plain, c, ctx_->stream);
  const std::unique_ptr<InferenceNetwork> exact = inference_net(Layout::NHWC);  // fp32, no TF32
  restore_checkpoint(*exact, c, ctx_->stream);
  for (int k = 0; k < kBatches; ++k) {
    const auto [plain_error, fused_error] = fp16_errors(*exact, plain, *second, k);
    std::printf("[ fp16 ] batch %d: relative error against fp32, plain %.4f, measured fused %.4f\n", k, plain_error,
                fused_error);
    EXPECT_LE(fused_error, 2 * plain_error + 1e-3) << "the measured fused network, batch " << k;
  }
}

TEST_F(PredictGpu, EveryEgressRungDeliversEachBatchInOrder) {
  std::unique_ptr<TrainingNetwork> a = training_net(Layout::NCHW);
  const Checkpoint c = trained_checkpoint(*a);
  std::unique_ptr<InferenceNetwork> b = inference_net(Layout::NCHW);
  restore_checkpoint(*b, c, ctx_->stream);
  const size_t logit_bytes = size_t(kBatch) * kClasses * 4, feat_bytes = size_t(kBatch) * b->feature_count() * 4;
  // The reference: after each batch, wait and copy.
  std::vector<std::vector<uint8_t>> want;
  for (int k = 0; k < kBatches; ++k) {
    b->forward(batches_->images(Layout::NCHW, k));
    std::vector<uint8_t> bytes = download<uint8_t>(b->logits(), logit_bytes);
    const std::vector<uint8_t> f = download<uint8_t>(b->features(), feat_bytes);
    bytes.insert(bytes.end(), f.begin(), f.end());
    want.push_back(bytes);
  }
  const std::vector<EgressRegion> regions = {{b->logits(), logit_bytes}, {b->features(), feat_bytes}};
  for (const EgressSettings& s : {EgressSettings{false, false, false, false, "baseline"},
                                  EgressSettings{true, false, false, false, "workers"},
                                  EgressSettings{true, true, false, false, "pool"},
                                  EgressSettings{true, true, true, false, "async"},
                                  EgressSettings{true, true, true, true, "stream"}}) {
    SCOPED_TRACE(s.variant);
    const int workers = s.workers ? 3 : 0, slots = workers + 2;
    std::vector<std::vector<uint8_t>> got(kBatches);
    std::vector<int> order;
    {
      CudaEgressEngine engine(s, slots, regions, ctx_->stream);
      EgressPipeline pipe(slots, workers, engine, [&](int k, const void* host) -> EgressPipeline::Commit {
        got[k].assign(static_cast<const uint8_t*>(host), static_cast<const uint8_t*>(host) + logit_bytes + feat_bytes);
        return [&order, k] { order.push_back(k); };
      });
      for (int k = 0; k < kBatches; ++k) {
        b->forward(batches_->images(Layout::NCHW, k));  // overwrites the outputs of batch k - 1
        pipe.submit(k);
      }
      pipe.finish();
    }
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
    for (int k = 0; k < kBatches; ++k) EXPECT_TRUE(got[k] == want[k]) << "batch " << k << " arrived with other bytes";
  }
}

}  // namespace
