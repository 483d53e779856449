// The input normalization kernel (kernels/normalize.cu) against the CPU, in every type and layout,
// for grey and colour input. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/normalize.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

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

}  // namespace
