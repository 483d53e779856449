// The model's cuDNN convolution layers (Conv2d, the legacy API, and ConvGraph, the graph API) and
// its cuBLAS linear layer, forward and backward against the CPU references in double
// (support/reference.h), in each precision and layout they run in, and how the convolutions'
// algorithms are chosen. How the tests compare and their error bounds: support/gpu_test_util.h.
// The tests of our own kernels are in tests/kernels/. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>

#include "model/conv.h"
#include "model/linear.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// ================================================================================================
// Convolution (cuDNN through Conv2d, the legacy API, and ConvGraph, the graph API)
// ================================================================================================

enum class Precision { F32, TF32, F16 };
const char* precision_name(Precision p) { return p == Precision::F32 ? "fp32" : p == Precision::TF32 ? "tf32" : "fp16"; }

struct ConvCase {
  const char* name;
  ConvGeometry g;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name << " (" << c.g.key() << ")"; }

// The network's shapes at a small batch and resolution.
const ConvCase kConvCases[] = {
    {"1x1", {4, 64, 8, 8, 32, 1, 1, 0}},        // bottleneck reduce / expand
    {"3x3", {4, 16, 8, 8, 16, 3, 1, 1}},        // bottleneck 3x3
    {"3x3s2", {4, 16, 16, 16, 32, 3, 2, 1}},    // first 3x3 of stages 2-4
    {"1x1s2", {4, 32, 16, 16, 64, 1, 2, 0}},    // projection shortcut
    {"stem", {4, 3, 16, 16, 64, 3, 1, 1}},      // 3 -> 64 stem
    // Odd sides, as at --image-size 28 (stages 28, 14, 7, 4): a 7x7 stage, and the stride-2 convs
    // into it (14 -> 7) and out of it (7 -> 4), where the last window reaches into the padding.
    {"3x3_7x7", {4, 16, 7, 7, 16, 3, 1, 1}},
    {"3x3s2_14to7", {4, 16, 14, 14, 32, 3, 2, 1}},
    {"3x3s2_7to4", {4, 16, 7, 7, 32, 3, 2, 1}},
    {"1x1s2_7to4", {4, 32, 7, 7, 64, 1, 2, 0}},
};

using ConvParam = std::tuple<ConvCase, Precision, Layout, AlgoPolicy, ConvApi>;

class GpuConv : public testing::TestWithParam<ConvParam> {};

std::string conv_param_name(const testing::TestParamInfo<ConvParam>& info) {
  const auto& [c, p, l, policy, api] = info.param;
  return std::string(c.name) + "_" + precision_name(p) + "_" + layout_name(l) + "_" + algo_policy_name(policy) + "_" +
         conv_api_name(api);
}

// Forward, backward-data and backward-filter of one shape.
TEST_P(GpuConv, MatchesReference) {
  SKIP_WITHOUT_GPU("the cuDNN convolution");
  const auto& [cs, prec, layout, policy, api] = GetParam();
  const DType t = prec == Precision::F16 ? DType::F16 : DType::F32;
  const double bound = prec == Precision::F32 ? kTolF32 : prec == Precision::TF32 ? kTolTf32 : kTolF16;
  const ConvGeometry& g = cs.g;
  const ref::ConvDims rg = conv_dims(g);
  const ref::Dims xd = rg.input(), yd = rg.output();
  const ref::Dims wd{g.k, g.c, g.r, g.r};  // KCRS is NCHW with N=K, H=R, W=S; KRSC is its NHWC

  GpuContext& c = ctx();
  const std::unique_ptr<ConvLayer> layer = make_conv(api, g, t, layout, prec == Precision::TF32);
  ConvLayer& conv = *layer;
  AlgoChooser chooser(c.cudnn, ConvPolicy{policy, false, size_t(256) << 20}, nullptr);
  chooser.configure(conv);
  DeviceBuffer ws(conv.workspace_bytes(), "conv test workspace");

  std::mt19937_64 rng = test_rng();
  const Vec x = quantize(t, random_normal(rng, xd.count()));
  const Vec w = quantize(t, random_normal(rng, wd.count(), 0.0, 1.0 / std::sqrt(double(g.c) * g.r * g.r)));
  const Vec dy = quantize(t, random_normal(rng, yd.count()));
  const DeviceTensor x_d = upload_activation(x, xd, t, layout);
  const DeviceTensor w_d = upload_activation(w, wd, t, layout);
  const DeviceTensor dy_d = upload_activation(dy, yd, t, layout);

  DeviceTensor y(yd.count(), t);
  y.poison();
  conv.forward(c.cudnn, x_d.get(), w_d.get(), y.get(), ws.get(), ws.bytes());
  EXPECT_CLOSE(download_activation(y, yd, layout), ref::conv2d_forward(rg, x, w), bound) << "forward";

  DeviceTensor dx(xd.count(), t);
  dx.poison();
  conv.backward_data(c.cudnn, dy_d.get(), w_d.get(), dx.get(), ws.get(), ws.bytes());
  EXPECT_CLOSE(download_activation(dx, xd, layout), ref::conv2d_backward_data(rg, dy, w), bound) << "backward_data";

  DeviceTensor dw(wd.count(), t);
  dw.poison();
  conv.backward_filter(c.cudnn, x_d.get(), dy_d.get(), dw.get(), ws.get(), ws.bytes());
  EXPECT_CLOSE(download_activation(dw, wd, layout), ref::conv2d_backward_filter(rg, x, dy), bound)
      << "backward_filter";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuConv,
                         testing::Combine(testing::ValuesIn(kConvCases),
                                          testing::Values(Precision::F32, Precision::TF32, Precision::F16),
                                          testing::Values(Layout::NCHW, Layout::NHWC),
                                          testing::Values(AlgoPolicy::Heuristic, AlgoPolicy::Autotune),
                                          testing::Values(ConvApi::Legacy, ConvApi::Graph)),
                         conv_param_name);

// --no-tf32 must keep fp32 convs off tensor cores in all directions. Legacy API: the math type a
// chosen algorithm reports is written back into the descriptor (Conv2d::use), and on Ampere and
// later CUDNN_DEFAULT_MATH permits TF32: only CUDNN_FMA_MATH guarantees full fp32 products. (Graph
// API: the plan picker refuses engines with cuDNN's TENSOR_CORE or DOWN_CONVERT_INPUTS notes; the
// fp32 cases of MatchesReference, held to fp32's bound, would fail on a TF32 engine.)
TEST(GpuConvAlgos, NoTf32ChoosesFmaMathInEveryDirection) {
  SKIP_WITHOUT_GPU("cuDNN's algorithm choice");
  GpuContext& c = ctx();
  for (const ConvApi api : {ConvApi::Legacy})
    for (const AlgoPolicy policy : {AlgoPolicy::Heuristic, AlgoPolicy::Autotune})
      for (const Layout l : {Layout::NCHW, Layout::NHWC})
        for (const ConvCase& cs : kConvCases) {
          SCOPED_TRACE(std::string(cs.name) + " " + layout_name(l) + " " + algo_policy_name(policy) + " " +
                       conv_api_name(api));
          const std::unique_ptr<ConvLayer> conv = make_conv(api, cs.g, DType::F32, l, false);
          AlgoChooser chooser(c.cudnn, ConvPolicy{policy, false, size_t(256) << 20}, nullptr);
          chooser.configure(*conv);
          const ConvAlgos& a = conv->algorithms();
          EXPECT_EQ(a.fwd.math, int(CUDNN_FMA_MATH)) << "forward algo " << a.fwd.algo;
          EXPECT_EQ(a.bwd_data.math, int(CUDNN_FMA_MATH)) << "backward-data algo " << a.bwd_data.algo;
          EXPECT_EQ(a.bwd_filter.math, int(CUDNN_FMA_MATH)) << "backward-filter algo " << a.bwd_filter.algo;
        }
}

// A choice taken from the autotune cache builds the same plans as the search that produced it, and
// an entry naming an engine cuDNN does not have, or naming none, is refused (so it is searched).
TEST(GpuConvAlgos, GraphPlansFromTheCacheMatchTheSearch) {
  SKIP_WITHOUT_GPU("cuDNN's graph API");
  GpuContext& c = ctx();
  const ConvGeometry& g = kConvCases[1].g;
  AutotuneCache cache("", "test");
  ConvGraph first(g, DType::F16, Layout::NHWC, false), second(g, DType::F16, Layout::NHWC, false);
  AlgoChooser chooser(c.cudnn, ConvPolicy{AlgoPolicy::Autotune, false, size_t(256) << 20}, &cache);
  chooser.configure(first);
  EXPECT_EQ(chooser.searched(), 1);
  chooser.configure(second);
  EXPECT_EQ(chooser.searched(), 1) << "the second layer of the same shape searched again";
  EXPECT_EQ(first.algorithms().fwd.algo, second.algorithms().fwd.algo);
  EXPECT_EQ(first.algorithms().bwd_filter.algo, second.algorithms().bwd_filter.algo);
  ConvGraph third(g, DType::F16, Layout::NHWC, false);
  for (const char* engine : {"eng99999", "eng1_k99999=1", "3", "engine"}) {
    ConvAlgos stale = first.algorithms();
    stale.fwd.algo = engine;
    EXPECT_FALSE(third.use(c.cudnn, stale, {})) << engine;
  }
}

// The legacy API's choice from the cache is an algorithm number and a math type: one this cuDNN
// does not have, or a graph-API engine tag, is refused.
TEST(GpuConvAlgos, LegacyChoicesCuDnnDoesNotHaveAreRefused) {
  SKIP_WITHOUT_GPU("cuDNN's legacy API");
  GpuContext& c = ctx();
  const ConvGeometry& g = kConvCases[1].g;
  Conv2d conv(g, DType::F16, Layout::NHWC, false);
  AlgoChooser chooser(c.cudnn, ConvPolicy{AlgoPolicy::Heuristic, false, size_t(256) << 20}, nullptr);
  chooser.configure(conv);
  const ConvAlgos good = conv.algorithms();
  EXPECT_TRUE(conv.use(c.cudnn, good, {}));
  ConvAlgos bad = good;
  bad.fwd.algo = std::to_string(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  EXPECT_FALSE(conv.use(c.cudnn, bad, {}));
  bad = good;
  bad.bwd_filter.algo = "70";
  EXPECT_FALSE(conv.use(c.cudnn, bad, {}));
  bad = good;
  bad.bwd_data.algo = "eng1_k2=3";
  EXPECT_FALSE(conv.use(c.cudnn, bad, {}));
  bad = good;
  bad.bwd_data.math = 9;
  EXPECT_FALSE(conv.use(c.cudnn, bad, {}));
  EXPECT_EQ(conv.algorithms(), good) << "a refused choice leaves the layer as it was";
}

// An autotuned choice (every engine configuration of both heuristics lists timed) computes the
// reference forward, and its engine tag, as the autotune cache keeps it, builds the same engine in a
// layer made after the first is gone (as in a later run reading the cache): both layers' outputs
// are equal bit for bit.
TEST(GpuConvAlgos, AnEngineTagRebuildsTheEngineItNames) {
  SKIP_WITHOUT_GPU("cuDNN's graph API");
  GpuContext& c = ctx();
  const ConvGeometry& g = kConvCases[1].g;
  const ref::ConvDims rg = conv_dims(g);
  const ref::Dims xd = rg.input(), yd = rg.output(), wd{g.k, g.c, g.r, g.r};
  std::mt19937_64 rng = test_rng();
  const Vec x = quantize(DType::F16, random_normal(rng, xd.count()));
  const Vec w = quantize(DType::F16, random_normal(rng, wd.count(), 0.0, 1.0 / std::sqrt(double(g.c) * g.r * g.r)));
  const DeviceTensor x_d = upload_activation(x, xd, DType::F16, Layout::NHWC);
  const DeviceTensor w_d = upload_activation(w, wd, DType::F16, Layout::NHWC);
  auto forward = [&](ConvGraph& conv) {
    DeviceBuffer ws(conv.workspace_bytes(), "conv test workspace");
    DeviceTensor y(yd.count(), DType::F16);
    y.poison();
    conv.forward(c.cudnn, x_d.get(), w_d.get(), y.get(), ws.get(), ws.bytes());
    return download_activation(y, yd, Layout::NHWC);
  };
  ConvAlgos chosen;
  Vec out1;
  {
    ConvGraph first(g, DType::F16, Layout::NHWC, false);
    AlgoChooser(c.cudnn, ConvPolicy{AlgoPolicy::Autotune, false, size_t(256) << 20}, nullptr).configure(first);
    chosen = first.algorithms();
    EXPECT_EQ(chosen.fwd.algo.rfind("eng", 0), 0u) << chosen.fwd.algo;
    EXPECT_GT(chosen.fwd.ms, 0.f);
    out1 = forward(first);
  }
  EXPECT_CLOSE(out1, ref::conv2d_forward(rg, x, w), kTolF16) << "engine " << chosen.fwd.algo;
  ConvGraph second(g, DType::F16, Layout::NHWC, false);
  ASSERT_TRUE(second.use(c.cudnn, chosen, {})) << chosen.fwd.algo << " refused by a new layer";
  EXPECT_EQ(second.algorithms(), chosen);
  EXPECT_EQ(out1, forward(second)) << chosen.fwd.algo << " built another engine in a new layer";
}

// A weight gradient planned for fewer SMs (cuDNN's SM-count target: training's lane, LaneCudnnSms)
// computes the reference, its choice is cached under a key of its own, and a later layer of the
// same shape builds that choice again, found among the heuristics' configurations under the same
// target (the frontend's replay of an engine tag would drop the target), without searching.
TEST(GpuConvAlgos, AWeightGradientPlannedForFewerSmsMatchesTheReference) {
  SKIP_WITHOUT_GPU("cuDNN's graph API");
  GpuContext& c = ctx();
  const ConvGeometry g{8, 64, 16, 16, 64, 3, 1, 1};  // a 3x3 conv as the lane runs it, fp16 NHWC
  const ref::ConvDims rg = conv_dims(g);
  const ref::Dims xd = rg.input(), yd = rg.output(), wd{g.k, g.c, g.r, g.r};
  std::mt19937_64 rng = test_rng();
  const Vec x = quantize(DType::F16, random_normal(rng, xd.count()));
  const Vec dy = quantize(DType::F16, random_normal(rng, yd.count()));
  const DeviceTensor x_d = upload_activation(x, xd, DType::F16, Layout::NHWC);
  const DeviceTensor dy_d = upload_activation(dy, yd, DType::F16, Layout::NHWC);
  auto wgrad = [&](ConvGraph& conv) {
    DeviceBuffer ws(conv.workspace_bytes(), "conv test workspace");
    DeviceTensor dw(wd.count(), DType::F16);
    dw.poison();
    conv.backward_filter(c.cudnn, x_d.get(), dy_d.get(), dw.get(), ws.get(), ws.bytes());
    return download_activation(dw, wd, Layout::NHWC);
  };
  ConvPolicy p{AlgoPolicy::Autotune, false, size_t(256) << 20};
  p.wgrad_sm_target = 66;
  EXPECT_EQ(p.cache_suffix(), ".wgrad-sms66");
  EXPECT_EQ(ConvPolicy{}.cache_suffix(), "") << "no target: the shape's key as before";
  AutotuneCache cache("", "test");
  AlgoChooser chooser(c.cudnn, p, &cache);
  const Vec expected = ref::conv2d_backward_filter(rg, x, dy);
  ConvAlgos chosen;
  {
    ConvGraph first(g, DType::F16, Layout::NHWC, false);
    chooser.configure(first);
    chosen = first.algorithms();
    EXPECT_CLOSE(wgrad(first), expected, kTolF16) << "engine " << chosen.bwd_filter.algo;
  }
  EXPECT_NE(cache.find(g.key() + ".wgrad-sms66"), nullptr);
  EXPECT_EQ(cache.find(g.key()), nullptr) << "a targeted choice under the plain shape's key";
  ConvGraph second(g, DType::F16, Layout::NHWC, false);  // the first's plans are gone: built again
  chooser.configure(second);
  EXPECT_EQ(chooser.searched(), 1) << "the cached choice under the target was refused";
  EXPECT_EQ(second.algorithms(), chosen);
  EXPECT_CLOSE(wgrad(second), expected, kTolF16) << "engine " << chosen.bwd_filter.algo;
}

// ================================================================================================
// Linear (cuBLAS, src/model/linear.cpp)
// ================================================================================================

class GpuLinear : public testing::TestWithParam<Precision> {};

TEST_P(GpuLinear, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_GPU("the cuBLAS linear layer");
  const Precision prec = GetParam();
  const DType t = prec == Precision::F16 ? DType::F16 : DType::F32;
  const bool tf32 = prec == Precision::TF32;
  const double bound = prec == Precision::F32 ? kTolF32 : prec == Precision::TF32 ? kTolTf32 : kTolF16;
  cublasHandle_t h = ctx().cublas;
  std::mt19937_64 rng = test_rng();
  for (const LinearShape s : {LinearShape{8, 64, 10}, LinearShape{5, 2048, 10}, LinearShape{13, 40, 7}}) {
    SCOPED_TRACE("n " + std::to_string(s.n) + ", in " + std::to_string(s.in) + ", out " + std::to_string(s.out));
    const Vec x = quantize(t, random_normal(rng, size_t(s.n) * s.in));
    const Vec w = quantize(t, random_normal(rng, size_t(s.out) * s.in, 0.0, 1.0 / std::sqrt(double(s.in))));
    const Vec dy = quantize(t, random_normal(rng, size_t(s.n) * s.out));
    const DeviceTensor x_d(x, t), w_d(w, t), dy_d(dy, t);
    DeviceTensor y(size_t(s.n) * s.out, DType::F32), dw(w.size(), t), dx(x.size(), t);
    y.poison();
    dw.poison();
    dx.poison();
    linear_forward(h, s, t, tf32, x_d.get(), w_d.get(), y.f32());
    linear_backward(h, s, t, tf32, x_d.get(), w_d.get(), dy_d.get(), dw.get(), dx.get());
    const ref::LinearGrads g = ref::linear_backward(s.n, s.in, s.out, x, w, dy);
    EXPECT_CLOSE(y.download(), ref::linear_forward(s.n, s.in, s.out, x, w), bound) << "logits";
    EXPECT_CLOSE(dw.download(), g.dw, bound) << "dW";
    EXPECT_CLOSE(dx.download(), g.dx, bound) << "dx";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuLinear, testing::Values(Precision::F32, Precision::TF32, Precision::F16),
                         [](const testing::TestParamInfo<Precision>& i) { return std::string(precision_name(i.param)); });

}  // namespace
