// Synthetic data: uniformly random pixels and labels, for throughput runs only. Random rather than
// constant so that no kernel runs faster on it than on real images.
#include "data/dataset.h"
#include "core/rng.h"

namespace {
Dataset random_set(int count, uint64_t seed, int side) {
  Dataset d;
  d.name = "synthetic";
  d.class_names = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  d.count = count;
  d.channels = 3;
  d.side = side;
  d.images.resize(d.image_bytes() * count);
  d.labels.resize(count);
  Rng rng(seed);
  for (auto& p : d.images) p = static_cast<uint8_t>(rng.next() >> 56);
  for (auto& l : d.labels) l = static_cast<uint8_t>(rng.below(kArrayClasses));
  return d;
}
}  // namespace

DataSplit make_synthetic(int train_count, int test_count, uint64_t seed, int side) {
  DataSplit s;
  s.train = random_set(train_count, mix(seed, 1), side);
  s.test = random_set(test_count, mix(seed, 2), side);
  return s;
}
