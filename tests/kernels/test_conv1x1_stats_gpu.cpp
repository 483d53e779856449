// The 1x1 conv with BN statistics of our own (kernels/conv1x1_stats.h) against the CPU reference in
// double: y, and the per-channel sums and sums of squares its rows of partial sums add up to; with
// the previous BN applied as x is read and without; both schedules; shapes where a CTA walks several
// tiles (the statistics added across them) and where a tile's k-tiles outnumber the stages (the
// ping-pong warpgroups' turns); and the BN finalized in the kernel as the finalize kernel does it.
// The kernel runs on sm_90 only: elsewhere these tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/errors.h"
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
  Vec y(size_t(t.m) * t.k), sum(t.k, 0.0), sq(t.k, 0.0);
  for (int i = 0; i < t.m; ++i)
    for (int o = 0; o < t.k; ++o) {
      double acc = 0;
      for (int j = 0; j < t.c; ++j) acc += in[size_t(i) * t.c + j] * w[size_t(o) * t.c + j];
      y[size_t(i) * t.k + o] = acc;
      sum[o] += acc;
      sq[o] += acc * acc;
    }

  const int rows = conv1x1_partial_rows(t.m, t.k);
  DeviceTensor dx(x, DType::F16), dw(w, DType::F16), ds(s, DType::F16), db(b, DType::F16);
  DeviceTensor dy(y.size(), DType::F16, "conv output"), part(2 * size_t(rows) * t.k, DType::F32, "partial sums");
  dy.poison();
  part.poison();
  conv1x1_stats({dx.get(), dw.get(), dy.get(), t.m, t.k, t.c, t.prologue ? ds.get() : nullptr,
                 t.prologue ? db.get() : nullptr, part.f32(), t.schedule},
                ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  EXPECT_CLOSE(dy.download(), y, gpu_test::kTolF16) << "y";
  const Vec p = part.download();
  Vec got_sum(t.k, 0.0), got_sq(t.k, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < t.k; ++o) {
      got_sum[o] += p[size_t(r) * t.k + o];
      got_sq[o] += p[(size_t(rows) + r) * t.k + o];
    }
  // fp32 accumulators of fp16 inputs: held to the fp32 bound, as the fused patterns' statistics are.
  EXPECT_CLOSE(got_sum, sum, gpu_test::kTolF32) << "the sums";
  EXPECT_CLOSE(got_sq, sq, gpu_test::kTolF32) << "the sums of squares";
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
// rounding. 4 columns (on a 132-SM GPU 33 CTAs each, some with two tiles); run three times on the
// same counters, each into a fresh state: a launch must leave them zero for the next.
TEST(Conv1x1Stats, FinalizedInTheKernelAsTheFinalizeKernelDoes) {
  const int m = 128 * 40, k = 256, c = 128;
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

// A prologue needs both its coefficients.
TEST(Conv1x1Stats, APrologueWithOneCoefficientIsRefused) {
  SKIP_UNLESS_RUNS(128, 64, 64);
  DeviceTensor s(64, DType::F16);
  EXPECT_THROW(conv1x1_stats({nullptr, nullptr, nullptr, 128, 64, 64, s.get(), nullptr}, ctx().stream), Fatal);
}

}  // namespace
