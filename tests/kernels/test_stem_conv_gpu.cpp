// The stem's conv by our kernels (kernels/stem_conv.h) against the CPU reference in double: the
// network's stem (3 channels, 3x3, 64 filters), pixel counts that leave a part of a 16-pixel slice,
// a 5x5 filter of one channel, and fewer filters. The forward's output and its statistics' partial
// sums; the filter gradient, whose sums add up in the same order every run, also with the BN
// backward's apply taken as it reads the gradient; the shapes refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/errors.h"
#include "core/memory.h"
#include "kernels/stem_conv.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// fp16 inputs and fp16 outputs of fp32 sums: the rounding of the output dominates.
constexpr double kTol = 4e-3;

// n, h, w, c, k, r: the last two give each warp several slices (the weight gradient's loads of the
// next slice, the tiles reused), bin/train's at batch 128 the last
const StemShape kShapes[] = {{8, 32, 32, 3, 64, 3}, {3, 7, 5, 3, 16, 3},    {2, 9, 9, 1, 32, 5},
                             {1, 4, 4, 3, 48, 3},   {64, 28, 28, 3, 16, 3}, {128, 32, 32, 3, 64, 3}};

// Partial sums' memory filled with NaN bytes before a launch: a row a kernel leaves unwritten shows.
void poison(DeviceBuffer& b) { CUDA_CHECK(cudaMemset(b.get(), 0xFF, b.bytes())); }

ref::ConvDims dims_of(const StemShape& s) { return {s.n, s.c, s.h, s.w, s.k, s.r, s.r, 1, (s.r - 1) / 2}; }

std::string name_of(const StemShape& s) {
  return dims_name(dims_of(s).input()) + " k" + std::to_string(s.k) + " r" + std::to_string(s.r);
}

TEST(GpuStemConv, ForwardAndItsStatisticsMatchTheReference) {
  SKIP_WITHOUT_GPU("the stem's forward kernel");
  std::mt19937_64 rng = test_rng();
  for (const StemShape& s : kShapes) {
    SCOPED_TRACE(name_of(s));
    ASSERT_EQ(stem_conv_refusal(s.c, s.k, s.r, 1, (s.r - 1) / 2), "");
    const ref::ConvDims g = dims_of(s);
    const ref::Dims wd{s.k, s.c, s.r, s.r};
    const Vec x = quantize(DType::F16, random_normal(rng, g.input().count()));
    const Vec w = quantize(DType::F16, random_normal(rng, wd.count(), 0.0, 1.0 / std::sqrt(double(s.c) * s.r * s.r)));
    const DeviceTensor x_d = upload_activation(x, g.input(), DType::F16, Layout::NHWC);
    const DeviceTensor w_d = upload_activation(w, wd, DType::F16, Layout::NHWC);
    DeviceTensor y(g.output().count(), DType::F16);
    y.poison();
    DeviceBuffer partials(stem_conv_partials_bytes(s), "stem forward test partials");
    poison(partials);
    const int rows = stem_conv_forward({x_d.get(), w_d.get(), y.get(), partials.as<float>(), s}, ctx().stream);
    ASSERT_GE(rows, 1);
    const Vec got = download_activation(y, g.output(), Layout::NHWC);
    EXPECT_CLOSE(got, ref::conv2d_forward(g, x, w), kTol) << "forward";

    // the partial sums: of y and y^2 as y holds them, each channel's rows added here in double
    std::vector<float> p(size_t(2) * rows * s.k);
    CUDA_CHECK(cudaMemcpy(p.data(), partials.get(), p.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const ref::Dims yd = g.output();
    for (int k = 0; k < s.k; ++k) {
      double sum = 0, sq = 0, want_sum = 0, want_sq = 0;
      for (int r = 0; r < rows; ++r) sum += p[size_t(r) * s.k + k], sq += p[(size_t(rows) + r) * s.k + k];
      for (int n = 0; n < yd.n; ++n)
        for (int h = 0; h < yd.h; ++h)
          for (int x_ = 0; x_ < yd.w; ++x_) {
            const double v = got[yd.at(n, k, h, x_)];
            want_sum += v, want_sq += v * v;
          }
      const double count = double(yd.per_channel());
      EXPECT_NEAR(sum / count, want_sum / count, 1e-5 * (1 + std::fabs(want_sum / count))) << "channel " << k;
      EXPECT_NEAR(sq / count, want_sq / count, 1e-5 * (1 + want_sq / count)) << "channel " << k;
    }

    // evaluation: no statistics, the same output
    y.poison();
    stem_conv_forward({x_d.get(), w_d.get(), y.get(), nullptr, s}, ctx().stream);
    EXPECT_EQ(download_activation(y, g.output(), Layout::NHWC), got) << "without statistics";
  }
}

TEST(GpuStemConv, WeightGradientMatchesTheReference) {
  SKIP_WITHOUT_GPU("the stem's weight-gradient kernel");
  std::mt19937_64 rng = test_rng();
  for (const StemShape& s : kShapes) {
    SCOPED_TRACE(name_of(s));
    const ref::ConvDims g = dims_of(s);
    const ref::Dims wd{s.k, s.c, s.r, s.r};
    const Vec x = quantize(DType::F16, random_normal(rng, g.input().count()));
    const Vec dy = quantize(DType::F16, random_normal(rng, g.output().count()));
    const DeviceTensor x_d = upload_activation(x, g.input(), DType::F16, Layout::NHWC);
    const DeviceTensor dy_d = upload_activation(dy, g.output(), DType::F16, Layout::NHWC);
    DeviceTensor dw(wd.count(), DType::F16);
    dw.poison();
    DeviceBuffer partials(stem_conv_partials_bytes(s), "stem wgrad test partials");
    poison(partials);
    const StemWgrad a{x_d.get(), dy_d.get(), dw.get(), partials.as<float>(), s};
    stem_wgrad(a, ctx().stream);
    const Vec got = download_activation(dw, wd, Layout::NHWC);
    EXPECT_CLOSE(got, ref::conv2d_backward_filter(g, x, dy), kTol);

    // again, into poisoned buffers: the same bits (the CTAs' sums are added in a fixed order)
    dw.poison();
    poison(partials);
    stem_wgrad(a, ctx().stream);
    EXPECT_EQ(download_activation(dw, wd, Layout::NHWC), got) << "a second run differs";
  }
}

// With the BN backward's apply taken as the gradient is read (StemWgrad::coef): dy holds the BN's
// dz, and the filter gradient is that of coef[c] dz + coef[k + c] bn_x + coef[2k + c], each rounded
// to fp16 as the apply pass would store it. The kernel's filter gradient, and the reference's.
struct AppliedWgrad {
  Vec got, want;
};
AppliedWgrad wgrad_with_apply(const StemShape& s, const Vec& x, const Vec& dz, const Vec& bn_x,
                              const std::vector<float>& coef) {
  const ref::ConvDims g = dims_of(s);
  const ref::Dims wd{s.k, s.c, s.r, s.r}, yd = g.output();
  Vec dy(yd.count());
  for (int n = 0; n < yd.n; ++n)
    for (int k = 0; k < s.k; ++k)
      for (int h = 0; h < yd.h; ++h)
        for (int x_ = 0; x_ < yd.w; ++x_) {
          const size_t i = yd.at(n, k, h, x_);
          dy[i] = coef[k] * float(dz[i]) + coef[s.k + k] * float(bn_x[i]) + coef[2 * s.k + k];
        }
  const DeviceTensor x_d = upload_activation(x, g.input(), DType::F16, Layout::NHWC);
  const DeviceTensor dz_d = upload_activation(dz, yd, DType::F16, Layout::NHWC);
  const DeviceTensor bn_x_d = upload_activation(bn_x, yd, DType::F16, Layout::NHWC);
  DeviceBuffer coef_d(coef.size() * sizeof(float), "stem wgrad test coefficients");
  CUDA_CHECK(cudaMemcpy(coef_d.get(), coef.data(), coef_d.bytes(), cudaMemcpyHostToDevice));
  DeviceTensor dw(wd.count(), DType::F16);
  dw.poison();
  DeviceBuffer partials(stem_conv_partials_bytes(s), "stem wgrad test partials");
  poison(partials);
  StemWgrad a{x_d.get(), dz_d.get(), dw.get(), partials.as<float>(), s};
  a.bn_x = bn_x_d.get();
  a.coef = coef_d.as<float>();
  stem_wgrad(a, ctx().stream);
  return {download_activation(dw, wd, Layout::NHWC), ref::conv2d_backward_filter(g, x, quantize(DType::F16, dy))};
}

TEST(GpuStemConv, WeightGradientTakesTheBnApplyAsItReadsTheGradient) {
  SKIP_WITHOUT_GPU("the stem's weight-gradient kernel");
  std::mt19937_64 rng = test_rng();
  for (const StemShape& s : kShapes) {
    SCOPED_TRACE(name_of(s));
    const ref::ConvDims g = dims_of(s);
    const Vec x = quantize(DType::F16, random_normal(rng, g.input().count()));
    const Vec dz = quantize(DType::F16, random_normal(rng, g.output().count()));
    const Vec bn_x = quantize(DType::F16, random_normal(rng, g.output().count(), 0.5, 2.0));
    std::vector<float> coef(size_t(3) * s.k);
    std::normal_distribution<float> unit(0.f, 1.f);
    for (float& c : coef) c = unit(rng);
    const AppliedWgrad r = wgrad_with_apply(s, x, dz, bn_x, coef);
    EXPECT_CLOSE(r.got, r.want, kTol);
  }
}

// The rows of a slice past the last pixel: their taps are zero, and what the apply would give them
// is the constant term alone (dz and bn_x read as zeros). Here that term rounds to an fp16 Inf (0 x
// Inf is NaN), while every real pixel's gradient, 2 dz + bn_x + 99968 with dz near -49984, is small:
// rows past the end must be left zero, not applied.
TEST(GpuStemConv, TheApplyLeavesTheRowsPastTheLastPixelZero) {
  SKIP_WITHOUT_GPU("the stem's weight-gradient kernel");
  std::mt19937_64 rng = test_rng();
  for (const StemShape& s : {StemShape{3, 7, 5, 3, 16, 3}, StemShape{2, 9, 9, 1, 32, 5}}) {  // 105, 162 pixels
    SCOPED_TRACE(name_of(s));
    const ref::ConvDims g = dims_of(s);
    const Vec x = quantize(DType::F16, random_normal(rng, g.input().count()));
    Vec dz(g.output().count());
    std::uniform_int_distribution<int> step(-2, 2);
    for (double& v : dz) v = -49984.0 + 32.0 * step(rng);  // fp16 values: its spacing there is 32
    const Vec bn_x = quantize(DType::F16, random_normal(rng, g.output().count()));
    std::vector<float> coef(size_t(3) * s.k);
    for (int k = 0; k < s.k; ++k) coef[k] = 2.f, coef[s.k + k] = 1.f, coef[2 * s.k + k] = 99968.f;
    const AppliedWgrad r = wgrad_with_apply(s, x, dz, bn_x, coef);
    size_t bad = 0;
    for (const double v : r.got) bad += !std::isfinite(v);
    EXPECT_EQ(bad, 0u) << "non-finite filter gradients";
    EXPECT_CLOSE(r.got, r.want, kTol);
  }
}

TEST(StemConv, RefusesWhatItDoesNotCompute) {
  EXPECT_EQ(stem_conv_refusal(3, 64, 3, 1, 1), "");
  EXPECT_NE(stem_conv_refusal(0, 64, 3, 1, 1), "") << "no channels";
  EXPECT_NE(stem_conv_refusal(3, 0, 3, 1, 1), "") << "no filters";
  EXPECT_NE(stem_conv_refusal(3, 64, -1, 1, -1), "") << "a negative filter";
  EXPECT_NE(stem_conv_refusal(3, 64, 3, 2, 1), "") << "stride 2";
  EXPECT_NE(stem_conv_refusal(3, 64, 3, 1, 0), "") << "no padding";
  EXPECT_NE(stem_conv_refusal(3, 64, 4, 1, 1), "") << "an even filter";
  EXPECT_NE(stem_conv_refusal(4, 64, 3, 1, 1), "") << "36 taps";
  EXPECT_NE(stem_conv_refusal(3, 72, 3, 1, 1), "") << "72 filters";
  EXPECT_NE(stem_conv_refusal(3, 24, 3, 1, 1), "") << "24 filters";
  EXPECT_NE(stem_conv_refusal(2, 64, 7, 1, 3), "") << "98 taps";
}

TEST(StemConv, ThrowsOnWhatItRefuses) {
  const StemShape four_channels{1, 8, 8, 4, 64, 3}, empty{0, 8, 8, 3, 64, 3};
  EXPECT_THROW(stem_wgrad({nullptr, nullptr, nullptr, nullptr, four_channels}, nullptr), Fatal);
  EXPECT_THROW(stem_conv_forward({nullptr, nullptr, nullptr, nullptr, four_channels}, nullptr), Fatal);
  EXPECT_THROW(stem_conv_forward({nullptr, nullptr, nullptr, nullptr, empty}, nullptr), Fatal);
  const StemShape ok{1, 8, 8, 3, 64, 3};
  EXPECT_THROW(stem_conv_forward({nullptr, nullptr, nullptr, nullptr, ok}, nullptr), Fatal) << "no tensors";
  // checked before anything is launched: these addresses are never read
  alignas(16) static uint16_t some[64];
  EXPECT_THROW(stem_wgrad({some, some, some, nullptr, ok}, nullptr), Fatal) << "no partial sums";
  float* sums = reinterpret_cast<float*>(some);
  EXPECT_THROW(stem_wgrad({some, some + 1, some, sums, ok}, nullptr), Fatal) << "a gradient not 16-byte aligned";
  StemWgrad apply{some, some, some, sums, ok};
  apply.bn_x = some;
  EXPECT_THROW(stem_wgrad(apply, nullptr), Fatal) << "the BN's input without its coefficients";
  apply.coef = sums;
  apply.bn_x = some + 1;
  EXPECT_THROW(stem_wgrad(apply, nullptr), Fatal) << "the BN's input not 16-byte aligned";
  EXPECT_THROW(stem_conv_forward({some, some, some + 1, sums, ok}, nullptr), Fatal) << "an output not 8-byte aligned";
  const StemShape huge{1 << 20, 1 << 6, 1 << 5, 3, 64, 3};  // 2^31 pixels
  EXPECT_THROW(stem_conv_forward({some, some, some, sums, huge}, nullptr), Fatal) << "2^31 pixels";
}

}  // namespace
