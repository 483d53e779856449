// The fp32 <-> fp16 casts (kernels/cast.cu) against the host's conversion, on values whose rounding
// is easy to get wrong and on every fp16 bit pattern; and that host conversion itself, which the
// tests rely on (quantize, the expected cast results), on the CPU. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

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

// CPU-only.

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
