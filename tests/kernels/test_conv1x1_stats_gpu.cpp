// The 1x1 conv with BN statistics of our own (kernels/conv1x1_stats.h) against the CPU reference in
// double: y, and the per-channel sums and sums of squares its rows of partial sums add up to; with
// the previous BN applied as x is read and without; both schedules; shapes where a CTA walks several
// tiles (the statistics added across them) and where a tile's k-tiles outnumber the stages (the
// ping-pong warpgroups' turns); the BN finalized in the kernel as the finalize kernel does it; and
// the previous block's join applied as x is read.
// The kernel runs on sm_90 only: elsewhere these tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kernels/batchnorm.h"
#include "kernels/conv1x1_stats.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using gpu_test::ctx;
using gpu_test::DeviceTensor;
using ref::Vec;

// Skips, with the reason, where the kernel does not run the shape here.
#define SKIP_UNLESS_RUNS(m, k, c)                                                               \
  do {                                                                                          \
    SKIP_WITHOUT_GPU("the 1x1 conv with statistics");                                           \
    if (const std::string why = conv1x1_stats_refusal(m, k, c); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

struct Case {
  int m, k, c;
  bool prologue;
  Conv1x1Schedule schedule;
};

// y = in w^T (m by k, from in [m, c] and w [k, c]) and its per-column sums and sums of squares, as
// the CPU reference makes them in double, against the kernel's y and its rows of partial sums.
void expect_gemm_and_sums(const Vec& in, const Vec& w, int m, int k, int c, const DeviceTensor& dy,
                          const DeviceTensor& part) {
  Vec y(size_t(m) * k), sum(k, 0.0), sq(k, 0.0);
  for (int i = 0; i < m; ++i)
    for (int o = 0; o < k; ++o) {
      double acc = 0;
      for (int j = 0; j < c; ++j) acc += in[size_t(i) * c + j] * w[size_t(o) * c + j];
      y[size_t(i) * k + o] = acc;
      sum[o] += acc;
      sq[o] += acc * acc;
    }
  EXPECT_CLOSE(dy.download(), y, gpu_test::kTolF16) << "y";
  const int rows = conv1x1_partial_rows(m, k);
  const Vec p = part.download();
  Vec got_sum(k, 0.0), got_sq(k, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < k; ++o) {
      got_sum[o] += p[size_t(r) * k + o];
      got_sq[o] += p[(size_t(rows) + r) * k + o];
    }
  // fp32 accumulators of fp16 inputs: held to the fp32 bound, as the fused patterns' statistics are.
  EXPECT_CLOSE(got_sum, sum, gpu_test::kTolF32) << "the sums";
  EXPECT_CLOSE(got_sq, sq, gpu_test::kTolF32) << "the sums of squares";
}

// Runs the case and compares; skips (with the reason) where the kernel does not run it here.
void check(const Case& t) {
  SKIP_UNLESS_RUNS(t.m, t.k, t.c);
  auto rng = gpu_test::test_rng();
  const Vec x = gpu_test::quantize(DType::F16, gpu_test::random_uniform(rng, size_t(t.m) * t.c, -1.0, 1.0));
  const Vec w = gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.k) * t.c, 0.0, 1.0 / std::sqrt(t.c)));
  const Vec s = gpu_test::quantize(DType::F16, gpu_test::random_uniform(rng, t.c, 0.5, 1.5));
  const Vec b = gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, t.c, 0.0, 0.5));
  // What the GEMM reads: relu(x * s + b) rounded once to fp16 (one fused multiply-add), or x.
  Vec in = x;
  if (t.prologue)
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = gpu_test::quantize(DType::F16, std::max(0.0, x[i] * s[i % t.c] + b[i % t.c]));

  const int rows = conv1x1_partial_rows(t.m, t.k);
  DeviceTensor dx(x, DType::F16), dw(w, DType::F16), ds(s, DType::F16), db(b, DType::F16);
  DeviceTensor dy(size_t(t.m) * t.k, DType::F16, "conv output"), part(2 * size_t(rows) * t.k, DType::F32, "partial sums");
  dy.poison();
  part.poison();
  conv1x1_stats({dx.get(), dw.get(), dy.get(), t.m, t.k, t.c, t.prologue ? ds.get() : nullptr,
                 t.prologue ? db.get() : nullptr, part.f32(), t.schedule},
                ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  expect_gemm_and_sums(in, w, t.m, t.k, t.c, dy, part);
}

// One tile a CTA, no prologue (conv1, the first shortcut).
TEST(Conv1x1Stats, OneTileACtaMatchesTheReference) {
  check({128 * 4, 128, 64, false, Conv1x1Schedule::PingPong});
}

// 16 columns of tiles share the SMs: each CTA walks several rows of tiles and adds their statistics
// in registers; the previous BN applied as x is read (conv3).
TEST(Conv1x1Stats, SeveralTilesACtaWithThePrologueMatchTheReference) {
  check({128 * 32, 1024, 64, true, Conv1x1Schedule::PingPong});
}

// 8 k-tiles a tile, more than the pipeline's stages: the ping-pong warpgroups must take turns.
TEST(Conv1x1Stats, MoreKTilesThanStagesMatchTheReference) {
  check({128 * 16, 1024, 512, true, Conv1x1Schedule::PingPong});
}

TEST(Conv1x1Stats, CooperativeScheduleMatchesTheReference) {
  check({128 * 32, 1024, 128, true, Conv1x1Schedule::Cooperative});
}

// Finalized in the kernel (kernels/conv1x1_finalize.h), the BN's state is what bn_finalize_partials
// makes of the same partial sums: batch and running statistics, scale, shift and their fp16 copies.
// The rows are added in another order (both in double), so held to 1e-6, the fp16 copies to their
// rounding. 4 columns of tiles (k = 256); run three times on the same counters, each into a fresh
// state: a launch must leave them zero for the next.
void check_finalize_in_kernel(int m) {
  const int k = 256, c = 128;
  SKIP_UNLESS_RUNS(m, k, c);
  auto rng = gpu_test::test_rng();
  const DeviceTensor x(gpu_test::quantize(DType::F16, gpu_test::random_uniform(rng, size_t(m) * c, -1.0, 1.0)), DType::F16);
  const DeviceTensor w(gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, size_t(k) * c, 0.3, 1.0 / std::sqrt(c))),
                       DType::F16);
  const DeviceTensor s(gpu_test::quantize(DType::F16, gpu_test::random_uniform(rng, c, 0.5, 1.5)), DType::F16);
  const DeviceTensor b(gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, c, 0.0, 0.5)), DType::F16);
  const gpu_test::HostBn h = gpu_test::random_bn(rng, k);
  DeviceTensor y(size_t(m) * k, DType::F16), part(2 * size_t(conv1x1_partial_rows(m, k)) * k, DType::F32);
  const size_t counters = conv1x1_finalize_counters(k);
  DeviceBuffer arrivals(counters * sizeof(unsigned), "column counters");
  CUDA_CHECK(cudaMemset(arrivals.get(), 0, arrivals.bytes()));
  struct State {
    gpu_test::DeviceBn bn;
    DeviceTensor scale_h, shift_h;
    std::vector<Vec> all() const {
      return {bn.save_mean.download(), bn.save_invstd.download(), bn.scale.download(), bn.shift.download(),
              bn.running_mean.download(), bn.running_var.download()};
    }
  };
  auto run = [&](bool in_kernel) {
    State st{gpu_test::DeviceBn(h), DeviceTensor(k, DType::F16), DeviceTensor(k, DType::F16)};
    st.scale_h.poison();
    st.shift_h.poison();
    part.poison();  // a row read before its CTA wrote it shows as NaN, not as the last run's equal value
    Conv1x1Stats a{x.get(), w.get(), y.get(), m, k, c, s.get(), b.get(), part.f32()};
    if (in_kernel)
      a.finalize = {.bn = st.bn.state(), .scale_h = st.scale_h.get(), .shift_h = st.shift_h.get(),
                    .arrivals = arrivals.as<unsigned>()};
    conv1x1_stats(a, ctx().stream);
    if (!in_kernel)
      bn_finalize_partials(part.f32(), conv1x1_partial_rows(m, k), k, m, st.bn.state(), k, st.scale_h.get(),
                           st.shift_h.get(), ctx().stream);
    CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
    return st;
  };
  const State want = run(false);
  const std::vector<Vec> want_all = want.all();
  const char* names[] = {"save_mean", "save_invstd", "scale", "shift", "running_mean", "running_var"};
  for (int launch = 0; launch < 3; ++launch) {
    SCOPED_TRACE("launch " + std::to_string(launch));
    const State got = run(true);
    const std::vector<Vec> got_all = got.all();
    for (size_t i = 0; i < got_all.size(); ++i) EXPECT_CLOSE(got_all[i], want_all[i], 1e-6) << names[i];
    EXPECT_CLOSE(got.scale_h.download(), want.scale_h.download(), gpu_test::kTolF16) << "scale_h";
    EXPECT_CLOSE(got.shift_h.download(), want.shift_h.download(), gpu_test::kTolF16) << "shift_h";
    std::vector<unsigned> left(counters);
    CUDA_CHECK(cudaMemcpy(left.data(), arrivals.get(), left.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), long(left.size())) << "the counters left zero";
  }
}

// 40 rows of tiles: on a 132-SM GPU 33 CTAs a column, some with two tiles, most with one.
TEST(Conv1x1Stats, FinalizedInTheKernelAsTheFinalizeKernelDoes) { check_finalize_in_kernel(128 * 40); }

// Every CTA two tiles, one for each ping-pong warpgroup, on any GPU: the shape make sanitize-gpu
// racechecks. Where a CTA has an odd number of tiles its two warpgroups pass their own named
// barriers unequally often, and racecheck can then report hazards that a barrier of both orders
// (its false positives: docs/testing.md).
TEST(Conv1x1Stats, FinalizedInTheKernelWithTwoTilesEveryCta) {
  SKIP_UNLESS_RUNS(128, 256, 128);  // before the count below asks the GPU its SMs
  const int ctas = conv1x1_partial_rows(1 << 20, 256);  // a column's CTAs where rows outnumber the SMs
  check_finalize_in_kernel(128 * 2 * ctas);
}

// A finalize needs the partial sums and the BN's whole state.
TEST(Conv1x1Stats, AFinalizeWithoutItsStateIsRefused) {
  SKIP_UNLESS_RUNS(128, 64, 64);
  DeviceTensor any(128 * 64, DType::F32);  // stands for every tensor: nothing runs
  unsigned* counters = static_cast<unsigned*>(any.get());
  Conv1x1Stats a{any.get(), any.get(), any.get(), 128, 64, 64, nullptr, nullptr, nullptr};
  a.finalize.arrivals = counters;
  EXPECT_THROW(conv1x1_stats(a, ctx().stream), Fatal) << "no partial sums";
  a.partials = any.f32();
  EXPECT_THROW(conv1x1_stats(a, ctx().stream), Fatal) << "no BN state";
}

// Shapes the tiles do not cover are refused before anything runs, and running one throws.
TEST(Conv1x1Stats, ShapesTheTilesDoNotCoverAreRefused) {
  SKIP_UNLESS_RUNS(128, 64, 64);
  EXPECT_NE(conv1x1_stats_refusal(100, 64, 64), "");
  EXPECT_NE(conv1x1_stats_refusal(128, 96, 64), "");
  EXPECT_NE(conv1x1_stats_refusal(128, 64, 72), "");
  EXPECT_THROW(conv1x1_stats({nullptr, nullptr, nullptr, 100, 64, 64}, ctx().stream), Fatal);
}

// The previous block's join applied as x is read (Conv1x1Join), in fp16 (kernels/cutlass_join_mainloop.cuh):
// out within one fp16 rounding of the CPU reference that rounds where the kernel does, and within
// fp16 rounding of the join pass's (fp32); its bits exactly where out > 0; y and its sums as the CPU
// reference makes them from that out.
void check_join(int m, int k, int c, bool projection) {
  SKIP_UNLESS_RUNS(m, k, c);
  auto rng = gpu_test::test_rng();
  const size_t n = size_t(m) * c;
  const Vec x = gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, n, 0.0, 1.0));
  const Vec r = gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, n, 0.2, 1.0));
  const Vec w = gpu_test::quantize(DType::F16, gpu_test::random_normal(rng, size_t(k) * c, 0.0, 1.0 / std::sqrt(c)));
  auto coefficients = [&](double lo, double hi) {
    return gpu_test::quantize(DType::F32, gpu_test::random_uniform(rng, c, lo, hi));
  };
  const Vec s = coefficients(0.5, 1.5), h = coefficients(-0.5, 0.5), rs = coefficients(0.5, 1.5),
            rh = coefficients(-0.5, 0.5);
  // The kernel's arithmetic: coefficients rounded to fp16 (the shifts of both BNs added first, in
  // fp32), t = r + shift or r * res_scale + shift rounded, then relu(x * scale + t) rounded: each a
  // multiply-add of fp16 values, exact in double before its rounding (straight to fp16).
  auto h16 = [](double v) { return double(__half2float(__double2half(v))); };  // one rounding, not two via fp32
  Vec out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = i % c;
    const double shift = h16(projection ? double(float(h[j]) + float(rh[j])) : h[j]);
    const double t = h16(projection ? r[i] * h16(rs[j]) + shift : r[i] + shift);
    out[i] = h16(std::max(0.0, x[i] * h16(s[j]) + t));
  }

  const DeviceTensor dx(x, DType::F16), dr(r, DType::F16), dw(w, DType::F16), ds(s, DType::F32), dh(h, DType::F32),
      drs(rs, DType::F32), drh(rh, DType::F32);
  DeviceTensor pass(n, DType::F16), got(n, DType::F16), dy(size_t(m) * k, DType::F16);
  const int rows = conv1x1_partial_rows(m, k);
  DeviceTensor part(2 * size_t(rows) * k, DType::F32);
  DeviceBuffer got_bits(n / 8, "the kernel's bits");
  got.poison();
  dy.poison();
  part.poison();
  CUDA_CHECK(cudaMemset(got_bits.get(), 0xA5, got_bits.bytes()));
  ApplyArgs a{dx.get(), ds.f32(), dh.f32(), projection ? Residual::BatchNorm : Residual::Tensor, dr.get(),
              projection ? drs.f32() : nullptr, projection ? drh.f32() : nullptr, true, pass.get()};
  bn_apply(a, Shape4{m, c, 1, 1}, DType::F16, Layout::NHWC, ctx().stream);
  Conv1x1Stats cs{dx.get(), dw.get(), dy.get(), m, k, c, nullptr, nullptr, part.f32()};
  cs.join = {.res = dr.get(), .scale = ds.f32(), .shift = dh.f32(), .res_scale = projection ? drs.f32() : nullptr,
             .res_shift = projection ? drh.f32() : nullptr, .out = got.get(), .bits = got_bits.as<uint8_t>()};
  conv1x1_stats(cs, ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));

  const Vec got_out = got.download();
  size_t off = 0, worst = 0;  // elements more than one fp16 rounding from the reference
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(got_out[i] - out[i]);
    if (!(d <= std::ldexp(std::fabs(out[i]), -10) + 6e-8)) worst = off++ ? worst : i;
  }
  EXPECT_EQ(off, 0u) << "out more than one rounding off; first at " << worst << ": " << got_out[worst] << " for "
                     << out[worst];
  EXPECT_CLOSE(got_out, pass.download(), gpu_test::kTolF16) << "out against the join pass's";
  std::vector<uint8_t> bits(n / 8);
  CUDA_CHECK(cudaMemcpy(bits.data(), got_bits.get(), bits.size(), cudaMemcpyDeviceToHost));
  size_t wrong_bits = 0;
  for (size_t i = 0; i < n; ++i) wrong_bits += ((bits[i / 8] >> (i % 8)) & 1) != (got_out[i] > 0);
  EXPECT_EQ(wrong_bits, 0u) << "bits unlike out > 0";

  expect_gemm_and_sums(got_out, w, m, k, c, dy, part);
}

// An identity shortcut, one column of tiles (layer1's conv1s): every CTA stores the join, several
// tiles each on a 132-SM GPU.
TEST(Conv1x1Stats, TheIdentityJoinAsConv1ReadsItMatchesTheReference) {
  check_join(128 * 300, 64, 256, false);
}

// A projection's BN, two columns (only the first's CTAs store), 8 k-tiles a tile: more than the
// stages, which hold the shortcut's tile too, so the ping-pong warpgroups take turns.
TEST(Conv1x1Stats, TheProjectionJoinAsConv1ReadsItMatchesTheReference) {
  check_join(128 * 80, 128, 512, true);
}

// A join needs its shortcut, coefficients, output and bits, aligned, its output apart from its
// inputs, and comes without a BN prologue, on the ping-pong schedule.
TEST(Conv1x1Stats, AJoinWithoutWhatItNeedsIsRefused) {
  SKIP_UNLESS_RUNS(128, 64, 64);
  const int m = 128, c = 64;
  DeviceTensor x(size_t(m) * c, DType::F16), res(size_t(m) * c, DType::F16), out(size_t(m) * c, DType::F16),
      w(size_t(c) * c, DType::F16), y(size_t(m) * c, DType::F16), coef(c, DType::F32),
      part(conv1x1_partials_bytes(m, c) / 4, DType::F32), bits(size_t(m) * c / 8 / 4, DType::F32);
  uint8_t* bits_at = static_cast<uint8_t*>(bits.get());
  const Conv1x1Join whole{.res = res.get(), .scale = coef.f32(), .shift = coef.f32(), .out = out.get(), .bits = bits_at};
  auto refused = [&](Conv1x1Join j, bool prologue, Conv1x1Schedule schedule) {
    Conv1x1Stats a{x.get(), w.get(), y.get(), m, c, c, prologue ? coef.get() : nullptr, prologue ? coef.get() : nullptr,
                   part.f32(), schedule};
    a.join = j;
    try {
      conv1x1_stats(a, ctx().stream);
    } catch (const Fatal&) {
      return true;
    }
    return false;
  };
  EXPECT_FALSE(refused(whole, false, Conv1x1Schedule::PingPong)) << "all it needs";
  Conv1x1Join j = whole;
  j.bits = nullptr;
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "no bits";
  j = whole;
  j.res = nullptr;
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "no shortcut";
  j = whole;
  j.out = nullptr;
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "no output";
  j = whole;
  j.res_scale = coef.f32();
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "the shortcut's scale without its shift";
  j = whole;
  j.out = x.get();
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "the output over its input";
  j = whole;
  j.bits = bits_at + 1;
  EXPECT_TRUE(refused(j, false, Conv1x1Schedule::PingPong)) << "bits not 8-byte aligned";
  EXPECT_TRUE(refused(whole, true, Conv1x1Schedule::PingPong)) << "with a BN prologue";
  EXPECT_TRUE(refused(whole, false, Conv1x1Schedule::Cooperative)) << "cooperative";
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}

// A prologue needs both its coefficients.
TEST(Conv1x1Stats, APrologueWithOneCoefficientIsRefused) {
  SKIP_UNLESS_RUNS(128, 64, 64);
  DeviceTensor s(64, DType::F16);
  EXPECT_THROW(conv1x1_stats({nullptr, nullptr, nullptr, 128, 64, 64, s.get(), nullptr}, ctx().stream), Fatal);
}

}  // namespace
