// Per-channel mean and standard deviation of a training set, for input normalization.
#include <cmath>

#include "data/dataset.h"

Normalization compute_normalization(const Dataset& train) {
  Normalization n{};
  const size_t plane = size_t(kImageSide) * kImageSide;
  for (int c = 0; c < train.channels; ++c) {
    double sum = 0, sumsq = 0;
    for (int i = 0; i < train.count; ++i) {
      const uint8_t* p = train.image(i) + plane * c;
      uint64_t s = 0, s2 = 0;
      for (size_t k = 0; k < plane; ++k) {
        s += p[k];
        s2 += uint64_t(p[k]) * p[k];
      }
      sum += double(s);
      sumsq += double(s2);
    }
    const double count = double(train.count) * plane;
    const double mean = sum / count / 255.0;
    const double var = sumsq / count / (255.0 * 255.0) - mean * mean;
    n.mean[c] = static_cast<float>(mean);
    n.stdev[c] = static_cast<float>(std::sqrt(var > 1e-12 ? var : 1e-12));
  }
  for (int c = train.channels; c < kModelChannels; ++c) {  // grey: repeat channel 0
    n.mean[c] = n.mean[0];
    n.stdev[c] = n.stdev[0];
  }
  return n;
}
