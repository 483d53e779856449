// The optimizer kernels (kernels/optimizer.cu): the SGD update against the CPU reference in double
// (decay, momentum, Nesterov, the fp16 working copy), a non-finite gradient skipping the step, and
// the loss-scale update against the CPU rule, whose every branch is checked on the CPU first. GPU
// tests skip without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;
using ref::Vec;

ScalerState scaler(float scale, int good = 0, int found_inf = 0, int skipped = 0, int diverged = 0) {
  return {scale, good, found_inf, skipped, diverged};
}

struct DeviceScaler {
  DeviceBuffer buf{sizeof(ScalerState), "test scaler state"};
  explicit DeviceScaler(const ScalerState& s) { set(s); }
  void set(const ScalerState& s) { CUDA_CHECK(cudaMemcpy(buf.get(), &s, sizeof s, cudaMemcpyHostToDevice)); }
  ScalerState get() const {
    ScalerState s;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(&s, buf.get(), sizeof s, cudaMemcpyDeviceToHost));
    return s;
  }
  ScalerState* ptr() const { return buf.as<ScalerState>(); }
};

void expect_same_state(const ScalerState& got, const ScalerState& want) {
  EXPECT_EQ(got.scale, want.scale);
  EXPECT_EQ(got.good_steps, want.good_steps);
  EXPECT_EQ(got.found_inf, want.found_inf);
  EXPECT_EQ(got.skipped_steps, want.skipped_steps);
  EXPECT_EQ(got.diverged, want.diverged);
}

// The flat parameter buffer: n_act conv/linear weights (gradients in the activation type, decayed,
// with an fp16 working copy in fp16 builds), then n - n_act BN/bias parameters (fp32 gradients).
struct SgdSetup {
  size_t n, n_act;
  DType act;
  Vec w, mom, grad_act, grad_f32;  // grads as stored (scaled by the loss scale)
  DeviceTensor w_d, mom_d, grad_act_d, grad_f32_d, w_act_d, lr_d{1, DType::F32, "sgd lr"};
  static constexpr size_t kGuard = 64;  // fp16 copy elements past n_act that must stay untouched

  SgdSetup(std::mt19937_64& rng, size_t n_, size_t n_act_, DType act_, double grad_scale)
      : n(n_), n_act(n_act_), act(act_),
        w(quantize(DType::F32, random_normal(rng, n_))),
        mom(quantize(DType::F32, random_normal(rng, n_, 0.0, 0.5))),
        grad_act(quantize(act_, random_normal(rng, n_act_, 0.0, grad_scale))),
        grad_f32(quantize(DType::F32, random_normal(rng, n_ - n_act_, 0.0, grad_scale))),
        w_d(w, DType::F32, "sgd w"), mom_d(mom, DType::F32, "sgd momentum"),
        grad_act_d(grad_act, act_, "sgd grad act"), grad_f32_d(grad_f32, DType::F32, "sgd grad f32"),
        w_act_d(n_act_ + kGuard, DType::F16, "sgd fp16 copy") {
    w_act_d.poison();
  }
  // The kernel reads lr from device memory: it is uploaded here (a blocking copy, ordered after the
  // work already enqueued on the blocking test stream).
  SgdArgs args(float lr, float m, float wd, bool nesterov) {
    lr_d.upload(Vec{lr});
    return {w_d.f32(), mom_d.f32(), grad_act_d.get(), grad_f32_d.f32(),
            act == DType::F16 ? w_act_d.get() : nullptr, n, n_act, act, lr_d.f32(), m, wd, nesterov};
  }
};

TEST(GpuSgd, UpdateMatchesReference) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const float lr = 0.1f, m = 0.9f, wd = 0.05f, scale = 1024.f;
  for (const DType act : {DType::F32, DType::F16})
    for (const bool nesterov : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + (nesterov ? ", nesterov" : ", classical"));
      const size_t n = 5000, n_act = 3000;
      SgdSetup s(rng, n, n_act, act, scale);
      const DeviceScaler state(scaler(scale));
      Vec w_act_ref(s.w.begin(), s.w.begin() + n_act), w_f32_ref(s.w.begin() + n_act, s.w.end());
      Vec m_act_ref(s.mom.begin(), s.mom.begin() + n_act), m_f32_ref(s.mom.begin() + n_act, s.mom.end());
      for (int step = 0; step < 2; ++step) {
        if (step == 1) {  // new gradients for the second step
          s.grad_act = quantize(act, random_normal(rng, n_act, 0.0, scale));
          s.grad_f32 = quantize(DType::F32, random_normal(rng, n - n_act, 0.0, scale));
          s.grad_act_d.upload(s.grad_act);
          s.grad_f32_d.upload(s.grad_f32);
        }
        const SgdArgs a = s.args(lr, m, wd, nesterov);
        check_grads_finite(a, state.ptr(), stream);
        sgd_update(a, state.ptr(), stream);
        Vec g_act = s.grad_act, g_f32 = s.grad_f32;
        for (double& g : g_act) g /= scale;
        for (double& g : g_f32) g /= scale;
        ref::sgd_step(w_act_ref, m_act_ref, g_act, lr, m, wd, nesterov);    // decayed
        ref::sgd_step(w_f32_ref, m_f32_ref, g_f32, lr, m, 0.0, nesterov);   // not decayed
      }
      EXPECT_EQ(state.get().found_inf, 0) << "all gradients are finite";
      // Compare the change of the weights (two steps of ~lr * |g|), not the weights themselves,
      // so that a wrong decay or momentum term cannot hide under |w|.
      const Vec w_gpu = s.w_d.download(), mom_gpu = s.mom_d.download();
      Vec dw_gpu_act(n_act), dw_ref_act(n_act), dw_gpu_f32(n - n_act), dw_ref_f32(n - n_act);
      for (size_t i = 0; i < n_act; ++i) {
        dw_gpu_act[i] = w_gpu[i] - s.w[i];
        dw_ref_act[i] = w_act_ref[i] - s.w[i];
      }
      for (size_t i = n_act; i < n; ++i) {
        dw_gpu_f32[i - n_act] = w_gpu[i] - s.w[i];
        dw_ref_f32[i - n_act] = w_f32_ref[i - n_act] - s.w[i];
      }
      EXPECT_CLOSE(dw_gpu_act, dw_ref_act, kTolF32) << "update of the decayed (conv/linear) weights";
      EXPECT_CLOSE(dw_gpu_f32, dw_ref_f32, kTolF32) << "update of the BN/bias parameters (no decay)";
      EXPECT_CLOSE(Vec(mom_gpu.begin(), mom_gpu.begin() + n_act), m_act_ref, kTolF32) << "momentum (decayed part)";
      EXPECT_CLOSE(Vec(mom_gpu.begin() + n_act, mom_gpu.end()), m_f32_ref, kTolF32) << "momentum (rest)";
      if (act == DType::F16) {  // the working copy: the new master weights rounded to fp16, only n_act of them
        const std::vector<uint8_t> raw = s.w_act_d.bytes();
        size_t wrong = 0, overrun = 0;
        for (size_t i = 0; i < n_act + SgdSetup::kGuard; ++i) {
          uint16_t b;
          std::memcpy(&b, raw.data() + 2 * i, 2);
          if (i < n_act) wrong += b != half_bits(__float2half(static_cast<float>(w_gpu[i])));
          else overrun += b != 0xFFFF;
        }
        EXPECT_EQ(wrong, 0u) << "fp16 working copy elements that are not the rounded master weight";
        EXPECT_EQ(overrun, 0u) << "fp16 copy written past n_act";
      }
    }
}

// A NaN or Inf anywhere in the gradients sets found_inf, and the update is then a no-op; the
// loss-scale update skips the step and halves the scale.
TEST(GpuSgd, NonFiniteGradientSkipsTheStep) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Bad {
    const char* what;
    bool in_act;   // in the activation-type part, else in the fp32 part
    bool at_end;   // last element of that part, else the first
    double value;
  };
  for (const DType act : {DType::F32, DType::F16})
    for (const Bad bad : {Bad{"NaN, first weight grad", true, false, nan}, Bad{"+Inf, last weight grad", true, true, inf},
                          Bad{"-Inf, first BN grad", false, false, -inf}, Bad{"NaN, last BN grad", false, true, nan}})
      for (const size_t n : {size_t(777), (size_t(1) << 20) + 3}) {  // 2^20 + 3: several grid-stride passes
        SCOPED_TRACE(std::string(dtype_name(act)) + ", " + bad.what + ", n " + std::to_string(n));
        const size_t n_act = n / 2 + 1;
        SgdSetup s(rng, n, n_act, act, 1.0);
        if (bad.in_act) s.grad_act[bad.at_end ? n_act - 1 : 0] = bad.value;
        else s.grad_f32[bad.at_end ? n - n_act - 1 : 0] = bad.value;
        s.grad_act_d.upload(s.grad_act);
        s.grad_f32_d.upload(s.grad_f32);
        const std::vector<uint8_t> w0 = s.w_d.bytes(), m0 = s.mom_d.bytes(), c0 = s.w_act_d.bytes();
        const DeviceScaler state(scaler(65536.f, 17, 0, 3));
        const SgdArgs a = s.args(0.1f, 0.9f, 5e-4f, true);
        check_grads_finite(a, state.ptr(), stream);
        EXPECT_EQ(state.get().found_inf, 1);
        sgd_update(a, state.ptr(), stream);
        EXPECT_TRUE(s.w_d.bytes() == w0) << "weights changed by a skipped step";
        EXPECT_TRUE(s.mom_d.bytes() == m0) << "momentum changed by a skipped step";
        EXPECT_TRUE(s.w_act_d.bytes() == c0) << "fp16 copy changed by a skipped step";
        loss_scale_update(state.ptr(), true, 2000, stream);
        expect_same_state(state.get(), scaler(32768.f, 0, 0, 4));
      }
}

// Gradients as many as the network's (16M in fp16: several passes of the grid-stride loop, and the
// elements after its last whole vector): a single Inf anywhere is found; none where there is none.
TEST(GpuSgd, TheCheckFindsOneInfAmongMillions) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  const size_t n_act = (size_t(1) << 24) + 13, n = n_act + 100;
  DeviceTensor grads(n_act, DType::F16, "check grads"), vectors(n - n_act, DType::F32, "check vector grads");
  CUDA_CHECK(cudaMemset(grads.get(), 0, n_act * sizeof(uint16_t)));
  CUDA_CHECK(cudaMemset(vectors.get(), 0, (n - n_act) * sizeof(float)));
  const SgdArgs a{nullptr, nullptr, grads.get(), vectors.f32(), nullptr, n, n_act, DType::F16, nullptr, 0.f, 0.f, false};
  auto set = [&](size_t at, uint16_t bits) {
    CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(grads.get()) + at, &bits, sizeof bits, cudaMemcpyHostToDevice));
  };
  for (const size_t at : {size_t(0), n_act / 3, n_act / 2 + 8, n_act * 3 / 4 + 17, n_act - 20, n_act - 1}) {
    SCOPED_TRACE("an Inf at " + std::to_string(at));
    set(at, 0x7C00);  // +Inf in fp16
    const DeviceScaler state(scaler(1.f));
    check_grads_finite(a, state.ptr(), stream);
    EXPECT_EQ(state.get().found_inf, 1);
    set(at, 0);
  }
  const DeviceScaler state(scaler(1.f));
  check_grads_finite(a, state.ptr(), stream);
  EXPECT_EQ(state.get().found_inf, 0) << "all zeros again";
}

// Finite gradients, the largest fp16 values included, leave found_inf clear.
TEST(GpuSgd, FiniteGradientsLeaveFoundInfClear) {
  SKIP_WITHOUT_GPU("the optimizer kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const DType act : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(act));
    SgdSetup s(rng, 4096, 2048, act, 1.0);
    s.grad_act[0] = 65504.0;
    s.grad_act[1] = -65504.0;
    s.grad_f32[0] = 3.0e38;
    s.grad_act_d.upload(s.grad_act);
    s.grad_f32_d.upload(s.grad_f32);
    const DeviceScaler state(scaler(1.f));
    check_grads_finite(s.args(0.1f, 0.9f, 0.f, true), state.ptr(), stream);
    EXPECT_EQ(state.get().found_inf, 0);
  }
}

// Every branch of the scaling rule (kernels/optimizer.h), with the state it must lead to.
struct LossScaleCase {
  const char* what;
  ScalerState before;
  bool dynamic;
  int window;
  ScalerState after;
};
const LossScaleCase kLossScaleCases[] = {
    {"overflow: halve, reset, count the skip", scaler(65536.f, 5, 1, 2), true, 2000, scaler(32768.f, 0, 0, 3)},
    {"a good step inside the window", scaler(65536.f, 1998, 0), true, 2000, scaler(65536.f, 1999, 0)},
    {"the window completes: double", scaler(65536.f, 1999, 0), true, 2000, scaler(131072.f, 0, 0)},
    {"at the ceiling: no doubling", scaler(kMaxLossScale, 1999, 0), true, 2000, scaler(kMaxLossScale, 0, 0)},
    {"below the floor after halving: diverged", scaler(kMinLossScale, 0, 1, 9), true, 2000,
     scaler(kMinLossScale / 2, 0, 0, 10, 1)},
    {"halved onto the floor: alive", scaler(2 * kMinLossScale, 0, 1), true, 2000, scaler(kMinLossScale, 0, 0, 1)},
    {"window of 1", scaler(1.f, 0, 0), true, 1, scaler(2.f, 0, 0)},
    {"fixed scale: a non-finite step diverges", scaler(1.f, 0, 1, 0), false, 2000, scaler(1.f, 0, 0, 1, 1)},
    {"fixed scale: a finite step changes nothing", scaler(1.f, 7, 0, 0), false, 2000, scaler(1.f, 7, 0, 0)},
};

// The CPU rule itself (what the GPU kernel is then compared with).
TEST(KernelArgs, LossScaleRuleOnTheCpu) {
  for (const LossScaleCase& c : kLossScaleCases) {
    SCOPED_TRACE(c.what);
    ScalerState s = c.before;
    apply_loss_scale_rule(s, c.dynamic, c.window);
    expect_same_state(s, c.after);
  }
}

TEST(GpuLossScale, UpdateMatchesTheCpuRule) {
  SKIP_WITHOUT_GPU("the loss-scale kernel");
  cudaStream_t stream = ctx().stream;
  for (const LossScaleCase& c : kLossScaleCases) {
    SCOPED_TRACE(c.what);
    DeviceScaler d(c.before);
    loss_scale_update(d.ptr(), c.dynamic, c.window, stream);
    ScalerState want = c.before;
    apply_loss_scale_rule(want, c.dynamic, c.window);
    expect_same_state(d.get(), want);
  }
}

}  // namespace
