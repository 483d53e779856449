// Batch-norm and convolution data shared by the GPU tests and bin/kernel_lab (lab/): per-channel
// parameters, activations whose channels differ in mean and spread, one BN layer's device state,
// the batch statistics as the kernels save them, the conv shapes in the reference's terms, and the
// small references the fused patterns are checked with. No GoogleTest here.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/batchnorm.h"
#include "model/conv.h"
#include "support/device_data.h"

namespace gpu_test {

inline Shape4 shape4(const ref::Dims& d) { return {d.n, d.c, d.h, d.w}; }
inline ref::ConvDims conv_dims(const ConvGeometry& g) { return {g.n, g.c, g.h, g.w, g.k, g.r, g.r, g.stride, g.pad}; }

// A random conv filter (std 1/sqrt(fan-in)) in fp16, as the fused patterns take it: the values in
// KCRS order, the device copy in KRSC (the NHWC filter layout).
inline ref::Vec random_filter(std::mt19937_64& rng, const ConvGeometry& g) {
  return quantize(DType::F16, random_normal(rng, g.filter_count(), 0.0, 1.0 / std::sqrt(double(g.c * g.r * g.r))));
}
inline DeviceTensor device_filter(const ConvGeometry& g, const ref::Vec& kcrs) {
  return DeviceTensor(ref::kcrs_to_krsc(g.k, g.c, g.r, g.r, kcrs), DType::F16, "filter");
}
struct Filter {
  ref::Vec v;
  DeviceTensor d;
  Filter(std::mt19937_64& rng, const ConvGeometry& g) : v(random_filter(rng, g)), d(device_filter(g, v)) {}
};

// Per-channel parameters and running statistics, as the GPU stores them (fp32).
struct HostBn {
  ref::Vec gamma, beta, running_mean, running_var;
};

inline HostBn random_bn(std::mt19937_64& rng, int c) {
  return {quantize(DType::F32, random_normal(rng, c, 1.0, 0.3)), quantize(DType::F32, random_normal(rng, c, 0.0, 0.5)),
          quantize(DType::F32, random_normal(rng, c, 0.0, 0.5)), quantize(DType::F32, random_uniform(rng, c, 0.5, 2.0))};
}

// x[n,c,h,w] = mean_c + std_c * N(0,1): channels differ in mean and spread.
inline ref::Vec channel_data(std::mt19937_64& rng, const ref::Dims& d, double mean_lo, double mean_hi,
                             double std_lo = 0.5, double std_hi = 2.0) {
  const ref::Vec mean = random_uniform(rng, d.c, mean_lo, mean_hi), sd = random_uniform(rng, d.c, std_lo, std_hi);
  ref::Vec x = random_normal(rng, d.count());
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    x[i] = mean[c] + sd[c] * x[i];
  }
  return x;
}

// One BN layer's per-channel device state; what the kernels write starts as NaN.
struct DeviceBn {
  DeviceTensor gamma, beta, running_mean, running_var, save_mean, save_invstd, scale, shift, bwd_coef;
  explicit DeviceBn(const HostBn& h)
      : gamma(h.gamma, DType::F32, "bn gamma"),
        beta(h.beta, DType::F32, "bn beta"),
        running_mean(h.running_mean, DType::F32, "bn running mean"),
        running_var(h.running_var, DType::F32, "bn running var"),
        save_mean(h.gamma.size(), DType::F32, "bn save mean"),
        save_invstd(h.gamma.size(), DType::F32, "bn save invstd"),
        scale(h.gamma.size(), DType::F32, "bn scale"),
        shift(h.gamma.size(), DType::F32, "bn shift"),
        bwd_coef(3 * h.gamma.size(), DType::F32, "bn bwd coef") {
    for (DeviceTensor* t : {&save_mean, &save_invstd, &scale, &shift, &bwd_coef}) t->poison();
  }
  BnChannelState state() const {
    return {gamma.f32(), beta.f32(), running_mean.f32(), running_var.f32(), save_mean.f32(),
            save_invstd.f32(), scale.f32(), shift.f32(), bwd_coef.f32()};
  }
};

// Partial-sum scratch of the BN kernels, NaN so that finalize can only read what the reduction wrote.
inline DeviceTensor bn_scratch(Shape4 s, DType t, Layout l) {
  DeviceTensor scratch(bn_scratch_floats(s, t, l), DType::F32, "bn scratch");
  scratch.poison();
  return scratch;
}

// Batch statistics of x as the forward kernel saves them (fp32); a reference backward fed these
// reads the same rounded values as the GPU.
inline ref::BnStats saved_stats(const ref::Dims& d, const ref::Vec& x) {
  ref::BnStats st = ref::bn_batch_stats(d, x, double(kBnEps));
  st.mean = quantize(DType::F32, st.mean);
  st.invstd = quantize(DType::F32, st.invstd);
  return st;
}

// scale = gamma * invstd and shift = beta - mean * scale as finalize stores them (fp32).
inline ref::BnCoefs saved_coefs(const ref::BnStats& st, const ref::Vec& gamma, const ref::Vec& beta) {
  ref::BnCoefs k{ref::Vec(gamma.size()), ref::Vec(gamma.size())};
  for (size_t c = 0; c < gamma.size(); ++c) {
    k.scale[c] = quantize(DType::F32, gamma[c] * st.invstd[c]);
    k.shift[c] = quantize(DType::F32, beta[c] - st.mean[c] * k.scale[c]);
  }
  return k;
}

// Per-channel sums of x (NCHW) and of its squares: what a fused conv's statistics hold.
inline void channel_sums(const ref::Dims& d, const ref::Vec& x, ref::Vec& sum, ref::Vec& sq) {
  sum.assign(d.c, 0.0);
  sq.assign(d.c, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    sum[c] += x[i];
    sq[c] += x[i] * x[i];
  }
}

// relu(x * s + b) per channel: the scale-bias-ReLU prologue of the fused patterns.
inline ref::Vec sbr(const ref::Dims& d, const ref::Vec& x, const ref::Vec& s, const ref::Vec& b) {
  return ref::relu(ref::bn_affine(d, x, {s, b}));
}

// relu(x * scale + shift) in type t exactly as bn_apply writes it: one fp32 fma, then rounded to t.
inline ref::Vec bn_apply_as_gpu(const ref::Dims& d, const ref::Vec& x, const ref::Vec& scale, const ref::Vec& shift,
                                DType t) {
  ref::Vec y(x.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const int c = static_cast<int>((i / (size_t(d.h) * d.w)) % d.c);
    const float v = std::fma(float(x[i]), float(scale[c]), float(shift[c]));
    y[i] = quantize(t, std::max(0.0, double(v)));
  }
  return y;
}

}  // namespace gpu_test
