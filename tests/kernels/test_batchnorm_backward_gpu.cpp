// The batch-norm backward kernel (kernels/batchnorm_backward.cu) against the CPU references in
// double, in every type and layout: every residual path and source of the ReLU mask the network
// uses, the mask recomputed from the input bit for bit, the forward's ReLU bits, and channel means
// far from zero. The GpuBatchNorm suite's other tests, and its instantiation, are in
// test_batchnorm_gpu.cpp. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "support/bn_fixture.h"

namespace {

using namespace gpu_test;
using ref::Vec;

// The backward configurations: no ReLU; ReLU with its mask from the stored output y, with dx apart
// from or in place of dy; ReLU with its mask recomputed from x, dx in place of dy (the inner BNs of
// the network, training_backward.cpp); ReLU with the identity shortcut's dz written to dres in place of dy
// (the last BN of an identity block); ReLU with the projection shortcut's BN fed the same dz (dual).
enum class BwdMode { Plain, Relu, ReluInPlace, ReluFromInput, Identity, IdentityInPlace, Projection };
const char* bwd_mode_name(BwdMode m) {
  switch (m) {
    case BwdMode::Plain: return "plain";
    case BwdMode::Relu: return "relu";
    case BwdMode::ReluInPlace: return "relu, dx aliases dy";
    case BwdMode::ReluFromInput: return "relu mask from x, dx aliases dy";
    case BwdMode::Identity: return "relu + identity dres";
    case BwdMode::IdentityInPlace: return "relu + identity dres aliasing dy";
    case BwdMode::Projection: return "relu + projection (dual BN)";
  }
  return "?";
}

struct BwdCase {
  // inputs; dy2, where given, is a second part of dy, summed by the kernel as it reads them
  Vec x, x2, y, dy, dy2;
  HostBn h, h2;
  ref::BnStats st, st2;
  Vec scale, shift;  // bn's forward scale/shift (fp32), from which ReluFromInput recomputes the mask
  // reference results
  ref::BnGrads g, g2;
  Vec dz;
};

// split: dy given in two parts of type t, dy and dy2, whose sum the reference takes.
BwdCase make_bwd_case(std::mt19937_64& rng, const ref::Dims& d, DType t, BwdMode m, double mean_lo, double mean_hi,
                      bool split = false) {
  BwdCase b;
  b.x = quantize(t, channel_data(rng, d, mean_lo, mean_hi));
  b.x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  b.h = random_bn(rng, d.c);
  b.h2 = random_bn(rng, d.c);
  b.dy = quantize(t, random_normal(rng, d.count()));
  Vec dy = b.dy;
  if (split) {
    b.dy2 = quantize(t, random_normal(rng, d.count()));
    dy = ref::add(b.dy, b.dy2);
  }
  b.st = saved_stats(d, b.x);
  b.st2 = saved_stats(d, b.x2);
  const bool relu = m != BwdMode::Plain;
  const ref::BnCoefs k = saved_coefs(b.st, b.h.gamma, b.h.beta);
  b.scale = k.scale;
  b.shift = k.shift;
  if (m == BwdMode::ReluFromInput) {
    b.y = bn_apply_as_gpu(d, b.x, b.scale, b.shift, t);  // exactly as the forward kernel rounds it
  } else if (relu) {
    // y = relu(bn(x) + residual) as the forward wrote it: only its sign matters here.
    Vec pre = ref::bn_affine(d, b.x, ref::bn_train_coefs(b.st, b.h.gamma, b.h.beta));
    if (m == BwdMode::Identity || m == BwdMode::IdentityInPlace) pre = ref::add(pre, b.x2);
    if (m == BwdMode::Projection)
      pre = ref::add(pre, ref::bn_affine(d, b.x2, ref::bn_train_coefs(b.st2, b.h2.gamma, b.h2.beta)));
    b.y = quantize(t, ref::relu(pre));
  }
  b.dz = relu ? ref::relu_backward(dy, b.y) : dy;
  if (split) b.dz = quantize(t, b.dz);  // the kernel stores dz in dy's buffer and takes its sums of that
  b.g = ref::bn_backward(d, b.dz, b.x, b.h.gamma, b.st);
  if (m == BwdMode::Projection) b.g2 = ref::bn_backward(d, b.dz, b.x2, b.h2.gamma, b.st2);
  return b;
}

// Runs bn_backward on the GPU for one case and checks every output.
void check_bn_backward(const ref::Dims& d, DType t, Layout l, BwdMode m, const BwdCase& b) {
  cudaStream_t stream = ctx().stream;
  const bool relu = m != BwdMode::Plain;
  const bool dual = m == BwdMode::Projection;
  const bool identity = m == BwdMode::Identity || m == BwdMode::IdentityInPlace;
  const DeviceTensor x_d = upload_activation(b.x, d, t, l), x2_d = upload_activation(b.x2, d, t, l);
  const DeviceTensor y_d = upload_activation(relu ? b.y : Vec(d.count(), 0.0), d, t, l);
  DeviceTensor dy_d = upload_activation(b.dy, d, t, l);
  const DeviceTensor dy2_d = upload_activation(b.dy2.empty() ? Vec(d.count(), 0.0) : b.dy2, d, t, l);
  DeviceBn bn(b.h), bn2(b.h2);
  bn.save_mean.upload(b.st.mean);
  bn.save_invstd.upload(b.st.invstd);
  bn.scale.upload(b.scale);
  bn.shift.upload(b.shift);
  bn2.save_mean.upload(b.st2.mean);
  bn2.save_invstd.upload(b.st2.invstd);
  DeviceTensor dgamma(d.c, DType::F32), dbeta(d.c, DType::F32), dgamma2(d.c, DType::F32), dbeta2(d.c, DType::F32);
  DeviceTensor dx(d.count(), t), dx2(d.count(), t), dres(d.count(), t);
  for (DeviceTensor* p : {&dgamma, &dbeta, &dgamma2, &dbeta2, &dx, &dx2, &dres}) p->poison();
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);

  const BnChannelState s1 = bn.state(), s2 = bn2.state();
  BnBackwardArgs a{};
  a.dy = dy_d.get();
  if (!b.dy2.empty()) a.dy2 = dy2_d.get();
  a.relu = !relu ? ReluMask::None : m == BwdMode::ReluFromInput ? ReluMask::FromInput : ReluMask::FromOutput;
  a.y = a.relu == ReluMask::FromOutput ? y_d.get() : nullptr;
  a.x = x_d.get();
  a.bn = &s1;
  a.dgamma = dgamma.f32();
  a.dbeta = dbeta.f32();
  const bool in_place = m == BwdMode::ReluInPlace || m == BwdMode::ReluFromInput;
  a.dx = in_place ? dy_d.get() : dx.get();
  if (dual) {
    a.x2 = x2_d.get();
    a.bn2 = &s2;
    a.dgamma2 = dgamma2.f32();
    a.dbeta2 = dbeta2.f32();
    a.dx2 = dx2.get();
  }
  if (identity) a.dres = m == BwdMode::IdentityInPlace ? dy_d.get() : dres.get();
  bn_backward(a, shape4(d), t, l, scratch.f32(), stream);

  EXPECT_CLOSE(dgamma.download(), b.g.dgamma, kTolF32) << "dgamma";
  EXPECT_CLOSE(dbeta.download(), b.g.dbeta, kTolF32) << "dbeta";
  const DeviceTensor& dx_out = in_place ? dy_d : dx;
  EXPECT_CLOSE(download_activation(dx_out, d, l), b.g.dx, tol(t)) << "dx";
  if (dual) {
    EXPECT_CLOSE(dgamma2.download(), b.g2.dgamma, kTolF32) << "dgamma2";
    EXPECT_CLOSE(dbeta2.download(), b.g2.dbeta, kTolF32) << "dbeta2";
    EXPECT_CLOSE(download_activation(dx2, d, l), b.g2.dx, tol(t)) << "dx2";
  }
  if (identity) {  // dz = dy * (y > 0): masking does no arithmetic (a sum of two parts rounds once to t)
    const DeviceTensor& dres_out = m == BwdMode::IdentityInPlace ? dy_d : dres;
    EXPECT_CLOSE(download_activation(dres_out, d, l), b.dz, b.dy2.empty() ? 0.0 : tol(t)) << "dres";
  }
}

TEST_P(GpuBatchNorm, BackwardMatchesReference) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const BwdMode m : {BwdMode::Plain, BwdMode::Relu, BwdMode::ReluInPlace, BwdMode::ReluFromInput, BwdMode::Identity,
                            BwdMode::IdentityInPlace, BwdMode::Projection}) {
      SCOPED_TRACE(dims_name(d) + ", " + bwd_mode_name(m));
      check_bn_backward(d, t, l, m, make_bwd_case(rng, d, t, m, -2.0, 2.0));
    }
  }
}

// A block's input gradient arrives in two parts, its shortcut's and its main path's (the graph API
// cannot accumulate conv1's data gradient into the shortcut's): the BN backward that reads it next
// (the previous block's join, the stem's BN) sums them as it reads, in every mode it is used in,
// and leaves dz in dy's buffer (so dres, for the identity shortcut, must be that buffer).
TEST_P(GpuBatchNorm, BackwardSumsAGradientGivenInTwoParts) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  std::mt19937_64 rng = test_rng();
  for (const ref::Dims& d : kBnShapes) {
    if (!bn_supported(d, t, l)) continue;
    for (const BwdMode m : {BwdMode::ReluFromInput, BwdMode::IdentityInPlace, BwdMode::Projection}) {
      SCOPED_TRACE(dims_name(d) + ", " + bwd_mode_name(m) + ", dy in two parts");
      check_bn_backward(d, t, l, m, make_bwd_case(rng, d, t, m, -2.0, 2.0, true));
    }
  }
  const ref::Dims d = kBnShapes[0];
  EXPECT_THROW(check_bn_backward(d, t, l, BwdMode::Identity, make_bwd_case(rng, d, t, BwdMode::Identity, -2, 2, true)),
               Fatal)
      << "dres apart from dy, with dy in two parts";
}

// The inner BNs' backward recomputes the ReLU mask from x instead of reading y: it must be the mask
// of the y the forward kernel stored, bit for bit, also for pre-activations within rounding of 0.
// A third of the elements are set to the value of T nearest to where the channel's affine map
// crosses 0, so that many of them round to +-0 or to the smallest subnormals.
TEST_P(GpuBatchNorm, MaskFromInputMatchesTheStoredOutput) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 64, 8, 8};
  ASSERT_TRUE(bn_supported(d, t, l));
  const HostBn h = random_bn(rng, d.c);
  DeviceBn bn(h);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
  {  // the forward's scale/shift for this data
    const DeviceTensor x_d = upload_activation(x, d, t, l);
    bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const Vec scale = bn.scale.download(), shift = bn.shift.download();
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    if (pick(rng) == 0 && scale[c] != 0) x[i] = quantize(t, -shift[c] / scale[c]);
  }
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  DeviceTensor y(d.count(), t);
  y.poison();
  bn_apply(apply_args(x_d.get(), bn, y.get()), shape4(d), t, l, stream);  // scale/shift as above
  size_t near_zero = 0;  // pre-activations within 1e-3 of 0, as the kernel computes them (one fp32 fma)
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    near_zero += std::fabs(std::fma(float(x[i]), float(scale[c]), float(shift[c]))) < 1e-3f;
  }
  EXPECT_GT(near_zero, x.size() / 5) << "the data should put many pre-activations within rounding of 0";

  const DeviceTensor dy_d = upload_activation(quantize(t, random_normal(rng, d.count())), d, t, l);
  auto backward = [&](ReluMask mask) {
    DeviceTensor dx(d.count(), t), dg(d.c, DType::F32), db(d.c, DType::F32);
    for (DeviceTensor* p : {&dx, &dg, &db}) p->poison();
    const BnChannelState st = bn.state();
    BnBackwardArgs a{};
    a.dy = dy_d.get();
    a.relu = mask;
    a.y = mask == ReluMask::FromOutput ? y.get() : nullptr;
    a.x = x_d.get();
    a.bn = &st;
    a.dgamma = dg.f32();
    a.dbeta = db.f32();
    a.dx = dx.get();
    bn_backward(a, shape4(d), t, l, scratch.f32(), stream);
    return std::vector<std::vector<uint8_t>>{dx.bytes(), dg.bytes(), db.bytes()};
  };
  const auto from_y = backward(ReluMask::FromOutput), from_x = backward(ReluMask::FromInput);
  EXPECT_TRUE(from_y[0] == from_x[0]) << "dx differs";
  EXPECT_TRUE(from_y[1] == from_x[1]) << "dgamma differs";
  EXPECT_TRUE(from_y[2] == from_x[2]) << "dbeta differs";
}

// The joins' backward reads the ReLU bits the forward wrote (ApplyArgs::relu_bits) instead of the
// stored output: each bit must be the sign of the stored element (also where the sum rounds to +-0
// or to subnormals: a third of the residuals cancel the BN output within T's rounding), and the
// backward from the bits must equal the backward from y bit for bit, with the identity shortcut's
// dres and with the projection's second BN, with dy in one part and in two (as the network runs it).
TEST_P(GpuBatchNorm, ReluBitsAreTheStoredOutputsSignsAndGiveItsBackward) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 64, 8, 8};
  ASSERT_TRUE(bn_supported(d, t, l));
  const HostBn h = random_bn(rng, d.c), h2 = random_bn(rng, d.c);
  DeviceBn bn(h), bn2(h2);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  const Vec x = quantize(t, channel_data(rng, d, -2.0, 2.0));
  Vec x2 = quantize(t, channel_data(rng, d, -1.0, 1.0));
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
  const Vec scale = bn.scale.download(), shift = bn.shift.download();
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t i = 0; i < x.size(); ++i) {  // x2 = -bn(x), rounded to T: the sum lands within rounding of 0
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    if (pick(rng) == 0) x2[i] = quantize(t, -std::fma(float(x[i]), float(scale[c]), float(shift[c])));
  }
  const DeviceTensor x2_d = upload_activation(x2, d, t, l);
  bn_forward_train_stats(x2_d.get(), shape4(d), t, l, bn2.state(), scratch.f32(), stream);
  const Vec dy = quantize(t, random_normal(rng, d.count())), dy2 = quantize(t, random_normal(rng, d.count()));
  const DeviceTensor dy2_d = upload_activation(dy2, d, t, l);
  const size_t V = 16 / dtype_size(t);
  ASSERT_EQ(relu_bits_bytes(shape4(d), t), d.count() / V);

  for (const Residual r : {Residual::Tensor, Residual::BatchNorm}) {
    SCOPED_TRACE(residual_name(r));
    DeviceTensor y(d.count(), t);
    y.poison();
    DeviceBuffer bits(relu_bits_bytes(shape4(d), t), "test ReLU bits");
    CUDA_CHECK(cudaMemset(bits.get(), 0xA5, bits.bytes()));
    ApplyArgs a = apply_args(x_d.get(), bn, y.get());
    a.residual = r;
    a.res = x2_d.get();
    if (r == Residual::BatchNorm) {
      a.res_scale = bn2.scale.f32();
      a.res_shift = bn2.shift.f32();
    }
    a.relu_bits = bits.as<uint8_t>();
    bn_apply(a, shape4(d), t, l, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    // Each bit against the element it stands for (the buffer's own order: vector e / V, bit e % V).
    const std::vector<uint8_t> y_raw = y.bytes();
    std::vector<uint8_t> b_raw(bits.bytes());
    CUDA_CHECK(cudaMemcpy(b_raw.data(), bits.get(), b_raw.size(), cudaMemcpyDeviceToHost));
    size_t wrong = 0, zeros = 0;
    for (size_t e = 0; e < d.count(); ++e) {
      bool positive;
      if (t == DType::F16) {
        uint16_t v;
        std::memcpy(&v, y_raw.data() + 2 * e, 2);
        positive = (v & 0x8000u) == 0 && (v & 0x7FFFu) != 0;
      } else {
        float v;
        std::memcpy(&v, y_raw.data() + 4 * e, 4);
        positive = v > 0.f;
      }
      zeros += !positive;
      wrong += positive != bool((b_raw[e / V] >> (e % V)) & 1u);
    }
    EXPECT_EQ(wrong, 0u) << "bits that are not the stored element's sign";
    EXPECT_GT(zeros, d.count() / 3) << "the ReLU should zero many elements";

    // two_parts: dy arrives with a second part, as in the network, and the reduction leaves dz in
    // dy's buffer (the identity shortcut's dres); each call starts from a fresh copy of dy.
    auto backward = [&](ReluMask mask, bool two_parts) {
      DeviceTensor dy_d = upload_activation(dy, d, t, l);
      DeviceTensor dx(d.count(), t), dx2(d.count(), t), dres(d.count(), t);
      DeviceTensor dg(d.c, DType::F32), db(d.c, DType::F32), dg2(d.c, DType::F32), db2(d.c, DType::F32);
      for (DeviceTensor* p : {&dx, &dx2, &dres, &dg, &db, &dg2, &db2}) p->poison();
      const BnChannelState s1 = bn.state(), s2 = bn2.state();
      BnBackwardArgs b{};
      b.dy = dy_d.get();
      if (two_parts) b.dy2 = dy2_d.get();
      b.relu = mask;
      b.y = mask == ReluMask::FromOutput ? y.get() : nullptr;
      b.relu_bits = mask == ReluMask::FromBits ? bits.as<uint8_t>() : nullptr;
      b.x = x_d.get();
      b.bn = &s1;
      b.dgamma = dg.f32();
      b.dbeta = db.f32();
      b.dx = dx.get();
      if (r == Residual::BatchNorm) {
        b.x2 = x2_d.get();
        b.bn2 = &s2;
        b.dgamma2 = dg2.f32();
        b.dbeta2 = db2.f32();
        b.dx2 = dx2.get();
      } else {
        b.dres = two_parts ? dy_d.get() : dres.get();
      }
      bn_backward(b, shape4(d), t, l, scratch.f32(), stream);
      std::vector<std::vector<uint8_t>> out;
      for (const DeviceTensor* p : {&dx, &dg, &db}) out.push_back(p->bytes());
      const DeviceTensor* dz = two_parts ? &dy_d : &dres;  // the identity shortcut's gradient
      for (const DeviceTensor* p : r == Residual::BatchNorm ? std::vector<const DeviceTensor*>{&dx2, &dg2, &db2}
                                                           : std::vector<const DeviceTensor*>{dz})
        out.push_back(p->bytes());
      return out;
    };
    for (const bool two_parts : {false, true}) {
      SCOPED_TRACE(two_parts ? "dy in two parts" : "dy in one part");
      const auto from_y = backward(ReluMask::FromOutput, two_parts);
      const auto from_bits = backward(ReluMask::FromBits, two_parts);
      ASSERT_EQ(from_y.size(), from_bits.size());
      for (size_t i = 0; i < from_y.size(); ++i) EXPECT_TRUE(from_y[i] == from_bits[i]) << "output " << i << " differs";
    }
  }
}

// Channel means far from zero against their spread (x = 1000 + N(0,1)): the variance must not be
// lost to cancellation in E[x^2] - E[x]^2. In fp32, y = x * scale + shift itself loses about
// log2(1000) bits (|shift| ~ 1000 for |y| ~ 1): about 4e-5 measured on a CPU emulation of the
// kernel's arithmetic, inside the 1e-4 bound.
TEST_P(GpuBatchNorm, LargeMeanKeepsTheVariance) {
  SKIP_WITHOUT_GPU("the batch-norm kernels");
  const auto [t, l] = GetParam();
  cudaStream_t stream = ctx().stream;
  std::mt19937_64 rng = test_rng();
  const ref::Dims d{8, 32, 16, 16};
  ASSERT_TRUE(bn_supported(d, t, l));
  const Vec x = quantize(t, channel_data(rng, d, 990.0, 1010.0, 0.8, 1.2));
  const HostBn h = random_bn(rng, d.c);
  const DeviceTensor x_d = upload_activation(x, d, t, l);
  DeviceBn bn(h);
  DeviceTensor scratch = bn_scratch(shape4(d), t, l);
  DeviceTensor y(d.count(), t);
  y.poison();
  bn_forward_train_stats(x_d.get(), shape4(d), t, l, bn.state(), scratch.f32(), stream);
  ApplyArgs a = apply_args(x_d.get(), bn, y.get());
  a.relu = false;
  bn_apply(a, shape4(d), t, l, stream);

  const ref::BnStats st = ref::bn_batch_stats(d, x, kEps);
  Vec rm = h.running_mean, rv = h.running_var;
  ref::bn_update_running(st, d.per_channel(), kMomentum, rm, rv);
  EXPECT_CLOSE(bn.save_mean.download(), st.mean, kTolF32) << "save_mean";
  EXPECT_CLOSE(bn.save_invstd.download(), st.invstd, kTolF32) << "save_invstd";
  EXPECT_CLOSE(bn.running_var.download(), rv, kTolF32) << "running_var";
  EXPECT_CLOSE(bn.running_mean.download(), rm, kTolF32) << "running_mean";
  EXPECT_CLOSE(download_activation(y, d, l), ref::bn_affine(d, x, ref::bn_train_coefs(st, h.gamma, h.beta)), tol(t))
      << "y";

  // And the backward at the same large mean (dx = k_dz * dz + k_x * x + k_c also cancels).
  SCOPED_TRACE("backward");
  check_bn_backward(d, t, l, BwdMode::Plain, make_bwd_case(rng, d, t, BwdMode::Plain, 990.0, 1010.0));
}

}  // namespace
