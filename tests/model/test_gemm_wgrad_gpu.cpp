// The 1x1 weight gradient as a cuBLASLt GEMM (model/gemm_wgrad.h) against the CPU reference in
// double: dw = dy^T x, fp16 NHWC in, the KRSC filter gradient out, within the fp16 bound, for each
// SM-count target the trainer may ask for (the device's, about half of an H200's, a few SMs).
// Without a GPU only the shape check runs.
#include <gtest/gtest.h>

#include <string>

#include "core/errors.h"
#include "core/handles.h"
#include "model/gemm_wgrad.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

struct Case {
  const char* name;
  ConvGeometry g;
  int sm_target;
};
// The expanding and reducing 1x1 convs; the last two with a long reduction (N*H*W = 16,384), where
// cuBLASLt splits K and the SM target changes the split.
const Case kCases[] = {{"expand", {8, 64, 8, 8, 256, 1, 1, 0}, 0},
                       {"reduce", {8, 256, 8, 8, 64, 1, 1, 0}, 0},
                       {"odd_pixels", {3, 64, 7, 7, 256, 1, 1, 0}, 0},
                       {"long_device_sms", {64, 64, 16, 16, 256, 1, 1, 0}, 0},
                       {"long_66_sms", {64, 64, 16, 16, 256, 1, 1, 0}, 66},
                       {"long_8_sms", {64, 256, 16, 16, 64, 1, 1, 0}, 8}};

class GemmWgradGpu : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU("cuBLASLt's GEMMs"); }
};

TEST_P(GemmWgradGpu, IsTheConvsWeightGradient) {
  const ConvGeometry& g = GetParam().g;
  const GemmWgrad gemm(ctx().cublas_lt, g, size_t(64) << 20, GetParam().sm_target, ctx().stream);
  ASSERT_TRUE(gemm.ok()) << gemm.why();
  EXPECT_GT(gemm.ms(), 0.f) << "the algorithm was chosen by timing";
  EXPECT_EQ(gemm.algorithm().rfind("lt", 0), 0u) << gemm.algorithm();
  auto rng = test_rng();
  const ref::ConvDims cd = conv_dims(g);
  const Vec x = quantize(DType::F16, random_normal(rng, cd.input().count(), 0.2, 1.0));
  const Vec dy = quantize(DType::F16, random_normal(rng, cd.output().count(), 0.0, 1.0));
  const DeviceTensor xd = upload_activation(x, cd.input(), DType::F16, Layout::NHWC),
                     dyd = upload_activation(dy, cd.output(), DType::F16, Layout::NHWC);
  DeviceTensor dw(g.filter_count(), DType::F16), ws(gemm.workspace() / 4 + 16, DType::F32, "workspace");
  dw.poison();
  gemm.run(ctx().cublas_lt, xd.get(), dyd.get(), dw.get(), ws.get(), ws.count() * 4, ctx().stream);
  const Vec got = ref::krsc_to_kcrs(g.k, g.c, 1, 1, dw.download());
  EXPECT_CLOSE(got, ref::conv2d_backward_filter(cd, x, dy), kTolF16) << gemm.algorithm();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmWgradGpu, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A workspace smaller than the plan needs is refused with a message, never run.
TEST(GemmWgradGpuRun, ASmallWorkspaceIsRefused) {
  SKIP_WITHOUT_GPU("cuBLASLt's GEMMs");
  const ConvGeometry g{64, 64, 16, 16, 256, 1, 1, 0};
  const GemmWgrad gemm(ctx().cublas_lt, g, size_t(64) << 20, 0, ctx().stream);
  ASSERT_TRUE(gemm.ok()) << gemm.why();
  if (gemm.workspace() == 0) GTEST_SKIP() << "the chosen algorithm (" << gemm.algorithm() << ") needs no workspace";
  DeviceTensor x(size_t(g.n) * g.h * g.w * g.c, DType::F16), dy(size_t(g.n) * g.h * g.w * g.k, DType::F16),
      dw(g.filter_count(), DType::F16);
  EXPECT_THROW(gemm.run(ctx().cublas_lt, x.get(), dy.get(), dw.get(), nullptr, gemm.workspace() - 1, ctx().stream),
               Fatal);
}

// Only a 1x1 stride-1 unpadded conv's weight gradient is this matrix product; anything else is
// refused at planning, with its reason.
TEST(GemmWgrad, AppliesToThe1x1Stride1ConvsOnly) {
  EXPECT_TRUE(GemmWgrad::applies({8, 64, 8, 8, 256, 1, 1, 0}));
  EXPECT_FALSE(GemmWgrad::applies({8, 64, 8, 8, 64, 3, 1, 1}));
  EXPECT_FALSE(GemmWgrad::applies({8, 256, 8, 8, 512, 1, 2, 0})) << "the strided projection shortcut";
  EXPECT_FALSE(GemmWgrad::applies({8, 64, 8, 8, 64, 1, 1, 1})) << "padded";
  EXPECT_FALSE(GemmWgrad::applies({8, 3, 8, 8, 64, 1, 1, 0})) << "rows of x not 16-byte aligned";
}

}  // namespace
