// Per-channel mean and standard deviation of a training set, for input normalization.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/parallel.h"
#include "data/dataset.h"
#include "data/image_decode.h"

namespace {

// Per image and channel: exact integer sums, and the least and greatest value (a channel whose least
// and greatest agree over every image is one value everywhere).
struct ChannelStats {
  uint64_t sum = 0, sumsq = 0;
  uint8_t lo = 255, hi = 0;
};

const char* channel_name(int c, int channels) {
  static const char* const kColour[] = {"red", "green", "blue"};
  return channels == 1 ? "grey" : kColour[c];
}

// One line naming the channels that are one value in every pixel of the images used ("" when none).
std::string flat_channels_warning(const std::vector<ChannelStats>& total, int used, bool sample, int count) {
  std::string flat;
  const int C = static_cast<int>(total.size());
  for (int c = 0; c < C; ++c)
    if (total[c].lo == total[c].hi)
      flat += std::string(flat.empty() ? "" : ", ") + channel_name(c, C) + " (" + std::to_string(total[c].lo) + "/255)";
  if (flat.empty()) return "";
  const std::string images = sample ? "a sample of " + with_commas(used) + " of the " + with_commas(count) + " training images"
                                    : "the " + with_commas(used) + " training image" + (used == 1 ? "" : "s");
  return "normalisation: every pixel of " + images + " has the same value in channel " + flat +
         ": a standard deviation of 0, taken as 1 (are the images blank or of one colour?)";
}

}  // namespace

Normalization compute_normalization(const Dataset& train, int threads) {
  // Which images: all of them when they are in memory, an even spread when each must be decoded.
  const bool sample = train.decoded_on_demand && train.count > kNormalizationSample;
  const int used = sample ? kNormalizationSample : train.count;
  const int C = train.channels;
  const size_t plane = size_t(train.side) * train.side;
  // Integer sums per image (exact), added in image order: the result does not depend on threads.
  std::vector<ChannelStats> stats(size_t(used) * C);
  try {
    parallel_for(used, train.decoded_on_demand ? threads : 1, [&](int j) {
      const int i = sample ? static_cast<int>(int64_t(j) * train.count / used) : j;
      std::vector<uint8_t> scratch(train.decoded_on_demand ? train.image_bytes() : 0);
      const uint8_t* img = image_pixels(train, i, scratch.data());
      for (int c = 0; c < C; ++c) {
        ChannelStats& s = stats[size_t(j) * C + c];
        for (size_t k = 0; k < plane; ++k) {
          const uint8_t v = img[plane * c + k];
          s.sum += v;
          s.sumsq += uint64_t(v) * v;
          s.lo = std::min(s.lo, v);
          s.hi = std::max(s.hi, v);
        }
      }
    });
  } catch (const ImageDecodeError& e) {
    // Decoded on demand, this is the first time these files are decoded: say where it was found.
    throw ImageDecodeError(std::string(e.what()) +
                           " (met by the normalisation sample at start; --skip-bad-images leaves out files that do not decode)");
  }
  Normalization n{};
  n.images = used;
  std::vector<ChannelStats> total(C);
  for (int c = 0; c < C; ++c) {
    double sum = 0, sumsq = 0;
    for (int j = 0; j < used; ++j) {
      const ChannelStats& s = stats[size_t(j) * C + c];
      sum += double(s.sum);
      sumsq += double(s.sumsq);
      total[c].lo = std::min(total[c].lo, s.lo);
      total[c].hi = std::max(total[c].hi, s.hi);
    }
    const double count = double(used) * plane;
    const double mean = sum / count / 255.0;
    const double var = sumsq / count / (255.0 * 255.0) - mean * mean;
    n.mean[c] = static_cast<float>(mean);
    // A channel of one value carries nothing to learn: dividing by its std of 0 (or by the rounding
    // error in its place) would multiply any other value of it at test time into the millions.
    const bool flat = total[c].lo == total[c].hi;
    n.stdev[c] = static_cast<float>(flat ? 1.0 : std::sqrt(std::max(var, 1e-12)));
  }
  for (int c = C; c < kModelChannels; ++c) {  // grey: repeat channel 0
    n.mean[c] = n.mean[0];
    n.stdev[c] = n.stdev[0];
  }
  n.warning = flat_channels_warning(total, used, sample, train.count);
  return n;
}
