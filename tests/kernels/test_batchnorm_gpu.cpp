// The batch-norm kernels (kernels/batchnorm_*.cu) against the CPU references in double, in every
// type and layout: training statistics with the fused apply (every residual kind, with and without
// ReLU), evaluation coefficients (one BN a launch, or all of them in one), the same bits from run
// to run, and the arguments refused before any launch (on the CPU). The backward's tests are in
// test_batchnorm_backward_gpu.cpp. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kernels/batchnorm.h"
#include "support/bn_fixture.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// Statistics, running-stat update, scale/shift and the fused apply, for every residual kind with
// and without ReLU.
TEST_P(GpuBatchNorm, TrainForwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const Residual res : {Residual::None, Residual::Tensor, Residual::BatchNorm})
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(dims_name(d) + ", " + residual_name(res) + (relu ? ", relu" : ", no relu"));
        const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
        const Vec x2 = quantize(t, channel_data(rng, d, -1.0, 3.0));  // residual tensor or 2nd BN input
        const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
        const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
        DeviceBn bn(h), bn2(h2);
        DeviceTensor scratch = bn_scratch(shape4(d), t, l);
        DeviceTensor y(d.count(), t);
        y.poison();

        bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
        if (res == Residual::BatchNorm)
          bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
        ApplyArgs a = apply_args(x_d.get(), bn, y.get());
        a.residual = res;
        a.res = res == Residual::None ? nullptr : x2_d.get();
        if (res == Residual::BatchNorm) {
          a.res_scale = bn2.scale.f32();
          a.res_shift = bn2.shift.f32();
        }
        a.relu = relu;
        bn_apply(a, shape4(d), t, l, stream);

        const ref::BnStats st = ref::bn_batch_stats(d, x, kEps);
        Vec rm = h.running_mean, rv = h.running_var;
        ref::bn_update_running(st, d.per_channel(), kMomentum, rm, rv);
        const ref::BnCoefs k = ref::bn_train_coefs(st, h.gamma, h.beta);
        Vec pre = ref::bn_affine(d, x, k);
        if (res == Residual::Tensor) pre = ref::add(pre, x2);
        if (res == Residual::BatchNorm) {
          const ref::BnStats st2 = ref::bn_batch_stats(d, x2, kEps);
          pre = ref::add(pre, ref::bn_affine(d, x2, ref::bn_train_coefs(st2, h2.gamma, h2.beta)));
          EXPECT_CLOSE(bn2.save_mean.download(), st2.mean, kTolF32) << "second BN mean";
          EXPECT_CLOSE(bn2.save_invstd.download(), st2.invstd, kTolF32) << "second BN invstd";
        }
        EXPECT_CLOSE(bn.save_mean.download(), st.mean, kTolF32) << "save_mean";
        EXPECT_CLOSE(bn.save_invstd.download(), st.invstd, kTolF32) << "save_invstd";
        EXPECT_CLOSE(bn.running_mean.download(), rm, kTolF32) << "running_mean";
        EXPECT_CLOSE(bn.running_var.download(), rv, kTolF32) << "running_var (unbiased batch variance)";
        EXPECT_CLOSE(bn.scale.download(), k.scale, kTolF32) << "scale";
        EXPECT_CLOSE(bn.shift.download(), k.shift, kTolF32) << "shift";
        EXPECT_CLOSE(download_activation(y, d, l), relu ? ref::relu(pre) : pre, tol(t)) << "y";
      }
  }
}

// Asked for them, the coefficients also come in fp16 (what a fused conv's prologue reads): each the
// fp32 value rounded to nearest, from the batch statistics in training and from the running ones in
// evaluation, in every activation type and layout.
TEST_P(GpuBatchNorm, CoefficientsWriteTheirFp16CopiesWhenAsked) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const bool train : {true, false}) {
      SCOPED_TRACE(dims_name(d) + (train ? ", training" : ", evaluation"));
      const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
      const DeviceTensor x_d = upload_activation(x, d, t, l);
      DeviceBn bn(random_bn(rng, d.c));
      DeviceTensor scratch = bn_scratch(shape4(d), t, l);
      DeviceTensor scale_h(d.c, DType::F16), shift_h(d.c, DType::F16);
      scale_h.poison();
      shift_h.poison();
      if (train)
        bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), ctx().stream, scale_h.get(),
                               shift_h.get());
      else
        bn_forward_eval_coefs(bn.state(), d.c, ctx().stream, scale_h.get(), shift_h.get());
      EXPECT_EQ(scale_h.download(), quantize(DType::F16, bn.scale.download())) << "the fp16 copy of scale";
      EXPECT_EQ(shift_h.download(), quantize(DType::F16, bn.shift.download())) << "the fp16 copy of shift";
    }
  }
}

// Evaluation: scale/shift from the running statistics, which stay untouched.
TEST_P(GpuBatchNorm, EvalForwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const Residual res : {Residual::None, Residual::Tensor, Residual::BatchNorm}) {
      const bool relu = res != Residual::None;
      SCOPED_TRACE(dims_name(d) + ", " + residual_name(res));
      const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0)), x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
      const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
      const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
      DeviceBn bn(h), bn2(h2);
      DeviceTensor y(d.count(), t);
      y.poison();

      bn_forward_eval_coefs(bn.state(), d.c, stream);
      if (res == Residual::BatchNorm) bn_forward_eval_coefs(bn2.state(), d.c, stream);
      ApplyArgs a = apply_args(x_d.get(), bn, y.get());
      a.residual = res;
      a.res = res == Residual::None ? nullptr : x2_d.get();
      if (res == Residual::BatchNorm) {
        a.res_scale = bn2.scale.f32();
        a.res_shift = bn2.shift.f32();
      }
      a.relu = relu;
      bn_apply(a, shape4(d), t, l, stream);

      const ref::BnCoefs k = ref::bn_eval_coefs(h.gamma, h.beta, h.running_mean, h.running_var, kEps);
      Vec pre = ref::bn_eval_forward(d, x, h.gamma, h.beta, h.running_mean, h.running_var, kEps);
      if (res == Residual::Tensor) pre = ref::add(pre, x2);
      if (res == Residual::BatchNorm)
        pre = ref::add(pre, ref::bn_eval_forward(d, x2, h2.gamma, h2.beta, h2.running_mean, h2.running_var, kEps));
      EXPECT_CLOSE(bn.scale.download(), k.scale, kTolF32) << "scale";
      EXPECT_CLOSE(bn.shift.download(), k.shift, kTolF32) << "shift";
      EXPECT_CLOSE(download_activation(y, d, l), relu ? ref::relu(pre) : pre, tol(t)) << "y";
      EXPECT_EQ(bn.running_mean.download(), h.running_mean) << "evaluation must not touch running_mean";
      EXPECT_EQ(bn.running_var.download(), h.running_var) << "evaluation must not touch running_var";
    }
  }
}

// bin/predict computes every BN's evaluation coefficients in one launch: the same bits as one
// launch per BN, at widths that leave channels of the widest launch block idle, and the fp16
// copies where asked for (left untouched where not).
TEST(GpuBatchNormEval, AllBnsInOneLaunchEqualOneLaunchEach) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const int widths[] = {64, 2048, 24, 300};
  std::vector<std::unique_ptr<DeviceBn>> one, all;
  std::vector<std::unique_ptr<DeviceTensor>> halves;
  std::vector<BnEvalTarget> targets;
  for (size_t i = 0; i < std::size(widths); ++i) {
    const HostBn h = random_bn(rng, widths[i]);
    one.push_back(std::make_unique<DeviceBn>(h));
    all.push_back(std::make_unique<DeviceBn>(h));
    bn_forward_eval_coefs(one.back()->state(), widths[i], stream);
    halves.push_back(std::make_unique<DeviceTensor>(2 * size_t(widths[i]), DType::F16, "fp16 scale and shift"));
    halves.back()->poison();
    const bool half = i % 2 == 0;
    uint16_t* h16 = static_cast<uint16_t*>(halves.back()->get());
    targets.push_back({all.back()->state(), widths[i], half ? h16 : nullptr, half ? h16 + widths[i] : nullptr});
  }
  DeviceBuffer table(targets.size() * sizeof(BnEvalTarget), "test eval targets");
  CUDA_CHECK(cudaMemcpy(table.get(), targets.data(), table.bytes(), cudaMemcpyHostToDevice));
  bn_forward_eval_coefs_all(table.as<BnEvalTarget>(), static_cast<int>(targets.size()), 2048, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < targets.size(); ++i) {
    SCOPED_TRACE("BN " + std::to_string(i) + " of " + std::to_string(widths[i]) + " channels");
    EXPECT_TRUE(all[i]->scale.bytes() == one[i]->scale.bytes()) << "scale";
    EXPECT_TRUE(all[i]->shift.bytes() == one[i]->shift.bytes()) << "shift";
    const std::vector<uint8_t> h = halves[i]->bytes();
    if (i % 2 != 0) {
      EXPECT_EQ(h, std::vector<uint8_t>(h.size(), 0xFF)) << "no fp16 copy was asked for";
      continue;
    }
    const ref::Vec sc = all[i]->scale.download(), sh = all[i]->shift.download();
    for (int c = 0; c < widths[i]; ++c) {
      uint16_t got_s, got_h;
      std::memcpy(&got_s, h.data() + 2 * c, 2);
      std::memcpy(&got_h, h.data() + 2 * (widths[i] + c), 2);
      ASSERT_EQ(got_s, gpu_test::half_bits(__float2half_rn(float(sc[c])))) << "scale_h[" << c << "]";
      ASSERT_EQ(got_h, gpu_test::half_bits(__float2half_rn(float(sh[c])))) << "shift_h[" << c << "]";
    }
  }
}

// Fixed-order reductions: the same inputs give the same bits, forward and backward.
TEST_P(GpuBatchNorm, BitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{16, 64, 16, 16};  // many chunks in both layouts
  ASSERT_TRUE(bn_supported(d, t, l));
  const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0)), x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  const Vec dy = quantize(t, random_normal(rng, d.count()));
  const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
  const DeviceTensor x_d = upload_activation(x, d, t, l), x2_d = upload_activation(x2, d, t, l);
  const DeviceTensor dy_d = upload_activation(dy, d, t, l);

  auto run = [&] {
    DeviceBn bn(h), bn2(h2);  // fresh running statistics each run
    DeviceTensor scratch = bn_scratch(shape4(d), t, l);
    DeviceTensor y(d.count(), t), dx(d.count(), t), dx2(d.count(), t);
    DeviceTensor dg(d.c, DType::F32), db(d.c, DType::F32), dg2(d.c, DType::F32), db2(d.c, DType::F32);
    for (DeviceTensor* p : {&y, &dx, &dx2, &dg, &db, &dg2, &db2}) p->poison();
    bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
    bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
    ApplyArgs a{x_d.get(), bn.scale.f32(), bn.shift.f32(), Residual::BatchNorm, x2_d.get(),
                bn2.scale.f32(), bn2.shift.f32(), true, y.get()};
    bn_apply(a, shape4(d), t, l, stream);
    const BnChannelState s1 = bn.state(), s2 = bn2.state();
    BnBackwardArgs b{};
    b.dy = dy_d.get();
    b.relu = ReluMask::FromOutput;
    b.y = y.get();
    b.x = x_d.get();
    b.bn = &s1;
    b.dgamma = dg.f32();
    b.dbeta = db.f32();
    b.x2 = x2_d.get();
    b.bn2 = &s2;
    b.dgamma2 = dg2.f32();
    b.dbeta2 = db2.f32();
    b.dx = dx.get();
    b.dx2 = dx2.get();
    bn_backward(b, shape4(d), t, l, scratch.f32(), stream);
    std::vector<std::vector<uint8_t>> out;
    for (const DeviceTensor* p : {&bn.save_mean, &bn.save_invstd, &bn.scale, &bn.shift, &bn.running_mean,
                                  &bn.running_var, &bn2.save_mean, &bn2.save_invstd, &y, &dg, &db, &dg2, &db2,
                                  &dx, &dx2})
      out.push_back(p->bytes());
    return out;
  };
  const auto first = run(), second = run();
  const char* names[] = {"save_mean", "save_invstd", "scale", "shift", "running_mean", "running_var",
                         "save_mean2", "save_invstd2", "y", "dgamma", "dbeta", "dgamma2", "dbeta2", "dx", "dx2"};
  ASSERT_EQ(first.size(), std::size(names));
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i] == second[i]) << names[i] << " differs between runs";
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuBatchNorm, testing::ValuesIn(kVariants), variant_param_name);

// CPU-only: argument validation before any launch.

TEST(KernelArgs, BatchNormRejectsShapesItCannotVectorize) {
  const BnChannelState st{};
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 12, 4, 4}, DType::F16, Layout::NHWC, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 6, 4, 4}, DType::F32, Layout::NHWC, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 8, 2, 2}, DType::F16, Layout::NCHW, st, nullptr, nullptr), Fatal);
  EXPECT_THROW(bn_forward_train_stats(nullptr, {2, 8, 3, 3}, DType::F32, Layout::NCHW, st, nullptr, nullptr), Fatal);
  const ApplyArgs a{};
  EXPECT_THROW(bn_apply(a, {2, 12, 4, 4}, DType::F16, Layout::NHWC, nullptr), Fatal);
  BnBackwardArgs b{};
  b.bn = &st;
  EXPECT_THROW(bn_backward(b, {2, 8, 3, 3}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
}

TEST(KernelArgs, BatchNormBackwardRejectsResidualPathsWithoutRelu) {
  const BnChannelState st{};
  int dummy = 0;
  BnBackwardArgs b{};
  b.bn = &st;
  b.dres = &dummy;  // identity shortcut without the ReLU output
  EXPECT_THROW(bn_backward(b, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs c{};
  c.bn = &st;
  c.relu = ReluMask::FromOutput;
  c.y = &dummy;
  c.x2 = &dummy;
  c.bn2 = &st;
  c.dres = &dummy;  // projection and identity at once
  EXPECT_THROW(bn_backward(c, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs e{};
  e.bn = &st;
  e.relu = ReluMask::FromOutput;  // the mask's source missing
  EXPECT_THROW(bn_backward(e, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs f{};
  f.bn = &st;
  f.relu = ReluMask::FromInput;  // recomputing the mask from x ignores the residual that came before the ReLU
  f.dres = &dummy;
  EXPECT_THROW(bn_backward(f, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
  BnBackwardArgs g{};
  g.bn = &st;
  g.relu = ReluMask::FromBits;  // the bits missing
  g.dres = &dummy;
  EXPECT_THROW(bn_backward(g, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr, nullptr), Fatal);
}

// The backward from a conv's sums takes dz as it is: a mask, a second part or dres is a caller's bug.
TEST(KernelArgs, BatchNormBackwardFromSumsRejectsWhatDzAlreadyHas) {
  const BnChannelState st{};
  int dummy = 0;
  float sums[48] = {};
  for (int which = 0; which < 3; ++which) {
    BnBackwardArgs b{};
    b.bn = &st;
    if (which == 0) b.relu = ReluMask::FromBits, b.relu_bits = reinterpret_cast<uint8_t*>(&dummy);
    if (which == 1) b.dy2 = &dummy;
    if (which == 2) b.dres = &dummy;
    EXPECT_THROW(bn_backward_from_sums(b, sums, 1, {2, 8, 4, 4}, DType::F32, Layout::NHWC, nullptr), Fatal);
  }
  BnBackwardArgs b{};
  b.bn = &st;
  EXPECT_THROW(bn_backward_from_sums(b, sums, 0, {2, 8, 4, 4}, DType::F32, Layout::NHWC, nullptr), Fatal);
}

TEST(KernelArgs, BatchNormApplyRejectsReluBitsWithoutRelu) {
  uint8_t bits[64];
  ApplyArgs a{};
  a.relu = false;
  a.relu_bits = bits;
  EXPECT_THROW(bn_apply(a, {2, 8, 4, 4}, DType::F32, Layout::NCHW, nullptr), Fatal);
}

}  // namespace
