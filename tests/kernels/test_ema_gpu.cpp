// The weight average's kernels (kernels/ema.cu) against the CPU reference: the update after a step
// (with the decay's warm-up read from the step index in device memory, a skipped step changing
// nothing), and the swap that evaluates the average, bit for bit; the decay rule on the CPU. GPU tests
// skip without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/errors.h"
#include "kernels/ema.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

TEST(EmaDecay, WarmsUpAsTensorFlowsThenHoldsTheDecay) {
  EXPECT_FLOAT_EQ(ema_decay_at(0.999f, 0), 0.1f);           // (1 + 0) / (10 + 0)
  EXPECT_FLOAT_EQ(ema_decay_at(0.999f, 90), 0.91f);         // 91 / 100
  EXPECT_FLOAT_EQ(ema_decay_at(0.999f, 100000), 0.999f);    // (1 + t) / (10 + t) > 0.999 from t = 8991
  EXPECT_FLOAT_EQ(ema_decay_at(0.5f, 0), 0.1f);
  EXPECT_FLOAT_EQ(ema_decay_at(0.5f, 8), 0.5f);             // 9 / 18
  EXPECT_FLOAT_EQ(ema_decay_at(0.0f, 5), 0.0f);             // the average is the weights
  for (long long t = 1; t < 20000; t += 37) EXPECT_LE(ema_decay_at(0.999f, t - 1), ema_decay_at(0.999f, t)) << t;
}

template <class T>
struct DeviceValue {
  DeviceBuffer buf{sizeof(T), "test value"};
  explicit DeviceValue(const T& v) { set(v); }
  void set(const T& v) { CUDA_CHECK(cudaMemcpy(buf.get(), &v, sizeof v, cudaMemcpyHostToDevice)); }
  const T* ptr() const { return buf.as<T>(); }
};

// Five steps whose weights change each time, n with a tail beyond the 16-byte vectors.
TEST(GpuEma, UpdatesMatchTheReferenceStepByStep) {
  SKIP_WITHOUT_GPU("the weight average's update");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const size_t n : {size_t(1), size_t(4099), size_t(100003)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    Vec avg = quantize(DType::F32, random_normal(rng, n));
    DeviceTensor avg_d(avg, DType::F32, "test average");
    ScalerState fine{1.f, 0, 0, 0, 0};
    const DeviceValue<ScalerState> scaler(fine);
    for (long long step : {0LL, 1LL, 2LL, 500LL, 20000LL}) {
      const Vec w = quantize(DType::F32, random_normal(rng, n, 0.5, 2.0));
      const DeviceTensor w_d(w, DType::F32, "test weights");
      const DeviceValue<long long> step_d(step);
      ema_update(avg_d.f32(), w_d.f32(), n, 0.999f, step_d.ptr(), scaler.ptr(), stream);
      ref::ema_update(avg, w, ema_decay_at(0.999f, step));
      EXPECT_CLOSE(avg_d.download(), avg, 1e-6) << "step " << step;
      avg = avg_d.download();  // the next step starts from what the kernel holds
    }
  }
}

// fp16 overflow: the scaler's found_inf skips the optimizer step, and the average with it; no scaler
// (nullptr) always updates.
TEST(GpuEma, ASkippedStepLeavesTheAverageAsItWas) {
  SKIP_WITHOUT_GPU("the weight average's update");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const size_t n = 1030;
  const Vec avg = quantize(DType::F32, random_normal(rng, n)), w = quantize(DType::F32, random_normal(rng, n));
  DeviceTensor avg_d(avg, DType::F32), w_d(w, DType::F32);
  const DeviceValue<long long> step(7);
  const DeviceValue<ScalerState> skipped(ScalerState{1024.f, 0, 1, 0, 0});
  const std::vector<uint8_t> before = avg_d.bytes();
  ema_update(avg_d.f32(), w_d.f32(), n, 0.9f, step.ptr(), skipped.ptr(), stream);
  EXPECT_EQ(avg_d.bytes(), before) << "a skipped step moved the average";
  ema_update(avg_d.f32(), w_d.f32(), n, 0.9f, step.ptr(), nullptr, stream);
  Vec want = avg;
  ref::ema_update(want, w, ema_decay_at(0.9f, 7));
  EXPECT_CLOSE(avg_d.download(), want, 1e-6);
}

// The swap exchanges every value bit for bit (NaN payloads, signed zeros and denormals included);
// twice, and both buffers are as they were.
TEST(GpuEma, SwapExchangesEveryBitAndTwiceRestores) {
  SKIP_WITHOUT_GPU("the weight average's swap");
  cudaStream_t stream = ctx().stream;
  for (const size_t n : {size_t(3), size_t(4096), size_t(70001)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<uint32_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) a[i] = uint32_t(i * 2654435761u), b[i] = ~uint32_t(i * 40503u);
    a[0] = 0x7FC00123u;  // a NaN with a payload
    b[n - 1] = 0x80000000u;  // -0
    DeviceBuffer da(n * 4, "test a"), db(n * 4, "test b");
    CUDA_CHECK(cudaMemcpy(da.get(), a.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(db.get(), b.data(), n * 4, cudaMemcpyHostToDevice));
    auto read = [&](const DeviceBuffer& d) {
      std::vector<uint32_t> h(n);
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost));
      return h;
    };
    swap_values(da.as<float>(), db.as<float>(), n, stream);
    EXPECT_EQ(read(da), b);
    EXPECT_EQ(read(db), a);
    swap_values(da.as<float>(), db.as<float>(), n, stream);
    EXPECT_EQ(read(da), a);
    EXPECT_EQ(read(db), b);
  }
}

TEST(KernelArgs, EmaKernelsRefuseUnalignedBuffers) {
  float* odd = reinterpret_cast<float*>(uintptr_t(4));
  float* even = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(ema_update(odd, even, 8, 0.9f, nullptr, nullptr, nullptr), Fatal);
  EXPECT_THROW(ema_update(even, odd, 8, 0.9f, nullptr, nullptr, nullptr), Fatal);
  EXPECT_THROW(swap_values(odd, even, 8, nullptr), Fatal);
}

}  // namespace
