// Plain CPU references of every layer, in double precision, for the GPU tests.
#include "support/reference.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ref {

namespace {

void expect_size(const Vec& v, size_t n, const char* what) {
  if (v.size() != n)
    throw std::invalid_argument(std::string("reference: ") + what + " has " + std::to_string(v.size()) +
                                " elements, expected " + std::to_string(n));
}

// Calls f(n, c, h, w, index) for every element of an NCHW tensor.
template <class F>
void for_each(const Dims& d, F&& f) {
  size_t i = 0;
  for (int n = 0; n < d.n; ++n)
    for (int c = 0; c < d.c; ++c)
      for (int h = 0; h < d.h; ++h)
        for (int w = 0; w < d.w; ++w) f(n, c, h, w, i++);
}

// All three conv directions walk the same (output position, filter tap) pairs; only what is read
// and what is accumulated differs. Calls f(x index, w index, y index) for each pair that does not
// fall into the zero padding.
template <class F>
void for_each_tap(const ConvDims& g, F&& f) {
  const Dims in = g.input(), out = g.output();
  for (int n = 0; n < g.n; ++n)
    for (int k = 0; k < g.k; ++k)
      for (int p = 0; p < out.h; ++p)
        for (int q = 0; q < out.w; ++q)
          for (int c = 0; c < g.c; ++c)
            for (int r = 0; r < g.r; ++r)
              for (int s = 0; s < g.s; ++s) {
                const int ih = p * g.stride - g.pad + r, iw = q * g.stride - g.pad + s;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;  // zero padding
                const size_t xi = in.at(n, c, ih, iw), yi = out.at(n, k, p, q);
                const size_t wi = ((size_t(k) * g.c + c) * g.r + r) * g.s + s;
                f(xi, wi, yi);
              }
}

}  // namespace

// ---- convolution -------------------------------------------------------------------------------
Vec conv2d_forward(const ConvDims& g, const Vec& x, const Vec& w) {
  expect_size(x, g.input().count(), "conv x");
  expect_size(w, g.filter_count(), "conv w");
  Vec y(g.output().count(), 0.0);
  for_each_tap(g, [&](size_t xi, size_t wi, size_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

Vec conv2d_backward_data(const ConvDims& g, const Vec& dy, const Vec& w) {
  expect_size(dy, g.output().count(), "conv dy");
  expect_size(w, g.filter_count(), "conv w");
  Vec dx(g.input().count(), 0.0);
  for_each_tap(g, [&](size_t xi, size_t wi, size_t yi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}

Vec conv2d_backward_filter(const ConvDims& g, const Vec& x, const Vec& dy) {
  expect_size(x, g.input().count(), "conv x");
  expect_size(dy, g.output().count(), "conv dy");
  Vec dw(g.filter_count(), 0.0);
  for_each_tap(g, [&](size_t xi, size_t wi, size_t yi) { dw[wi] += dy[yi] * x[xi]; });
  return dw;
}

// ---- batch norm --------------------------------------------------------------------------------
BnStats bn_batch_stats(const Dims& d, const Vec& x, double eps) {
  expect_size(x, d.count(), "bn x");
  const double M = double(d.per_channel());
  BnStats st{Vec(d.c, 0.0), Vec(d.c, 0.0), Vec(d.c, 0.0)};
  for_each(d, [&](int, int c, int, int, size_t i) { st.mean[c] += x[i]; });
  for (int c = 0; c < d.c; ++c) st.mean[c] /= M;
  // Two passes: the variance from squared deviations, not E[x^2] - E[x]^2.
  for_each(d, [&](int, int c, int, int, size_t i) {
    const double dev = x[i] - st.mean[c];
    st.var[c] += dev * dev;
  });
  for (int c = 0; c < d.c; ++c) {
    st.var[c] /= M;
    st.invstd[c] = 1.0 / std::sqrt(st.var[c] + eps);
  }
  return st;
}

void bn_update_running(const BnStats& st, size_t per_channel, double momentum, Vec& running_mean,
                       Vec& running_var) {
  const double M = double(per_channel);
  for (size_t c = 0; c < st.mean.size(); ++c) {
    const double unbiased = M > 1 ? st.var[c] * M / (M - 1) : st.var[c];
    running_mean[c] = (1 - momentum) * running_mean[c] + momentum * st.mean[c];
    running_var[c] = (1 - momentum) * running_var[c] + momentum * unbiased;
  }
}

BnCoefs bn_train_coefs(const BnStats& st, const Vec& gamma, const Vec& beta) {
  BnCoefs k{Vec(gamma.size()), Vec(gamma.size())};
  for (size_t c = 0; c < gamma.size(); ++c) {
    k.scale[c] = gamma[c] * st.invstd[c];
    k.shift[c] = beta[c] - st.mean[c] * k.scale[c];
  }
  return k;
}

BnCoefs bn_eval_coefs(const Vec& gamma, const Vec& beta, const Vec& running_mean, const Vec& running_var,
                      double eps) {
  BnCoefs k{Vec(gamma.size()), Vec(gamma.size())};
  for (size_t c = 0; c < gamma.size(); ++c) {
    k.scale[c] = gamma[c] / std::sqrt(running_var[c] + eps);
    k.shift[c] = beta[c] - running_mean[c] * k.scale[c];
  }
  return k;
}

Vec bn_affine(const Dims& d, const Vec& x, const BnCoefs& k) {
  expect_size(x, d.count(), "bn x");
  Vec y(x.size());
  for_each(d, [&](int, int c, int, int, size_t i) { y[i] = x[i] * k.scale[c] + k.shift[c]; });
  return y;
}

BnForward bn_train_forward(const Dims& d, const Vec& x, const Vec& gamma, const Vec& beta, double eps) {
  BnForward f;
  f.stats = bn_batch_stats(d, x, eps);
  f.y.resize(x.size());
  for_each(d, [&](int, int c, int, int, size_t i) {
    f.y[i] = gamma[c] * (x[i] - f.stats.mean[c]) * f.stats.invstd[c] + beta[c];
  });
  return f;
}

Vec bn_eval_forward(const Dims& d, const Vec& x, const Vec& gamma, const Vec& beta, const Vec& running_mean,
                    const Vec& running_var, double eps) {
  expect_size(x, d.count(), "bn x");
  Vec y(x.size());
  for_each(d, [&](int, int c, int, int, size_t i) {
    y[i] = gamma[c] * (x[i] - running_mean[c]) / std::sqrt(running_var[c] + eps) + beta[c];
  });
  return y;
}

BnGrads bn_backward(const Dims& d, const Vec& dz, const Vec& x, const Vec& gamma, const BnStats& st) {
  expect_size(dz, d.count(), "bn dz");
  expect_size(x, d.count(), "bn x");
  const double M = double(d.per_channel());
  BnGrads g{Vec(d.c, 0.0), Vec(d.c, 0.0), Vec(x.size())};
  auto xhat = [&](int c, size_t i) { return (x[i] - st.mean[c]) * st.invstd[c]; };
  for_each(d, [&](int, int c, int, int, size_t i) {
    g.dbeta[c] += dz[i];
    g.dgamma[c] += dz[i] * xhat(c, i);
  });
  for_each(d, [&](int, int c, int, int, size_t i) {
    g.dx[i] = gamma[c] * st.invstd[c] / M * (M * dz[i] - g.dbeta[c] - xhat(c, i) * g.dgamma[c]);
  });
  return g;
}

// ---- elementwise -------------------------------------------------------------------------------
Vec add(const Vec& a, const Vec& b) {
  expect_size(b, a.size(), "add operand");
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

Vec relu(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0 ? x[i] : 0.0;
  return y;
}

Vec relu_backward(const Vec& dy, const Vec& y) {
  expect_size(y, dy.size(), "relu y");
  Vec dx(dy.size());
  for (size_t i = 0; i < dy.size(); ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0;
  return dx;
}

// ---- pooling -----------------------------------------------------------------------------------
Vec avgpool_forward(const Dims& d, const Vec& x) {
  expect_size(x, d.count(), "pool x");
  Vec y(size_t(d.n) * d.c, 0.0);
  for_each(d, [&](int n, int c, int, int, size_t i) { y[size_t(n) * d.c + c] += x[i]; });
  for (double& v : y) v /= double(d.h) * d.w;
  return y;
}

Vec avgpool_backward(const Dims& d, const Vec& dy) {
  expect_size(dy, size_t(d.n) * d.c, "pool dy");
  Vec dx(d.count());
  for_each(d, [&](int n, int c, int, int, size_t i) { dx[i] = dy[size_t(n) * d.c + c] / (double(d.h) * d.w); });
  return dx;
}

// ---- linear ------------------------------------------------------------------------------------
Vec linear_forward(int n, int in, int out, const Vec& x, const Vec& w) {
  expect_size(x, size_t(n) * in, "linear x");
  expect_size(w, size_t(out) * in, "linear w");
  Vec y(size_t(n) * out, 0.0);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o)
      for (int j = 0; j < in; ++j) y[size_t(i) * out + o] += x[size_t(i) * in + j] * w[size_t(o) * in + j];
  return y;
}

LinearGrads linear_backward(int n, int in, int out, const Vec& x, const Vec& w, const Vec& dy) {
  expect_size(x, size_t(n) * in, "linear x");
  expect_size(w, size_t(out) * in, "linear w");
  expect_size(dy, size_t(n) * out, "linear dy");
  LinearGrads g{Vec(w.size(), 0.0), Vec(x.size(), 0.0)};
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o)
      for (int j = 0; j < in; ++j) {
        const double d = dy[size_t(i) * out + o];
        g.dw[size_t(o) * in + j] += d * x[size_t(i) * in + j];
        g.dx[size_t(i) * in + j] += d * w[size_t(o) * in + j];
      }
  return g;
}

// ---- softmax cross-entropy ---------------------------------------------------------------------
XentResult softmax_xent(int n, int classes, const Vec& logits, const Vec& bias, const std::vector<int32_t>& labels,
                        double loss_scale, double label_smoothing) {
  expect_size(logits, size_t(n) * classes, "xent logits");
  expect_size(bias, size_t(classes), "xent bias");
  if (labels.size() != size_t(n)) throw std::invalid_argument("reference: xent labels size");
  XentResult r{Vec(logits.size()), 0.0, 0.0, 0, 0, Vec(logits.size(), 0.0), Vec(classes, 0.0)};
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < classes; ++j) r.logits[size_t(i) * classes + j] = logits[size_t(i) * classes + j] + bias[j];
  for (int i = 0; i < n; ++i) r.valid += labels[i] >= 0;
  for (int i = 0; i < n; ++i) {
    const int y = labels[i];
    if (y < 0) continue;  // padding: no loss, no gradient
    const double* z = &r.logits[size_t(i) * classes];
    int arg = 0;
    for (int j = 1; j < classes; ++j)
      if (z[j] > z[arg]) arg = j;
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - z[arg]);
    const double log_sum = std::log(sum) + z[arg];  // log softmax_j = z_j - log_sum
    auto target = [&](int j) { return (j == y ? 1.0 - label_smoothing : 0.0) + label_smoothing / classes; };
    for (int j = 0; j < classes; ++j) r.loss_sum -= target(j) * (z[j] - log_sum);
    r.correct += arg == y;
    for (int j = 0; j < classes; ++j) {
      const double p = std::exp(z[j] - z[arg]) / sum;
      const double g = (p - target(j)) * loss_scale / r.valid;
      r.dlogits[size_t(i) * classes + j] = g;
      r.dbias[j] += g;
    }
  }
  r.loss = r.valid > 0 ? r.loss_sum / r.valid : 0.0;
  return r;
}

// ---- SGD ---------------------------------------------------------------------------------------
void sgd_step(Vec& w, Vec& buf, const Vec& grad, double lr, double momentum, double weight_decay, bool nesterov) {
  expect_size(buf, w.size(), "sgd momentum");
  expect_size(grad, w.size(), "sgd grad");
  for (size_t i = 0; i < w.size(); ++i) {
    const double g = grad[i] + weight_decay * w[i];
    buf[i] = momentum * buf[i] + g;
    w[i] -= lr * (nesterov ? g + momentum * buf[i] : buf[i]);
  }
}

// ---- exponential moving average ---------------------------------------------------------------
void ema_update(Vec& average, const Vec& weights, double decay) {
  expect_size(weights, average.size(), "ema weights");
  for (size_t i = 0; i < average.size(); ++i) average[i] = decay * average[i] + (1 - decay) * weights[i];
}

// ---- horizontal flip ---------------------------------------------------------------------------
Vec flip_horizontal(const Dims& d, const Vec& x) {
  expect_size(x, d.count(), "flip input");
  Vec y(x.size());
  for_each(d, [&](int n, int c, int h, int w, size_t i) { y[i] = x[d.at(n, c, h, d.w - 1 - w)]; });
  return y;
}

// ---- layouts -----------------------------------------------------------------------------------
Vec nchw_to_nhwc(const Dims& d, const Vec& x) {
  expect_size(x, d.count(), "nchw tensor");
  Vec y(x.size());
  for_each(d, [&](int n, int c, int h, int w, size_t i) { y[((size_t(n) * d.h + h) * d.w + w) * d.c + c] = x[i]; });
  return y;
}

Vec nhwc_to_nchw(const Dims& d, const Vec& x) {
  expect_size(x, d.count(), "nhwc tensor");
  Vec y(x.size());
  for_each(d, [&](int n, int c, int h, int w, size_t i) { y[i] = x[((size_t(n) * d.h + h) * d.w + w) * d.c + c]; });
  return y;
}

// A KCRS filter is an NCHW tensor with N = K, H = R, W = S; KRSC is the same tensor in NHWC.
Vec kcrs_to_krsc(int k, int c, int r, int s, const Vec& w) { return nchw_to_nhwc({k, c, r, s}, w); }
Vec krsc_to_kcrs(int k, int c, int r, int s, const Vec& w) { return nhwc_to_nchw({k, c, r, s}, w); }

// ---- comparison --------------------------------------------------------------------------------
double rel_error(const Vec& got, const Vec& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace ref
