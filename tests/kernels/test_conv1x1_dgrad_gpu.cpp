// The 1x1 data gradients with a BN backward's sums, against the CPU reference in double, dx = dy w:
//   - taking the previous join's backward (kernels/conv1x1_dgrad_join.h): dz = (dx + g) where the
//     ReLU bit is set; its sums of dz, dz * xhat and dz * xhat2;
//   - with bn2's ReLU (kernels/conv1x1_dgrad_bn.h): dz = dx where fp16(x * scale + shift) > 0, as
//     the forward's prologue computed it; its sums of dz and dz * xhat;
// each sum against the sums of the dz the kernel wrote. Then, fed to bn_backward_from_sums, the
// join's the same gradients as the two-pass backward the network runs without it (the plain data
// gradient, then bn_backward with the gradient in two parts and the ReLU bits). Identity and
// projection shortcuts; a CTA walking several tiles; more k-tiles than stages; a stride-2
// shortcut's part read compact at the even pixels. And conv3's kernel doing the BN backward's
// finalize itself, against bn_backward_from_sums. The kernels run on sm_90 only: elsewhere these
// tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_dgrad_join.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace {

using gpu_test::ctx;
using gpu_test::DeviceTensor;
using gpu_test::quantize;
using ref::Vec;

// Skips, with the reason, where the kernel (refusal: its refusal function) does not run the shape here.
#define SKIP_UNLESS_RUNS(refusal, m, k, c)                                                 \
  do {                                                                                     \
    SKIP_WITHOUT_GPU("the 1x1 data gradients with BN backward sums");                      \
    if (const std::string why = (refusal)(m, k, c); !why.empty()) GTEST_SKIP() << why;     \
  } while (0)

enum class Kind { Join, Inner };
struct Case {
  int m, k, c;  // pixels, the conv's output channels (dy's), its input channels (dz's)
  bool dual;    // Join: a projection shortcut, a second BN
  Kind kind = Kind::Join;
  // Join: the shortcut's part given compact at the even pixels of img_h x img_w images (a stride-2
  // shortcut's), zero at the others; 0: in dz.
  int img_h = 0, img_w = 0;
  bool dw = false;  // Inner: the weight gradient taken too (Conv1x1DgradBn::dw_partials)
  bool from_join = false;  // Inner with dw: dy made from the join's dz and a3 as it is read (dy_x)
  bool own_g = false;      // Join: the shortcut's part in a buffer of its own (Conv1x1DgradJoin::g)
  bool other_schedule = false;  // the schedule that is not the kernel's default (Join: cooperative; Inner: ping-pong)
};

// conv3's (or a projection shortcut's) output gradient as the join's BN backward gives it: dy =
// coef[j] dz + coef[k + j] a3 + coef[2k + j], from the join's dz and the BN's input a3, in fp16 as
// the apply stores it; and the three on the device, for the kernel that makes dy as it reads them.
// The coefficients of a3 and of 1 small, as a BN backward's are: dy's channel means add up in dw.
struct JoinedDy {
  Vec dz, a3, coef, dy;
  DeviceTensor dz_d, a3_d, coef_d;
  static Vec coefficients(int k, std::mt19937_64& rng) {
    Vec c = gpu_test::random_normal(rng, size_t(k), 0.0, 0.7);
    for (double sd : {0.05, 0.01})
      for (double v : gpu_test::random_normal(rng, size_t(k), 0.0, sd)) c.push_back(v);
    return quantize(DType::F32, c);
  }
  JoinedDy(const Case& t, std::mt19937_64& rng)
      : dz(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.k))),
        a3(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.k, 0.5, 2.0))),
        coef(coefficients(t.k, rng)),
        dy(size_t(t.m) * t.k),
        dz_d(dz, DType::F16),
        a3_d(a3, DType::F16),
        coef_d(coef, DType::F32) {
    for (size_t e = 0; e < dy.size(); ++e) {
      const size_t j = e % t.k;
      dy[e] = quantize(DType::F16, coef[j] * dz[e] + coef[t.k + j] * a3[e] + coef[2 * t.k + j]);
    }
  }
};

// A stride-2 shortcut's part of the gradient: g with its odd rows' and columns' pixels zeroed (what
// the kernel must add), and the even pixels' rows compact (what it reads).
struct EvenPixels {
  Vec full, compact;
  EvenPixels(const Vec& g, const Case& t) : full(g.size(), 0.0) {
    for (int pix = 0; pix < t.m; ++pix) {
      const int in_img = pix % (t.img_h * t.img_w), y = in_img / t.img_w, x = in_img % t.img_w;
      if (y % 2 || x % 2) continue;
      for (int j = 0; j < t.c; ++j) {
        full[size_t(pix) * t.c + j] = g[size_t(pix) * t.c + j];
        compact.push_back(g[size_t(pix) * t.c + j]);
      }
    }
  }
};

// Everything one case reads, in fp16 where the network keeps it so, and on the device.
struct Inputs {
  Vec dy, w, g, x, x2, scale, shift;
  std::vector<uint8_t> bits;
  gpu_test::HostBn h, h2;
  DeviceTensor dy_d, w_d, x_d, x2_d, scale_d, shift_d;
  gpu_test::DeviceBn bn, bn2;
  DeviceBuffer bits_d;
  Inputs(const Case& t, std::mt19937_64& rng)
      : dy(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.k))),
        w(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.k) * t.c, 0.0, 1.0 / std::sqrt(t.k)))),
        g(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.c))),
        x(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.c, 0.5, 2.0))),
        x2(quantize(DType::F16, gpu_test::random_normal(rng, size_t(t.m) * t.c, -0.5, 1.0))),
        scale(quantize(DType::F16, gpu_test::random_uniform(rng, t.c, 0.5, 1.5))),
        shift(quantize(DType::F16, gpu_test::random_normal(rng, t.c, -0.5, 1.0))),
        bits(size_t(t.m) * t.c / 8),
        h(gpu_test::random_bn(rng, t.c)),
        h2(gpu_test::random_bn(rng, t.c)),
        dy_d(dy, DType::F16),
        w_d(w, DType::F16),
        x_d(x, DType::F16),
        x2_d(x2, DType::F16),
        scale_d(scale, DType::F16),
        shift_d(shift, DType::F16),
        bn(h),
        bn2(h2),
        bits_d(bits.size(), "test ReLU bits") {
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : bits) b = uint8_t(byte(rng));
    CUDA_CHECK(cudaMemcpy(bits_d.get(), bits.data(), bits.size(), cudaMemcpyHostToDevice));
    // The batch statistics of x and x2, as the forward saves them (NHWC: m pixels of c channels).
    const Shape4 s{t.m, t.c, 1, 1};
    DeviceTensor scratch(bn_scratch_floats(s, DType::F16, Layout::NHWC), DType::F32, "bn scratch");
    bn_forward_train_stats(x_d.get(), s, DType::F16, Layout::NHWC, bn.state(), scratch.f32(), ctx().stream);
    bn_forward_train_stats(x2_d.get(), s, DType::F16, Layout::NHWC, bn2.state(), scratch.f32(), ctx().stream);
    CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  }
  bool bit(size_t e) const { return (bits[e / 8] >> (e % 8)) & 1u; }
  // Where relu(x * scale + shift) passed, as the forward's prologue computes it: one fp16 multiply-add.
  bool passes(size_t e, int c) const {
    const size_t j = e % c;
    return quantize(DType::F16, x[e] * scale[j] + shift[j]) > 0.0;
  }
  // dw[o][j] = sum over pixels of dy[., o] y[., j], y = relu(fp16 x * scale + shift) as the forward's
  // prologue fed the conv, in double, rounded to fp16 as a weight gradient is stored.
  Vec dw(const Case& t) const {
    Vec y(size_t(t.m) * t.c), out(size_t(t.k) * t.c, 0.0);
    for (size_t e = 0; e < y.size(); ++e) y[e] = passes(e, t.c) ? quantize(DType::F16, x[e] * scale[e % t.c] + shift[e % t.c]) : 0.0;
    for (int i = 0; i < t.m; ++i)
      for (int o = 0; o < t.k; ++o) {
        const double d = dy[size_t(i) * t.k + o];
        for (int j = 0; j < t.c; ++j) out[size_t(o) * t.c + j] += d * y[size_t(i) * t.c + j];
      }
    return quantize(DType::F16, out);
  }
  // dx = dy w in double, rounded to fp16 as a data gradient is stored.
  Vec dx(const Case& t) const {
    Vec out(size_t(t.m) * t.c, 0.0);
    for (int i = 0; i < t.m; ++i)
      for (int o = 0; o < t.k; ++o) {
        const double d = dy[size_t(i) * t.k + o];
        for (int j = 0; j < t.c; ++j) out[size_t(i) * t.c + j] += d * w[size_t(o) * t.c + j];
      }
    return quantize(DType::F16, out);
  }
  Conv1x1DgradJoin args(const Case& t, DeviceTensor& dz, DeviceTensor& partials) const {
    Conv1x1DgradJoin a{.dy = dy_d.get(), .w = w_d.get(), .dz = dz.get(), .relu_bits = bits_d.as<uint8_t>(),
                       .x = x_d.get(), .mean = bn.save_mean.f32(), .invstd = bn.save_invstd.f32(),
                       .partials = partials.f32(), .m = t.m, .k = t.k, .c = t.c};
    if (t.dual) {
      a.x2 = x2_d.get();
      a.mean2 = bn2.save_mean.f32();
      a.invstd2 = bn2.save_invstd.f32();
    }
    return a;
  }
  Conv1x1DgradBn inner_args(const Case& t, DeviceTensor& dz, DeviceTensor& partials) const {
    return {.dy = dy_d.get(), .w = w_d.get(), .dz = dz.get(), .x = x_d.get(), .mean = bn.save_mean.f32(),
            .invstd = bn.save_invstd.f32(), .scale = scale_d.get(), .shift = shift_d.get(),
            .partials = partials.f32(), .m = t.m, .k = t.k, .c = t.c};
  }
};

void check_against_reference(const Case& t) {
  const bool join = t.kind == Kind::Join;
  SKIP_UNLESS_RUNS(join ? conv1x1_dgrad_join_refusal : t.dw ? conv1x1_dgrad_bn_dw_refusal : conv1x1_dgrad_bn_refusal,
                   t.m, t.k, t.c);
  auto rng = gpu_test::test_rng();
  Inputs in(t, rng);
  const std::unique_ptr<JoinedDy> joined = t.from_join ? std::make_unique<JoinedDy>(t, rng) : nullptr;
  if (joined) in.dy = joined->dy;  // what the references multiply; the kernel reads dz and a3
  const Vec dx = in.dx(t);
  const bool compact = t.img_h > 0;
  const EvenPixels even(in.g, compact ? t : Case{0, 0, 0, false});
  const Vec& g = compact ? even.full : in.g;
  Vec want(dx.size());
  auto passed = [&](size_t e) { return join ? in.bit(e) : in.passes(e, t.c); };
  for (size_t e = 0; e < dx.size(); ++e)
    want[e] = !passed(e) ? 0.0 : join ? quantize(DType::F16, dx[e] + g[e]) : dx[e];

  const int rows = join ? conv1x1_dgrad_join_rows(t.m, t.c) : conv1x1_dgrad_bn_rows(t.m, t.c);
  DeviceTensor dz(in.g, DType::F16), part(3 * size_t(rows) * t.c, DType::F32, "partial sums");
  part.poison();
  DeviceTensor g_even(compact ? even.compact : Vec(8, 0.0), DType::F16);
  if (compact || t.own_g) dz.poison();  // only written: a read of it would show
  DeviceTensor own_g(t.own_g ? g : Vec(8, 0.0), DType::F16);
  if (join) {
    Conv1x1DgradJoin a = in.args(t, dz, part);
    if (compact) a.g_even = g_even.get(), a.img_h = t.img_h, a.img_w = t.img_w;
    if (t.own_g) a.g = own_g.get();
    if (t.other_schedule) a.schedule = Conv1x1Schedule::Cooperative;
    conv1x1_dgrad_join(a, ctx().stream);
  }
  DeviceTensor dw_parts(t.dw ? conv1x1_dw_partials_bytes(t.m, t.k, t.c) / 4 : 1, DType::F32, "dw parts"),
      dw(size_t(t.k) * t.c, DType::F16, "dw");
  if (!join) {
    Conv1x1DgradBn a = in.inner_args(t, dz, part);
    if (t.other_schedule) a.schedule = Conv1x1Schedule::PingPong;
    if (t.dw) {
      dw_parts.poison();
      dw.poison();
      a.dw_partials = dw_parts.f32();
    }
    if (joined) {
      a.dy = joined->dz_d.get();
      a.dy_x = joined->a3_d.get();
      a.dy_coef = joined->coef_d.f32();
    }
    conv1x1_dgrad_bn(a, ctx().stream);
    if (t.dw) conv1x1_dw_from_partials(dw_parts.f32(), rows, t.k, t.c, dw.get(), ctx().stream);
  }
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  if (t.dw) {
    EXPECT_CLOSE(dw.download(), in.dw(t), gpu_test::kTolF16) << "dw";
  }
  const Vec got = dz.download();
  EXPECT_CLOSE(got, want, gpu_test::kTolF16) << "dz";
  size_t leaked = 0, zeros = 0;
  for (size_t e = 0; e < got.size(); ++e) leaked += !passed(e) && got[e] != 0.0, zeros += !passed(e);
  EXPECT_EQ(leaked, 0u) << "dz not zero where the ReLU did not pass";
  EXPECT_GT(zeros, got.size() / 10) << "the ReLU should stop some elements";

  // The sums, of the dz written (what the apply then reads), in double.
  const Vec mean = in.bn.save_mean.download(), invstd = in.bn.save_invstd.download();
  const Vec mean2 = in.bn2.save_mean.download(), invstd2 = in.bn2.save_invstd.download();
  Vec s0(t.c, 0.0), s1(t.c, 0.0), s2(t.c, 0.0);
  for (size_t e = 0; e < got.size(); ++e) {
    const size_t j = e % t.c;
    s0[j] += got[e];
    s1[j] += got[e] * (in.x[e] - mean[j]) * invstd[j];
    s2[j] += got[e] * (in.x2[e] - mean2[j]) * invstd2[j];
  }
  const Vec p = part.download();
  Vec g0(t.c, 0.0), g1(t.c, 0.0), g2(t.c, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < t.c; ++j) {
      g0[j] += p[size_t(r) * t.c + j];
      g1[j] += p[(size_t(rows) + r) * t.c + j];
      if (t.dual) g2[j] += p[(2 * size_t(rows) + r) * t.c + j];
    }
  EXPECT_CLOSE(g0, s0, gpu_test::kTolF32) << "the sums of dz";
  EXPECT_CLOSE(g1, s1, gpu_test::kTolF32) << "the sums of dz * xhat";
  if (t.dual) {
    EXPECT_CLOSE(g2, s2, gpu_test::kTolF32) << "the sums of dz * xhat2";
  }
}

// A refusal: Fatal, its message naming `why`, before anything runs.
template <class Run>
void expect_refused(Run&& run, const std::string& why) {
  try {
    run();
    ADD_FAILURE() << "accepted; expected a refusal naming: " << why;
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// One tile a CTA (layer1's shapes, scaled down), an identity shortcut.
TEST(Conv1x1DgradJoin, IdentityShortcutMatchesTheReference) { check_against_reference({128 * 8, 64, 256, false}); }

// A projection shortcut; 16 columns of tiles, so each CTA walks several rows of tiles.
TEST(Conv1x1DgradJoin, ProjectionShortcutSeveralTilesACtaMatchTheReference) {
  check_against_reference({128 * 24, 128, 1024, true});
}

// Every CTA two tiles, one for each ping-pong warpgroup, on any GPU, in each form the tests above
// take: identity and projection shortcuts at 16 columns of tiles; more k-tiles than stages, with
// and without the projection's BN; a stride-2 shortcut's part compact; the shortcut's part in a
// buffer of its own. The shapes make sanitize-gpu racechecks: where a CTA's two warpgroups take
// unequal numbers of tiles, racecheck can report hazards that a barrier of both orders (its false
// positives: docs/testing.md).
TEST(Conv1x1DgradJoin, TwoTilesEveryCtaMatchTheReference) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_join_refusal, 128, 128, 1024);  // before the counts below ask the GPU its SMs
  // the pixels for two rows of tiles a CTA: a column's CTAs where rows outnumber the SMs, twice
  auto two_tiles = [](int c) { return 128 * 2 * conv1x1_dgrad_join_rows(1 << 20, c); };
  Case own{two_tiles(64), 64, 64, true};
  own.own_g = true;
  for (const Case& t : {Case{two_tiles(1024), 128, 1024, false}, Case{two_tiles(1024), 128, 1024, true},
                        Case{two_tiles(256), 512, 256, true}, Case{two_tiles(256), 1024, 256, false},
                        Case{two_tiles(256), 512, 256, false, Kind::Join, 8, 8}, own}) {
    SCOPED_TRACE(::testing::Message() << "m " << t.m << ", k " << t.k << ", c " << t.c);
    check_against_reference(t);
  }
}

// More k-tiles a tile than the pipeline's stages: 8 (layer4's conv1: 512 channels in dy) with a
// projection BN; 16 with an identity shortcut, whose kernel keeps one side tile fewer and so more
// stages.
TEST(Conv1x1DgradJoin, MoreKTilesThanStagesMatchTheReference) {
  check_against_reference({128 * 8, 512, 256, true});
  check_against_reference({128 * 8, 1024, 256, false});
}

// A stride-2 shortcut's part compact at the even pixels: 8x8 images (layer4.0's conv1 input), with
// the identity shortcut before it as in the network; 6x10 ones, whose rows of tiles start mid-image
// and mid-row; odd sides, 7x7 (--image-size 28 at layer4.0) and 5x9, whose last row and column are
// even.
TEST(Conv1x1DgradJoin, AStride2ShortcutsCompactPartMatchesTheReference) {
  check_against_reference({128 * 8, 512, 256, false, Kind::Join, 8, 8});
  check_against_reference({128 * 15, 128, 128, true, Kind::Join, 6, 10});
  check_against_reference({128 * 49, 128, 128, false, Kind::Join, 7, 7});
  check_against_reference({128 * 45, 64, 64, false, Kind::Join, 5, 9});
}

// The shortcut's part in a buffer of its own (layer1.0's, whose shortcut data gradient read the join's
// dz from dz's buffer): dz only written. Layer1.0's shapes, scaled down: the stem's join (one BN, as
// the network runs it), then with a projection BN beside.
TEST(Conv1x1DgradJoin, TheShortcutsPartInABufferOfItsOwnMatchesTheReference) {
  for (bool dual : {false, true}) {
    Case t{128 * 8, 64, 64, dual};
    t.own_g = true;
    check_against_reference(t);
  }
}

// On the cooperative schedule (Conv1x1DgradJoin::schedule), both warpgroups on each tile: one tile
// a CTA; a projection with 16 columns, each CTA walking several tiles; more k-tiles than stages,
// with and without the projection's BN; a stride-2 shortcut's part compact.
TEST(Conv1x1DgradJoin, TheCooperativeScheduleMatchesTheReference) {
  for (Case t : {Case{128 * 8, 64, 256, false}, Case{128 * 24, 128, 1024, true}, Case{128 * 8, 512, 256, true},
                 Case{128 * 8, 1024, 256, false}, Case{128 * 15, 128, 128, true, Kind::Join, 6, 10}}) {
    t.other_schedule = true;
    check_against_reference(t);
  }
}

// conv3's data gradient at layer1's channels (256 -> 64: 4 k-tiles, one column of tiles).
TEST(Conv1x1DgradBn, OneColumnMatchesTheReference) { check_against_reference({128 * 16, 256, 64, false, Kind::Inner}); }

// With the weight gradient too (kernels/conv1x1_dgrad_wgrad_kernel.cuh): layer1's conv3 (256 -> 64),
// 300 rows of tiles, so that a CTA walks 2-3 tiles (x a tile ahead, dw across tiles); two columns.
TEST(Conv1x1DgradBn, TheWeightGradientBesideMatchesTheReference) {
  check_against_reference({128 * 300, 256, 64, false, Kind::Inner, 0, 0, true});
  check_against_reference({128 * 70, 256, 128, false, Kind::Inner, 0, 0, true});
}

// dy made from the join as the kernel reads it (bn3's apply, Conv1x1DgradBn::dy_x): dz, its sums and
// dw against the references on the apply's dy; a CTA walking 2-3 tiles, then two columns.
TEST(Conv1x1DgradBn, DyMadeFromTheJoinMatchesTheReference) {
  check_against_reference({128 * 300, 256, 64, false, Kind::Inner, 0, 0, true, true});
  check_against_reference({128 * 70, 256, 128, false, Kind::Inner, 0, 0, true, true});
}

// Half of what makes dy from the join, without the weight gradient's kernel, misaligned or with dz
// over a3: refused before anything runs.
TEST(Conv1x1DgradBn, DyFromTheJoinWithoutAllItNeedsIsRefused) {
  const Case t{128 * 8, 256, 64, false, Kind::Inner, 0, 0, true, true};
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_dw_refusal, t.m, t.k, t.c);
  auto rng = gpu_test::test_rng();
  const Inputs in(t, rng);
  const JoinedDy joined(t, rng);
  const int rows = conv1x1_dgrad_bn_rows(t.m, t.c);
  DeviceTensor dz(size_t(t.m) * t.c, DType::F16, "dz"), part(2 * size_t(rows) * t.c, DType::F32, "partial sums"),
      parts(conv1x1_dw_partials_bytes(t.m, t.k, t.c) / 4, DType::F32, "dw parts");
  auto args = [&] {
    Conv1x1DgradBn a = in.inner_args(t, dz, part);
    a.dy = joined.dz_d.get();
    a.dy_x = joined.a3_d.get();
    a.dy_coef = joined.coef_d.f32();
    a.dw_partials = parts.f32();
    return a;
  };
  Conv1x1DgradBn a = args();
  a.dy_coef = nullptr;
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "needs both the BN's input and its coefficients");
  a = args();
  a.dw_partials = nullptr;
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "only by the kernel that takes the weight gradient too");
  a = args();
  a.dy_coef = joined.coef_d.f32() + 1;
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "must start 16-byte aligned");
  a = args();
  a.dz = const_cast<void*>(a.dy_x);
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "the output overlaps the join's dz or the BN's input");
}

// The plain variant (Conv1x1DgradDw: layer1.0's projection shortcut, 256 -> 64 backward): dx as the
// GEMM gives it, no ReLU and no sums, and dw = dy^T x from x as stored. 300 rows of tiles (a CTA walks
// 2-3), then two columns.
void check_plain_against_reference(const Case& t) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_dw_refusal, t.m, t.k, t.c);
  auto rng = gpu_test::test_rng();
  Inputs in(t, rng);
  const std::unique_ptr<JoinedDy> joined = t.from_join ? std::make_unique<JoinedDy>(t, rng) : nullptr;
  if (joined) in.dy = joined->dy;  // what the references multiply; the kernel reads dz and ad
  const int rows = conv1x1_dgrad_bn_rows(t.m, t.c);
  DeviceTensor dx(size_t(t.m) * t.c, DType::F16, "dx"), parts(conv1x1_dw_partials_bytes(t.m, t.k, t.c) / 4, DType::F32, "dw parts"),
      dw(size_t(t.k) * t.c, DType::F16, "dw");
  dx.poison();
  parts.poison();
  dw.poison();
  Conv1x1DgradDw a{.dy = in.dy_d.get(), .w = in.w_d.get(), .dx = dx.get(), .x = in.x_d.get(), .dw_partials = parts.f32(),
                   .m = t.m, .k = t.k, .c = t.c};
  if (joined) a.dy = joined->dz_d.get(), a.dy_x = joined->a3_d.get(), a.dy_coef = joined->coef_d.f32();
  conv1x1_dgrad_dw(a, ctx().stream);
  conv1x1_dw_from_partials(parts.f32(), rows, t.k, t.c, dw.get(), ctx().stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  EXPECT_CLOSE(dx.download(), in.dx(t), gpu_test::kTolF16) << "dx";
  // dw = dy^T x in double, rounded to fp16 as a weight gradient is stored.
  Vec want(size_t(t.k) * t.c, 0.0);
  for (int i = 0; i < t.m; ++i)
    for (int o = 0; o < t.k; ++o) {
      const double d = in.dy[size_t(i) * t.k + o];
      for (int j = 0; j < t.c; ++j) want[size_t(o) * t.c + j] += d * in.x[size_t(i) * t.c + j];
    }
  EXPECT_CLOSE(dw.download(), quantize(DType::F16, want), gpu_test::kTolF16) << "dw";
}

TEST(Conv1x1DgradDw, TheDataAndWeightGradientsMatchTheReference) {
  check_plain_against_reference({128 * 300, 256, 64, false});
  check_plain_against_reference({128 * 70, 256, 128, false});
}

// dy made from the join as it is read (layer1.0's shortcut: its BN's apply, Conv1x1DgradDw::dy_x).
TEST(Conv1x1DgradDw, DyMadeFromTheJoinMatchesTheReference) {
  check_plain_against_reference({128 * 300, 256, 64, false, Kind::Inner, 0, 0, true, true});
}

TEST(Conv1x1DgradDw, OtherChannelsAndMissingMisalignedOrOverlappingTensorsAreRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_refusal, 128, 512, 64);
  DeviceTensor any(128 * 512, DType::F32);  // stands for every tensor: nothing runs
  Conv1x1DgradDw a{.dy = any.get(), .w = any.get(), .dx = any.get(), .x = any.get(), .dw_partials = any.f32(),
                   .m = 128, .k = 512, .c = 64};
  expect_refused([&] { conv1x1_dgrad_dw(a, ctx().stream); }, "only at 256 output channels");
  a.k = 256;
  a.x = nullptr;
  expect_refused([&] { conv1x1_dgrad_dw(a, ctx().stream); }, "missing");
  a.x = static_cast<const char*>(any.get()) + 8;
  expect_refused([&] { conv1x1_dgrad_dw(a, ctx().stream); }, "16-byte aligned");
  a.x = any.get();  // dx over x
  expect_refused([&] { conv1x1_dgrad_dw(a, ctx().stream); }, "overlaps");
}

// The weight gradient is taken only at the k it holds in registers; elsewhere a clear refusal.
TEST(Conv1x1DgradBn, TheWeightGradientAtOtherChannelsIsRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_refusal, 128, 512, 64);
  EXPECT_EQ(conv1x1_dgrad_bn_dw_refusal(128, 256, 64), "");
  EXPECT_NE(conv1x1_dgrad_bn_dw_refusal(128, 512, 64), "");
  DeviceTensor any(128 * 512, DType::F32);  // stands for every tensor: nothing runs
  const Conv1x1DgradBn a{.dy = any.get(), .w = any.get(), .dz = any.get(), .x = any.get(), .mean = any.f32(),
                         .invstd = any.f32(), .scale = any.get(), .shift = any.get(), .partials = any.f32(), .m = 128,
                         .k = 512, .c = 64, .dw_partials = any.f32()};
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "only at 256 output channels");
}

// 16 k-tiles (layer3's 1024 -> 256) and two tiles a CTA (64 rows of tiles over 4 columns).
TEST(Conv1x1DgradBn, SeveralTilesACtaAndMoreKTilesThanStagesMatchTheReference) {
  check_against_reference({128 * 64, 1024, 256, false, Kind::Inner});
}

// On the ping-pong schedule (Conv1x1DgradBn::schedule), each warpgroup its own tiles: one column,
// then several tiles a CTA and more k-tiles than stages.
TEST(Conv1x1DgradBn, ThePingPongScheduleMatchesTheReference) {
  for (Case t : {Case{128 * 16, 256, 64, false, Kind::Inner}, Case{128 * 64, 1024, 256, false, Kind::Inner}}) {
    t.other_schedule = true;
    check_against_reference(t);
  }
}

// The kernel that takes dw too runs cooperative only: ping-pong with dw is refused.
TEST(Conv1x1DgradBn, ThePingPongScheduleWithTheWeightGradientIsRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_dw_refusal, 128, 256, 64);
  DeviceTensor any(128 * 256, DType::F32);  // stands for every tensor: nothing runs
  Conv1x1DgradBn a{.dy = any.get(), .w = any.get(), .dz = any.get(), .x = any.get(), .mean = any.f32(),
                   .invstd = any.f32(), .scale = any.get(), .shift = any.get(), .partials = any.f32(), .m = 128,
                   .k = 256, .c = 64, .dw_partials = any.f32()};
  a.schedule = Conv1x1Schedule::PingPong;
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "cooperative schedule only");
}

TEST(Conv1x1DgradBn, ShapesTheTilesDoNotCoverAndMissingArgumentsAreRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_refusal, 128, 64, 64);
  EXPECT_NE(conv1x1_dgrad_bn_refusal(100, 64, 64), "");
  EXPECT_NE(conv1x1_dgrad_bn_refusal(128, 64, 96), "");
  DeviceTensor any(128 * 64, DType::F32);  // stands for every tensor: nothing runs
  Conv1x1DgradBn a{.dy = any.get(), .w = any.get(), .dz = any.get(), .x = any.get(), .mean = any.f32(),
                   .invstd = any.f32(), .scale = nullptr, .shift = nullptr,  // the mask's coefficients missing
                   .partials = any.f32(), .m = 128, .k = 64, .c = 64};
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "scale and shift");
  a.scale = a.shift = any.get();
  a.partials = nullptr;
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "missing");
}

// Fed to bn_backward_from_sums, the same gradients as the plain path: dx stored in fp16, then
// bn_backward with dy in two parts (g and dx) and the ReLU bits, as the network runs without it.
// dz may differ in the last bit where dx's two roundings (fp32 accumulators here, double there)
// fall on either side of an fp16 value, so the two are held to the fp16 bound, the BN weight
// gradients to 1e-3.
TEST(Conv1x1DgradJoin, JoinedBackwardGivesThePlainPathsGradients) {
  for (const bool dual : {false, true}) {
    SCOPED_TRACE(dual ? "projection shortcut" : "identity shortcut");
    const Case t{128 * 16, 128, 512, dual};
    SKIP_UNLESS_RUNS(conv1x1_dgrad_join_refusal, t.m, t.k, t.c);
    auto rng = gpu_test::test_rng(dual ? "dual" : "identity");
    const Inputs in(t, rng);
    const Shape4 s{t.m, t.c, 1, 1};
    cudaStream_t stream = ctx().stream;
    const BnChannelState st = in.bn.state(), st2 = in.bn2.state();
    struct Out {
      Vec dz, dx, dx2, dgamma, dbeta, dgamma2, dbeta2;
    };
    auto backward = [&](bool joined) {
      DeviceTensor dz(in.g, DType::F16), dx(s.count(), DType::F16), dx2(s.count(), DType::F16);
      DeviceTensor dg(t.c, DType::F32), db(t.c, DType::F32), dg2(t.c, DType::F32), db2(t.c, DType::F32);
      for (DeviceTensor* p : {&dx, &dx2, &dg, &db, &dg2, &db2}) p->poison();
      BnBackwardArgs b{.dy = dz.get(), .x = in.x_d.get(), .bn = &st, .dgamma = dg.f32(), .dbeta = db.f32(), .dx = dx.get()};
      if (dual) {
        b.x2 = in.x2_d.get();
        b.bn2 = &st2;
        b.dgamma2 = dg2.f32();
        b.dbeta2 = db2.f32();
        b.dx2 = dx2.get();
      }
      if (joined) {
        const int rows = conv1x1_dgrad_join_rows(t.m, t.c);
        DeviceTensor part(3 * size_t(rows) * t.c, DType::F32, "partial sums");
        part.poison();
        conv1x1_dgrad_join(in.args(t, dz, part), stream);
        bn_backward_from_sums(b, part.f32(), rows, s, DType::F16, Layout::NHWC, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
      } else {
        const DeviceTensor dy2(in.dx(t), DType::F16);
        DeviceTensor scratch(bn_scratch_floats(s, DType::F16, Layout::NHWC), DType::F32, "bn scratch");
        b.dy2 = dy2.get();
        b.relu = ReluMask::FromBits;
        b.relu_bits = in.bits_d.as<uint8_t>();
        if (!dual) b.dres = dz.get();
        bn_backward(b, s, DType::F16, Layout::NHWC, scratch.f32(), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      Out o{dz.download(), dx.download(), {}, dg.download(), db.download(), {}, {}};
      if (dual) o.dx2 = dx2.download(), o.dgamma2 = dg2.download(), o.dbeta2 = db2.download();
      return o;
    };
    const Out joined = backward(true), plain = backward(false);
    EXPECT_CLOSE(joined.dz, plain.dz, gpu_test::kTolF16) << "dz (the identity shortcut's gradient)";
    EXPECT_CLOSE(joined.dx, plain.dx, gpu_test::kTolF16) << "bn3's input gradient";
    EXPECT_CLOSE(joined.dgamma, plain.dgamma, 1e-3) << "dgamma";
    EXPECT_CLOSE(joined.dbeta, plain.dbeta, 1e-3) << "dbeta";
    if (dual) {
      EXPECT_CLOSE(joined.dx2, plain.dx2, gpu_test::kTolF16) << "the shortcut BN's input gradient";
      EXPECT_CLOSE(joined.dgamma2, plain.dgamma2, 1e-3) << "dgamma2";
      EXPECT_CLOSE(joined.dbeta2, plain.dbeta2, 1e-3) << "dbeta2";
    }
  }
}

// conv3's data gradient finalizing bn2 in the kernel (kernels/conv1x1_finalize.h), then
// bn_backward_apply: the same weight gradients, coefficients and input gradient as
// bn_backward_from_sums on the same partial sums. The rows are added in another order (both in
// double), so the fp32 results are held to 1e-6 and the fp16 gradient to 1e-3. 4 columns (33 CTAs
// each on a 132-SM GPU); twice on the same counters (a launch must leave them zero). The kernel that
// takes the weight gradient too is set against the plain one's sums.
void check_finalize_in_kernel(const Case& t) {
  SKIP_UNLESS_RUNS(t.dw ? conv1x1_dgrad_bn_dw_refusal : conv1x1_dgrad_bn_refusal, t.m, t.k, t.c);
  auto rng = gpu_test::test_rng();
  Inputs in(t, rng);  // not const: the coefficients are poisoned before each run
  const Shape4 s{t.m, t.c, 1, 1};
  cudaStream_t stream = ctx().stream;
  const BnChannelState st = in.bn.state();
  const int rows = conv1x1_dgrad_bn_rows(t.m, t.c);
  DeviceTensor part(2 * size_t(rows) * t.c, DType::F32, "partial sums");
  const size_t counters = conv1x1_finalize_counters(t.c);
  DeviceBuffer arrivals(counters * sizeof(unsigned), "column counters");
  DeviceTensor dw_parts(t.dw ? conv1x1_dw_partials_bytes(t.m, t.k, t.c) / 4 : 1, DType::F32, "dw parts");
  CUDA_CHECK(cudaMemset(arrivals.get(), 0, arrivals.bytes()));
  auto backward = [&](bool in_kernel) {
    DeviceTensor dz(in.g, DType::F16), dx(s.count(), DType::F16), dg(t.c, DType::F32), db(t.c, DType::F32);
    for (DeviceTensor* p : {&dx, &dg, &db, &in.bn.bwd_coef, &part}) p->poison();
    const BnBackwardArgs b{.dy = dz.get(), .x = in.x_d.get(), .bn = &st, .dgamma = dg.f32(), .dbeta = db.f32(), .dx = dx.get()};
    Conv1x1DgradBn a = in.inner_args(t, dz, part);
    if (in_kernel) a.finalize = {.bn = st, .dgamma = dg.f32(), .dbeta = db.f32(), .arrivals = arrivals.as<unsigned>()};
    if (in_kernel && t.dw) a.dw_partials = dw_parts.f32();
    conv1x1_dgrad_bn(a, stream);
    if (in_kernel) bn_backward_apply(b, s, DType::F16, Layout::NHWC, stream);
    else bn_backward_from_sums(b, part.f32(), rows, s, DType::F16, Layout::NHWC, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return std::vector<Vec>{dg.download(), db.download(), in.bn.bwd_coef.download(), dx.download()};
  };
  const std::vector<Vec> want = backward(false);
  const char* names[] = {"dgamma", "dbeta", "bwd_coef", "dx"};
  for (int launch = 0; launch < 2; ++launch) {
    SCOPED_TRACE("launch " + std::to_string(launch));
    const std::vector<Vec> got = backward(true);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_CLOSE(got[i], want[i], i == 3 ? 1e-3 : 1e-6) << names[i];
    std::vector<unsigned> left(counters);
    CUDA_CHECK(cudaMemcpy(left.data(), arrivals.get(), left.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), long(left.size())) << "the counters left zero";
  }
}

TEST(Conv1x1DgradBn, FinalizedInTheKernelAsBnBackwardFromSumsDoes) {
  check_finalize_in_kernel({128 * 40, 512, 256, false, Kind::Inner});
}

// The same with the weight gradient beside (the cooperative kernel's finalize; 2 columns).
TEST(Conv1x1DgradBn, FinalizedInTheKernelWithTheWeightGradientBeside) {
  check_finalize_in_kernel({128 * 40, 256, 128, false, Kind::Inner, 0, 0, true});
}

// A finalize without the weight gradients is refused before anything runs.
TEST(Conv1x1DgradBn, AFinalizeWithoutItsWeightGradientsIsRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_bn_refusal, 128, 64, 64);
  DeviceTensor any(128 * 64, DType::F32);  // stands for every tensor: nothing runs
  const BnChannelState st{any.f32(), any.f32(), any.f32(), any.f32(), any.f32(), any.f32(), any.f32(), any.f32(), any.f32()};
  const Conv1x1DgradBn a{.dy = any.get(), .w = any.get(), .dz = any.get(), .x = any.get(), .mean = any.f32(),
                         .invstd = any.f32(), .scale = any.get(), .shift = any.get(), .partials = any.f32(), .m = 128,
                         .k = 64, .c = 64,
                         .finalize = {.bn = st, .dgamma = any.f32(), .arrivals = static_cast<unsigned*>(any.get())}};
  expect_refused([&] { conv1x1_dgrad_bn(a, ctx().stream); }, "weight gradients");  // dbeta missing
}

// Shapes the tiles do not cover are refused, running one throws, and so does a second BN given in part.
TEST(Conv1x1DgradJoin, ShapesTheTilesDoNotCoverAndPartialArgumentsAreRefused) {
  SKIP_UNLESS_RUNS(conv1x1_dgrad_join_refusal, 128, 64, 64);
  EXPECT_NE(conv1x1_dgrad_join_refusal(100, 64, 64), "");
  EXPECT_NE(conv1x1_dgrad_join_refusal(128, 72, 64), "");
  EXPECT_NE(conv1x1_dgrad_join_refusal(128, 64, 96), "");
  Conv1x1DgradJoin a{};
  a.m = 100, a.k = 64, a.c = 64;
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "pixels");
  DeviceTensor any(128 * 64, DType::F32);  // stands for every tensor: nothing runs
  a = {.dy = any.get(), .w = any.get(), .dz = any.get(), .relu_bits = static_cast<const uint8_t*>(any.get()), .x = any.get(),
       .mean = any.f32(), .invstd = any.f32(), .partials = any.f32(), .m = 128, .k = 64, .c = 64};
  a.x2 = any.get();  // without mean2 and invstd2
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "the shortcut's BN");
  a.x2 = nullptr;
  DeviceTensor compact(32 * 64, DType::F16);  // 128 pixels of 8x8 images, their even ones
  a.g_even = compact.get();                    // without the images' size
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "image height and width");
  a.img_h = 6, a.img_w = 10;  // 60 pixels an image: 128 is no whole number of them
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "a whole number of");
  a.g_even = static_cast<const char*>(compact.get()) + 8;
  a.img_h = a.img_w = 8;
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "16-byte aligned");
  a.g_even = static_cast<const char*>(any.get()) + 64;  // inside dz
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "overlaps dz");
  a.g_even = nullptr;
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "an image size without");
  a.img_h = a.img_w = 0;
  DeviceTensor own_g(128 * 64, DType::F16);
  a.g = own_g.get(), a.g_even = compact.get(), a.img_h = a.img_w = 8;
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "both compact and in a buffer of its own");
  a.g_even = nullptr, a.img_h = a.img_w = 0;
  a.g = static_cast<const char*>(any.get()) + 64;  // inside dz
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "the shortcut's part overlaps dz");
  a.g = nullptr;
  a.relu_bits = nullptr;
  expect_refused([&] { conv1x1_dgrad_join(a, ctx().stream); }, "missing");
}

}  // namespace
