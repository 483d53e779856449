// Every layer's GPU forward and backward against the CPU references in double (tests/reference.h),
// in each precision and layout it runs in: cuDNN convolutions, the batch-norm kernels (statistics,
// fused apply, backward with the residual paths), pooling, the cuBLAS linear layer, softmax
// cross-entropy, the optimizer and loss-scale kernels, input normalization and the casts.
//
// Each test draws fresh random inputs (seeded from its name), poisons every output with NaN bytes
// first (an element a kernel leaves unwritten fails the comparison), and compares with
// ||gpu - ref|| / ||ref||: fp32 with TF32 off <= 1e-4, TF32 <= 5e-3, fp16 <= 1e-2. Quantities the
// kernels compute in fp32 from exactly representable inputs (BN statistics and gamma/beta
// gradients, the loss, the optimizer step) are held to the fp32 bound in either precision.
//
// GPU tests skip without a device; the KernelArgs and HostHalf tests run on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/conv.h"
#include "model/conv_graph.h"
#include "core/errors.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"
#include "kernels/batchnorm.h"
#include "kernels/cast.h"
#include "kernels/loss.h"
#include "kernels/normalize.h"
#include "kernels/optimizer.h"
#include "kernels/pooling.h"
#include "model/linear.h"
#include "train/loss_scale.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// One context for the whole binary: creating cuDNN/cuBLAS handles per test would dominate the run
// time. Never destroyed, so nothing is torn down after the CUDA runtime at exit.
GpuContext& ctx() {
  static GpuContext* c = new GpuContext;
  return *c;
}

struct Variant {
  DType t;
  Layout l;
};
const Variant kVariants[] = {{DType::F32, Layout::NCHW}, {DType::F32, Layout::NHWC},
                             {DType::F16, Layout::NCHW}, {DType::F16, Layout::NHWC}};

std::string variant_name(const Variant& v) { return std::string(dtype_name(v.t)) + "_" + layout_name(v.l); }
void PrintTo(const Variant& v, std::ostream* os) { *os << variant_name(v); }
std::string variant_param_name(const testing::TestParamInfo<Variant>& info) { return variant_name(info.param); }

std::string dims_name(const ref::Dims& d) {
  return std::to_string(d.n) + "x" + std::to_string(d.c) + "x" + std::to_string(d.h) + "x" + std::to_string(d.w);
}

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
};

using ConvParam = std::tuple<ConvCase, Precision, Layout, AlgoPolicy, ConvApi>;

class GpuConv : public testing::TestWithParam<ConvParam> {};

std::string conv_param_name(const testing::TestParamInfo<ConvParam>& info) {
  const auto& [c, p, l, policy, api] = info.param;
  return std::string(c.name) + "_" + precision_name(p) + "_" + layout_name(l) + "_" + algo_policy_name(policy) + "_" +
         conv_api_name(api);
}

// Forward, backward-data (overwriting and accumulating) and backward-filter of one shape.
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
  conv.backward_data(c.cudnn, dy_d.get(), w_d.get(), dx.get(), false, ws.get(), ws.bytes());
  const Vec dx_ref = ref::conv2d_backward_data(rg, dy, w);
  EXPECT_CLOSE(download_activation(dx, xd, layout), dx_ref, bound) << "backward_data";

  const Vec prior = quantize(t, random_normal(rng, xd.count()));
  dx.upload(to_layout(layout, xd, prior));
  conv.backward_data(c.cudnn, dy_d.get(), w_d.get(), dx.get(), true, ws.get(), ws.bytes());
  EXPECT_CLOSE(download_activation(dx, xd, layout), ref::add(prior, dx_ref), bound) << "backward_data accumulate";

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
// later CUDNN_DEFAULT_MATH permits TF32: only CUDNN_FMA_MATH guarantees full fp32 products. Graph
// API: engines with cuDNN's TENSOR_CORE or DOWN_CONVERT_INPUTS notes are refused, and the choice
// records CUDNN_FMA_MATH for the others.
TEST(GpuConvAlgos, NoTf32ChoosesFmaMathInEveryDirection) {
  SKIP_WITHOUT_GPU("cuDNN's algorithm choice");
  GpuContext& c = ctx();
  for (const ConvApi api : {ConvApi::Legacy, ConvApi::Graph})
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
          if (api == ConvApi::Graph) {
            EXPECT_EQ(a.bwd_data_acc.math, int(CUDNN_FMA_MATH)) << "accumulating algo " << a.bwd_data_acc.algo;
          }
        }
}

// A choice taken from the autotune cache builds the same plans as the search that produced it, and
// an entry naming an engine configuration that cuDNN does not list is refused (so it is searched).
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
  ConvAlgos stale = first.algorithms();
  ConvGraph third(g, DType::F16, Layout::NHWC, false);
  stale.fwd.algo = static_cast<int>(third.heuristic_lists(ConvGraph::kForward, c.cudnn).all);  // one past the last
  EXPECT_FALSE(third.use(c.cudnn, stale));
}

// The legacy API's choice from the cache is an algorithm number and a math type: one this cuDNN
// does not have (the file's parser takes numbers up to 65535, for the graph API's ranks) is refused.
TEST(GpuConvAlgos, LegacyChoicesCuDnnDoesNotHaveAreRefused) {
  SKIP_WITHOUT_GPU("cuDNN's legacy API");
  GpuContext& c = ctx();
  const ConvGeometry& g = kConvCases[1].g;
  Conv2d conv(g, DType::F16, Layout::NHWC, false);
  AlgoChooser chooser(c.cudnn, ConvPolicy{AlgoPolicy::Heuristic, false, size_t(256) << 20}, nullptr);
  chooser.configure(conv);
  const ConvAlgos good = conv.algorithms();
  EXPECT_TRUE(conv.use(c.cudnn, good));
  ConvAlgos bad = good;
  bad.fwd.algo = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  EXPECT_FALSE(conv.use(c.cudnn, bad));
  bad = good;
  bad.bwd_filter.algo = 70;
  EXPECT_FALSE(conv.use(c.cudnn, bad));
  bad = good;
  bad.bwd_data.math = 9;
  EXPECT_FALSE(conv.use(c.cudnn, bad));
  EXPECT_EQ(conv.algorithms(), good) << "a refused choice leaves the layer as it was";
}

// A configuration from the second heuristics list (mode B), as a search or the autotune cache may
// choose it, computes the reference forward, and its rank names the same engine in a layer built
// after the first is gone (its heuristics asked again, as in a later run reading the cache): both
// layers' outputs are equal bit for bit.
TEST(GpuConvAlgos, GraphConfigurationsFromModeBComputeTheConvolution) {
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
    const ConvGraph::ListSizes lists = first.heuristic_lists(ConvGraph::kForward, c.cudnn);
    if (lists.second == lists.all) GTEST_SKIP() << "cuDNN's mode B lists no forward configuration for this conv on this GPU";
    AlgoChooser chooser(c.cudnn, ConvPolicy{AlgoPolicy::Heuristic, false, size_t(256) << 20}, nullptr);
    chooser.configure(first);
    ConvAlgos a = first.algorithms();
    bool usable = false;
    for (size_t rank = lists.second; rank < lists.all && !usable; ++rank) {
      a.fwd.algo = static_cast<int>(rank);
      usable = first.use(c.cudnn, a);
    }
    if (!usable) GTEST_SKIP() << "none of mode B's " << lists.all - lists.second << " forward configurations can be planned here";
    chosen = first.algorithms();
    EXPECT_GE(chosen.fwd.algo, static_cast<int>(lists.second));
    out1 = forward(first);
  }
  EXPECT_CLOSE(out1, ref::conv2d_forward(rg, x, w), kTolF16) << "mode B rank " << chosen.fwd.algo;
  ConvGraph second(g, DType::F16, Layout::NHWC, false);
  ASSERT_TRUE(second.use(c.cudnn, chosen)) << "rank " << chosen.fwd.algo << " refused by a new layer";
  EXPECT_EQ(out1, forward(second)) << "rank " << chosen.fwd.algo << " named another engine in a new layer";
}

// ================================================================================================
// Batch norm (kernels/batchnorm.cu)
// ================================================================================================

const double kEps = double(kBnEps);
const double kMomentum = double(kBnMomentum);

bool bn_supported(const ref::Dims& d, DType t, Layout l) {
  const int v = t == DType::F32 ? 4 : 8;
  return l == Layout::NHWC ? d.c % v == 0 : (d.h * d.w) % v == 0;
}

// Shapes of several reduction geometries: one chunk, many chunks (NHWC rows / NCHW images), a
// channel tile narrower than 32 vectors, several tiles, N not dividing the chunk count, rows that
// fill the unrolled loop exactly ({16, 64, 16, 16}), a last chunk shorter than the others and a
// partial last tile whose vectors per row are not a power of two ({6, 96, 10, 10}).
const ref::Dims kBnShapes[] = {{4, 16, 8, 8}, {8, 32, 16, 16}, {3, 24, 4, 4}, {2, 512, 2, 2}, {5, 2048, 2, 2},
                               {16, 64, 16, 16}, {6, 96, 10, 10}};

// Apply with bn's scale/shift, no residual, with ReLU (what the tests then change).
ApplyArgs apply_args(const void* x, const DeviceBn& bn, void* y) {
  ApplyArgs a{};
  a.x = x;
  a.scale = bn.scale.f32();
  a.shift = bn.shift.f32();
  a.y = y;
  return a;
}

const char* residual_name(Residual r) {
  return r == Residual::None ? "no residual" : r == Residual::Tensor ? "residual tensor" : "residual BN";
}

class GpuBatchNorm : public testing::TestWithParam<Variant> {};

// Statistics, running-stat update, scale/shift and the fused apply, for every residual kind with
// and without ReLU.
TEST_P(GpuBatchNorm, TrainForwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const Residual res : {Residual::None, Residual::Tensor, Residual::BatchNorm})
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(dims_name(d) + ", " + residual_name(res) + (relu ? ", relu" : ", no relu"));
        const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
        const Vec x2 = quantize(t, channel_data(rng, d, -1.0, 3.0));  // residual tensor or 2nd BN input
        const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
        const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
        DeviceBn bn(h), bn2(h2);
        DeviceTensor scratch = bn_scratch(shape4(d), t, l);
        DeviceTensor y(d.count(), t);
        y.poison();

        bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
        if (res == Residual::BatchNorm)
          bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
        ApplyArgs a = apply_args(x_d.get(), bn, y.get());
        a.residual = res;
        a.res = res == Residual::None ? nullptr : x2_d.get();
        if (res == Residual::BatchNorm) {
          a.res_scale = bn2.scale.f32();
          a.res_shift = bn2.shift.f32();
        }
        a.relu = relu;
        bn_apply(a, shape4(d), t, l, stream);

        const ref::BnStats st = ref::bn_batch_stats(d, x, kEps);
        Vec rm = h.running_mean, rv = h.running_var;
        ref::bn_update_running(st, d.per_channel(), kMomentum, rm, rv);
        const ref::BnCoefs k = ref::bn_train_coefs(st, h.gamma, h.beta);
        Vec pre = ref::bn_affine(d, x, k);
        if (res == Residual::Tensor) pre = ref::add(pre, x2);
        if (res == Residual::BatchNorm) {
          const ref::BnStats st2 = ref::bn_batch_stats(d, x2, kEps);
          pre = ref::add(pre, ref::bn_affine(d, x2, ref::bn_train_coefs(st2, h2.gamma, h2.beta)));
          EXPECT_CLOSE(bn2.save_mean.download(), st2.mean, kTolF32) << "second BN mean";
          EXPECT_CLOSE(bn2.save_invstd.download(), st2.invstd, kTolF32) << "second BN invstd";
        }
        EXPECT_CLOSE(bn.save_mean.download(), st.mean, kTolF32) << "save_mean";
        EXPECT_CLOSE(bn.save_invstd.download(), st.invstd, kTolF32) << "save_invstd";
        EXPECT_CLOSE(bn.running_mean.download(), rm, kTolF32) << "running_mean";
        EXPECT_CLOSE(bn.running_var.download(), rv, kTolF32) << "running_var (unbiased batch variance)";
        EXPECT_CLOSE(bn.scale.download(), k.scale, kTolF32) << "scale";
        EXPECT_CLOSE(bn.shift.download(), k.shift, kTolF32) << "shift";
        EXPECT_CLOSE(download_activation(y, d, l), relu ? ref::relu(pre) : pre, tol(t)) << "y";
      }
  }
}

// Evaluation: scale/shift from the running statistics, which stay untouched.
TEST_P(GpuBatchNorm, EvalForwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const Residual res : {Residual::None, Residual::Tensor, Residual::BatchNorm}) {
      const bool relu = res != Residual::None;
      SCOPED_TRACE(dims_name(d) + ", " + residual_name(res));
      const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0)), x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
      const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
      const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
      DeviceBn bn(h), bn2(h2);
      DeviceTensor y(d.count(), t);
      y.poison();

      bn_forward_eval_coefs(bn.state(), d.c, stream);
      if (res == Residual::BatchNorm) bn_forward_eval_coefs(bn2.state(), d.c, stream);
      ApplyArgs a = apply_args(x_d.get(), bn, y.get());
      a.residual = res;
      a.res = res == Residual::None ? nullptr : x2_d.get();
      if (res == Residual::BatchNorm) {
        a.res_scale = bn2.scale.f32();
        a.res_shift = bn2.shift.f32();
      }
      a.relu = relu;
      bn_apply(a, shape4(d), t, l, stream);

      const ref::BnCoefs k = ref::bn_eval_coefs(h.gamma, h.beta, h.running_mean, h.running_var, kEps);
      Vec pre = ref::bn_eval_forward(d, x, h.gamma, h.beta, h.running_mean, h.running_var, kEps);
      if (res == Residual::Tensor) pre = ref::add(pre, x2);
      if (res == Residual::BatchNorm)
        pre = ref::add(pre, ref::bn_eval_forward(d, x2, h2.gamma, h2.beta, h2.running_mean, h2.running_var, kEps));
      EXPECT_CLOSE(bn.scale.download(), k.scale, kTolF32) << "scale";
      EXPECT_CLOSE(bn.shift.download(), k.shift, kTolF32) << "shift";
      EXPECT_CLOSE(download_activation(y, d, l), relu ? ref::relu(pre) : pre, tol(t)) << "y";
      EXPECT_EQ(bn.running_mean.download(), h.running_mean) << "evaluation must not touch running_mean";
      EXPECT_EQ(bn.running_var.download(), h.running_var) << "evaluation must not touch running_var";
    }
  }
}

// The backward configurations: no ReLU; ReLU with its mask from the stored output y, with dx apart
// from or in place of dy; ReLU with its mask recomputed from x, dx in place of dy (the inner BNs of
// the network, resnet50.cpp); ReLU with the identity shortcut's dz written to dres in place of dy
// (the last BN of an identity block); ReLU with the projection shortcut's BN fed the same dz (dual).
enum class BwdMode { Plain, Relu, ReluInPlace, ReluFromInput, Identity, IdentityInPlace, Projection };
const char* bwd_mode_name(BwdMode m) {
  switch (m) {
    case BwdMode::Plain: return "plain";
    case BwdMode::Relu: return "relu";
    case BwdMode::ReluInPlace: return "relu, dx aliases dy";
    case BwdMode::ReluFromInput: return "relu mask from x, dx aliases dy";
    case BwdMode::Identity: return "relu + identity dres";
    case BwdMode::IdentityInPlace: return "relu + identity dres aliasing dy";
    case BwdMode::Projection: return "relu + projection (dual BN)";
  }
  return "?";
}

struct BwdCase {
  // inputs
  Vec x, x2, y, dy;
  HostBn h, h2;
  ref::BnStats st, st2;
  Vec scale, shift;  // bn's forward scale/shift (fp32), from which ReluFromInput recomputes the mask
  // reference results
  ref::BnGrads g, g2;
  Vec dz;
};

BwdCase make_bwd_case(std::mt19937_64& rng, const ref::Dims& d, DType t, BwdMode m, double mean_lo, double mean_hi) {
  BwdCase b;
  b.x = quantize(t, channel_data(rng, d, mean_lo, mean_hi));
  b.x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  b.h = random_bn(rng, d.c);
  b.h2 = random_bn(rng, d.c);
  b.dy = quantize(t, random_normal(rng, d.count()));
  b.st = saved_stats(d, b.x);
  b.st2 = saved_stats(d, b.x2);
  const bool relu = m != BwdMode::Plain;
  const ref::BnCoefs k = saved_coefs(b.st, b.h.gamma, b.h.beta);
  b.scale = k.scale;
  b.shift = k.shift;
  if (m == BwdMode::ReluFromInput) {
    b.y = bn_apply_as_gpu(d, b.x, b.scale, b.shift, t);  // exactly as the forward kernel rounds it
  } else if (relu) {
    // y = relu(bn(x) + residual) as the forward wrote it: only its sign matters here.
    Vec pre = ref::bn_affine(d, b.x, ref::bn_train_coefs(b.st, b.h.gamma, b.h.beta));
    if (m == BwdMode::Identity || m == BwdMode::IdentityInPlace) pre = ref::add(pre, b.x2);
    if (m == BwdMode::Projection)
      pre = ref::add(pre, ref::bn_affine(d, b.x2, ref::bn_train_coefs(b.st2, b.h2.gamma, b.h2.beta)));
    b.y = quantize(t, ref::relu(pre));
  }
  b.dz = relu ? ref::relu_backward(b.dy, b.y) : b.dy;
  b.g = ref::bn_backward(d, b.dz, b.x, b.h.gamma, b.st);
  if (m == BwdMode::Projection) b.g2 = ref::bn_backward(d, b.dz, b.x2, b.h2.gamma, b.st2);
  return b;
}

// Runs bn_backward on the GPU for one case and checks every output.
void check_bn_backward(const ref::Dims& d, DType t, Layout l, BwdMode m, const BwdCase& b) {
  cudaStream_t stream = ctx().stream;
  const bool relu = m != BwdMode::Plain;
  const bool dual = m == BwdMode::Projection;
  const bool identity = m == BwdMode::Identity || m == BwdMode::IdentityInPlace;
  const DeviceTensor x_d = upload_activation(b.x, d, t, l), x2_d = upload_activation(b.x2, d, t, l);
  const DeviceTensor y_d = upload_activation(relu ? b.y : Vec(d.count(), 0.0), d, t, l);
  DeviceTensor dy_d = upload_activation(b.dy, d, t, l);
  DeviceBn bn(b.h), bn2(b.h2);
  bn.save_mean.upload(b.st.mean);
  bn.save_invstd.upload(b.st.invstd);
  bn.scale.upload(b.scale);
  bn.shift.upload(b.shift);
  bn2.save_mean.upload(b.st2.mean);
  bn2.save_invstd.upload(b.st2.invstd);
  DeviceTensor dgamma(d.c, DType::F32), dbeta(d.c, DType::F32), dgamma2(d.c, DType::F32), dbeta2(d.c, DType::F32);
  DeviceTensor dx(d.count(), t), dx2(d.count(), t), dres(d.count(), t);
  for (DeviceTensor* p : {&dgamma, &dbeta, &dgamma2, &dbeta2, &dx, &dx2, &dres}) p->poison();
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);

  const BnChannelState s1 = bn.state(), s2 = bn2.state();
  BnBackwardArgs a{};
  a.dy = dy_d.get();
  a.relu = !relu ? ReluMask::None : m == BwdMode::ReluFromInput ? ReluMask::FromInput : ReluMask::FromOutput;
  a.y = a.relu == ReluMask::FromOutput ? y_d.get() : nullptr;
  a.x = x_d.get();
  a.bn = &s1;
  a.dgamma = dgamma.f32();
  a.dbeta = dbeta.f32();
  const bool in_place = m == BwdMode::ReluInPlace || m == BwdMode::ReluFromInput;
  a.dx = in_place ? dy_d.get() : dx.get();
  if (dual) {
    a.x2 = x2_d.get();
    a.bn2 = &s2;
    a.dgamma2 = dgamma2.f32();
    a.dbeta2 = dbeta2.f32();
    a.dx2 = dx2.get();
  }
  if (identity) a.dres = m == BwdMode::IdentityInPlace ? dy_d.get() : dres.get();
  bn_backward(a, shape4(d), t, l, scratch.f32(), stream);

  EXPECT_CLOSE(dgamma.download(), b.g.dgamma, kTolF32) << "dgamma";
  EXPECT_CLOSE(dbeta.download(), b.g.dbeta, kTolF32) << "dbeta";
  const DeviceTensor& dx_out = in_place ? dy_d : dx;
  EXPECT_CLOSE(download_activation(dx_out, d, l), b.g.dx, tol(t)) << "dx";
  if (dual) {
    EXPECT_CLOSE(dgamma2.download(), b.g2.dgamma, kTolF32) << "dgamma2";
    EXPECT_CLOSE(dbeta2.download(), b.g2.dbeta, kTolF32) << "dbeta2";
    EXPECT_CLOSE(download_activation(dx2, d, l), b.g2.dx, tol(t)) << "dx2";
  }
  if (identity) {  // dz = dy * (y > 0) exactly: masking does no arithmetic
    const DeviceTensor& dres_out = m == BwdMode::IdentityInPlace ? dy_d : dres;
    EXPECT_CLOSE(download_activation(dres_out, d, l), b.dz, 0.0) << "dres";
  }
}

TEST_P(GpuBatchNorm, BackwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const BwdMode m : {BwdMode::Plain, BwdMode::Relu, BwdMode::ReluInPlace, BwdMode::ReluFromInput, BwdMode::Identity,
                            BwdMode::IdentityInPlace, BwdMode::Projection}) {
      SCOPED_TRACE(dims_name(d) + ", " + bwd_mode_name(m));
      check_bn_backward(d, t, l, m, make_bwd_case(rng, d, t, m, -2.0, 2.0));
    }
  }
}

// The inner BNs' backward recomputes the ReLU mask from x instead of reading y: it must be the mask
// of the y the forward kernel stored, bit for bit, also for pre-activations within rounding of 0.
// A third of the elements are set to the value of T nearest to where the channel's affine map
// crosses 0, so that many of them round to +-0 or to the smallest subnormals.
TEST_P(GpuBatchNorm, MaskFromInputMatchesTheStoredOutput) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 64, 8, 8};
  ASSERT_TRUE(bn_supported(d, t, l));
  const HostBn h = random_bn(rng, d.c);
  DeviceBn bn(h);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
  {  // the forward's scale/shift for this data
    const DeviceTensor x_d = upload_activation(x, d, t, l);
    bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const Vec scale = bn.scale.download(), shift = bn.shift.download();
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    if (pick(rng) == 0 && scale[c] != 0) x[i] = quantize(t, -shift[c] / scale[c]);
  }
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  DeviceTensor y(d.count(), t);
  y.poison();
  bn_apply(apply_args(x_d.get(), bn, y.get()), shape4(d), t, l, stream);  // scale/shift as above
  size_t near_zero = 0;  // pre-activations within 1e-3 of 0, as the kernel computes them (one fp32 fma)
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    near_zero += std::fabs(std::fma(float(x[i]), float(scale[c]), float(shift[c]))) < 1e-3f;
  }
  EXPECT_GT(near_zero, x.size() / 5) << "the data should put many pre-activations within rounding of 0";

  const DeviceTensor dy_d = upload_activation(quantize(t, random_normal(rng, d.count())), d, t, l);
  auto backward = [&](ReluMask mask) {
    DeviceTensor dx(d.count(), t), dg(d.c, DType::F32), db(d.c, DType::F32);
    for (DeviceTensor* p : {&dx, &dg, &db}) p->poison();
    const BnChannelState st = bn.state();
    BnBackwardArgs a{};
    a.dy = dy_d.get();
    a.relu = mask;
    a.y = mask == ReluMask::FromOutput ? y.get() : nullptr;
    a.x = x_d.get();
    a.bn = &st;
    a.dgamma = dg.f32();
    a.dbeta = db.f32();
    a.dx = dx.get();
    bn_backward(a, shape4(d), t, l, scratch.f32(), stream);
    return std::vector<std::vector<uint8_t>>{dx.bytes(), dg.bytes(), db.bytes()};
  };
  const auto from_y = backward(ReluMask::FromOutput), from_x = backward(ReluMask::FromInput);
  EXPECT_TRUE(from_y[0] == from_x[0]) << "dx differs";
  EXPECT_TRUE(from_y[1] == from_x[1]) << "dgamma differs";
  EXPECT_TRUE(from_y[2] == from_x[2]) << "dbeta differs";
}

// The joins' backward reads the ReLU bits the forward wrote (ApplyArgs::relu_bits) instead of the
// stored output: each bit must be the sign of the stored element (also where the sum rounds to +-0
// or to subnormals: a third of the residuals cancel the BN output within T's rounding), and the
// backward from the bits must equal the backward from y bit for bit, with the identity shortcut's
// dres and with the projection's second BN.
TEST_P(GpuBatchNorm, ReluBitsAreTheStoredOutputsSignsAndGiveItsBackward) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 64, 8, 8};
  ASSERT_TRUE(bn_supported(d, t, l));
  const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
  DeviceBn bn(h), bn2(h2);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
  Vec x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
  const Vec scale = bn.scale.download(), shift = bn.shift.download();
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t i = 0; i < x.size(); ++i) {  // x2 = -bn(x), rounded to T: the sum lands within rounding of 0
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    if (pick(rng) == 0) x2[i] = quantize(t, -std::fma(float(x[i]), float(scale[c]), float(shift[c])));
  }
  const DeviceTensor x2_d = upload_activation(x2, d, t, l);
  bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
  const DeviceTensor dy_d = upload_activation(quantize(t, random_normal(rng, d.count())), d, t, l);
  const size_t V = 16 / dtype_size(t);
  ASSERT_EQ(relu_bits_bytes(shape4(d), t), d.count() / V);

  for (const Residual r : {Residual::Tensor, Residual::BatchNorm}) {
    SCOPED_TRACE(residual_name(r));
    DeviceTensor y(d.count(), t);
    y.poison();
    DeviceBuffer bits(relu_bits_bytes(shape4(d), t), "test ReLU bits");
    CUDA_CHECK(cudaMemset(bits.get(), 0xA5, bits.bytes()));
    ApplyArgs a = apply_args(x_d.get(), bn, y.get());
    a.residual = r;
    a.res = x2_d.get();
    if (r == Residual::BatchNorm) {
      a.res_scale = bn2.scale.f32();
      a.res_shift = bn2.shift.f32();
    }
    a.relu_bits = bits.as<uint8_t>();
    bn_apply(a, shape4(d), t, l, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    // Each bit against the element it stands for (the buffer's own order: vector e / V, bit e % V).
    const std::vector<uint8_t> y_raw = y.bytes();
    std::vector<uint8_t> b_raw(bits.bytes());
    CUDA_CHECK(cudaMemcpy(b_raw.data(), bits.get(), b_raw.size(), cudaMemcpyDeviceToHost));
    size_t wrong = 0, zeros = 0;
    for (size_t e = 0; e < d.count(); ++e) {
      bool positive;
      if (t == DType::F16) {
        uint16_t v;
        std::memcpy(&v, y_raw.data() + 2 * e, 2);
        positive = (v & 0x8000u) == 0 && (v & 0x7FFFu) != 0;
      } else {
        float v;
        std::memcpy(&v, y_raw.data() + 4 * e, 4);
        positive = v > 0.f;
      }
      zeros += !positive;
      wrong += positive != bool((b_raw[e / V] >> (e % V)) & 1u);
    }
    EXPECT_EQ(wrong, 0u) << "bits that are not the stored element's sign";
    EXPECT_GT(zeros, d.count() / 3) << "the ReLU should zero many elements";

    auto backward = [&](ReluMask mask) {
      DeviceTensor dx(d.count(), t), dx2(d.count(), t), dres(d.count(), t);
      DeviceTensor dg(d.c, DType::F32), db(d.c, DType::F32), dg2(d.c, DType::F32), db2(d.c, DType::F32);
      for (DeviceTensor* p : {&dx, &dx2, &dres, &dg, &db, &dg2, &db2}) p->poison();
      const BnChannelState s1 = bn.state(), s2 = bn2.state();
      BnBackwardArgs b{};
      b.dy = dy_d.get();
      b.relu = mask;
      b.y = mask == ReluMask::FromOutput ? y.get() : nullptr;
      b.relu_bits = mask == ReluMask::FromBits ? bits.as<uint8_t>() : nullptr;
      b.x = x_d.get();
      b.bn = &s1;
      b.dgamma = dg.f32();
      b.dbeta = db.f32();
      b.dx = dx.get();
      if (r == Residual::BatchNorm) {
        b.x2 = x2_d.get();
        b.bn2 = &s2;
        b.dgamma2 = dg2.f32();
        b.dbeta2 = db2.f32();
        b.dx2 = dx2.get();
      } else {
        b.dres = dres.get();
      }
      bn_backward(b, shape4(d), t, l, scratch.f32(), stream);
      std::vector<std::vector<uint8_t>> out;
      for (const DeviceTensor* p : {&dx, &dg, &db}) out.push_back(p->bytes());
      for (const DeviceTensor* p : r == Residual::BatchNorm ? std::vector<const DeviceTensor*>{&dx2, &dg2, &db2}
                                                           : std::vector<const DeviceTensor*>{&dres})
        out.push_back(p->bytes());
      return out;
    };
    const auto from_y = backward(ReluMask::FromOutput), from_bits = backward(ReluMask::FromBits);
    ASSERT_EQ(from_y.size(), from_bits.size());
    for (size_t i = 0; i < from_y.size(); ++i) EXPECT_TRUE(from_y[i] == from_bits[i]) << "output " << i << " differs";
  }
}

// bin/predict computes every BN's evaluation coefficients in one launch: the same bits as one
// launch per BN, at widths that leave channels of the widest launch block idle, and the fp16
// copies where asked for (left untouched where not).
TEST(GpuBatchNormEval, AllBnsInOneLaunchEqualOneLaunchEach) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const int widths[] = {64, 2048, 24, 300};
  std::vector<std::unique_ptr<DeviceBn>> one, all;
  std::vector<std::unique_ptr<DeviceTensor>> halves;
  std::vector<BnEvalTarget> targets;
  for (size_t i = 0; i < std::size(widths); ++i) {
    const HostBn h = random_bn(rng, widths[i]);
    one.push_back(std::make_unique<DeviceBn>(h));
    all.push_back(std::make_unique<DeviceBn>(h));
    bn_forward_eval_coefs(one.back()->state(), widths[i], stream);
    halves.push_back(std::make_unique<DeviceTensor>(2 * size_t(widths[i]), DType::F16, "fp16 scale and shift"));
    halves.back()->poison();
    const bool half = i % 2 == 0;
    uint16_t* h16 = static_cast<uint16_t*>(halves.back()->get());
    targets.push_back({all.back()->state(), widths[i], half ? h16 : nullptr, half ? h16 + widths[i] : nullptr});
  }
  DeviceBuffer table(targets.size() * sizeof(BnEvalTarget), "test eval targets");
  CUDA_CHECK(cudaMemcpy(table.get(), targets.data(), table.bytes(), cudaMemcpyHostToDevice));
  bn_forward_eval_coefs_all(table.as<BnEvalTarget>(), static_cast<int>(targets.size()), 2048, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < targets.size(); ++i) {
    SCOPED_TRACE("BN " + std::to_string(i) + " of " + std::to_string(widths[i]) + " channels");
    EXPECT_TRUE(all[i]->scale.bytes() == one[i]->scale.bytes()) << "scale";
    EXPECT_TRUE(all[i]->shift.bytes() == one[i]->shift.bytes()) << "shift";
    const std::vector<uint8_t> h = halves[i]->bytes();
    if (i % 2 != 0) {
      EXPECT_EQ(h, std::vector<uint8_t>(h.size(), 0xFF)) << "no fp16 copy was asked for";
      continue;
    }
    const ref::Vec sc = all[i]->scale.download(), sh = all[i]->shift.download();
    for (int c = 0; c < widths[i]; ++c) {
      uint16_t got_s, got_h;
      std::memcpy(&got_s, h.data() + 2 * c, 2);
      std::memcpy(&got_h, h.data() + 2 * (widths[i] + c), 2);
      ASSERT_EQ(got_s, gpu_test::half_bits(__float2half_rn(float(sc[c])))) << "scale_h[" << c << "]";
      ASSERT_EQ(got_h, gpu_test::half_bits(__float2half_rn(float(sh[c])))) << "shift_h[" << c << "]";
    }
  }
}

// Channel means far from zero against their spread (x = 1000 + N(0,1)): the variance must not be
// lost to cancellation in E[x^2] - E[x]^2. In fp32, y = x * scale + shift itself loses about
// log2(1000) bits (|shift| ~ 1000 for |y| ~ 1): about 4e-5 measured on a CPU emulation of the
// kernel's arithmetic, inside the 1e-4 bound.
TEST_P(GpuBatchNorm, LargeMeanKeepsTheVariance) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 32, 16, 16};
  ASSERT_TRUE(bn_supported(d, t, l));
  const Vec x = quantize(t, channel_data(rng, d, 990.0, 1010.0, 0.8, 1.2));
  const HostBn h = random_bn(rng, d.c);
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  DeviceBn bn(h);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  DeviceTensor y(d.count(), t);
  y.poison();
  bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
  ApplyArgs a = apply_args(x_d.get(), bn, y.get());
  a.relu = false;
  bn_apply(a, shape4(d), t, l, stream);

  const ref::BnStats st = ref::bn_batch_stats(d, x, kEps);
  Vec rm = h.running_mean, rv = h.running_var;
  ref::bn_update_running(st, d.per_channel(), kMomentum, rm, rv);
  EXPECT_CLOSE(bn.save_mean.download(), st.mean, kTolF32) << "save_mean";
  EXPECT_CLOSE(bn.save_invstd.download(), st.invstd, kTolF32) << "save_invstd";
  EXPECT_CLOSE(bn.running_var.download(), rv, kTolF32) << "running_var";
  EXPECT_CLOSE(bn.running_mean.download(), rm, kTolF32) << "running_mean";
  EXPECT_CLOSE(download_activation(y, d, l), ref::bn_affine(d, x, ref::bn_train_coefs(st, h.gamma, h.beta)), tol(t))
      << "y";

  // And the backward at the same large mean (dx = k_dz * dz + k_x * x + k_c also cancels).
  SCOPED_TRACE("backward");
  check_bn_backward(d, t, l, BwdMode::Plain, make_bwd_case(rng, d, t, BwdMode::Plain, 990.0, 1010.0));
}

// Fixed-order reductions: the same inputs give the same bits, forward and backward.
TEST_P(GpuBatchNorm, BitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{16, 64, 16, 16};  // many chunks in both layouts
  ASSERT_TRUE(bn_supported(d, t, l));
  const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0)), x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  const Vec dy = quantize(t, random_normal(rng, d.count()));
  const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
  const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
  const DeviceTensor dy_d = upload_activation(dy, d, t, l);

  auto run = [&] {
    DeviceBn bn(h), bn2(h2);  // fresh running statistics each run
    DeviceTensor scratch = bn_scratch(shape4(d), t, l);
    DeviceTensor y(d.count(), t), dx(d.count(), t), dx2(d.count(), t);
    DeviceTensor dg(d.c, DType::F32), db(d.c, DType::F32), dg2(d.c, DType::F32), db2(d.c, DType::F32);
    for (DeviceTensor* p : {&y, &dx, &dx2, &dg, &db, &dg2, &db2}) p->poison();
    bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
    bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
    ApplyArgs a{x_d.get(), bn.scale.f32(), bn.shift.f32(), Residual::BatchNorm, x2_d.get(),
                bn2.scale.f32(), bn2.shift.f32(), true, y.get()};
    bn_apply(a, shape4(d), t, l, stream);
    const BnChannelState s1 = bn.state(), s2 = bn2.state();
    BnBackwardArgs b{};
    b.dy = dy_d.get();
    b.relu = ReluMask::FromOutput;
    b.y = y.get();
    b.x = x_d.get();
    b.bn = &s1;
    b.dgamma = dg.f32();
    b.dbeta = db.f32();
    b.x2 = x2_d.get();
    b.bn2 = &s2;
    b.dgamma2 = dg2.f32();
    b.dbeta2 = db2.f32();
    b.dx = dx.get();
    b.dx2 = dx2.get();
    bn_backward(b, shape4(d), t, l, scratch.f32(), stream);
    std::vector<std::vector<uint8_t>> out;
    for (const DeviceTensor* p : {&bn.save_mean, &bn.save_invstd, &bn.scale, &bn.shift, &bn.running_mean,
                                  &bn.running_var, &bn2.save_mean, &bn2.save_invstd, &y, &dg, &db, &dg2, &db2,
                                  &dx, &dx2})
      out.push_back(p->bytes());
    return out;
  };
  const auto first = run(), second = run();
  const char* names[] = {"save_mean", "save_invstd", "scale", "shift", "running_mean", "running_var",
                         "save_mean2", "save_invstd2", "y", "dgamma", "dbeta", "dgamma2", "dbeta2", "dx", "dx2"};
  ASSERT_EQ(first.size(), std::size(names));
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i] == second[i]) << names[i] << " differs between runs";
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuBatchNorm, testing::ValuesIn(kVariants), variant_param_name);

// ================================================================================================
// Global average pool (kernels/pooling.cu)
// ================================================================================================

class GpuPool : public testing::TestWithParam<Variant> {};

TEST_P(GpuPool, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_GPU("the pooling kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : {ref::Dims{4, 64, 4, 4}, ref::Dims{3, 24, 7, 7}, ref::Dims{2, 2048, 4, 4},
                             ref::Dims{5, 3, 1, 1}}) {
    SCOPED_TRACE(dims_name(d));
    const size_t nc = size_t(d.n) * d.c;
    const Vec x = quantize(t, channel_data(rng, d, -1.0, 1.0)), dy = quantize(t, random_normal(rng, nc));
    const DeviceTensor x_d = upload_activation(x, d, t, l);
    const DeviceTensor dy_d(dy, t);
    DeviceTensor y(nc, t), dx(d.count(), t);
    y.poison();
    dx.poison();
    global_avgpool_forward(x_d.get(), shape4(d), t, l, y.get(), stream);
    global_avgpool_backward(dy_d.get(), shape4(d), t, l, dx.get(), stream);
    EXPECT_CLOSE(y.download(), ref::avgpool_forward(d, x), tol(t)) << "forward";
    EXPECT_CLOSE(download_activation(dx, d, l), ref::avgpool_backward(d, dy), tol(t)) << "backward";
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuPool, testing::ValuesIn(kVariants), variant_param_name);

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

// ================================================================================================
// Softmax cross-entropy (kernels/loss.cu)
// ================================================================================================

LossTotals fresh_totals() {
  LossTotals z{};
  z.first_bad_step = -1;
  return z;
}

// One value in device memory, as a kernel reads it (a step index, a learning rate).
template <class T>
struct DeviceValue {
  DeviceBuffer buf{sizeof(T), "test value"};
  explicit DeviceValue(T v) { CUDA_CHECK(cudaMemcpy(buf.get(), &v, sizeof v, cudaMemcpyHostToDevice)); }
  const T* ptr() const { return buf.as<T>(); }
};

struct DeviceTotals {
  DeviceBuffer buf{sizeof(LossTotals), "test loss totals"};
  explicit DeviceTotals(const LossTotals& init = fresh_totals()) { set(init); }
  void set(const LossTotals& v) { CUDA_CHECK(cudaMemcpy(buf.get(), &v, sizeof v, cudaMemcpyHostToDevice)); }
  LossTotals get() const {
    LossTotals v;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(&v, buf.get(), sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
  LossTotals* ptr() const { return buf.as<LossTotals>(); }
};

struct XentInputs {
  int n, classes;
  Vec logits, bias;
  std::vector<int32_t> labels;
};

// Random logits and labels, every `pad_every`-th label -1 (padding).
XentInputs random_xent(std::mt19937_64& rng, int n, int classes, int pad_every) {
  XentInputs in{n, classes, quantize(DType::F32, random_normal(rng, size_t(n) * classes, 0.0, 2.0)),
                quantize(DType::F32, random_normal(rng, classes, 0.0, 0.5)), std::vector<int32_t>(n)};
  std::uniform_int_distribution<int> label(0, classes - 1);
  for (int i = 0; i < n; ++i) in.labels[i] = pad_every > 0 && i % pad_every == pad_every - 1 ? -1 : label(rng);
  return in;
}

struct DeviceXent {
  DeviceTensor logits, bias;
  DeviceBuffer labels;
  DeviceXent(const XentInputs& in)
      : logits(in.logits, DType::F32, "test logits"),
        bias(in.bias, DType::F32, "test bias"),
        labels(in.labels.size() * sizeof(int32_t), "test labels") {
    CUDA_CHECK(cudaMemcpy(labels.get(), in.labels.data(), labels.bytes(), cudaMemcpyHostToDevice));
  }
  const int32_t* label_ptr() const { return labels.as<int32_t>(); }
};

class GpuSoftmaxXent : public testing::TestWithParam<DType> {};

// Loss, accuracy, dlogits and dbias with padding labels and a loss scale of 1024.
TEST_P(GpuSoftmaxXent, MatchesReferenceWithPaddingAndLossScale) {
  SKIP_WITHOUT_GPU("the softmax cross-entropy kernel");
  const DType t = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const double loss_scale = 1024;
  const DeviceTensor scale_d(Vec{loss_scale}, DType::F32);
  const DeviceValue<long long> step(42);
  for (const int n : {13, 300}) {  // 300: more rows than the block's threads
    SCOPED_TRACE("n " + std::to_string(n));
    const XentInputs in = random_xent(rng, n, 10, 5);
    DeviceXent dev(in);
    DeviceTensor dlogits(in.logits.size(), t), dbias(10, DType::F32);
    dlogits.poison();
    dbias.poison();
    DeviceTotals totals;
    softmax_xent(dev.logits.f32(), dev.bias.f32(), dev.label_ptr(), n, 10, dlogits.get(), t, dbias.f32(),
                 scale_d.f32(), totals.ptr(), step.ptr(), stream);
    const ref::XentResult r = ref::softmax_xent(n, 10, in.logits, in.bias, in.labels, loss_scale);
    const LossTotals got = totals.get();
    EXPECT_CLOSE(dev.logits.download(), r.logits, kTolF32) << "logits + bias, in place";
    EXPECT_CLOSE(dlogits.download(), r.dlogits, tol(t)) << "dlogits";
    EXPECT_CLOSE(dbias.download(), r.dbias, kTolF32) << "dbias";
    EXPECT_NEAR(got.loss_sum, r.loss_sum, kTolF32 * r.loss_sum) << "loss_sum";
    EXPECT_NEAR(got.last_loss, r.loss, kTolF32 * r.loss) << "last_loss (mean over valid rows)";
    EXPECT_EQ(got.last_good_loss, got.last_loss);
    EXPECT_EQ(got.correct, static_cast<unsigned long long>(r.correct));
    EXPECT_EQ(got.count, static_cast<unsigned long long>(r.valid));
    EXPECT_EQ(got.first_bad_step, -1);
    // Padding rows get no gradient at all.
    const Vec dl = dlogits.download();
    for (int i = 0; i < n; ++i) {
      if (in.labels[i] >= 0) continue;
      for (int j = 0; j < 10; ++j) EXPECT_EQ(dl[size_t(i) * 10 + j], 0.0) << "padding row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DlogitsTypes, GpuSoftmaxXent, testing::Values(DType::F32, DType::F16),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// The totals add up over batches; a NaN loss is recorded as the first bad step and does not
// replace the last good loss.
TEST(GpuSoftmaxXentTotals, AccumulateAndMarkTheFirstBadStep) {
  SKIP_WITHOUT_GPU("the softmax cross-entropy kernel");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  DeviceTotals totals;
  const XentInputs a = random_xent(rng, 20, 10, 4), b = random_xent(rng, 20, 10, 0);
  const ref::XentResult ra = ref::softmax_xent(20, 10, a.logits, a.bias, a.labels, 1.0);
  const ref::XentResult rb = ref::softmax_xent(20, 10, b.logits, b.bias, b.labels, 1.0);
  DeviceTensor dlogits(200, DType::F32), dbias(10, DType::F32);
  DeviceXent da(a), db(b);
  const DeviceValue<long long> step1(1), step2(2);
  softmax_xent(da.logits.f32(), da.bias.f32(), da.label_ptr(), 20, 10, dlogits.get(), DType::F32, dbias.f32(),
               nullptr, totals.ptr(), step1.ptr(), stream);
  softmax_xent(db.logits.f32(), db.bias.f32(), db.label_ptr(), 20, 10, dlogits.get(), DType::F32, dbias.f32(),
               nullptr, totals.ptr(), step2.ptr(), stream);
  LossTotals got = totals.get();
  EXPECT_NEAR(got.loss_sum, ra.loss_sum + rb.loss_sum, kTolF32 * (ra.loss_sum + rb.loss_sum));
  EXPECT_EQ(got.count, static_cast<unsigned long long>(ra.valid + rb.valid));
  EXPECT_EQ(got.correct, static_cast<unsigned long long>(ra.correct + rb.correct));
  EXPECT_NEAR(got.last_loss, rb.loss, kTolF32 * rb.loss);
  EXPECT_EQ(got.first_bad_step, -1);
  // dbias with no loss scale (nullptr = 1): the batch-b gradient alone (overwritten, not summed).
  EXPECT_CLOSE(dbias.download(), rb.dbias, kTolF32);

  XentInputs bad = random_xent(rng, 20, 10, 0);
  bad.logits[3 * 10 + 4] = std::numeric_limits<double>::quiet_NaN();
  const float good = got.last_loss;
  for (const long long step : {7LL, 8LL}) {
    DeviceXent dbad(bad);
    const DeviceValue<long long> step_d(step);
    softmax_xent(dbad.logits.f32(), dbad.bias.f32(), dbad.label_ptr(), 20, 10, dlogits.get(), DType::F32,
                 dbias.f32(), nullptr, totals.ptr(), step_d.ptr(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));  // before step_d goes
  }
  got = totals.get();
  EXPECT_TRUE(std::isnan(got.last_loss));
  EXPECT_EQ(got.last_good_loss, good);
  EXPECT_EQ(got.first_bad_step, 7) << "the first non-finite step, not the latest";
}

// Evaluation passes no gradient buffers and no loss scale; a batch of padding only changes nothing.
TEST(GpuSoftmaxXentTotals, EvaluationAndAllPaddingBatches) {
  SKIP_WITHOUT_GPU("the softmax cross-entropy kernel");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const XentInputs in = random_xent(rng, 37, 10, 6);
  const ref::XentResult r = ref::softmax_xent(37, 10, in.logits, in.bias, in.labels, 1.0);
  DeviceXent dev(in);
  DeviceTotals totals;
  softmax_xent(dev.logits.f32(), dev.bias.f32(), dev.label_ptr(), 37, 10, nullptr, DType::F32, nullptr, nullptr,
               totals.ptr(), nullptr, stream);
  const LossTotals got = totals.get();
  EXPECT_NEAR(got.loss_sum, r.loss_sum, kTolF32 * r.loss_sum);
  EXPECT_EQ(got.correct, static_cast<unsigned long long>(r.correct));
  EXPECT_EQ(got.count, static_cast<unsigned long long>(r.valid));
  EXPECT_CLOSE(dev.logits.download(), r.logits, kTolF32) << "logits + bias, in place";

  XentInputs pad = random_xent(rng, 9, 10, 0);
  for (int32_t& y : pad.labels) y = -1;
  DeviceXent dpad(pad);
  DeviceTensor dlogits(90, DType::F16), dbias(10, DType::F32);
  dlogits.poison();
  dbias.poison();
  softmax_xent(dpad.logits.f32(), dpad.bias.f32(), dpad.label_ptr(), 9, 10, dlogits.get(), DType::F16, dbias.f32(),
               nullptr, totals.ptr(), nullptr, stream);
  const LossTotals after = totals.get();
  EXPECT_EQ(after.loss_sum, got.loss_sum);
  EXPECT_EQ(after.count, got.count);
  EXPECT_EQ(after.correct, got.correct);
  EXPECT_EQ(after.last_loss, got.last_loss);
  EXPECT_EQ(dlogits.download(), Vec(90, 0.0));
  EXPECT_EQ(dbias.download(), Vec(10, 0.0));
}

// Without a step index (evaluation) a NaN loss is no training divergence: nothing is recorded.
// record_loss puts the latest loss at the slot it reads from device memory, and nowhere else.
TEST(GpuSoftmaxXentTotals, StepIndexAndLossSlotComeFromDeviceMemory) {
  SKIP_WITHOUT_GPU("the softmax cross-entropy kernel");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  XentInputs bad = random_xent(rng, 20, 10, 0);
  bad.logits[5 * 10 + 1] = std::numeric_limits<double>::quiet_NaN();
  DeviceXent dbad(bad);
  DeviceTotals totals;
  softmax_xent(dbad.logits.f32(), dbad.bias.f32(), dbad.label_ptr(), 20, 10, nullptr, DType::F32, nullptr, nullptr,
               totals.ptr(), nullptr, stream);
  EXPECT_TRUE(std::isnan(totals.get().last_loss));
  EXPECT_EQ(totals.get().first_bad_step, -1) << "evaluation recorded a bad training step";

  const XentInputs in = random_xent(rng, 20, 10, 0);
  DeviceXent dev(in);
  DeviceTotals fresh;
  const DeviceValue<long long> step(123456789012LL);
  softmax_xent(dev.logits.f32(), dev.bias.f32(), dev.label_ptr(), 20, 10, nullptr, DType::F32, nullptr, nullptr,
               fresh.ptr(), step.ptr(), stream);
  DeviceTensor history(8, DType::F32);
  history.poison();
  const DeviceValue<int> slot(5);
  record_loss(fresh.ptr(), slot.ptr(), history.f32(), stream);
  const Vec h = history.download();
  const float want = fresh.get().last_loss;
  for (int i = 0; i < 8; ++i) {
    if (i == 5) EXPECT_EQ(h[i], double(want)) << "the recorded loss";
    else EXPECT_TRUE(std::isnan(h[i])) << "slot " << i << " was written";
  }
}

// ================================================================================================
// Optimizer and loss scaling (kernels/optimizer.cu)
// ================================================================================================

ScalerState scaler(float scale, int good = 0, int found_inf = 0, int skipped = 0, int diverged = 0) {
  return {scale, good, found_inf, skipped, diverged};
}

struct DeviceScaler {
  DeviceBuffer buf{sizeof(ScalerState), "test scaler state"};
  explicit DeviceScaler(const ScalerState& s) { set(s); }
  void set(const ScalerState& s) { CUDA_CHECK(cudaMemcpy(buf.get(), &s, sizeof s, cudaMemcpyHostToDevice)); }
  ScalerState get() const {
    ScalerState s;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(&s, buf.get(), sizeof s, cudaMemcpyDeviceToHost));
    return s;
  }
  ScalerState* ptr() const { return buf.as<ScalerState>(); }
};

void expect_same_state(const ScalerState& got, const ScalerState& want) {
  EXPECT_EQ(got.scale, want.scale);
  EXPECT_EQ(got.good_steps, want.good_steps);
  EXPECT_EQ(got.found_inf, want.found_inf);
  EXPECT_EQ(got.skipped_steps, want.skipped_steps);
  EXPECT_EQ(got.diverged, want.diverged);
}

// The flat parameter buffer: n_act conv/linear weights (gradients in the activation type, decayed,
// with an fp16 working copy in fp16 builds), then n - n_act BN/bias parameters (fp32 gradients).
struct SgdSetup {
  size_t n, n_act;
  DType act;
  Vec w, mom, grad_act, grad_f32;  // grads as stored (scaled by the loss scale)
  DeviceTensor w_d, mom_d, grad_act_d, grad_f32_d, w_act_d, lr_d{1, DType::F32, "sgd lr"};
  static constexpr size_t kGuard = 64;  // fp16 copy elements past n_act that must stay untouched

  SgdSetup(std::mt19937_64& rng, size_t n_, size_t n_act_, DType act_, double grad_scale)
      : n(n_), n_act(n_act_), act(act_),
        w(quantize(DType::F32, random_normal(rng, n_))),
        mom(quantize(DType::F32, random_normal(rng, n_, 0.0, 0.5))),
        grad_act(quantize(act_, random_normal(rng, n_act_, 0.0, grad_scale))),
        grad_f32(quantize(DType::F32, random_normal(rng, n_ - n_act_, 0.0, grad_scale))),
        w_d(w, DType::F32, "sgd w"), mom_d(mom, DType::F32, "sgd momentum"),
        grad_act_d(grad_act, act_, "sgd grad act"), grad_f32_d(grad_f32, DType::F32, "sgd grad f32"),
        w_act_d(n_act_ + kGuard, DType::F16, "sgd fp16 copy") {
    w_act_d.poison();
  }
  // The kernel reads lr from device memory: it is uploaded here (a blocking copy, ordered after the
  // work already enqueued on the blocking test stream).
  SgdArgs args(float lr, float m, float wd, bool nesterov) {
    lr_d.upload(Vec{lr});
    return {w_d.f32(), mom_d.f32(), grad_act_d.get(), grad_f32_d.f32(),
            act == DType::F16 ? w_act_d.get() : nullptr, n, n_act, act, lr_d.f32(), m, wd, nesterov};
  }
};

TEST(GpuSgd, UpdateMatchesReference) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const float lr = 0.1f, m = 0.9f, wd = 0.05f, scale = 1024.f;
  for (const DType act : {DType::F32, DType::F16})
    for (const bool nesterov : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + (nesterov ? ", nesterov" : ", classical"));
      const size_t n = 5000, n_act = 3000;
      SgdSetup s(rng, n, n_act, act, scale);
      const DeviceScaler state(scaler(scale));
      Vec w_act_ref(s.w.begin(), s.w.begin() + n_act), w_f32_ref(s.w.begin() + n_act, s.w.end());
      Vec m_act_ref(s.mom.begin(), s.mom.begin() + n_act), m_f32_ref(s.mom.begin() + n_act, s.mom.end());
      for (int step = 0; step < 2; ++step) {
        if (step == 1) {  // new gradients for the second step
          s.grad_act = quantize(act, random_normal(rng, n_act, 0.0, scale));
          s.grad_f32 = quantize(DType::F32, random_normal(rng, n - n_act, 0.0, scale));
          s.grad_act_d.upload(s.grad_act);
          s.grad_f32_d.upload(s.grad_f32);
        }
        const SgdArgs a = s.args(lr, m, wd, nesterov);
        check_grads_finite(a, state.ptr(), stream);
        sgd_update(a, state.ptr(), stream);
        Vec g_act = s.grad_act, g_f32 = s.grad_f32;
        for (double& g : g_act) g /= scale;
        for (double& g : g_f32) g /= scale;
        ref::sgd_step(w_act_ref, m_act_ref, g_act, lr, m, wd, nesterov);    // decayed
        ref::sgd_step(w_f32_ref, m_f32_ref, g_f32, lr, m, 0.0, nesterov);   // not decayed
      }
      EXPECT_EQ(state.get().found_inf, 0) << "all gradients are finite";
      // Compare the change of the weights (two steps of ~lr * |g|), not the weights themselves,
      // so that a wrong decay or momentum term cannot hide under |w|.
      const Vec w_gpu = s.w_d.download(), mom_gpu = s.mom_d.download();
      Vec dw_gpu_act(n_act), dw_ref_act(n_act), dw_gpu_f32(n - n_act), dw_ref_f32(n - n_act);
      for (size_t i = 0; i < n_act; ++i) {
        dw_gpu_act[i] = w_gpu[i] - s.w[i];
        dw_ref_act[i] = w_act_ref[i] - s.w[i];
      }
      for (size_t i = n_act; i < n; ++i) {
        dw_gpu_f32[i - n_act] = w_gpu[i] - s.w[i];
        dw_ref_f32[i - n_act] = w_f32_ref[i - n_act] - s.w[i];
      }
      EXPECT_CLOSE(dw_gpu_act, dw_ref_act, kTolF32) << "update of the decayed (conv/linear) weights";
      EXPECT_CLOSE(dw_gpu_f32, dw_ref_f32, kTolF32) << "update of the BN/bias parameters (no decay)";
      EXPECT_CLOSE(Vec(mom_gpu.begin(), mom_gpu.begin() + n_act), m_act_ref, kTolF32) << "momentum (decayed part)";
      EXPECT_CLOSE(Vec(mom_gpu.begin() + n_act, mom_gpu.end()), m_f32_ref, kTolF32) << "momentum (rest)";
      if (act == DType::F16) {  // the working copy: the new master weights rounded to fp16, only n_act of them
        const std::vector<uint8_t> raw = s.w_act_d.bytes();
        size_t wrong = 0, overrun = 0;
        for (size_t i = 0; i < n_act + SgdSetup::kGuard; ++i) {
          uint16_t b;
          std::memcpy(&b, raw.data() + 2 * i, 2);
          if (i < n_act) wrong += b != half_bits(__float2half(static_cast<float>(w_gpu[i])));
          else overrun += b != 0xFFFF;
        }
        EXPECT_EQ(wrong, 0u) << "fp16 working copy elements that are not the rounded master weight";
        EXPECT_EQ(overrun, 0u) << "fp16 copy written past n_act";
      }
    }
}

// A NaN or Inf anywhere in the gradients sets found_inf, and the update is then a no-op; the
// loss-scale update skips the step and halves the scale.
TEST(GpuSgd, NonFiniteGradientSkipsTheStep) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Bad {
    const char* what;
    bool in_act;   // in the activation-type part, else in the fp32 part
    bool at_end;   // last element of that part, else the first
    double value;
  };
  for (const DType act : {DType::F32, DType::F16})
    for (const Bad bad : {Bad{"NaN, first weight grad", true, false, nan}, Bad{"+Inf, last weight grad", true, true, inf},
                          Bad{"-Inf, first BN grad", false, false, -inf}, Bad{"NaN, last BN grad", false, true, nan}})
      for (const size_t n : {size_t(777), (size_t(1) << 20) + 3}) {  // 2^20 + 3: several grid-stride passes
        SCOPED_TRACE(std::string(dtype_name(act)) + ", " + bad.what + ", n " + std::to_string(n));
        const size_t n_act = n / 2 + 1;
        SgdSetup s(rng, n, n_act, act, 1.0);
        if (bad.in_act) s.grad_act[bad.at_end ? n_act - 1 : 0] = bad.value;
        else s.grad_f32[bad.at_end ? n - n_act - 1 : 0] = bad.value;
        s.grad_act_d.upload(s.grad_act);
        s.grad_f32_d.upload(s.grad_f32);
        const std::vector<uint8_t> w0 = s.w_d.bytes(), m0 = s.mom_d.bytes(), c0 = s.w_act_d.bytes();
        const DeviceScaler state(scaler(65536.f, 17, 0, 3));
        const SgdArgs a = s.args(0.1f, 0.9f, 5e-4f, true);
        check_grads_finite(a, state.ptr(), stream);
        EXPECT_EQ(state.get().found_inf, 1);
        sgd_update(a, state.ptr(), stream);
        EXPECT_TRUE(s.w_d.bytes() == w0) << "weights changed by a skipped step";
        EXPECT_TRUE(s.mom_d.bytes() == m0) << "momentum changed by a skipped step";
        EXPECT_TRUE(s.w_act_d.bytes() == c0) << "fp16 copy changed by a skipped step";
        loss_scale_update(state.ptr(), true, 2000, stream);
        expect_same_state(state.get(), scaler(32768.f, 0, 0, 4));
      }
}

// Finite gradients, the largest fp16 values included, leave found_inf clear.
TEST(GpuSgd, FiniteGradientsLeaveFoundInfClear) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const DType act : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(act));
    SgdSetup s(rng, 4096, 2048, act, 1.0);
    s.grad_act[0] = 65504.0;
    s.grad_act[1] = -65504.0;
    s.grad_f32[0] = 3.0e38;
    s.grad_act_d.upload(s.grad_act);
    s.grad_f32_d.upload(s.grad_f32);
    const DeviceScaler state(scaler(1.f));
    check_grads_finite(s.args(0.1f, 0.9f, 0.f, true), state.ptr(), stream);
    EXPECT_EQ(state.get().found_inf, 0);
  }
}

// Every branch of the scaling rule (loss_scale.h), with the state it must lead to.
struct LossScaleCase {
  const char* what;
  ScalerState before;
  bool dynamic;
  int window;
  ScalerState after;
};
const LossScaleCase kLossScaleCases[] = {
    {"overflow: halve, reset, count the skip", scaler(65536.f, 5, 1, 2), true, 2000, scaler(32768.f, 0, 0, 3)},
    {"a good step inside the window", scaler(65536.f, 1998, 0), true, 2000, scaler(65536.f, 1999, 0)},
    {"the window completes: double", scaler(65536.f, 1999, 0), true, 2000, scaler(131072.f, 0, 0)},
    {"at the ceiling: no doubling", scaler(kMaxLossScale, 1999, 0), true, 2000, scaler(kMaxLossScale, 0, 0)},
    {"below the floor after halving: diverged", scaler(kMinLossScale, 0, 1, 9), true, 2000,
     scaler(kMinLossScale / 2, 0, 0, 10, 1)},
    {"halved onto the floor: alive", scaler(2 * kMinLossScale, 0, 1), true, 2000, scaler(kMinLossScale, 0, 0, 1)},
    {"window of 1", scaler(1.f, 0, 0), true, 1, scaler(2.f, 0, 0)},
    {"fixed scale: a non-finite step diverges", scaler(1.f, 0, 1, 0), false, 2000, scaler(1.f, 0, 0, 1, 1)},
    {"fixed scale: a finite step changes nothing", scaler(1.f, 7, 0, 0), false, 2000, scaler(1.f, 7, 0, 0)},
};

// The CPU rule itself (what the GPU kernel is then compared with).
TEST(KernelArgs, LossScaleRuleOnTheCpu) {
  for (const LossScaleCase& c : kLossScaleCases) {
    SCOPED_TRACE(c.what);
    ScalerState s = c.before;
    apply_loss_scale_rule(s, c.dynamic, c.window);
    expect_same_state(s, c.after);
  }
}

TEST(GpuLossScale, UpdateMatchesTheCpuRule) {
  SKIP_WITHOUT_GPU("the loss-scale kernel");
  cudaStream_t stream = ctx().stream;
  for (const LossScaleCase& c : kLossScaleCases) {
    SCOPED_TRACE(c.what);
    DeviceScaler d(c.before);
    loss_scale_update(d.ptr(), c.dynamic, c.window, stream);
    ScalerState want = c.before;
    apply_loss_scale_rule(want, c.dynamic, c.window);
    expect_same_state(d.get(), want);
  }
}

// ================================================================================================
// Input normalization (kernels/normalize.cu) and casts (kernels/cast.cu)
// ================================================================================================

TEST(GpuNormalize, MatchesCpuInEveryLayoutAndType) {
  SKIP_WITHOUT_GPU("the normalization kernel");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const double mean[3] = {0.4914, 0.4822, 0.4465}, stdev[3] = {0.2470, 0.2435, 0.2616};
  NormalizeParams p{};
  for (int c = 0; c < 3; ++c) {
    p.scale[c] = static_cast<float>(1.0 / (255.0 * stdev[c]));
    p.shift[c] = static_cast<float>(-mean[c] / stdev[c]);
  }
  const int n = 3;
  for (const int side : {32, 64})  // the default and another --image-size
  for (const int in_channels : {1, 3})
    for (const Variant v : kVariants) {
      SCOPED_TRACE(variant_name(v) + (in_channels == 1 ? ", grey" : ", colour") + ", side " + std::to_string(side));
      const ref::Dims in_d{n, in_channels, side, side}, out_d{n, 3, side, side};
      std::uniform_int_distribution<int> pixel(0, 255);
      Vec in(in_d.count());
      for (double& e : in) e = pixel(rng);
      const Vec in_layout = to_layout(v.l, in_d, in);
      std::vector<uint8_t> bytes(in_layout.begin(), in_layout.end());
      DeviceBuffer in_dev(bytes.size(), "test pixels");
      CUDA_CHECK(cudaMemcpy(in_dev.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
      DeviceTensor out(out_d.count(), v.t);
      out.poison();
      normalize_u8(in_dev.as<uint8_t>(), n, in_channels, side, v.l, p, out.get(), v.t, stream);

      Vec want(out_d.count());
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < 3; ++c)
          for (int y = 0; y < side; ++y)
            for (int x = 0; x < side; ++x)
              want[out_d.at(i, c, y, x)] =
                  in[in_d.at(i, in_channels == 1 ? 0 : c, y, x)] * double(p.scale[c]) + double(p.shift[c]);
      EXPECT_CLOSE(download_activation(out, out_d, v.l), want, tol(v.t));
    }
}

// Values whose fp16 rounding is easy to get wrong: ties, the overflow edge, subnormals, specials.
std::vector<float> tricky_floats() {
  const float tiny = std::ldexp(1.f, -24);  // smallest fp16 subnormal
  return {0.f, -0.f, 1.f, -1.f, 65504.f, -65504.f, 65519.f, 65520.f, -65520.f, 1e6f, 1e-8f,
          1.f + std::ldexp(1.f, -11),        // tie between 1 and 1 + 2^-10: to even (1)
          1.f + 3 * std::ldexp(1.f, -11),    // tie: to even (1 + 2^-9)
          1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20),  // just above the tie: up
          tiny, tiny / 2, 3 * tiny / 2, tiny / 4, std::ldexp(1.f, -14), std::ldexp(1.f, -14) - tiny / 2,
          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
}

bool same_half(uint16_t a, uint16_t b) {
  const bool nan_a = (a & 0x7C00) == 0x7C00 && (a & 0x3FF), nan_b = (b & 0x7C00) == 0x7C00 && (b & 0x3FF);
  return a == b || (nan_a && nan_b);
}

TEST(GpuCast, F32ToF16RoundsLikeTheHost) {
  SKIP_WITHOUT_GPU("the cast kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  std::vector<float> in = tricky_floats();
  for (double e : random_normal(rng, 100003 - in.size(), 0.0, 100.0)) in.push_back(static_cast<float>(e));
  DeviceBuffer in_d(in.size() * 4, "cast input");
  CUDA_CHECK(cudaMemcpy(in_d.get(), in.data(), in_d.bytes(), cudaMemcpyHostToDevice));
  DeviceTensor out(in.size(), DType::F16);
  out.poison();
  cast_f32_to_f16(in_d.as<float>(), out.get(), in.size(), stream);
  const std::vector<uint8_t> raw = out.bytes();
  size_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, raw.data() + 2 * i, 2);
    const uint16_t want = half_bits(__float2half(in[i]));
    if (!same_half(got, want) && wrong++ < 5)
      ADD_FAILURE() << "cast of " << in[i] << " (element " << i << "): got 0x" << std::hex << got << ", want 0x" << want;
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(GpuCast, F16ToF32IsExactForEveryBitPattern) {
  SKIP_WITHOUT_GPU("the cast kernels");
  cudaStream_t stream = ctx().stream;
  std::vector<uint16_t> in(65536);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  DeviceBuffer in_d(in.size() * 2, "cast input");
  CUDA_CHECK(cudaMemcpy(in_d.get(), in.data(), in_d.bytes(), cudaMemcpyHostToDevice));
  DeviceTensor out(in.size(), DType::F32);
  out.poison();
  cast_f16_to_f32(in_d.get(), out.f32(), in.size(), stream);
  const std::vector<uint8_t> raw = out.bytes();
  size_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    float got;
    std::memcpy(&got, raw.data() + 4 * i, 4);
    const float want = __half2float(half_from_bits(in[i]));
    const bool ok = float_bits(got) == float_bits(want) || (std::isnan(got) && std::isnan(want));
    if (!ok && wrong++ < 5)
      ADD_FAILURE() << "cast of 0x" << std::hex << in[i] << ": got " << got << ", want " << want;
  }
  EXPECT_EQ(wrong, 0u);
}

// ================================================================================================
// CPU-only checks: argument validation before any launch, and the host fp16 conversion the tests
// themselves rely on (quantize, the expected cast results).
// ================================================================================================

TEST(KernelArgs, BatchNormRejectsShapesItCannotVectorize) {
  const BnChannelState st{};
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 12, 4, 4}, DType::F16, Layout::NHWC, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 6, 4, 4}, DType::F32, Layout::NHWC, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 8, 2, 2}, DType::F16, Layout::NCHW, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 8, 3, 3}, DType::F32, Layout::NCHW, st, nullptr, nullptr), Fatal);
  const ApplyArgs a{};
  EXPECT_THROW(bn_apply(a, {2, 12, 4, 4}, DType::F16, Layout::NHWC, nullptr), Fatal);
  BnBackwardArgs b{};
  b.bn = &st;
  EXPECT_THROW(bn_backward(b, {2, 8, 3, 3}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
}

TEST(KernelArgs, BatchNormBackwardRejectsResidualPathsWithoutRelu) {
  const BnChannelState st{};
  int dummy = 0;
  BnBackwardArgs b{};
  b.bn = &st;
  b.dres = &dummy;  // identity shortcut without the ReLU output
  EXPECT_THROW(bn_backward(b, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs c{};
  c.bn = &st;
  c.relu = ReluMask::FromOutput;
  c.y = &dummy;
  c.x2 = &dummy;
  c.bn2 = &st;
  c.dres = &dummy;  // projection and identity at once
  EXPECT_THROW(bn_backward(c, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs e{};
  e.bn = &st;
  e.relu = ReluMask::FromOutput;  // the mask's source missing
  EXPECT_THROW(bn_backward(e, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs f{};
  f.bn = &st;
  f.relu = ReluMask::FromInput;  // recomputing the mask from x ignores the residual that came before the ReLU
  f.dres = &dummy;
  EXPECT_THROW(bn_backward(f, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs g{};
  g.bn = &st;
  g.relu = ReluMask::FromBits;  // the bits missing
  g.dres = &dummy;
  EXPECT_THROW(bn_backward(g, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
}

TEST(KernelArgs, BatchNormApplyRejectsReluBitsWithoutRelu) {
  uint8_t bits[64];
  ApplyArgs a{};
  a.relu = false;
  a.relu_bits = bits;
  EXPECT_THROW(bn_apply(a, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr), Fatal);
}

TEST(KernelArgs, SoftmaxXentRejectsMoreThan16Classes) {
  EXPECT_THROW(softmax_xent(nullptr, nullptr, nullptr, 4, 17, nullptr, DType::F32, nullptr, nullptr, nullptr, nullptr,
                            nullptr),
               Fatal);
}

TEST(HostHalf, ConversionRoundsToNearestEven) {
  const float tiny = std::ldexp(1.f, -24);
  auto bits = [](float f) { return half_bits(__float2half(f)); };
  EXPECT_EQ(bits(1.f), 0x3C00);
  EXPECT_EQ(bits(1.f + std::ldexp(1.f, -11)), 0x3C00);      // tie to even
  EXPECT_EQ(bits(1.f + 3 * std::ldexp(1.f, -11)), 0x3C02);  // tie to even, upwards
  EXPECT_EQ(bits(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20)), 0x3C01);
  EXPECT_EQ(bits(65504.f), 0x7BFF);
  EXPECT_EQ(bits(65519.f), 0x7BFF);
  EXPECT_EQ(bits(65520.f), 0x7C00);  // rounds to infinity
  EXPECT_EQ(bits(-65520.f), 0xFC00);
  EXPECT_EQ(bits(tiny), 0x0001);
  EXPECT_EQ(bits(tiny / 2), 0x0000);      // tie to even: zero
  EXPECT_EQ(bits(3 * tiny / 2), 0x0002);  // tie to even: 2 * tiny
  EXPECT_EQ(bits(-0.f), 0x8000);
  EXPECT_EQ(bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(__half2float(__float2half(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t b = 0; b < 0x7C00; b += 7)  // every finite positive fp16 survives the round trip
    EXPECT_EQ(bits(__half2float(half_from_bits(static_cast<uint16_t>(b)))), b);
  EXPECT_EQ(quantize(DType::F16, 0.1), double(__half2float(__float2half(0.1f))));
  EXPECT_EQ(quantize(DType::F32, 0.1), double(0.1f));
}

}  // namespace
