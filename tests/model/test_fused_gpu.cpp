// The fused batch-norm patterns (model/fused_conv.h), training and inference, against the CPU
// references in double, fp16 NHWC as the fused rungs run them, at the shapes of the network's convs
// (1x1, 3x3, stride 2):
// each output against ||gpu - ref|| / ||ref|| <= 1e-2 (fp16), the per-channel sums and BN
// gradients too. A pattern cuDNN refuses on this GPU skips its test with cuDNN's reason (the
// network then runs that conv unfused, which test_conv_linear_gpu.cpp and tests/kernels/ cover);
// the finalize kernel and the report are checked on their own. Without a GPU every test but the
// report skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include "core/handles.h"
#include "kernels/batchnorm.h"
#include "kernels/chained_launch.h"
#include "model/autotune_cache.h"
#include "model/fused_conv.h"
#include "model/gemm_conv.h"
#include "model/gemm_wgrad.h"
#include "model/training_network.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

constexpr double kTol = kTolF16;
const Layout kL = Layout::NHWC;

struct Case {
  const char* name;
  ConvGeometry g;
};
// The last four: the odd sides of --image-size 28 (stages 28, 14, 7, 4), where N*H*W is odd per
// image and the stride-2 conv's last window reaches into the padding.
const Case kCases[] = {{"3x3", {8, 64, 8, 8, 64, 3, 1, 1}},
                       {"1x1_expand", {8, 64, 8, 8, 256, 1, 1, 0}},
                       {"1x1_reduce", {8, 256, 8, 8, 64, 1, 1, 0}},
                       {"3x3_stride2", {8, 128, 8, 8, 128, 3, 2, 1}},
                       {"3x3_7x7", {8, 64, 7, 7, 64, 3, 1, 1}},
                       {"1x1_expand_7x7", {8, 64, 7, 7, 256, 1, 1, 0}},
                       {"3x3_stride2_14to7", {8, 128, 14, 14, 128, 3, 2, 1}},
                       {"3x3_stride2_7to4", {8, 128, 7, 7, 128, 3, 2, 1}}};

// The fp16 values the GPU holds, in NCHW, and the device copy in NHWC.
struct Act {
  Vec v;
  DeviceTensor d;
  Act(Vec nchw, const ref::Dims& dims) : v(quantize(DType::F16, std::move(nchw))), d(upload_activation(v, dims, DType::F16, kL)) {}
};

std::unique_ptr<FusedConv> build_or_skip(FusedPattern p, const ConvGeometry& g, std::string& skip) {
  auto f = std::make_unique<FusedConv>(ctx().cudnn, p, g, FusedOptions{});
  if (!f->ok()) skip = std::string("cuDNN refused ") + fused_pattern_name(p) + " for " + g.key() + ": " + f->why();
  return f;
}

#define BUILD_OR_SKIP(var, pattern, g)                  \
  std::string skip_;                                    \
  auto var = build_or_skip(pattern, g, skip_);          \
  if (!skip_.empty()) GTEST_SKIP() << skip_

class FusedGpu : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU("cuDNN's fused patterns"); }
  DeviceTensor workspace(const FusedConv& f) { return DeviceTensor(f.workspace() + 16, DType::F32, "workspace"); }
};

// y = conv(x) or conv(relu(x * s + b)), and the channel sums of y, against the reference.
void check_conv_stats(const FusedConv& f, const ConvGeometry& g, DeviceTensor& ws) {
  const bool prologue = f.pattern() == FusedPattern::SbrConvStats;
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  Act x(random_normal(rng, cd.input().count(), 0.2, 1.0), cd.input());
  Filter w(rng, g);
  const DType st = f.scale_type();
  const Vec s = quantize(st, random_uniform(rng, g.c, 0.5, 1.5)), b = quantize(st, random_normal(rng, g.c, 0.0, 0.5));
  DeviceTensor ds(s, st), db(b, st), y(cd.output().count(), DType::F16), sum(g.k, DType::F32), sq(g.k, DType::F32);
  for (DeviceTensor* t : {&y, &sum, &sq}) t->poison();
  FusedArgs a;
  a.x = x.d.get();
  a.w = w.d.get();
  if (prologue) {
    a.scale = ds.get();
    a.bias = db.get();
  }
  a.y = y.get();
  a.sum = sum.f32();
  a.sqsum = sq.f32();
  f.run(ctx().cudnn, a, ws.get(), ws.count() * 4);
  const Vec got = download_activation(y, cd.output(), kL);
  EXPECT_CLOSE(got, ref::conv2d_forward(cd, prologue ? sbr(cd.input(), x.v, s, b) : x.v, w.v), kTol);
  Vec s_want, q_want;
  channel_sums(cd.output(), got, s_want, q_want);  // of the fp16 values written: what the statistics read
  EXPECT_CLOSE(sum.download(), s_want, kTol);
  EXPECT_CLOSE(sq.download(), q_want, kTol);
}

TEST_P(FusedGpu, ConvStatsMatchesConvAndItsChannelSums) {
  BUILD_OR_SKIP(f, FusedPattern::ConvStats, GetParam().g);
  DeviceTensor ws = workspace(*f);
  check_conv_stats(*f, GetParam().g, ws);
}

TEST_P(FusedGpu, ScaleBiasReluConvStatsAppliesTheBnOnRead) {
  BUILD_OR_SKIP(f, FusedPattern::SbrConvStats, GetParam().g);
  DeviceTensor ws = workspace(*f);
  check_conv_stats(*f, GetParam().g, ws);
}

TEST_P(FusedGpu, ScaleBiasReluWgradTakesTheGradientOfTheBnOutput) {
  const ConvGeometry& g = GetParam().g;
  BUILD_OR_SKIP(f, FusedPattern::SbrWgrad, g);
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  Act x(random_normal(rng, cd.input().count(), 0.2, 1.0), cd.input());
  Act dy(random_normal(rng, cd.output().count()), cd.output());
  const DType st = f->scale_type();
  const Vec s = quantize(st, random_uniform(rng, g.c, 0.5, 1.5)), b = quantize(st, random_normal(rng, g.c, 0.0, 0.5));
  DeviceTensor ds(s, st), db(b, st), dw(g.filter_count(), DType::F16), ws = workspace(*f);
  dw.poison();
  FusedArgs a;
  a.x = x.d.get();
  a.scale = ds.get();
  a.bias = db.get();
  a.dy = dy.d.get();
  a.dw = dw.get();
  f->run(ctx().cudnn, a, ws.get(), ws.count() * 4);
  const Vec got = ref::krsc_to_kcrs(g.k, g.c, g.r, g.r, dw.download());
  EXPECT_CLOSE(got, ref::conv2d_backward_filter(cd, sbr(cd.input(), x.v, s, b), dy.v), kTol);
}

// dgrad, then the ReLU mask of bn(x) and BN backward weights; dx then comes from our apply kernel
// (the join kernel with x as its second input), as the network runs it.
TEST_P(FusedGpu, DgradDreluDbnGivesTheBnInputGradient) {
  const ConvGeometry& g = GetParam().g;
  BUILD_OR_SKIP(f, FusedPattern::DgradDreluDbn, g);
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  const ref::Dims in = cd.input();
  Act x(random_normal(rng, in.count(), 0.3, 1.2), in);
  Act dy(random_normal(rng, cd.output().count()), cd.output());
  Filter w(rng, g);
  const Vec gamma = quantize(DType::F32, random_uniform(rng, g.c, 0.5, 1.5));
  const Vec beta = quantize(DType::F32, random_normal(rng, g.c, 0.0, 0.5));
  const ref::BnStats st = saved_stats(in, x.v);
  DeviceTensor mean(st.mean, DType::F32), invstd(st.invstd, DType::F32), dgamma(gamma, DType::F32),
      dbeta(beta, DType::F32), gout(in.count(), DType::F16), dg(g.c, DType::F32), db(g.c, DType::F32),
      coef(3 * size_t(g.c), DType::F32), zeros(Vec(g.c, 0.0), DType::F32), ws = workspace(*f);
  for (DeviceTensor* t : {&gout, &dg, &db, &coef}) t->poison();
  FusedArgs a;
  a.dy = dy.d.get();
  a.w = w.d.get();
  a.x = x.d.get();
  a.mean = mean.f32();
  a.invstd = invstd.f32();
  a.gamma = dgamma.f32();
  a.beta = dbeta.f32();
  a.g = gout.get();
  a.dgamma = dg.f32();
  a.dbeta = db.f32();
  a.eq_dy = coef.f32();
  a.eq_x = coef.f32() + g.c;
  a.eq_b = coef.f32() + 2 * g.c;
  f->run(ctx().cudnn, a, ws.get(), ws.count() * 4);

  // The reference: the BN output's ReLU mask applied to the conv's data gradient, then BN backward.
  const Vec bn_out = ref::bn_affine(in, x.v, ref::bn_train_coefs(st, gamma, beta));
  const Vec g_want = ref::relu_backward(ref::conv2d_backward_data(cd, dy.v, w.v), bn_out);
  const Vec g_got = download_activation(gout, in, kL);
  EXPECT_CLOSE(g_got, g_want, kTol);
  const ref::BnGrads want = ref::bn_backward(in, g_got, x.v, gamma, st);  // from the g written
  EXPECT_CLOSE(dg.download(), want.dgamma, kTol);
  EXPECT_CLOSE(db.download(), want.dbeta, kTol);
  const Shape4 s{in.n, in.c, in.h, in.w};
  float* k = coef.f32();
  bn_apply({gout.get(), k, k + 2 * g.c, Residual::BatchNorm, x.d.get(), k + g.c, zeros.f32(), false, gout.get()}, s,
           DType::F16, kL, ctx().stream);
  EXPECT_CLOSE(download_activation(gout, in, kL), want.dx, kTol);
}

// Inference: y = relu?(conv(x) * s + b + z?), the BN (running statistics) in the conv's epilogue.
void check_epilogue(FusedPattern p, const ConvGeometry& g, const FusedConv& f, DeviceTensor& ws) {
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  Act x(random_normal(rng, cd.input().count(), 0.2, 1.0), cd.input());
  Filter w(rng, g);
  // z of the join's size: the shortcut's BN output, about as large as the conv's
  Act z(random_normal(rng, cd.output().count(), 0.0, 1.0), cd.output());
  const DType st = f.scale_type();
  const ref::BnCoefs k{quantize(st, random_uniform(rng, g.k, 0.5, 1.5)), quantize(st, random_normal(rng, g.k, 0.0, 0.5))};
  DeviceTensor ds(k.scale, st), db(k.shift, st), y(cd.output().count(), DType::F16);
  y.poison();
  FusedArgs a;
  a.x = x.d.get();
  a.w = w.d.get();
  a.scale = ds.get();
  a.bias = db.get();
  if (p == FusedPattern::ConvBnAddRelu) a.z = z.d.get();
  a.y = y.get();
  f.run(ctx().cudnn, a, ws.get(), ws.count() * 4);
  Vec want = ref::bn_affine(cd.output(), ref::conv2d_forward(cd, x.v, w.v), k);
  if (p == FusedPattern::ConvBnAddRelu) want = ref::add(want, z.v);
  if (p != FusedPattern::ConvBn) want = ref::relu(want);
  EXPECT_CLOSE(download_activation(y, cd.output(), kL), want, kTol);
}

TEST_P(FusedGpu, ConvBnAppliesTheBnInTheEpilogue) {
  BUILD_OR_SKIP(f, FusedPattern::ConvBn, GetParam().g);
  DeviceTensor ws = workspace(*f);
  check_epilogue(FusedPattern::ConvBn, GetParam().g, *f, ws);
}

TEST_P(FusedGpu, ConvBnReluAppliesTheBnAndReluInTheEpilogue) {
  BUILD_OR_SKIP(f, FusedPattern::ConvBnRelu, GetParam().g);
  DeviceTensor ws = workspace(*f);
  check_epilogue(FusedPattern::ConvBnRelu, GetParam().g, *f, ws);
}

TEST_P(FusedGpu, ConvBnAddReluAddsTheResidualBeforeTheRelu) {
  BUILD_OR_SKIP(f, FusedPattern::ConvBnAddRelu, GetParam().g);
  DeviceTensor ws = workspace(*f);
  check_epilogue(FusedPattern::ConvBnAddRelu, GetParam().g, *f, ws);
}

// Inference's 1x1 convs as one cuBLASLt GEMM (model/gemm_conv.h): the filter with the BN's scale
// folded in by fold_bn_into_filters, the shift as the epilogue's bias, the residual read as C; the
// same y = relu?(conv(x) * s + b + z?) as the cuDNN epilogues, against the reference.
void check_gemm(FusedPattern p, const ConvGeometry& g) {
  const GemmConv gemm(ctx().cublas_lt, p, g, size_t(64) << 20, ctx().stream);
  if (!gemm.ok()) GTEST_SKIP() << "cuBLASLt offers nothing for " << fused_pattern_name(p) << ": " << gemm.why();
  EXPECT_GT(gemm.ms(), 0.f) << "the algorithm was chosen by timing";
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  Act x(random_normal(rng, cd.input().count(), 0.2, 1.0), cd.input());
  Filter w(rng, g);
  Act z(random_normal(rng, cd.output().count(), 0.0, 1.0), cd.output());
  const ref::BnCoefs k{quantize(DType::F32, random_uniform(rng, g.k, 0.5, 1.5)),
                       quantize(DType::F16, random_normal(rng, g.k, 0.0, 0.5))};
  DeviceTensor scale(k.scale, DType::F32), shift_h(k.shift, DType::F16), folded(g.filter_count(), DType::F16),
      y(cd.output().count(), DType::F16), ws(gemm.workspace() / 4 + 16, DType::F32, "workspace");
  for (DeviceTensor* t : {&folded, &y}) t->poison();
  const FilterFold fold{w.d.get(), scale.f32(), folded.get(), g.k, g.c};
  DeviceBuffer folds(sizeof fold, "filter folds");
  CUDA_CHECK(cudaMemcpy(folds.get(), &fold, sizeof fold, cudaMemcpyHostToDevice));
  fold_bn_into_filters(folds.as<FilterFold>(), 1, g.filter_count(), ctx().stream);
  const bool add_z = p == FusedPattern::GemmBnAddRelu;
  gemm.run(ctx().cublas_lt, x.d.get(), folded.get(), shift_h.get(), add_z ? z.d.get() : nullptr, y.get(), ws.get(),
           ws.count() * 4, ctx().stream);
  Vec want = ref::bn_affine(cd.output(), ref::conv2d_forward(cd, x.v, w.v), k);
  if (add_z) want = ref::add(want, z.v);
  if (p != FusedPattern::GemmBn) want = ref::relu(want);
  EXPECT_CLOSE(download_activation(y, cd.output(), kL), want, kTol);
  // The fold alone: each filter row times its channel's scale, rounded once to fp16.
  const Vec wf = folded.download(), wd = w.d.download();
  for (size_t i = 0; i < wf.size(); ++i)
    ASSERT_EQ(wf[i], quantize(DType::F16, Vec{double(float(wd[i]) * float(k.scale[i / g.c]))})[0]) << "filter value " << i;
}

class GemmGpu : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU("cuBLASLt's GEMMs"); }
};

TEST_P(GemmGpu, GemmBnIsTheConvWithItsBnInTheFilterAndBias) { check_gemm(FusedPattern::GemmBn, GetParam().g); }

TEST_P(GemmGpu, GemmBnReluAppliesTheReluInTheEpilogue) { check_gemm(FusedPattern::GemmBnRelu, GetParam().g); }

TEST_P(GemmGpu, GemmBnAddReluReadsTheResidualAsC) { check_gemm(FusedPattern::GemmBnAddRelu, GetParam().g); }

// The network's 1x1 convs: a GEMM runs no other (the last at 7x7: M = N*H*W odd per image).
const Case kGemmCases[] = {kCases[1], kCases[2], kCases[5]};
INSTANTIATE_TEST_SUITE_P(Shapes, GemmGpu, testing::ValuesIn(kGemmCases),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Only a 1x1 stride-1 unpadded conv is a matrix product in NHWC (with rows cuBLASLt can read
// aligned); anything else is refused, not run.
TEST(GemmConv, AppliesToThe1x1Stride1ConvsOnly) {
  EXPECT_TRUE(GemmConv::applies({8, 64, 8, 8, 256, 1, 1, 0}));
  EXPECT_FALSE(GemmConv::applies({8, 64, 8, 8, 64, 3, 1, 1}));
  EXPECT_FALSE(GemmConv::applies({8, 256, 8, 8, 512, 1, 2, 0})) << "the strided projection shortcut";
  EXPECT_FALSE(GemmConv::applies({8, 64, 8, 8, 64, 1, 1, 1})) << "padded";
  EXPECT_FALSE(GemmConv::applies({8, 3, 8, 8, 64, 1, 1, 0})) << "rows of x not 16-byte aligned";
  EXPECT_FALSE(GemmConv::applies({8, 64, 8, 8, 10, 1, 1, 0})) << "rows of y not 16-byte aligned";
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedGpu, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A measured plan rebuilt from what the autotune cache keeps (choice()): the same engine, built
// alone, computing the pattern; a cached plan that no longer plans here is searched again.
TEST(FusedGpuCache, ACachedPlanIsBuiltAloneAndComputesThePattern) {
  SKIP_WITHOUT_GPU("the fused patterns");
  const ConvGeometry g = kCases[0].g;
  FusedOptions o;
  o.measure = true;
  FusedConv measured(ctx().cudnn, FusedPattern::ConvBnRelu, g, o);
  if (!measured.ok()) GTEST_SKIP() << "cuDNN refused " << fused_pattern_name(FusedPattern::ConvBnRelu) << ": " << measured.why();
  EXPECT_FALSE(measured.from_cache());
  const FusedChoice c = measured.choice();
  EXPECT_FALSE(c.engine.empty());
  EXPECT_GT(c.ms, 0.f);
  EXPECT_EQ(c.ms, measured.ms());
  EXPECT_EQ(c.workspace, measured.workspace());

  FusedConv again(ctx().cudnn, FusedPattern::ConvBnRelu, g, o, &c);
  ASSERT_TRUE(again.ok()) << again.why();
  EXPECT_TRUE(again.from_cache());
  EXPECT_EQ(again.choice(), c) << "the same engine, types, workspace and time";
  EXPECT_EQ(again.scale_type(), measured.scale_type());
  DeviceTensor ws(again.workspace() + 16, DType::F32, "workspace");
  check_epilogue(FusedPattern::ConvBnRelu, g, again, ws);

  // An engine cuDNN does not have; a type pair that is not one of the tries; a tag that names no
  // engine (a hand-edited file).
  for (const FusedChoice& stale : {FusedChoice{"eng99999", c.types, c.workspace, 0.001f},
                                   FusedChoice{c.engine, 9, c.workspace, 0.001f},
                                   FusedChoice{"engine", c.types, c.workspace, 0.001f}}) {
    FusedConv searched(ctx().cudnn, FusedPattern::ConvBnRelu, g, o, &stale);
    ASSERT_TRUE(searched.ok()) << searched.why();
    EXPECT_FALSE(searched.from_cache());
    EXPECT_NE(searched.choice().engine, "eng99999");
    EXPECT_NE(searched.ms(), 0.001f) << "measured again, not the stale entry's time";
    EXPECT_TRUE(searched.why().empty()) << "a stale entry is no refusal: " << searched.why();
  }
  // Without measuring (heuristic algorithms) a cached plan is not used: nothing measured chose it.
  o.measure = false;
  FusedConv heuristic(ctx().cudnn, FusedPattern::ConvBnRelu, g, o, &c);
  ASSERT_TRUE(heuristic.ok());
  EXPECT_FALSE(heuristic.from_cache());
}

// One BN's parameters and running statistics (random) for a finalize to write into, its outputs
// poisoned; check() compares what it wrote with the reference statistics of x.
struct FinalizeCase {
  ref::Dims d;
  Vec gamma, beta, run_mean, run_var;
  DeviceTensor dgamma, dbeta, rm, rv, mean, invstd, scale, shift, coef, scale_h, shift_h;
  BnChannelState bn;
  FinalizeCase(std::mt19937_64& rng, const ref::Dims& dims)
      : d(dims),
        gamma(quantize(DType::F32, random_uniform(rng, d.c, 0.5, 1.5))),
        beta(quantize(DType::F32, random_normal(rng, d.c, 0.0, 0.5))),
        run_mean(quantize(DType::F32, random_normal(rng, d.c, 0.0, 0.5))),
        run_var(quantize(DType::F32, random_uniform(rng, d.c, 0.5, 2.0))),
        dgamma(gamma, DType::F32), dbeta(beta, DType::F32), rm(run_mean, DType::F32), rv(run_var, DType::F32),
        mean(d.c, DType::F32), invstd(d.c, DType::F32), scale(d.c, DType::F32), shift(d.c, DType::F32),
        coef(3 * size_t(d.c), DType::F32), scale_h(d.c, DType::F16), shift_h(d.c, DType::F16),
        bn{dgamma.f32(), dbeta.f32(), rm.f32(), rv.f32(), mean.f32(), invstd.f32(), scale.f32(), shift.f32(),
           coef.f32()} {
    for (DeviceTensor* t : {&mean, &invstd, &scale, &shift}) t->poison();
  }
  void check(const Vec& x) {
    const ref::BnStats st = ref::bn_batch_stats(d, x, double(kBnEps));
    const ref::BnCoefs k = ref::bn_train_coefs(st, gamma, beta);
    ref::bn_update_running(st, d.per_channel(), double(kBnMomentum), run_mean, run_var);
    EXPECT_CLOSE(mean.download(), st.mean, 1e-5);
    EXPECT_CLOSE(invstd.download(), st.invstd, 1e-4);
    EXPECT_CLOSE(scale.download(), k.scale, 1e-4);
    EXPECT_CLOSE(shift.download(), k.shift, 1e-4);
    EXPECT_EQ(scale_h.download(), quantize(DType::F16, scale.download())) << "the fp16 copy of scale";
    EXPECT_EQ(shift_h.download(), quantize(DType::F16, shift.download())) << "the fp16 copy of shift";
    EXPECT_CLOSE(rm.download(), run_mean, 1e-5);
    EXPECT_CLOSE(rv.download(), run_var, 1e-4);
  }
};

// Statistics from sums (a fused conv's) give the batch mean, 1/std, scale, shift and running
// statistics of the unfused path.
TEST(FusedBnFinalize, SumsGiveTheBatchStatisticsAndRunningUpdate) {
  SKIP_WITHOUT_GPU("the finalize kernel");
  auto rng = test_rng();
  const ref::Dims d{16, 64, 4, 4};
  const Vec x = random_normal(rng, d.count(), 1.5, 2.0);
  Vec sum, sq;
  channel_sums(d, x, sum, sq);
  DeviceTensor dsum(sum, DType::F32), dsq(sq, DType::F32);
  FinalizeCase f(rng, d);
  bn_finalize_sums(dsum.f32(), dsq.f32(), d.per_channel(), f.bn, d.c, f.scale_h.get(), f.shift_h.get(),
                   ctx().stream);
  f.check(x);
  EXPECT_EQ(dsum.download(), Vec(d.c, 0.0)) << "the sums are left zero for the next accumulation";
  EXPECT_EQ(dsq.download(), Vec(d.c, 0.0));
}

// Statistics from rows of per-tile partial sums (a conv of our own leaves them so) give what the
// sums give; the columns past the channels are padding and not read, and the partials are left as
// they were.
TEST(FusedBnFinalize, PartialRowsGiveTheBatchStatisticsAndRunningUpdate) {
  SKIP_WITHOUT_GPU("the finalize kernel");
  auto rng = test_rng();
  const ref::Dims d{8, 40, 5, 7};  // 280 pixels: tiles of 16 pixels make 18 rows, the last short
  const int tile = 16, row_len = 64, pixels = d.n * d.h * d.w, rows = (pixels + tile - 1) / tile;
  const Vec x = random_normal(rng, d.count(), 1.5, 2.0);
  Vec part(2 * size_t(rows) * row_len, std::nan(""));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d.c; ++c) {
      double s1 = 0, s2 = 0;
      for (int p = r * tile; p < std::min(pixels, (r + 1) * tile); ++p) {
        const int n = p / (d.h * d.w), hw = p % (d.h * d.w);
        const double v = x[(size_t(n) * d.c + c) * d.h * d.w + hw];
        s1 += v;
        s2 += v * v;
      }
      part[size_t(r) * row_len + c] = float(s1);
      part[(size_t(rows) + r) * row_len + c] = float(s2);
    }
  DeviceTensor dpart(part, DType::F32);
  FinalizeCase f(rng, d);
  bn_finalize_partials(dpart.f32(), rows, row_len, d.per_channel(), f.bn, d.c, f.scale_h.get(), f.shift_h.get(),
                       ctx().stream);
  f.check(x);
  const Vec after = dpart.download();
  for (size_t i = 0; i < part.size(); ++i) {
    if (std::isnan(part[i])) continue;  // padding
    ASSERT_EQ(after[i], part[i]) << "partial " << i << " is only read";
  }
}

// Rows shorter than the channels are refused before anything runs (no GPU needed).
TEST(FusedBnFinalize, PartialRowsShorterThanTheChannelsAreRefused) {
  const BnChannelState bn{};
  EXPECT_THROW(bn_finalize_partials(nullptr, 4, 32, 100, bn, 64, nullptr, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_finalize_partials(nullptr, 0, 64, 100, bn, 64, nullptr, nullptr, nullptr), Fatal);
}

// ---- --no-fuse: patterns switched off run plain ---------------------------------------------------
// bin/train's network (fp16, NHWC, batch 16, fused) with the patterns `off` run plain.
NetConfig training_config(unsigned off, bool wgrad_beside, bool data_parallel) {
  NetConfig cfg;
  cfg.wgrad_beside = wgrad_beside;
  cfg.data_parallel = data_parallel;
  cfg.batch = 16;
  cfg.dtype = DType::F16;
  cfg.layout = Layout::NHWC;
  cfg.conv = {AlgoPolicy::Heuristic, false, size_t(256) << 20};
  cfg.conv_api = ConvApi::Graph;
  cfg.fused_bn = true;
  cfg.unfused_patterns = off;
  return cfg;
}

// What fusing did for that network.
FusionReport training_fusion_report(GpuContext& ctx, AutotuneCache& cache, unsigned off, bool wgrad_beside = false,
                                    bool data_parallel = false) {
  return TrainingNetwork(training_config(off, wgrad_beside, data_parallel), ctx, cache).fusion_report();
}

// A training network built three times from one configuration: as is, with two kinds of pattern
// switched off, with all of them off. The switched-off kinds are not even planned (every conv of
// theirs reads "switched off"), and the others fuse exactly as before.
TEST(FusedNetworkGpu, SwitchedOffPatternsRunPlainAndTheRestAsBefore) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "no-fuse test");
  auto report = [&](unsigned off) { return training_fusion_report(ctx, cache, off); };
  const FusionReport full = report(0);
  if (full.fused == 0) GTEST_SKIP() << "cuDNN fused no conv here: " << fusion_report_lines(full).back();
  const unsigned off = fused_pattern_bit(FusedPattern::SbrWgrad) | fused_pattern_bit(FusedPattern::ConvStats);
  const FusionReport some = report(off);
  std::printf("[ fusion ] as is:   %s\n[ fusion ] two off: %s\n", fusion_report_lines(full)[0].c_str(),
              fusion_report_lines(some)[0].c_str());
  EXPECT_EQ(some.tried, full.tried);
  int tried_off = 0;  // convs of the switched-off kinds
  for (const FusionRefusal& f : some.refused) {
    if (off & fused_pattern_bit(f.pattern)) {
      EXPECT_EQ(f.why, kSwitchedOff) << f.layer;
      ++tried_off;
    } else {
      EXPECT_NE(f.why, kSwitchedOff) << f.layer;
    }
  }
  EXPECT_GT(tried_off, 0) << "the network has convs of both kinds";
  int fused_off_before = tried_off;  // of them, those fused as is
  for (const FusionRefusal& f : full.refused) fused_off_before -= (off & fused_pattern_bit(f.pattern)) != 0;
  EXPECT_EQ(some.fused, full.fused - fused_off_before) << "the other kinds fuse as before";
  const std::vector<std::string> lines = fusion_report_lines(some);
  bool named = false;
  for (const std::string& l : lines) named |= l.find("scale-bias-ReLU + weight gradient not fused") != std::string::npos &&
                                              l.find("switched off by --no-fuse") != std::string::npos;
  EXPECT_TRUE(named) << "the report names the switched-off kind and why";

  const FusionReport none = report(parse_fused_pattern_list("all"));
  EXPECT_EQ(none.tried, full.tried);
  EXPECT_EQ(none.fused, 0);
  EXPECT_EQ(int(none.refused.size()), none.tried);
  EXPECT_EQ(none.plans, 0) << "a switched-off pattern is not planned";
}

// Our conv3 kernel reads relu(bn2(a2)) stored by a BN pass where y2 is stored anyway (the weight
// gradient plain) and 8 or more columns of tiles would each apply bn2 in the prologue: 512 output
// channels and up, the 13 conv3s of layers 2-4; layer1's 3 apply it. --no-fuse sbr-wgrad,own-prologue:
// all 16. Skipped where our kernel does not run every conv3 (fewer SMs than columns, no fp16 copies).
TEST(FusedNetworkGpu, Conv3ReadsTheStoredBnWhereManyColumnsWouldApplyIt) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "prologue test");
  const unsigned plain_wgrad = fused_pattern_bit(FusedPattern::SbrWgrad);
  const FusionReport as_is = training_fusion_report(ctx, cache, plain_wgrad);
  if (as_is.own_prologue + as_is.own_stored != 16)  // a GPU with fewer SMs than columns, or no fp16 coefficients
    GTEST_SKIP() << "our kernel runs " << as_is.own_prologue + as_is.own_stored << " of the 16 conv3s here";
  EXPECT_EQ(as_is.own_stored, 13);
  EXPECT_EQ(as_is.own_prologue, 3);
  const FusionReport none = training_fusion_report(ctx, cache, plain_wgrad | fused_pattern_bit(FusedPattern::OwnPrologue));
  EXPECT_EQ(none.own_stored, 16);
  EXPECT_EQ(none.own_prologue, 0);
}

// Where conv2's weight gradient runs plain (bin/train's default), y1 = relu(bn1(a1)) is stored by a BN
// pass and cuDNN's ConvStats reads it, in place of SbrConvStats; switched off (stored-conv-stats, or
// conv-stats, the pattern it runs) or with the fused weight gradient (y1 stored nowhere), SbrConvStats
// as before, and the same number of patterns tried. Skipped where cuDNN refuses ConvStats for a conv2
// or measures it slower than the plain conv with a statistics pass: the report says which and why.
TEST(FusedNetworkGpu, Conv2ReadsTheStoredBnWhereItsWeightGradientRunsPlain) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "stored conv2 test");
  const unsigned plain_wgrad = fused_pattern_bit(FusedPattern::SbrWgrad);
  const FusionReport as_is = training_fusion_report(ctx, cache, plain_wgrad);
  if (as_is.stored_conv2 != 16) {
    std::string why;
    for (const FusionRefusal& f : as_is.refused)
      if (f.pattern == FusedPattern::ConvStats && f.layer.find("conv2") != std::string::npos) why = f.layer + ": " + f.why;
    GTEST_SKIP() << as_is.stored_conv2 << " of the 16 conv2s read y1 here (" << why << ")";
  }
  for (const FusionRefusal& f : as_is.refused)
    EXPECT_FALSE(f.pattern == FusedPattern::SbrConvStats && f.layer.find("conv2") != std::string::npos)
        << f.layer << ": SbrConvStats was tried for a conv2 that reads y1";
  for (unsigned also : {fused_pattern_bit(FusedPattern::StoredConvStats), fused_pattern_bit(FusedPattern::ConvStats)}) {
    const FusionReport off = training_fusion_report(ctx, cache, plain_wgrad | also);
    EXPECT_EQ(off.stored_conv2, 0) << fused_pattern_list_text(plain_wgrad | also);
    EXPECT_EQ(off.tried, as_is.tried) << "conv2's forward is one pattern tried, either way";
  }
  const FusionReport fused_wgrad = training_fusion_report(ctx, cache, 0);
  EXPECT_EQ(fused_wgrad.stored_conv2, 0) << "with the fused weight gradient, y1 is stored nowhere";
}

// What rides on the conv1 joins. layer1.0's conv1 takes the stem's BN backward where our join kernel
// runs the other conv1s, not under --no-fuse own-stem-join; each switch leaves the other's convs as
// they were. The three stride-2 shortcuts' data gradients run compact, read by their block's conv1
// join; none when switched off or without the joins.
TEST(FusedNetworkGpu, TheConv1JoinsTakeTheStemAndTheCompactShortcutGradients) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "conv1 joins test");
  const unsigned defaults = default_unfused_patterns(true);
  const FusionReport as_is = training_fusion_report(ctx, cache, defaults);
  if (as_is.own_join != 15) GTEST_SKIP() << "our join kernel runs " << as_is.own_join << " of 15 conv1s here";
  EXPECT_TRUE(as_is.own_stem_join);
  const FusionReport off = training_fusion_report(ctx, cache, defaults | fused_pattern_bit(FusedPattern::OwnStemJoin));
  EXPECT_FALSE(off.own_stem_join);
  EXPECT_EQ(off.own_join, 15);
  const FusionReport no_joins =
      training_fusion_report(ctx, cache, defaults | fused_pattern_bit(FusedPattern::OwnJoinDgrad));
  EXPECT_TRUE(no_joins.own_stem_join) << "the stem's join is its own switch";
  EXPECT_EQ(no_joins.own_join, 0);
  EXPECT_EQ(no_joins.compact_shortcut_dgrad, 0) << "only conv1's join reads the compact gradient";
  EXPECT_EQ(as_is.compact_shortcut_dgrad, 3);
  const unsigned shortcut = fused_pattern_bit(FusedPattern::CompactShortcutDgrad);
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults | shortcut).compact_shortcut_dgrad, 0);
}

// The weight gradients' stream runs behind the data gradients where bin/train runs it (fused, the
// weight gradients on their own stream, one GPU); not switched off, nor without that stream, nor
// data-parallel (each gradient is reported as written, so the stream is joined after each conv).
TEST(FusedNetworkGpu, TheWeightGradientsRunBehindOnOneGpuWithTheirOwnStream) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "lagging weight gradients test");
  const unsigned defaults = default_unfused_patterns(true);
  EXPECT_TRUE(training_fusion_report(ctx, cache, defaults, true).lagging_wgrad);
  const unsigned lagging = fused_pattern_bit(FusedPattern::LaggingWgrad);
  EXPECT_FALSE(training_fusion_report(ctx, cache, defaults | lagging, true).lagging_wgrad) << "switched off";
  EXPECT_FALSE(training_fusion_report(ctx, cache, defaults, false).lagging_wgrad) << "no stream of their own";
  EXPECT_FALSE(training_fusion_report(ctx, cache, defaults, true, true).lagging_wgrad) << "data-parallel";
}

// The lane's 1x1 weight gradients run as cuBLASLt GEMMs for half the SMs where bin/train runs them
// (fp16 NHWC, the weight gradients on their own stream, one GPU); not switched off, nor without that
// stream, nor data-parallel (measured slower there). ResNet-50's 1x1 stride-1 convs: conv1 and conv3 of 16 blocks and layer1's
// projection shortcut, 33, less layer1's three conv3s whose data gradient takes their weight gradient.
TEST(FusedNetworkGpu, TheLanes1x1WeightGradientsRunAsGemmsOnHalfTheSms) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "lane GEMM weight gradients test");
  const unsigned defaults = default_unfused_patterns(true);
  const FusionReport on = training_fusion_report(ctx, cache, defaults, true);
  EXPECT_EQ(on.lane_gemm_wgrads, 33 - on.own_dgrad_wgrad - on.own_shortcut_dgrad_wgrad);
  const unsigned in_dgrad = fused_pattern_bit(FusedPattern::OwnDgradWgrad);
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults | in_dgrad, true).lane_gemm_wgrads, 33);
  EXPECT_EQ(on.lane_gemm_sms, lane_gemm_sm_target());
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EXPECT_EQ(lane_gemm_sm_target(), std::max(1, sms / 2));
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, true, true).lane_gemm_wgrads, 0) << "data-parallel";
  const unsigned off = fused_pattern_bit(FusedPattern::LaneGemmWgrad);
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults | off, true).lane_gemm_wgrads, 0) << "switched off";
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, false).lane_gemm_wgrads, 0) << "no stream of their own";
}

// The lane's cuDNN weight gradients are planned for three quarters of the SMs where bin/train runs
// them (as the GEMMs above), their choices cached under keys of their own, but the stem's, which runs
// alone; not switched off, nor without their stream, nor data-parallel, deterministic or through
// cuDNN's legacy calls.
TEST(FusedNetworkGpu, TheLanesCudnnWeightGradientsArePlannedForFewerSms) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "lane cuDNN SM target test");
  const unsigned defaults = default_unfused_patterns(true);
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int target = TrainingNetwork::lane_cudnn_sm_target();
  EXPECT_EQ(target, std::max(1, sms * 3 / 4));
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, true).lane_cudnn_sms, target);
  const std::string suffix = ConvPolicy{.wgrad_sm_target = target}.cache_suffix();
  const std::string stem = ConvGeometry{16, 3, 32, 32, 64, 3, 1, 1}.key(), layer2 = ConvGeometry{16, 128, 16, 16, 128, 3, 1, 1}.key();
  EXPECT_NE(cache.find(stem), nullptr) << "the stem's weight gradient, alone on the stream, planned for every SM";
  EXPECT_EQ(cache.find(stem + suffix), nullptr);
  EXPECT_NE(cache.find(layer2 + suffix), nullptr) << "layer2's 3x3 conv2, its weight gradient on the lane";
  EXPECT_EQ(cache.find(layer2), nullptr);
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, true, true).lane_cudnn_sms, 0) << "data-parallel";
  const unsigned off = fused_pattern_bit(FusedPattern::LaneCudnnSms);
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults | off, true).lane_cudnn_sms, 0) << "switched off";
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, false).lane_cudnn_sms, 0) << "no stream of their own";
  NetConfig cfg = training_config(0, true, false);
  cfg.fused_bn = false;  // as the builds without the fusedbn rung
  cfg.conv.deterministic = true;
  EXPECT_EQ(TrainingNetwork(cfg, ctx, cache).fusion_report().lane_cudnn_sms, 0) << "deterministic";
  cfg.conv.deterministic = false;
  cfg.conv_api = ConvApi::Legacy;
  EXPECT_EQ(TrainingNetwork(cfg, ctx, cache).fusion_report().lane_cudnn_sms, 0) << "cuDNN's legacy calls";
}

// Switched on (off by default: slower), every conv1 but the first applies the previous block's join
// where our kernel runs its forward; none by default, nor without our forward kernel.
TEST(FusedNetworkGpu, EveryConv1ButTheFirstAppliesThePreviousJoin) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "join prologue test");
  const unsigned join = fused_pattern_bit(FusedPattern::OwnJoinPrologue);
  const unsigned on = default_unfused_patterns(true) & ~join;
  const FusionReport as_on = training_fusion_report(ctx, cache, on);
  if (as_on.own != 33) GTEST_SKIP() << "our forward kernel runs " << as_on.own << " of 33 1x1 convs here";
  EXPECT_EQ(as_on.own_join_prologue, 15);
  const FusionReport by_default = training_fusion_report(ctx, cache, default_unfused_patterns(true));
  EXPECT_EQ(by_default.own_join_prologue, 0);
  EXPECT_EQ(by_default.own, 33) << "the convs' forward stays ours";
  const FusionReport no_own = training_fusion_report(ctx, cache, on | fused_pattern_bit(FusedPattern::OwnConvStats));
  EXPECT_EQ(no_own.own_join_prologue, 0) << "only our conv1 kernel applies the join";
}

// ---- the start-up report (CPU) ------------------------------------------------------------------
TEST(FusionReport, CountsAndGroupsRefusalsByPatternAndReason) {
  FusionReport r;
  r.tried = 10;
  r.fused = 6;
  const std::string busy = "its engines need more workspace than --workspace-mb";
  r.refused = {{"layer1.0.conv2", FusedPattern::SbrWgrad, busy},
               {"layer2.0.conv2", FusedPattern::DgradDreluDbn, "cuDNN has no engine for it on this GPU"},
               {"layer1.1.conv2", FusedPattern::SbrWgrad, busy},
               {"layer1.2.conv2", FusedPattern::SbrWgrad, busy},
               {"layer3.0.conv2", FusedPattern::SbrWgrad, busy}};
  const std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "fused batch norm: 6 of 10 conv patterns run fused through cuDNN; the rest run as the "
                      "plain conv and our BN kernels:");
  EXPECT_EQ(lines[1], "  scale-bias-ReLU + weight gradient not fused for 4 convs (layer1.0.conv2, layer1.1.conv2, "
                      "layer1.2.conv2, ...): " + busy);
  EXPECT_EQ(lines[2], "  data gradient + ReLU backward + BN backward weights not fused for 1 conv (layer2.0.conv2): "
                      "cuDNN has no engine for it on this GPU");
  r.refused.clear();
  r.fused = 10;
  r.half_coefficients = 3;
  EXPECT_EQ(fusion_report_lines(r), std::vector<std::string>{"fused batch norm: 10 of 10 conv patterns run fused "
                                                             "through cuDNN (3 read the BN scale/bias in fp16)"});
  r.seconds = 4.26;
  EXPECT_EQ(fusion_report_lines(r)[0], "fused batch norm: 10 of 10 conv patterns run fused through cuDNN (3 read the "
                                       "BN scale/bias in fp16; chosen in 4.3 s)");
  r.half_coefficients = 0;
  EXPECT_EQ(fusion_report_lines(r)[0], "fused batch norm: 10 of 10 conv patterns run fused through cuDNN (chosen in 4.3 s)");
  r.plans = 6;
  r.plans_cached = 5;
  EXPECT_EQ(fusion_report_lines(r)[0], "fused batch norm: 10 of 10 conv patterns run fused through cuDNN (chosen in "
                                       "4.3 s; 5 of 6 plans from the autotune cache)");
}

// bin/predict's 1x1 convs that run as cuBLASLt GEMMs are fused too, and the line says how many.
TEST(FusionReport, SaysHowManyRunAsGemms) {
  FusionReport r;
  r.tried = 53;
  r.fused = 52;
  r.gemms = 9;
  r.refused = {{"conv1", FusedPattern::ConvBnRelu, kSlowerThanUnfused}};
  const std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "fused batch norm: 52 of 53 conv patterns run fused: 43 through cuDNN, 9 as cuBLASLt GEMMs with "
                      "the BN folded into the filter; the rest run as the plain conv and our BN kernels:");
}

// Our kernels' lines: how many convs run each, what they replace, and the slug that turns it off.
TEST(FusionReport, SaysWhereOurKernelsRun) {
  FusionReport r;
  r.tried = 80;
  r.fused = 80;
  r.own = 33;
  r.own_join = 15;
  r.own_dgrad = 16;
  r.own_finalize = 49;
  r.own_prologue = 3;
  r.own_stored = 13;
  r.stored_conv2 = 16;
  const std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_NE(lines[1].find("for 33 1x1 stride-1 convs"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("for 15 conv1s"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("--no-fuse own-join-dgrad"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("for 16 conv3s"), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find("--no-fuse own-dgrad-dbn"), std::string::npos) << lines[3];
  EXPECT_NE(lines[4].find("and 49 of those kernels of ours (the forward's, the data gradients of conv3 and layer1's "
                          "conv2) finalize their BN"),
            std::string::npos) << lines[4];
  EXPECT_NE(lines[4].find("--no-fuse own-finalize"), std::string::npos) << lines[4];
  EXPECT_NE(lines[5].find("of the conv3s of ours 3 apply bn2 as they read its input, 13 read relu(bn2(x)) stored"),
            std::string::npos) << lines[5];
  EXPECT_NE(lines[5].find("--no-fuse sbr-wgrad,own-prologue"), std::string::npos) << lines[5];
  EXPECT_NE(lines[6].find("and 16 conv2s read relu(bn1(x)), stored by a BN pass"), std::string::npos) << lines[6];
  EXPECT_NE(lines[6].find("--no-fuse sbr-wgrad,stored-conv-stats"), std::string::npos) << lines[6];
  r.own = r.own_join = r.own_dgrad = r.own_finalize = r.own_prologue = r.own_stored = r.stored_conv2 = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u) << "none of our kernels, no line for them";
}

// Layer1's 3x3 conv2s of ours: one line, saying which of forward and data gradient run ours, before
// the finalize line; none where neither does.
TEST(FusionReport, SaysWhereOur3x3KernelsRun) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.own_conv3x3 = r.own_dgrad3x3 = 3;
  r.own_finalize = 6;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find("for 3 of layer1's 3x3 conv2s the forward with its BN statistics and the data gradient with "
                          "the ReLU and BN backward sums run a kernel of ours (kernels/conv3x3.h)"),
            std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse own-conv3x3,own-dgrad3x3"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("and 6 of those kernels of ours"), std::string::npos) << lines[2];
  r.own_dgrad3x3 = 0;
  r.own_finalize = 0;
  lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("the forward with its BN statistics runs a kernel of ours"), std::string::npos) << lines[1];
  r.own_conv3x3 = 0;
  r.own_dgrad3x3 = 3;
  lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("the data gradient with the ReLU and BN backward sums runs a kernel of ours"), std::string::npos)
      << lines[1];
  r.own_dgrad3x3 = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The stem's lines: which of its kernels are ours, and where its BN backward went.
TEST(FusionReport, SaysWhereTheStemsKernelsRun) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.own_stem_conv = r.own_stem_wgrad = r.own_stem_join = true;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find("forward with its BN statistics and its weight gradient run kernels of ours"),
            std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("layer1.0's conv1 data gradient takes the stem's BN backward sums"), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[2].find("the stem's weight gradient its apply"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("--no-fuse own-stem-join"), std::string::npos) << lines[2];
  r.own_stem_wgrad = false;  // cuDNN's weight gradient: the apply runs as a pass
  lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2].find("its apply"), std::string::npos) << lines[2];
  r.own_stem_conv = r.own_stem_join = false;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The lines for the conv1s that apply the previous join and for the stride-2 shortcuts whose data
// gradient runs compact, and none where none do.
TEST(FusionReport, SaysWhichConv1sApplyThePreviousJoinAndWhichShortcutsRunCompact) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.own_join_prologue = 15;
  r.compact_shortcut_dgrad = 3;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find("15 conv1s of ours apply the previous block's join"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse own-join-prologue"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("3 stride-2 shortcuts' data gradients run at their output pixels alone"), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[2].find("--no-fuse compact-shortcut-dgrad"), std::string::npos) << lines[2];
  r.own_join_prologue = r.compact_shortcut_dgrad = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The line for the weight gradients' stream running behind the data gradients, and none without it.
TEST(FusionReport, SaysWhetherTheWeightGradientsRunBehind) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.lagging_wgrad = true;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("weight gradients' stream runs up to three blocks behind"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse lagging-wgrad"), std::string::npos) << lines[1];
  r.lagging_wgrad = false;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The line for the lane's 1x1 weight gradients as cuBLASLt GEMMs, with the SM count they were
// planned for, and none without them.
TEST(FusionReport, SaysHowManyWeightGradientsRunAsGemmsOnFewerSms) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.lane_gemm_wgrads = 33;
  r.lane_gemm_sms = 66;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("33 1x1 convs' weight gradients run as cuBLASLt GEMMs planned for 66 SMs"),
            std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse lane-gemm-wgrad"), std::string::npos) << lines[1];
  r.lane_gemm_wgrads = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The line for the lane's cuDNN weight gradients planned for fewer SMs, and none without them.
TEST(FusionReport, SaysForHowManySmsTheLanesCudnnPlansWereMade) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.lane_cudnn_sms = 99;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("are planned for 99 SMs"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse lane-cudnn-sms"), std::string::npos) << lines[1];
  r.lane_cudnn_sms = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// Layer1's conv3s take their weight gradient in their data gradient (kernels/conv1x1_dgrad_bn.h)
// where bin/train runs them: our kernels, the forward applying bn2 in its prologue; and layer1.0's
// stride-1 projection shortcut; not switched off.
TEST(FusedNetworkGpu, Layer1sConv3sTakeTheirWeightGradientInTheirDataGradient) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "weight gradients in the data gradient test");
  const unsigned defaults = default_unfused_patterns(true);
  const FusionReport on = training_fusion_report(ctx, cache, defaults, true);
  if (on.own_dgrad == 0) GTEST_SKIP() << "our data gradient kernel runs no conv3 here";
  EXPECT_EQ(on.own_dgrad_wgrad, 3);
  EXPECT_EQ(on.own_shortcut_dgrad_wgrad, 1);
  const unsigned off = fused_pattern_bit(FusedPattern::OwnDgradWgrad);
  const FusionReport without = training_fusion_report(ctx, cache, defaults | off, true);
  EXPECT_EQ(without.own_dgrad_wgrad, 0) << "switched off";
  EXPECT_EQ(without.own_shortcut_dgrad_wgrad, 0) << "switched off";
}

// Layer1's conv3s, whose data gradient takes their weight gradient and whose next block's conv1
// joins, make dy from the join (three), unless switched off or their weight gradient is not taken.
TEST(FusedNetworkGpu, Layer1sConv3sMakeTheirOutputGradientFromTheJoin) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "the join's apply in conv3's data gradient test");
  const unsigned defaults = default_unfused_patterns(true);
  const FusionReport on = training_fusion_report(ctx, cache, defaults, true);
  if (on.own_dgrad_wgrad == 0) GTEST_SKIP() << "our data gradient kernel takes no conv3's weight gradient here";
  EXPECT_EQ(on.own_join_apply, 3);
  EXPECT_EQ(on.own_shortcut_join_apply, 1) << "layer1.0's shortcut";
  const FusionReport off = training_fusion_report(ctx, cache, defaults | fused_pattern_bit(FusedPattern::OwnJoinApply), true);
  EXPECT_EQ(off.own_join_apply, 0) << "switched off";
  EXPECT_EQ(off.own_shortcut_join_apply, 0) << "switched off";
  const FusionReport no_dw = training_fusion_report(ctx, cache, defaults | fused_pattern_bit(FusedPattern::OwnDgradWgrad), true);
  EXPECT_EQ(no_dw.own_join_apply, 0) << "only the kernel that takes the weight gradient makes dy";
  const FusionReport no_stem_join =
      training_fusion_report(ctx, cache, defaults | fused_pattern_bit(FusedPattern::OwnStemJoin), true);
  EXPECT_EQ(no_stem_join.own_join_apply, 2) << "layer1.0's shortcut cannot, so neither of its data gradients";
  EXPECT_EQ(no_stem_join.own_shortcut_join_apply, 0);
}

// The chain's kernels launch chained (kernels/chained_launch.h) where bin/train runs them on one GPU
// that can (compute capability 9.0 and up); not switched off, nor data-parallel, nor in the builds
// that do not fuse. The switch is the thread's, set by the network's forward and backward.
TEST(FusedNetworkGpu, TheChainsKernelsLaunchChainedOnOneGpuThatCan) {
  SKIP_WITHOUT_GPU("the fused training network");
  GpuContext ctx;
  AutotuneCache cache("", "chained launch test");
  const unsigned defaults = default_unfused_patterns(true);
  const bool can = device_chains_launches();
  EXPECT_EQ(training_fusion_report(ctx, cache, defaults, true).chained_launch, can);
  const unsigned off = fused_pattern_bit(FusedPattern::ChainedLaunch);
  EXPECT_FALSE(training_fusion_report(ctx, cache, defaults | off, true).chained_launch) << "switched off";
  EXPECT_FALSE(training_fusion_report(ctx, cache, defaults, true, true).chained_launch) << "data-parallel";
  NetConfig cfg = training_config(defaults, true, false);
  cfg.fused_bn = false;  // as the builds without the fusedbn rung
  EXPECT_FALSE(TrainingNetwork(cfg, ctx, cache).fusion_report().chained_launch) << "no fused batch norm";
  // The switch belongs to the thread that sets it: another thread starts with it off.
  set_chained_launches(true);
  EXPECT_EQ(chained_launches(), can);
  bool elsewhere = true;
  std::thread([&] { elsewhere = chained_launches(); }).join();
  EXPECT_FALSE(elsewhere);
  set_chained_launches(false);
  EXPECT_FALSE(chained_launches());
}

// The line for the chained launches, and none without them.
TEST(FusionReport, SaysWhetherTheChainsKernelsLaunchChained) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.chained_launch = true;
  const std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("launched chained"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse chained-launch"), std::string::npos) << lines[1];
  r.chained_launch = false;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
}

// The line for the conv3s that make dy from the join, and none without them.
TEST(FusionReport, SaysWhichDataGradientsMakeTheirOutputGradientFromTheJoin) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.own_join_apply = 3;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("for 3 conv3s the data gradient's kernel makes its output gradient from the join's dz"),
            std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse own-join-apply"), std::string::npos) << lines[1];
  r.own_join_apply = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
  r.own_shortcut_join_apply = 1;
  lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("for 1 projection shortcut the data gradient's kernel makes its output gradient"),
            std::string::npos) << lines[1];
}

// The line for the conv3s whose data gradient takes their weight gradient, and none without them.
TEST(FusionReport, SaysWhichDataGradientsTakeTheirWeightGradient) {
  FusionReport r;
  r.tried = r.fused = 80;
  r.own_dgrad_wgrad = 3;
  std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("for 3 conv3s the data gradient's kernel takes the weight gradient too"), std::string::npos)
      << lines[1];
  EXPECT_NE(lines[1].find("--no-fuse own-dgrad-wgrad"), std::string::npos) << lines[1];
  r.own_dgrad_wgrad = 0;
  EXPECT_EQ(fusion_report_lines(r).size(), 1u);
  r.own_shortcut_dgrad_wgrad = 1;
  lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("for 1 projection shortcut the data gradient's kernel takes the weight gradient too"),
            std::string::npos) << lines[1];
}

TEST(FusionReport, SaysFusionIsOffUnderDeterministic) {
  FusionReport r;
  r.off_for_determinism = true;
  const std::vector<std::string> lines = fusion_report_lines(r);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("off under --deterministic"), std::string::npos) << lines[0];
}

TEST(FusionChoice, FusedWhereNotMeasuredSlower) {
  EXPECT_TRUE(run_fused(-1, -1)) << "not measured (heuristics): fused saves memory passes";
  EXPECT_TRUE(run_fused(0.2f, -1)) << "only one side measured";
  EXPECT_TRUE(run_fused(0.2f, 0.25f));
  EXPECT_TRUE(run_fused(0.2f, 0.2f)) << "a tie goes to fusion: less memory";
  EXPECT_FALSE(run_fused(0.3f, 0.25f)) << "measured slower";
}

}  // namespace
