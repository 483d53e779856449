// The CPU references themselves (tests/reference.h), before any GPU result is judged by them: every
// backward against central finite differences of its forward, and a few values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "support/reference.h"

namespace {

using ref::Vec;

constexpr double kFdBound = 1e-6;  // relative error of an analytic gradient against differences

Vec random_vec(size_t n, std::mt19937_64& rng, double mean = 0.0, double stddev = 1.0) {
  std::normal_distribution<double> dist(mean, stddev);
  Vec v(n);
  for (double& e : v) e = dist(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of the scalar loss() with respect to every element of p (restored after).
Vec numeric_grad(Vec& p, const std::function<double()>& loss, double h = 1e-5) {
  Vec g(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double up = loss();
    p[i] = keep - h;
    const double down = loss();
    p[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// ---- convolution -------------------------------------------------------------------------------

void check_conv_gradients(const ref::ConvDims& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Vec x = random_vec(g.input().count(), rng);
  Vec w = random_vec(g.filter_count(), rng);
  const Vec r = random_vec(g.output().count(), rng);  // L = sum r * y, so dL/dy = r
  auto loss = [&] { return dot(r, ref::conv2d_forward(g, x, w)); };
  const Vec dx = ref::conv2d_backward_data(g, r, w);
  const Vec dw = ref::conv2d_backward_filter(g, x, r);
  EXPECT_LT(ref::rel_error(dx, numeric_grad(x, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(dw, numeric_grad(w, loss)), kFdBound);
}

TEST(ReferenceConv, Stride2Pad1MatchesFiniteDifferences) {
  check_conv_gradients({2, 3, 5, 5, 4, 3, 3, 2, 1}, 1);  // odd side: the last window hits the padding
  check_conv_gradients({2, 3, 6, 6, 4, 3, 3, 2, 1}, 2);
  check_conv_gradients({2, 3, 7, 7, 4, 3, 3, 2, 1}, 9);  // ResNet-50's last stage at --image-size 28: 7x7 -> 4x4
}

// What the network's spec relies on (model/resnet50_spec.h): at an odd side the 3x3 stride-2 pad-1
// conv and the 1x1 stride-2 pad-0 projection both give ceil(side / 2), windows at the same pixels.
TEST(ReferenceConv, BothStride2ConvsGiveHalfTheSideRoundedUp) {
  for (const int side : {6, 7, 14, 3}) {
    const ref::ConvDims three{1, 1, side, side, 1, 3, 3, 2, 1}, one{1, 1, side, side, 1, 1, 1, 2, 0};
    EXPECT_EQ(three.out_h(), (side + 1) / 2) << side;
    EXPECT_EQ(one.out_h(), (side + 1) / 2) << side;
  }
  // A 1 at pixel (6, 6) of a 7x7 image reaches output (3, 3) of both: the centre tap of the 3x3 and the 1x1.
  ref::Vec x(49, 0.0);
  x[48] = 1;
  const ref::Vec y3 = ref::conv2d_forward({1, 1, 7, 7, 1, 3, 3, 2, 1}, x, ref::Vec{0, 0, 0, 0, 1, 0, 0, 0, 0});
  const ref::Vec y1 = ref::conv2d_forward({1, 1, 7, 7, 1, 1, 1, 2, 0}, x, ref::Vec{1});
  EXPECT_EQ(y3, y1);
  EXPECT_EQ(y1[15], 1);
}

TEST(ReferenceConv, OtherShapesMatchFiniteDifferences) {
  check_conv_gradients({2, 4, 4, 4, 3, 1, 1, 1, 0}, 3);  // 1x1
  check_conv_gradients({2, 4, 6, 6, 3, 1, 1, 2, 0}, 4);  // 1x1 stride 2 (projection shortcut)
  check_conv_gradients({2, 4, 7, 7, 3, 1, 1, 2, 0}, 8);  // the projection at an odd side: 7x7 -> 4x4 (--image-size 28)
  check_conv_gradients({1, 2, 5, 4, 3, 3, 2, 1, 1}, 5);  // rectangular filter and input
  check_conv_gradients({1, 3, 7, 7, 2, 7, 7, 2, 3}, 6);  // a 7x7 stem
}

TEST(ReferenceConv, HandComputedValues) {
  // x = 1..9 in a 3x3 image, w = [[1, 0], [0, -1]]: y[p,q] = x[p,q] - x[p+1,q+1] where in range.
  const Vec x{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Vec w{1, 0, 0, -1};
  EXPECT_EQ(ref::conv2d_forward({1, 1, 3, 3, 1, 2, 2, 1, 0}, x, w), (Vec{-4, -4, -4, -4}));
  // Stride 2, pad 1: windows start at (-1,-1), (-1,1), (1,-1), (1,1).
  EXPECT_EQ(ref::conv2d_forward({1, 1, 3, 3, 1, 2, 2, 2, 1}, x, w), (Vec{-1, -3, -7, -4}));
  // Backward-data of a single 1 at output (1,1) of the stride-2 conv scatters w onto x[1..2][1..2].
  EXPECT_EQ(ref::conv2d_backward_data({1, 1, 3, 3, 1, 2, 2, 2, 1}, Vec{0, 0, 0, 1}, w),
            (Vec{0, 0, 0, 0, 1, 0, 0, 0, -1}));
}

TEST(ReferenceConv, OneByOneIsAMatmul) {
  // A 1x1 stride-1 conv is x (as [N*H*W, C], i.e. NHWC) times W^T (W as [K, C]).
  const ref::ConvDims g{2, 5, 3, 4, 6, 1, 1, 1, 0};
  std::mt19937_64 rng(7);
  const Vec x = random_vec(g.input().count(), rng), w = random_vec(g.filter_count(), rng);
  const Vec y = ref::conv2d_forward(g, x, w);
  const int rows = g.n * g.h * g.w;
  const Vec mm = ref::linear_forward(rows, g.c, g.k, ref::nchw_to_nhwc(g.input(), x), w);
  EXPECT_LT(ref::rel_error(ref::nchw_to_nhwc(g.output(), y), mm), 1e-14);
}

// ---- batch norm --------------------------------------------------------------------------------

TEST(ReferenceBatchNorm, StatsAndRunningUpdateByHand) {
  // One channel holding 1, 2, 3, 4: mean 2.5, biased variance 1.25, unbiased 5/3.
  const ref::Dims d{2, 1, 1, 2};
  const ref::BnStats st = ref::bn_batch_stats(d, {1, 2, 3, 4}, 1e-5);
  EXPECT_DOUBLE_EQ(st.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(st.var[0], 1.25);
  EXPECT_DOUBLE_EQ(st.invstd[0], 1.0 / std::sqrt(1.25 + 1e-5));
  Vec rm{0.0}, rv{1.0};
  ref::bn_update_running(st, d.per_channel(), 0.1, rm, rv);
  EXPECT_DOUBLE_EQ(rm[0], 0.25);
  EXPECT_DOUBLE_EQ(rv[0], 0.9 + 0.1 * 5.0 / 3.0);
}

TEST(ReferenceBatchNorm, ForwardsAgreeWithTheirCoefficients) {
  const ref::Dims d{3, 4, 2, 3};
  std::mt19937_64 rng(11);
  const Vec x = random_vec(d.count(), rng, 2.0, 3.0);
  const Vec gamma = random_vec(d.c, rng), beta = random_vec(d.c, rng);
  const ref::BnForward f = ref::bn_train_forward(d, x, gamma, beta, 1e-5);
  EXPECT_LT(ref::rel_error(ref::bn_affine(d, x, ref::bn_train_coefs(f.stats, gamma, beta)), f.y), 1e-13);
  // The training output has per-channel mean beta and (biased) variance gamma^2 * var / (var + eps).
  const ref::BnStats out = ref::bn_batch_stats(d, f.y, 0.0);
  for (int c = 0; c < d.c; ++c) {
    EXPECT_NEAR(out.mean[c], beta[c], 1e-12);
    EXPECT_NEAR(out.var[c], gamma[c] * gamma[c] * f.stats.var[c] / (f.stats.var[c] + 1e-5), 1e-12);
  }
  Vec rm = random_vec(d.c, rng), rv(d.c);
  for (double& v : rv) v = 0.5 + std::abs(random_vec(1, rng)[0]);
  EXPECT_LT(ref::rel_error(ref::bn_eval_forward(d, x, gamma, beta, rm, rv, 1e-5),
                           ref::bn_affine(d, x, ref::bn_eval_coefs(gamma, beta, rm, rv, 1e-5))),
            1e-13);
}

TEST(ReferenceBatchNorm, PlainBackwardMatchesFiniteDifferences) {
  const ref::Dims d{3, 2, 2, 3};
  std::mt19937_64 rng(12);
  Vec x = random_vec(d.count(), rng, 1.0, 2.0), gamma = random_vec(d.c, rng), beta = random_vec(d.c, rng);
  const Vec r = random_vec(d.count(), rng);
  auto loss = [&] { return dot(r, ref::bn_train_forward(d, x, gamma, beta, 1e-5).y); };
  const ref::BnGrads g = ref::bn_backward(d, r, x, gamma, ref::bn_batch_stats(d, x, 1e-5));
  EXPECT_LT(ref::rel_error(g.dx, numeric_grad(x, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g.dgamma, numeric_grad(gamma, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g.dbeta, numeric_grad(beta, loss)), kFdBound);
}

// Smallest |pre-activation|: finite differences across the ReLU's kink would be meaningless.
double min_abs(const Vec& v) {
  double m = INFINITY;
  for (double e : v) m = std::min(m, std::abs(e));
  return m;
}

TEST(ReferenceBatchNorm, ReluAndTensorResidualBackwardMatchesFiniteDifferences) {
  // y = relu(bn(x) + res): dz = dy * (y > 0) feeds bn's backward, and dres = dz.
  const ref::Dims d{2, 3, 2, 2};
  std::mt19937_64 rng(13);
  Vec x = random_vec(d.count(), rng), gamma = random_vec(d.c, rng), beta = random_vec(d.c, rng);
  Vec res = random_vec(d.count(), rng);
  const Vec r = random_vec(d.count(), rng);
  auto pre = [&] { return ref::add(ref::bn_train_forward(d, x, gamma, beta, 1e-5).y, res); };
  auto loss = [&] { return dot(r, ref::relu(pre())); };
  ASSERT_GT(min_abs(pre()), 1e-3);
  const Vec y = ref::relu(pre());
  const Vec dz = ref::relu_backward(r, y);
  const ref::BnGrads g = ref::bn_backward(d, dz, x, gamma, ref::bn_batch_stats(d, x, 1e-5));
  EXPECT_LT(ref::rel_error(g.dx, numeric_grad(x, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g.dgamma, numeric_grad(gamma, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g.dbeta, numeric_grad(beta, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(dz, numeric_grad(res, loss)), kFdBound);
}

TEST(ReferenceBatchNorm, ReluAndBatchNormResidualBackwardMatchesFiniteDifferences) {
  // The projection shortcut: y = relu(bn1(x) + bn2(x2)); both BNs' backward are fed the same dz.
  const ref::Dims d{2, 3, 2, 2};
  std::mt19937_64 rng(14);
  Vec x = random_vec(d.count(), rng), gamma = random_vec(d.c, rng), beta = random_vec(d.c, rng);
  Vec x2 = random_vec(d.count(), rng, -1.0, 0.5), gamma2 = random_vec(d.c, rng), beta2 = random_vec(d.c, rng);
  const Vec r = random_vec(d.count(), rng);
  auto pre = [&] {
    return ref::add(ref::bn_train_forward(d, x, gamma, beta, 1e-5).y,
                    ref::bn_train_forward(d, x2, gamma2, beta2, 1e-5).y);
  };
  auto loss = [&] { return dot(r, ref::relu(pre())); };
  ASSERT_GT(min_abs(pre()), 1e-3);
  const Vec dz = ref::relu_backward(r, ref::relu(pre()));
  const ref::BnGrads g1 = ref::bn_backward(d, dz, x, gamma, ref::bn_batch_stats(d, x, 1e-5));
  const ref::BnGrads g2 = ref::bn_backward(d, dz, x2, gamma2, ref::bn_batch_stats(d, x2, 1e-5));
  EXPECT_LT(ref::rel_error(g1.dx, numeric_grad(x, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g1.dgamma, numeric_grad(gamma, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g1.dbeta, numeric_grad(beta, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g2.dx, numeric_grad(x2, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g2.dgamma, numeric_grad(gamma2, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g2.dbeta, numeric_grad(beta2, loss)), kFdBound);
}

// ---- pooling, linear -----------------------------------------------------------------------------

TEST(ReferencePool, BackwardMatchesFiniteDifferences) {
  const ref::Dims d{2, 3, 3, 2};
  std::mt19937_64 rng(21);
  Vec x = random_vec(d.count(), rng);
  const Vec r = random_vec(size_t(d.n) * d.c, rng);
  auto loss = [&] { return dot(r, ref::avgpool_forward(d, x)); };
  EXPECT_LT(ref::rel_error(ref::avgpool_backward(d, r), numeric_grad(x, loss)), kFdBound);
  // By hand: the mean of 1..6 in one channel.
  EXPECT_EQ(ref::avgpool_forward({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6}), (Vec{3.5}));
}

TEST(ReferenceLinear, BackwardMatchesFiniteDifferences) {
  const int n = 3, in = 5, out = 4;
  std::mt19937_64 rng(22);
  Vec x = random_vec(size_t(n) * in, rng), w = random_vec(size_t(out) * in, rng);
  const Vec r = random_vec(size_t(n) * out, rng);
  auto loss = [&] { return dot(r, ref::linear_forward(n, in, out, x, w)); };
  const ref::LinearGrads g = ref::linear_backward(n, in, out, x, w, r);
  EXPECT_LT(ref::rel_error(g.dx, numeric_grad(x, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(g.dw, numeric_grad(w, loss)), kFdBound);
}

TEST(ReferenceLinear, HandComputedValues) {
  // x = [[1, 2]], W = [[1, 0], [0, 1], [1, 1]]: y = [[1, 2, 3]].
  EXPECT_EQ(ref::linear_forward(1, 2, 3, {1, 2}, {1, 0, 0, 1, 1, 1}), (Vec{1, 2, 3}));
  // dy = [[1, 0, 1]]: dW = dy^T x = [[1, 2], [0, 0], [1, 2]], dx = dy W = [[2, 1]].
  const ref::LinearGrads g = ref::linear_backward(1, 2, 3, {1, 2}, {1, 0, 0, 1, 1, 1}, {1, 0, 1});
  EXPECT_EQ(g.dw, (Vec{1, 2, 0, 0, 1, 2}));
  EXPECT_EQ(g.dx, (Vec{2, 1}));
}

// ---- softmax cross-entropy ---------------------------------------------------------------------

TEST(ReferenceXent, HandComputedValues) {
  // Row 0: logits ln(1, 2, 3), softmax (1, 2, 3)/6, label 1: loss ln 3, wrong (argmax 2).
  // Row 1: padding. Row 2: logits (0, 5, 0) + bias, label 1: right.
  const double l1 = std::log(1.0), l2 = std::log(2.0), l3 = std::log(3.0);
  const Vec bias{0.5, -0.5, 0.25};
  const Vec logits{l1 - 0.5, l2 + 0.5, l3 - 0.25, 9, 9, 9, -0.5, 5.5, -0.25};
  const ref::XentResult r = ref::softmax_xent(3, 3, logits, bias, {1, -1, 1}, 8.0);
  EXPECT_EQ(r.valid, 2);
  EXPECT_EQ(r.correct, 1);
  const double e5 = std::exp(5.0), row2_loss = std::log(2 + e5) - 5;
  EXPECT_NEAR(r.loss_sum, std::log(3.0) + row2_loss, 1e-14);
  EXPECT_NEAR(r.loss, (std::log(3.0) + row2_loss) / 2, 1e-14);
  EXPECT_NEAR(r.logits[0], l1, 1e-15);
  EXPECT_NEAR(r.logits[7], 5.0, 1e-15);
  // dlogits = (softmax - onehot) * 8 / 2
  const Vec want_row0{1.0 / 6 * 4, (2.0 / 6 - 1) * 4, 3.0 / 6 * 4};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.dlogits[j], want_row0[j], 1e-14);
  for (int j = 3; j < 6; ++j) EXPECT_EQ(r.dlogits[j], 0.0);  // padding row
  const Vec want_row2{1 / (2 + e5) * 4, (e5 / (2 + e5) - 1) * 4, 1 / (2 + e5) * 4};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.dlogits[6 + j], want_row2[j], 1e-14);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.dbias[j], want_row0[j] + want_row2[j], 1e-14);
}

TEST(ReferenceXent, GradientsMatchFiniteDifferencesWithPadding) {
  const int n = 5, classes = 4;
  const double scale = 3.0;
  const std::vector<int32_t> labels{2, -1, 0, 3, -1};
  std::mt19937_64 rng(31);
  Vec logits = random_vec(size_t(n) * classes, rng, 0.0, 2.0), bias = random_vec(classes, rng);
  auto loss = [&] { return scale * ref::softmax_xent(n, classes, logits, bias, labels, 1.0).loss; };
  const ref::XentResult r = ref::softmax_xent(n, classes, logits, bias, labels, scale);
  EXPECT_EQ(r.valid, 3);
  EXPECT_LT(ref::rel_error(r.dlogits, numeric_grad(logits, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(r.dbias, numeric_grad(bias, loss)), kFdBound);
}

// Label smoothing e over K classes: the target is 1 - e + e/K at the label and e/K elsewhere, the loss
// -sum target * log softmax (PyTorch's CrossEntropyLoss(label_smoothing=e)).
TEST(ReferenceXent, LabelSmoothingByHand) {
  // One row, logits ln(1, 2, 3) (softmax 1/6, 2/6, 3/6), label 2, e = 0.3: targets 0.1, 0.1, 0.8.
  const Vec logits{std::log(1.0), std::log(2.0), std::log(3.0)};
  const ref::XentResult r = ref::softmax_xent(1, 3, logits, {0, 0, 0}, {2}, 1.0, 0.3);
  const double want = -(0.1 * std::log(1.0 / 6) + 0.1 * std::log(2.0 / 6) + 0.8 * std::log(3.0 / 6));
  EXPECT_NEAR(r.loss, want, 1e-14);
  const Vec want_grad{1.0 / 6 - 0.1, 2.0 / 6 - 0.1, 3.0 / 6 - 0.8};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.dlogits[j], want_grad[j], 1e-14);
  EXPECT_EQ(r.correct, 1);
}

TEST(ReferenceXent, LabelSmoothingGradientsMatchFiniteDifferences) {
  const int n = 5, classes = 4;
  const double scale = 2.0, smoothing = 0.2;
  const std::vector<int32_t> labels{1, -1, 3, 0, 2};
  std::mt19937_64 rng(37);
  Vec logits = random_vec(size_t(n) * classes, rng, 0.0, 2.0), bias = random_vec(classes, rng);
  auto loss = [&] { return scale * ref::softmax_xent(n, classes, logits, bias, labels, 1.0, smoothing).loss; };
  const ref::XentResult r = ref::softmax_xent(n, classes, logits, bias, labels, scale, smoothing);
  EXPECT_LT(ref::rel_error(r.dlogits, numeric_grad(logits, loss)), kFdBound);
  EXPECT_LT(ref::rel_error(r.dbias, numeric_grad(bias, loss)), kFdBound);
}

TEST(ReferenceXent, NoValidLabelsGivesZeroLossAndGradient) {
  const ref::XentResult r = ref::softmax_xent(2, 2, {1, 2, 3, 4}, {0, 0}, {-1, -1}, 1.0);
  EXPECT_EQ(r.valid, 0);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.dlogits, (Vec{0, 0, 0, 0}));
  EXPECT_EQ(r.dbias, (Vec{0, 0}));
}

// ---- weight average and flip -----------------------------------------------------------------

TEST(ReferenceEma, TwoUpdatesByHand) {
  // decay 0.9: 0 -> 0.1 * 10 = 1 -> 0.9 * 1 + 0.1 * 20 = 2.9
  Vec avg{0.0, 5.0};
  ref::ema_update(avg, {10.0, 5.0}, 0.9);
  EXPECT_NEAR(avg[0], 1.0, 1e-15);
  EXPECT_NEAR(avg[1], 5.0, 1e-15);
  ref::ema_update(avg, {20.0, 5.0}, 0.9);
  EXPECT_NEAR(avg[0], 2.9, 1e-14);
  EXPECT_NEAR(avg[1], 5.0, 1e-14);
}

TEST(ReferenceFlip, ReversesEachRowAndTwiceIsTheIdentity) {
  const ref::Dims d{1, 2, 2, 3};
  const Vec x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(ref::flip_horizontal(d, x), (Vec{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10}));
  EXPECT_EQ(ref::flip_horizontal(d, ref::flip_horizontal(d, x)), x);
}

// ---- SGD ---------------------------------------------------------------------------------------

TEST(ReferenceSgd, TwoStepsUnrolledByHand) {
  // lr 0.1, momentum 0.9, weight decay 0.01; gradients 0.5 then -0.25; w starts at 1.
  // Nesterov:  g1 = 0.51, buf1 = 0.51, w1 = 1 - 0.1 * (0.51 + 0.9 * 0.51) = 0.9031
  //            g2 = -0.25 + 0.009031 = -0.240969, buf2 = 0.459 - 0.240969 = 0.218031,
  //            w2 = 0.9031 - 0.1 * (-0.240969 + 0.9 * 0.218031) = 0.90757411
  // Classical: w1 = 1 - 0.1 * 0.51 = 0.949, g2 = -0.24051, buf2 = 0.21849, w2 = 0.927151
  Vec w{1.0}, buf{0.0};
  ref::sgd_step(w, buf, {0.5}, 0.1, 0.9, 0.01, true);
  EXPECT_NEAR(w[0], 0.9031, 1e-15);
  EXPECT_NEAR(buf[0], 0.51, 1e-15);
  ref::sgd_step(w, buf, {-0.25}, 0.1, 0.9, 0.01, true);
  EXPECT_NEAR(buf[0], 0.218031, 1e-15);
  EXPECT_NEAR(w[0], 0.90757411, 1e-15);

  Vec v{1.0}, vbuf{0.0};
  ref::sgd_step(v, vbuf, {0.5}, 0.1, 0.9, 0.01, false);
  EXPECT_NEAR(v[0], 0.949, 1e-15);
  ref::sgd_step(v, vbuf, {-0.25}, 0.1, 0.9, 0.01, false);
  EXPECT_NEAR(vbuf[0], 0.21849, 1e-15);
  EXPECT_NEAR(v[0], 0.927151, 1e-15);

  // No decay: the weight does not enter the gradient.
  Vec u{5.0}, ubuf{0.0};
  ref::sgd_step(u, ubuf, {1.0}, 0.5, 0.0, 0.0, false);
  EXPECT_DOUBLE_EQ(u[0], 4.5);
}

// ---- layouts and the error measure -------------------------------------------------------------

TEST(ReferenceLayout, TransposesPlaceElementsAndRoundTrip) {
  const ref::Dims d{2, 3, 4, 5};
  Vec x(d.count());
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i);
  const Vec nhwc = ref::nchw_to_nhwc(d, x);
  // Element (n=1, c=2, h=3, w=4): NCHW index d.at(...), NHWC index ((1*4 + 3)*5 + 4)*3 + 2.
  EXPECT_EQ(nhwc[((1 * 4 + 3) * 5 + 4) * 3 + 2], x[d.at(1, 2, 3, 4)]);
  EXPECT_EQ(ref::nhwc_to_nchw(d, nhwc), x);
  // Filters: KCRS element (k=1, c=2, r=0, s=1) of a 2x3x2x2 filter sits at KRSC ((1*2 + 0)*2 + 1)*3 + 2.
  Vec w(2 * 3 * 2 * 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = double(i);
  const Vec krsc = ref::kcrs_to_krsc(2, 3, 2, 2, w);
  EXPECT_EQ(krsc[((1 * 2 + 0) * 2 + 1) * 3 + 2], w[((1 * 3 + 2) * 2 + 0) * 2 + 1]);
  EXPECT_EQ(ref::krsc_to_kcrs(2, 3, 2, 2, krsc), w);
}

TEST(ReferenceRelError, NormsNonFiniteAndZero) {
  EXPECT_DOUBLE_EQ(ref::rel_error({3, 4}, {3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(ref::rel_error({3, 4.5}, {3, 4}), 0.1);  // |(0, 0.5)| / |(3, 4)|
  EXPECT_TRUE(std::isnan(ref::rel_error({NAN, 4}, {3, 4})));
  EXPECT_TRUE(std::isnan(ref::rel_error({INFINITY, 4}, {3, 4})));
  EXPECT_EQ(ref::rel_error({0, 0}, {0, 0}), 0.0);
  EXPECT_TRUE(std::isinf(ref::rel_error({1, 0}, {0, 0})));
  EXPECT_TRUE(std::isinf(ref::rel_error({1}, {1, 2})));
}

}  // namespace
