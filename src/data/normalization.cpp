// Per-channel mean and standard deviation of a training set, for input normalization.
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "data/dataset.h"

Normalization compute_normalization(const Dataset& train, int threads) {
  // Which images: all of them when they are in memory, an even spread when each must be decoded.
  const bool sample = train.decoded_on_demand && train.count > kNormalizationSample;
  const int used = sample ? kNormalizationSample : train.count;
  const int C = train.channels;
  const size_t plane = size_t(train.side) * train.side;
  // Integer sums per image (exact), added in image order: the result does not depend on threads.
  std::vector<uint64_t> sums(size_t(used) * C * 2);
  parallel_for(used, train.decoded_on_demand ? threads : 1, [&](int j) {
    const int i = sample ? static_cast<int>(int64_t(j) * train.count / used) : j;
    std::vector<uint8_t> scratch(train.decoded_on_demand ? train.image_bytes() : 0);
    const uint8_t* img = image_pixels(train, i, scratch.data());
    for (int c = 0; c < C; ++c) {
      uint64_t s = 0, s2 = 0;
      for (size_t k = 0; k < plane; ++k) {
        const uint8_t v = img[plane * c + k];
        s += v;
        s2 += uint64_t(v) * v;
      }
      sums[(size_t(j) * C + c) * 2] = s;
      sums[(size_t(j) * C + c) * 2 + 1] = s2;
    }
  });
  Normalization n{};
  n.images = used;
  for (int c = 0; c < C; ++c) {
    double sum = 0, sumsq = 0;
    for (int j = 0; j < used; ++j) {
      sum += double(sums[(size_t(j) * C + c) * 2]);
      sumsq += double(sums[(size_t(j) * C + c) * 2 + 1]);
    }
    const double count = double(used) * plane;
    const double mean = sum / count / 255.0;
    const double var = sumsq / count / (255.0 * 255.0) - mean * mean;
    n.mean[c] = static_cast<float>(mean);
    n.stdev[c] = static_cast<float>(std::sqrt(var > 1e-12 ? var : 1e-12));
  }
  for (int c = C; c < kModelChannels; ++c) {  // grey: repeat channel 0
    n.mean[c] = n.mean[0];
    n.stdev[c] = n.stdev[0];
  }
  return n;
}
