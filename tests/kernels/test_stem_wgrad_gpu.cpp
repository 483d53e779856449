// The stem's filter gradient by our kernel (kernels/stem_wgrad.h) against the CPU reference in
// double: the network's stem (3 channels, 3x3, 64 filters), pixel counts that leave a part of a
// 16-pixel slice, a 5x5 filter of one channel, and fewer filters; its sums add up in the same order
// every run; and the shapes it refuses.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/errors.h"
#include "core/memory.h"
#include "kernels/stem_wgrad.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// fp16 inputs and an fp16 gradient summed in fp32: the rounding of the output dominates.
constexpr double kTol = 4e-3;

struct StemCase {
  int n, c, h, w, k, r;
};

TEST(GpuStemWgrad, MatchesTheReference) {
  SKIP_WITHOUT_GPU("the stem's weight-gradient kernel");
  const StemCase cases[] = {{8, 3, 32, 32, 64, 3}, {3, 3, 7, 5, 16, 3}, {2, 1, 9, 9, 32, 5}, {1, 3, 4, 4, 48, 3},
                            {64, 3, 28, 28, 64, 3}};
  std::mt19937_64 rng = test_rng();
  for (const StemCase& s : cases) {
    const ref::ConvDims g{s.n, s.c, s.h, s.w, s.k, s.r, s.r, 1, (s.r - 1) / 2};
    SCOPED_TRACE(dims_name(g.input()) + " k" + std::to_string(s.k) + " r" + std::to_string(s.r));
    ASSERT_EQ(stem_wgrad_refusal(s.c, s.k, s.r, 1, (s.r - 1) / 2), "");
    const ref::Dims wd{s.k, s.c, s.r, s.r};
    const Vec x = quantize(DType::F16, random_normal(rng, g.input().count()));
    const Vec dy = quantize(DType::F16, random_normal(rng, g.output().count()));
    const DeviceTensor x_d = upload_activation(x, g.input(), DType::F16, Layout::NHWC);
    const DeviceTensor dy_d = upload_activation(dy, g.output(), DType::F16, Layout::NHWC);
    DeviceTensor dw(wd.count(), DType::F16);
    dw.poison();
    DeviceBuffer partials(stem_wgrad_partials_bytes(s.k, s.c, s.r), "stem wgrad test partials");
    const StemWgrad a{x_d.get(), dy_d.get(), dw.get(), partials.as<float>(), s.n, s.h, s.w, s.c, s.k, s.r};
    stem_wgrad(a, ctx().stream);
    const Vec got = download_activation(dw, wd, Layout::NHWC);
    EXPECT_CLOSE(got, ref::conv2d_backward_filter(g, x, dy), kTol);

    // again, into a poisoned buffer: the same bits (the CTAs' sums are added in a fixed order)
    dw.poison();
    stem_wgrad(a, ctx().stream);
    EXPECT_EQ(download_activation(dw, wd, Layout::NHWC), got) << "a second run differs";
  }
}

TEST(StemWgrad, RefusesWhatItDoesNotCompute) {
  EXPECT_EQ(stem_wgrad_refusal(3, 64, 3, 1, 1), "");
  EXPECT_NE(stem_wgrad_refusal(3, 64, 3, 2, 1), "") << "stride 2";
  EXPECT_NE(stem_wgrad_refusal(3, 64, 3, 1, 0), "") << "no padding";
  EXPECT_NE(stem_wgrad_refusal(3, 64, 4, 1, 1), "") << "an even filter";
  EXPECT_NE(stem_wgrad_refusal(4, 64, 3, 1, 1), "") << "36 taps";
  EXPECT_NE(stem_wgrad_refusal(3, 72, 3, 1, 1), "") << "72 filters";
  EXPECT_NE(stem_wgrad_refusal(3, 24, 3, 1, 1), "") << "24 filters";
  EXPECT_NE(stem_wgrad_refusal(2, 64, 7, 1, 3), "") << "98 taps";
}

TEST(StemWgrad, ThrowsOnWhatItRefuses) {
  const StemWgrad a{nullptr, nullptr, nullptr, nullptr, 1, 8, 8, 4, 64, 3};
  EXPECT_THROW(stem_wgrad(a, nullptr), Fatal);
}

}  // namespace
