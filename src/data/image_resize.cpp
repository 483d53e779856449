// The resize of the shorter side and the centre crop (image_decode.h): PIL's bilinear resampling,
// separable, with the taps of only the rows and columns that the crop keeps.
#include <algorithm>
#include <cmath>
#include <vector>

#include "data/image_decode.h"

namespace {

// The filter taps of one axis: output pixel o of the crop reads `count[o]` input pixels from
// `first[o]` with weights `weights[o * stride ..]`.
struct AxisTaps {
  std::vector<int> first, count;
  std::vector<float> weights;
  int stride = 0;
};

// PIL's precompute_coeffs for its bilinear filter: `in` pixels resized to `resized`, of which the
// `n` from `offset` on are kept.
AxisTaps axis_taps(int in, int resized, int offset, int n) {
  const double scale = double(in) / resized;
  const double filter_scale = std::max(scale, 1.0);  // shrinking widens the triangle: antialiasing
  const double support = filter_scale;               // the triangle's radius is 1 input pixel at scale 1
  AxisTaps t;
  t.stride = static_cast<int>(std::ceil(2 * support)) + 1;
  t.first.resize(n);
  t.count.resize(n);
  t.weights.assign(size_t(n) * t.stride, 0.f);
  std::vector<double> w(t.stride);
  for (int o = 0; o < n; ++o) {
    const double center = (offset + o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));
    const int hi = std::min(in, static_cast<int>(center + support + 0.5));
    const int taps = std::min(hi - lo, t.stride);
    double total = 0;
    for (int j = 0; j < taps; ++j) {
      const double d = std::abs((lo + j - center + 0.5) / filter_scale);
      w[j] = d < 1 ? 1 - d : 0;
      total += w[j];
    }
    t.first[o] = lo;
    t.count[o] = taps;
    for (int j = 0; j < taps; ++j) t.weights[size_t(o) * t.stride + j] = static_cast<float>(total > 0 ? w[j] / total : 0);
  }
  return t;
}

// torchvision's CenterCrop: round((length - side) / 2), half to even (Python's round).
int centre_offset(int length, int side) { return static_cast<int>(std::nearbyint((length - side) / 2.0)); }

}  // namespace

void resize_shorter_and_crop(const uint8_t* hwc, int width, int height, int channels, int side, uint8_t* chw) {
  const bool wide = width > height;
  const int short_in = wide ? height : width, long_in = wide ? width : height;
  const int long_out = static_cast<int>(int64_t(side) * long_in / short_in);
  const int rw = wide ? long_out : side, rh = wide ? side : long_out;
  const AxisTaps tx = axis_taps(width, rw, centre_offset(rw, side), side);
  const AxisTaps ty = axis_taps(height, rh, centre_offset(rh, side), side);
  const int C = channels;
  // Horizontal pass over the input rows the vertical pass reads, then the vertical pass.
  const int y0 = ty.first.front(), y1 = ty.first.back() + ty.count.back();
  std::vector<float> rows(size_t(y1 - y0) * side * C);
  for (int y = y0; y < y1; ++y)
    for (int x = 0; x < side; ++x) {
      const float* w = &tx.weights[size_t(x) * tx.stride];
      const uint8_t* src = hwc + (size_t(y) * width + tx.first[x]) * C;
      for (int c = 0; c < C; ++c) {
        float s = 0;
        for (int j = 0; j < tx.count[x]; ++j) s += w[j] * src[size_t(j) * C + c];
        rows[(size_t(y - y0) * side + x) * C + c] = s;
      }
    }
  for (int y = 0; y < side; ++y) {
    const float* w = &ty.weights[size_t(y) * ty.stride];
    for (int x = 0; x < side; ++x)
      for (int c = 0; c < C; ++c) {
        float s = 0;
        for (int j = 0; j < ty.count[y]; ++j) s += w[j] * rows[(size_t(ty.first[y] - y0 + j) * side + x) * C + c];
        chw[(size_t(c) * side + y) * side + x] = static_cast<uint8_t>(std::clamp(s + 0.5f, 0.f, 255.f));
      }
  }
}

