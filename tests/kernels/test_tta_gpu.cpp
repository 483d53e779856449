// Test-time augmentation's kernels (kernels/tta.cu): the mirrored batch against the CPU reference,
// exactly, in every type and layout; the mean of two passes' logits. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <random>

#include "kernels/tta.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

class GpuFlip : public testing::TestWithParam<Variant> {};

TEST_P(GpuFlip, MirrorsEveryRowExactly) {
  SKIP_WITHOUT_GPU("the horizontal flip");
  const Variant v = GetParam();
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims d : {ref::Dims{3, 3, 5, 7}, ref::Dims{2, 3, 32, 32}, ref::Dims{1, 1, 1, 1}}) {
    SCOPED_TRACE(dims_name(d));
    const Vec x = quantize(v.t, random_normal(rng, d.count()));
    const DeviceTensor in = upload_activation(x, d, v.t, v.l);
    DeviceTensor out(d.count(), v.t);
    out.poison();
    flip_horizontal(in.get(), out.get(), {d.n, d.c, d.h, d.w}, v.t, v.l, ctx().stream);
    EXPECT_EQ(download_activation(out, d, v.l), ref::flip_horizontal(d, x));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuFlip, testing::ValuesIn(kVariants), variant_param_name);

TEST(GpuFlip, MeanIntoTheFirst) {
  SKIP_WITHOUT_GPU("the mean of two passes' logits");
  std::mt19937_64 rng = test_rng();
  const size_t n = 1283;
  const Vec a = quantize(DType::F32, random_normal(rng, n)), b = quantize(DType::F32, random_normal(rng, n));
  DeviceTensor da(a, DType::F32), db(b, DType::F32);
  mean_into(da.f32(), db.f32(), n, ctx().stream);
  const Vec got = da.download();
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], double(0.5f * (float(a[i]) + float(b[i])))) << i;
  EXPECT_EQ(db.download(), b) << "the second is read only";
}

}  // namespace
