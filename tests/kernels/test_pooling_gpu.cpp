// The global average pool (kernels/pooling.cu), forward and backward, against the CPU reference in
// double, in every type and layout. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <random>

#include "kernels/pooling.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

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

}  // namespace
