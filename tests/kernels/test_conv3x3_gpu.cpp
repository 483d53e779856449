// Layer1's 3x3 convs by our kernel (kernels/conv3x3.h) against the CPU reference in double:
//   - the forward, y = conv(x) and the per-channel sums and sums of squares its rows of partial sums
//     add up to;
//   - the turned filter, turned[c][r][s][k] = w[k][2-r][2-s][c];
//   - the data gradient with the previous BN + ReLU's backward: dz = conv's dx where fp16(x * scale +
//     shift) > 0, and its sums of dz and dz * xhat, against the sums of the dz it wrote.
//   - the data gradient of the stride-2 3x3 convs (layers 2-4's first conv2) by parity, the same
//     way (kernels/conv3x3_stride2.h), its filter the phases' taps in order.
// Shapes: layer1's 32x32 images (4 rows a tile, the padding rows at the tile's first and last image
// rows), 16x16 (8 rows a tile) and 16x8 (16 rows of 8 pixels), and enough 32x32 images that each CTA
// walks several tiles. The kernels run on sm_90 only: elsewhere these tests skip.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kernels/batchnorm.h"
#include "kernels/conv3x3.h"
#include "kernels/conv3x3_parity.h"
#include "kernels/conv3x3_stride2.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using gpu_test::ctx;
using gpu_test::DeviceTensor;
using gpu_test::quantize;
using ref::Vec;

#define SKIP_UNLESS_RUNS(shape)                                                              \
  do {                                                                                       \
    SKIP_WITHOUT_GPU("layer1's 3x3 convs of ours");                                          \
    if (const std::string why = conv3x3_refusal(shape); !why.empty()) GTEST_SKIP() << why;   \
  } while (0)

ref::ConvDims dims(const Conv3x3Shape& s) { return {s.n, s.c, s.h, s.w, s.k, 3, 3, 1, 1}; }

// The sums over the pixels of each channel of an NHWC tensor of `c` channels, of v and of v * f.
void channel_sums(const Vec& v, int c, const std::function<double(size_t)>& f, Vec& s0, Vec& s1) {
  s0.assign(c, 0.0);
  s1.assign(c, 0.0);
  for (size_t e = 0; e < v.size(); ++e) {
    s0[e % c] += v[e];
    s1[e % c] += v[e] * f(e);
  }
}

// Rows of partial sums (`rows` of c, then as many of the second sum) added up.
void add_rows(const Vec& p, int rows, int c, Vec& g0, Vec& g1) {
  g0.assign(c, 0.0);
  g1.assign(c, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < c; ++j) {
      g0[j] += p[size_t(r) * c + j];
      g1[j] += p[(size_t(rows) + r) * c + j];
    }
}

void check_forward(const Conv3x3Shape& s) {
  SKIP_UNLESS_RUNS(s);
  auto rng = gpu_test::test_rng();
  const ref::ConvDims g = dims(s);
  const size_t pixels = size_t(s.n) * s.h * s.w;
  const Vec x = quantize(DType::F16, gpu_test::random_uniform(rng, pixels * s.c, -1.0, 1.0));  // NHWC
  const Vec w = quantize(DType::F16, gpu_test::random_normal(rng, size_t(s.k) * 9 * s.c, 0.0, 1.0 / std::sqrt(9.0 * s.c)));  // KRSC
  const Vec want = ref::nchw_to_nhwc(g.output(), ref::conv2d_forward(g, ref::nhwc_to_nchw(g.input(), x),
                                                                      ref::krsc_to_kcrs(s.k, s.c, 3, 3, w)));
  const int rows = conv3x3_partial_rows(s);
  DeviceTensor xd(x, DType::F16), wd(w, DType::F16), y(pixels * s.k, DType::F16, "conv output"),
      part(2 * size_t(rows) * s.k, DType::F32, "partial sums");
  y.poison();
  part.poison();
  conv3x3_stats({.x = xd.get(), .w = wd.get(), .y = y.get(), .s = s, .partials = part.f32()}, ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  EXPECT_CLOSE(y.download(), want, gpu_test::kTolF16) << "y";
  Vec sum, sq, got_sum, got_sq;
  channel_sums(want, s.k, [&](size_t e) { return want[e]; }, sum, sq);
  add_rows(part.download(), rows, s.k, got_sum, got_sq);
  // fp32 accumulators of fp16 inputs: held to the fp32 bound, as the fused patterns' statistics are.
  EXPECT_CLOSE(got_sum, sum, gpu_test::kTolF32) << "the sums";
  EXPECT_CLOSE(got_sq, sq, gpu_test::kTolF32) << "the sums of squares";
}

// The filter the data gradient reads, exactly (a permutation): stride 1 turned[c][r][s][k] =
// w[k][2-r][2-s][c]; stride 2 the phases' taps in order, phases[c][t][k] = w[k][r_t][s_t][c].
void check_filter(const Vec& got, const Vec& w, const Conv3x3Shape& s, int stride) {
  size_t misplaced = 0;
  for (int c = 0; c < s.c; ++c)
    for (int t = 0; t < 9; ++t) {
      int from = 8 - t;  // stride 1: tap (r, s) -> (2 - r, 2 - s)
      if (stride == 2) {
        const int phase = t < 1 ? 0 : t < 3 ? 1 : t < 5 ? 2 : 3;
        const ParityTap tap = parity_tap(phase, t - parity_first_tap(phase));
        from = tap.r * 3 + tap.s;
      }
      for (int k = 0; k < s.k; ++k) misplaced += got[(size_t(c) * 9 + t) * s.k + k] != w[(size_t(k) * 9 + from) * s.c + c];
    }
  EXPECT_EQ(misplaced, 0u) << "the data gradient's filter, stride " << stride;
}

// s: x's shape (dy's is s.h / stride by s.w / stride).
void check_dgrad(const Conv3x3Shape& s, int stride = 1) {
  SKIP_WITHOUT_GPU("our 3x3 data gradient");
  if (const std::string why = stride == 1 ? conv3x3_refusal(s) : conv3x3_stride2_dgrad_refusal(s); !why.empty())
    GTEST_SKIP() << why;
  auto rng = gpu_test::test_rng();
  const ref::ConvDims g{s.n, s.c, s.h, s.w, s.k, 3, 3, stride, 1};
  const size_t pixels = size_t(s.n) * s.h * s.w, dy_pixels = pixels / (stride * stride);
  const Vec dy = quantize(DType::F16, gpu_test::random_normal(rng, dy_pixels * s.k));
  const Vec w = quantize(DType::F16, gpu_test::random_normal(rng, size_t(s.k) * 9 * s.c, 0.0, 1.0 / std::sqrt(9.0 * s.k)));
  const Vec x = quantize(DType::F16, gpu_test::random_normal(rng, pixels * s.c, 0.5, 2.0));
  const Vec scale = quantize(DType::F16, gpu_test::random_uniform(rng, s.c, 0.5, 1.5));
  const Vec shift = quantize(DType::F16, gpu_test::random_normal(rng, s.c, -0.5, 1.0));
  const gpu_test::HostBn h = gpu_test::random_bn(rng, s.c);
  DeviceTensor dyd(dy, DType::F16), wd(w, DType::F16), xd(x, DType::F16), scale_d(scale, DType::F16),
      shift_d(shift, DType::F16), turned(w.size(), DType::F16, "the data gradient's filter");
  gpu_test::DeviceBn bn(h);
  {  // x's batch statistics, as the forward saves them
    const Shape4 s4{int(pixels), s.c, 1, 1};
    DeviceTensor scratch(bn_scratch_floats(s4, DType::F16, Layout::NHWC), DType::F32, "bn scratch");
    bn_forward_train_stats(xd.get(), s4, DType::F16, Layout::NHWC, bn.state(), scratch.f32(), ctx().stream);
  }
  turned.poison();
  if (stride == 1)
    conv3x3_turn_filter(wd.get(), turned.get(), s, ctx().stream);
  else
    conv3x3_stride2_phase_filter(wd.get(), turned.get(), s, ctx().stream);
  const int rows = stride == 1 ? conv3x3_dgrad_partial_rows(s) : conv3x3_stride2_dgrad_partial_rows(s);
  DeviceTensor dz(pixels * s.c, DType::F16, "dz"), part(2 * size_t(rows) * s.c, DType::F32, "partial sums");
  dz.poison();
  part.poison();
  const Conv3x3DgradBn args{.dy = dyd.get(), .turned = turned.get(), .dz = dz.get(), .x = xd.get(),
                            .mean = bn.save_mean.f32(), .invstd = bn.save_invstd.f32(), .scale = scale_d.get(),
                            .shift = shift_d.get(), .partials = part.f32(), .s = s};
  if (stride == 1)
    conv3x3_dgrad_bn(args, ctx().stream);
  else
    conv3x3_stride2_dgrad_bn(args, ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  check_filter(turned.download(), w, s, stride);

  // dz: the conv's data gradient in double, rounded to fp16 as stored, where the ReLU passed (dz
  // poisoned before: every pixel of every phase must be written).
  const Vec dx = quantize(DType::F16, ref::nchw_to_nhwc(g.input(), ref::conv2d_backward_data(
                                                                     g, ref::nhwc_to_nchw(g.output(), dy),
                                                                     ref::krsc_to_kcrs(s.k, s.c, 3, 3, w))));
  auto passed = [&](size_t e) {
    const size_t j = e % s.c;
    return quantize(DType::F16, x[e] * scale[j] + shift[j]) > 0.0;
  };
  Vec want(dx.size());
  size_t zeros = 0;
  for (size_t e = 0; e < dx.size(); ++e) want[e] = passed(e) ? dx[e] : 0.0, zeros += !passed(e);
  const Vec got = dz.download();
  EXPECT_CLOSE(got, want, gpu_test::kTolF16) << "dz";
  size_t leaked = 0;
  for (size_t e = 0; e < got.size(); ++e) leaked += !passed(e) && got[e] != 0.0;
  EXPECT_EQ(leaked, 0u) << "dz not zero where the ReLU did not pass";
  EXPECT_GT(zeros, got.size() / 10) << "the ReLU should stop some elements";

  // The sums of the dz written (what the apply then reads), in double.
  const Vec mean = bn.save_mean.download(), invstd = bn.save_invstd.download();
  Vec s0, s1, g0, g1;
  channel_sums(got, s.c, [&](size_t e) { return (x[e] - mean[e % s.c]) * invstd[e % s.c]; }, s0, s1);
  add_rows(part.download(), rows, s.c, g0, g1);
  EXPECT_CLOSE(g0, s0, gpu_test::kTolF32) << "the sums of dz";
  EXPECT_CLOSE(g1, s1, gpu_test::kTolF32) << "the sums of dz * xhat";
}

TEST(Conv3x3Halo, Layer1ImagesMatchTheReference) { check_forward({2, 32, 32, 64, 64}); }

// 16x16 images (8 rows a tile, boxes of 10 rows) and 16 rows of 8 pixels (boxes of 18 rows).
TEST(Conv3x3Halo, NarrowerRowsMatchTheReference) {
  check_forward({3, 16, 16, 64, 64});
  check_forward({2, 16, 8, 64, 64});
}

// 20 images of 8 tiles: more tiles than a 132-SM GPU's CTAs, so CTAs walk several, their statistics
// added in registers across them, the filter loaded once for all.
TEST(Conv3x3Halo, SeveralTilesACtaMatchTheReference) { check_forward({20, 32, 32, 64, 64}); }

TEST(Conv3x3HaloDgrad, Layer1ImagesMatchTheReference) { check_dgrad({2, 32, 32, 64, 64}); }

TEST(Conv3x3HaloDgrad, NarrowerRowsAndSeveralTilesACtaMatchTheReference) {
  check_dgrad({3, 16, 16, 64, 64});
  check_dgrad({20, 32, 32, 64, 64});
}

// The stride-2 data gradient by parity (kernels/conv3x3_stride2.h), at the sides of layers 2-4's
// first conv2 with fewer images: dy of 16x16 (8 rows a tile), 8x8 (2 images a tile) and 4x4 (8
// images a tile), channels in and out unequal; then enough tiles that each CTA walks several, of
// every phase.
TEST(Conv3x3Stride2Dgrad, Layer2To4SidesMatchTheReference) {
  check_dgrad({2, 32, 32, 64, 128}, 2);
  check_dgrad({4, 16, 16, 128, 64}, 2);
  check_dgrad({8, 8, 8, 64, 64}, 2);
}

TEST(Conv3x3Stride2Dgrad, SeveralTilesACtaMatchTheReference) { check_dgrad({40, 32, 32, 64, 64}, 2); }

TEST(Conv3x3Stride2Dgrad, ShapesItDoesNotTakeAndMissingArgumentsAreRefused) {
  SKIP_WITHOUT_GPU("the stride-2 data gradient of ours");  // the refusal asks the GPU what it is
  if (const std::string why = conv3x3_stride2_dgrad_refusal({2, 32, 32, 64, 64}); !why.empty()) GTEST_SKIP() << why;
  EXPECT_NE(conv3x3_stride2_dgrad_refusal({2, 31, 32, 64, 64}), "");  // odd: dx is not twice dy
  EXPECT_NE(conv3x3_stride2_dgrad_refusal({2, 32, 32, 96, 64}), "");  // channels not multiples of 64
  EXPECT_NE(conv3x3_stride2_dgrad_refusal({1, 8, 8, 64, 64}), "");    // a phase of 16 pixels: not a tile
  EXPECT_NE(conv3x3_stride2_dgrad_refusal({2, 24, 24, 64, 64}), "");  // dy rows of 12: a tile would start mid-row
  DeviceTensor any(2 * 32 * 32 * 64, DType::F32);  // stands for every tensor: nothing runs
  try {
    conv3x3_stride2_dgrad_bn({.dy = any.get(), .turned = nullptr, .dz = any.get(), .x = any.get(), .mean = any.f32(),
                              .invstd = any.f32(), .scale = any.get(), .shift = any.get(), .partials = any.f32(),
                              .s = {2, 32, 32, 64, 64}},
                             ctx().stream);
    ADD_FAILURE() << "accepted without a filter";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(Conv3x3Halo, ShapesItDoesNotTakeAndMissingArgumentsAreRefused) {
  SKIP_UNLESS_RUNS((Conv3x3Shape{2, 32, 32, 64, 64}));
  EXPECT_NE(conv3x3_refusal({2, 32, 32, 128, 64}), "");  // the filter would not fit
  EXPECT_NE(conv3x3_refusal({2, 32, 32, 64, 128}), "");
  EXPECT_NE(conv3x3_refusal({2, 28, 28, 64, 64}), "");   // rows not a multiple of 8
  EXPECT_NE(conv3x3_refusal({2, 8, 8, 64, 64}), "");     // an image under a tile
  EXPECT_NE(conv3x3_refusal({2, 64, 64, 64, 64}), "");   // rows over 32 pixels
  EXPECT_NE(conv3x3_refusal({2, 24, 24, 64, 64}), "");   // rows of 24 (--image-size 24): a tile would start mid-row
  EXPECT_NE(conv3x3_refusal({2, 12, 16, 64, 64}), "");   // an image of 192 pixels: not whole tiles
  DeviceTensor any(2 * 32 * 32 * 64, DType::F32);  // stands for every tensor: nothing runs
  const Conv3x3Shape s{2, 32, 32, 64, 64};
  try {
    conv3x3_dgrad_bn({.dy = any.get(), .turned = any.get(), .dz = any.get(), .x = any.get(), .mean = any.f32(),
                      .invstd = any.f32(), .scale = nullptr, .shift = nullptr, .partials = any.f32(), .s = s},
                     ctx().stream);
    ADD_FAILURE() << "accepted without the mask's coefficients";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find("scale and shift"), std::string::npos) << e.what();
  }
  try {
    conv3x3_stats({.x = any.get(), .w = nullptr, .y = any.get(), .s = s}, ctx().stream);
    ADD_FAILURE() << "accepted without a filter";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

}  // namespace
