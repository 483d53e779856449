// Batch assembly and CPU augmentation. The images here encode their own coordinates (channel 0 holds
// x + 1, channel 1 holds y + 1, 0 is padding), so the crop offset and flip that were applied can be
// read back from the output alone and checked against the rule, independently of how the code drew
// them. The rules are checked at 32x32 and at other sides (--image-size), where the crop pads by
// side / 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"

namespace {

constexpr int S = kDefaultImageSide;

uint8_t identity_of(int idx) { return static_cast<uint8_t>(1 + idx % 251); }

// Colour images: channel 0 = x + 1, channel 1 = y + 1, channel 2 = a value naming the sample.
Dataset coordinate_images(int count, int side = S) {
  Dataset d;
  d.name = "coords";
  d.count = count;
  d.channels = 3;
  d.side = side;
  d.images.resize(d.image_bytes() * count);
  d.labels.resize(count);
  const int N = side;
  for (int i = 0; i < count; ++i) {
    uint8_t* img = d.images.data() + d.image_bytes() * i;
    for (int y = 0; y < N; ++y)
      for (int x = 0; x < N; ++x) {
        img[0 * N * N + y * N + x] = static_cast<uint8_t>(x + 1);
        img[1 * N * N + y * N + x] = static_cast<uint8_t>(y + 1);
        img[2 * N * N + y * N + x] = identity_of(i);
      }
    d.labels[i] = static_cast<uint8_t>((i * 7 + 3) % kArrayClasses);
  }
  return d;
}

// Pseudo-random pixels, `channels` 1 or 3.
Dataset noise_images(int count, int channels, int side = S) {
  Dataset d;
  d.count = count;
  d.channels = channels;
  d.side = side;
  d.images.resize(d.image_bytes() * count);
  d.labels.resize(count);
  uint32_t x = 12345;
  for (auto& p : d.images) {
    x = x * 1664525u + 1013904223u;
    p = static_cast<uint8_t>(x >> 24);
  }
  for (int i = 0; i < count; ++i) d.labels[i] = static_cast<uint8_t>(i % kArrayClasses);
  return d;
}

struct Batch {
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};

Batch assemble(const Dataset& d, const EpochPlan& plan, int k, Layout layout) {
  Batch b{std::vector<uint8_t>(d.image_bytes() * plan.batch, 0xAB), std::vector<int32_t>(plan.batch, 12345)};
  assemble_batch_u8(d, plan, k, layout, b.images.data(), b.labels.data());
  return b;
}

// What sample i of an NCHW coordinate batch (side N) shows: the crop offset and flip that map it back
// onto its source. Pixel (x, y) of the output must come from (sx, sy) = ((flip ? N-1 - x : x) + dx, y + dy).
struct Decoded {
  int dx, dy;
  bool flip;
};
Decoded decode(const uint8_t* img, int N = S) {
  // The centre pixels are never padding for offsets within N / 8.
  const int h = N / 2;
  const int a = img[h * N + h - 1] - 1, b = img[h * N + h] - 1;  // source x of output x = h - 1, h
  const int sy = img[N * N + h * N + h] - 1;
  const bool flip = b < a;
  return {flip ? b - (N - 1 - h) : b - h, sy - h, flip};
}

// The whole image must be the source shifted by (dx, dy) after the flip, zeros outside.
void expect_matches_rule(const uint8_t* img, const Decoded& t, uint8_t identity, const char* where, int N = S) {
  for (int y = 0; y < N; ++y)
    for (int x = 0; x < N; ++x) {
      const int sx = (t.flip ? N - 1 - x : x) + t.dx, sy = y + t.dy;
      const bool inside = sx >= 0 && sx < N && sy >= 0 && sy < N;
      ASSERT_EQ(img[y * N + x], inside ? sx + 1 : 0) << where << " x " << x << " y " << y;
      ASSERT_EQ(img[N * N + y * N + x], inside ? sy + 1 : 0) << where << " x " << x << " y " << y;
      ASSERT_EQ(img[2 * N * N + y * N + x], inside ? identity : 0) << where << " x " << x << " y " << y;
    }
}

// Checks every sample of every batch of `plan` against the rule, the pad and the transform the plan
// names for its slot; adds the offsets and flips seen.
void check_every_sample(const Dataset& d, const EpochPlan& plan, std::set<std::pair<int, int>>& offsets,
                        std::set<bool>& flips) {
  for (int k = 0; k < plan.steps; ++k) {
    const Batch b = assemble(d, plan, k, Layout::NCHW);
    for (int i = 0; i < plan.batch; ++i) {
      const uint8_t* img = b.images.data() + d.image_bytes() * i;
      const Decoded t = decode(img, d.side);
      ASSERT_LE(std::abs(t.dx), plan.crop_pad);
      ASSERT_LE(std::abs(t.dy), plan.crop_pad);
      expect_matches_rule(img, t, identity_of(plan.order[size_t(k) * plan.batch + i]), "sample", d.side);
      if (testing::Test::HasFatalFailure()) return;
      const CropFlip cf = crop_flip_for(plan.aug_seed, size_t(k) * plan.batch + i, plan.crop_pad);
      ASSERT_EQ(cf.dx, t.dx);
      ASSERT_EQ(cf.dy, t.dy);
      ASSERT_EQ(cf.flip, t.flip);
      offsets.insert({t.dx, t.dy});
      flips.insert(t.flip);
    }
  }
}

TEST(Augment, EveryCropOffsetAndBothFlipsOccurAndFollowTheRule) {
  const Dataset d = coordinate_images(2000);
  const EpochPlan plan = train_plan(d, 100, 42, 0);
  ASSERT_EQ(plan.crop_pad, 4) << "pad-4 at 32x32";
  std::set<std::pair<int, int>> offsets;
  std::set<bool> flips;
  check_every_sample(d, plan, offsets, flips);
  EXPECT_EQ(offsets.size(), 81u) << "every (dx, dy) in [-4, 4]^2 should occur over 2000 samples";
  EXPECT_EQ(flips.size(), 2u);
}

// --crop-pad: the offsets span exactly [-pad, pad]; 0 leaves flips alone.
TEST(Augment, AGivenCropPadBoundsTheOffsets) {
  const Dataset d = coordinate_images(2000);
  for (int pad : {0, 2}) {
    const EpochPlan plan = train_plan(d, 100, 42, 0, pad);
    ASSERT_EQ(plan.crop_pad, pad);
    std::set<std::pair<int, int>> offsets;
    std::set<bool> flips;
    check_every_sample(d, plan, offsets, flips);
    EXPECT_EQ(offsets.size(), size_t((2 * pad + 1) * (2 * pad + 1))) << pad;
    for (const auto& [dx, dy] : offsets) EXPECT_TRUE(std::abs(dx) <= pad && std::abs(dy) <= pad) << pad;
    EXPECT_EQ(flips.size(), 2u);
  }
}

// --image-size: the crop pads by side / 8 (5 at 40, 8 at 64), every sample follows the rule, and the
// offsets cover the whole range.
TEST(Augment, OtherSidesCropByAnEighthAndFollowTheRule) {
  for (const int side : {40, 64}) {
    SCOPED_TRACE("side " + std::to_string(side));
    const int pad = side / 8;
    const Dataset d = coordinate_images(side == 40 ? 3000 : 1000, side);
    const EpochPlan plan = train_plan(d, 100, 17, 1);
    ASSERT_EQ(plan.crop_pad, pad);
    std::set<std::pair<int, int>> offsets;
    std::set<bool> flips;
    check_every_sample(d, plan, offsets, flips);
    if (HasFatalFailure()) return;
    std::set<int> dxs, dys;
    for (const auto& [dx, dy] : offsets) {
      dxs.insert(dx);
      dys.insert(dy);
    }
    EXPECT_EQ(dxs.size(), size_t(2 * pad + 1));
    EXPECT_EQ(dys.size(), size_t(2 * pad + 1));
    if (side == 40) {
      EXPECT_EQ(offsets.size(), size_t((2 * pad + 1) * (2 * pad + 1)));
    }
    EXPECT_EQ(flips.size(), 2u);
  }
}

TEST(Augment, OneSampleMatchesADirectComputation) {
  // Pixel-exact against the definition, for a sample with a real shift: find one with dx, dy != 0.
  const Dataset d = noise_images(64, 3);
  const EpochPlan plan = train_plan(d, 64, 9, 3);
  int i = 0;
  CropFlip cf{};
  for (; i < 64; ++i) {
    cf = crop_flip_for(plan.aug_seed, i, plan.crop_pad);
    if (cf.dx != 0 && cf.dy != 0) break;
  }
  ASSERT_LT(i, 64);
  const Batch b = assemble(d, plan, 0, Layout::NCHW);
  const uint8_t* src = d.image(static_cast<int>(plan.order[i]));
  const uint8_t* out = b.images.data() + d.image_bytes() * i;
  int zeros_outside = 0;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        const int sx = (cf.flip ? S - 1 - x : x) + cf.dx, sy = y + cf.dy;
        const bool inside = sx >= 0 && sx < S && sy >= 0 && sy < S;
        const uint8_t want = inside ? src[(c * S + sy) * S + sx] : 0;
        ASSERT_EQ(out[(c * S + y) * S + x], want) << "c " << c << " x " << x << " y " << y;
        zeros_outside += !inside;
      }
  // |dx| columns and |dy| rows fall outside the source.
  const int outside = S * S - (S - std::abs(cf.dx)) * (S - std::abs(cf.dy));
  EXPECT_EQ(zeros_outside, 3 * outside);
}

TEST(Augment, LabelsFollowThePlanOrderUntouched) {
  const Dataset d = coordinate_images(500);
  const EpochPlan plan = train_plan(d, 64, 5, 2);
  for (int k = 0; k < plan.steps; ++k) {
    const Batch b = assemble(d, plan, k, Layout::NHWC);
    for (int i = 0; i < plan.batch; ++i)
      ASSERT_EQ(b.labels[i], d.labels[plan.order[size_t(k) * plan.batch + i]]) << "batch " << k << " sample " << i;
  }
}

TEST(Augment, WithoutAugmentationImagesAreCopiedExactly) {
  for (int channels : {1, 3}) {
    const Dataset d = noise_images(40, channels);
    const EpochPlan plan = eval_plan(d, 8);
    for (int k = 0; k < plan.steps; ++k) {
      const Batch b = assemble(d, plan, k, Layout::NCHW);
      for (int i = 0; i < plan.batch; ++i)
        ASSERT_EQ(std::memcmp(b.images.data() + d.image_bytes() * i, d.image(k * 8 + i), d.image_bytes()), 0)
            << channels << " channels, batch " << k << " sample " << i;
    }
  }
}

TEST(Augment, NhwcIsTheTransposeOfNchw) {
  for (int S : {32, 48})
  for (int channels : {1, 3}) {
    const Dataset d = noise_images(100, channels, S);
    const EpochPlan plan = train_plan(d, 32, 1, 0);
    const Batch nchw = assemble(d, plan, 1, Layout::NCHW), nhwc = assemble(d, plan, 1, Layout::NHWC);
    EXPECT_EQ(nchw.labels, nhwc.labels);
    const int C = channels;
    for (int i = 0; i < plan.batch; ++i)
      for (int c = 0; c < C; ++c)
        for (int p = 0; p < S * S; ++p)
          ASSERT_EQ(nhwc.images[d.image_bytes() * i + size_t(p) * C + c], nchw.images[d.image_bytes() * i + size_t(c) * S * S + p])
              << C << " channels, sample " << i << " c " << c << " pixel " << p;
  }
}

TEST(Augment, BatchAssembledInPartsEqualsOneCall) {
  const Dataset d = noise_images(300, 3);
  for (const EpochPlan& plan : {train_plan(d, 50, 3, 1), eval_plan(d, 64)}) {
    const int k = plan.steps - 1;  // the evaluation plan's last batch holds padding too
    for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
      const Batch whole = assemble(d, plan, k, layout);
      Batch parts{std::vector<uint8_t>(whole.images.size(), 0xCD), std::vector<int32_t>(plan.batch, -777)};
      const int a = 7, b = plan.batch - 13;
      assemble_batch_u8(d, plan, k, layout, parts.images.data(), parts.labels.data(), b, plan.batch);
      assemble_batch_u8(d, plan, k, layout, parts.images.data(), parts.labels.data(), 0, a);
      assemble_batch_u8(d, plan, k, layout, parts.images.data(), parts.labels.data(), a, b);
      EXPECT_EQ(parts.images, whole.images);
      EXPECT_EQ(parts.labels, whole.labels);
    }
  }
}

TEST(TrainPlan, IsAPermutationThatDependsOnSeedAndEpoch) {
  const Dataset d = noise_images(1003, 1);
  const EpochPlan p = train_plan(d, 100, 11, 4);
  std::vector<uint32_t> sorted = p.order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint32_t> iota(d.count);
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(p.order, iota) << "the order must be shuffled";
  EXPECT_TRUE(p.augment);

  EXPECT_EQ(train_plan(d, 100, 11, 4).order, p.order) << "same seed and epoch: same order";
  EXPECT_EQ(train_plan(d, 100, 11, 4).aug_seed, p.aug_seed);
  EXPECT_NE(train_plan(d, 100, 12, 4).order, p.order) << "another seed";
  EXPECT_NE(train_plan(d, 100, 11, 5).order, p.order) << "another epoch";
  EXPECT_NE(train_plan(d, 100, 11, 5).aug_seed, p.aug_seed) << "another epoch's crops";
  EXPECT_NE(train_plan(d, 100, 12, 4).aug_seed, p.aug_seed) << "another seed's crops";
}

TEST(TrainPlan, DropsTheLastPartialBatch) {
  const Dataset d = noise_images(1003, 1);
  const EpochPlan p = train_plan(d, 100, 0, 0);
  EXPECT_EQ(p.steps, 10);
  EXPECT_EQ(p.batch, 100);
  EXPECT_EQ(p.valid_last, 100);
  const EpochPlan exact = train_plan(noise_images(1000, 1), 100, 0, 0);
  EXPECT_EQ(exact.steps, 10);
  // No padding ever appears in a training batch.
  const Batch last = assemble(d, p, p.steps - 1, Layout::NCHW);
  for (int32_t l : last.labels) EXPECT_GE(l, 0);
}

TEST(EvalPlan, PadsTheLastBatchWithLabelMinusOneAndZeroImages) {
  const Dataset d = noise_images(1003, 3);
  const EpochPlan p = eval_plan(d, 100);
  EXPECT_EQ(p.steps, 11);
  EXPECT_EQ(p.valid_last, 3);
  EXPECT_FALSE(p.augment);
  for (int i = 0; i < d.count; ++i) ASSERT_EQ(p.order[i], static_cast<uint32_t>(i));
  const Batch last = assemble(d, p, 10, Layout::NHWC);
  for (int i = 0; i < 100; ++i) {
    if (i < 3) {
      EXPECT_EQ(last.labels[i], d.labels[1000 + i]);
      continue;
    }
    EXPECT_EQ(last.labels[i], -1) << i;
    const uint8_t* img = last.images.data() + d.image_bytes() * i;
    EXPECT_TRUE(std::all_of(img, img + d.image_bytes(), [](uint8_t v) { return v == 0; })) << "padding sample " << i;
  }
  const EpochPlan full = eval_plan(noise_images(1000, 3), 100);
  EXPECT_EQ(full.steps, 10);
  EXPECT_EQ(full.valid_last, 100);
}

// ---- normalize_batch_cpu --------------------------------------------------------------------------

// IEEE binary16 bits to float, written out here so the check does not share code with the cast.
float half_bits_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant + 1024), exp - 25);
  return sign ? -v : v;
}

TEST(NormalizeBatchCpu, GreyIsReplicatedAndValuesAreStandardized) {
  const Normalization norm{{0.25f, 0.5f, 0.75f}, {0.5f, 0.25f, 0.125f}};  // per-channel on purpose
  for (int S : {32, 40})  // the default side and another (--image-size)
  for (int channels : {1, 3})
    for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
      const Dataset d = noise_images(4, channels, S);
      const EpochPlan plan = eval_plan(d, 4);
      const Batch b = assemble(d, plan, 0, layout);
      std::vector<float> f32(4 * 3 * S * S);
      std::vector<uint16_t> f16(4 * 3 * S * S);
      normalize_batch_cpu(b.images.data(), 4, channels, S, layout, norm, DType::F32, f32.data());
      normalize_batch_cpu(b.images.data(), 4, channels, S, layout, norm, DType::F16, f16.data());
      for (int n = 0; n < 4; ++n)
        for (int c = 0; c < 3; ++c)
          for (int y = 0; y < S; ++y)
            for (int x = 0; x < S; ++x) {
              const int sc = channels == 1 ? 0 : c;
              const uint8_t u = d.image(n)[(sc * S + y) * S + x];  // eval: the image as stored (CHW)
              const double want = (u / 255.0 - norm.mean[c]) / norm.stdev[c];
              const size_t o = layout == Layout::NCHW ? ((size_t(n) * 3 + c) * S + y) * S + x
                                                      : ((size_t(n) * S + y) * S + x) * 3 + c;
              ASSERT_NEAR(f32[o], want, 1e-5 * (1 + std::abs(want)))
                  << channels << " channels, " << layout_name(layout) << " n " << n << " c " << c;
              ASSERT_NEAR(half_bits_to_float(f16[o]), want, 1e-3 * (1 + std::abs(want)))
                  << "fp16, " << channels << " channels, " << layout_name(layout) << " n " << n << " c " << c;
            }
    }
}

// The sample indices rank `shard` takes in a pass, in order (-1 for padding).
std::vector<long> samples_of(const EpochPlan& p) {
  std::vector<long> s;
  for (int k = 0; k < p.steps; ++k)
    for (int i = 0; i < p.batch; ++i) {
      const size_t slot = p.slot(k, i);
      s.push_back(slot < p.order.size() ? long(p.order[slot]) : -1);
    }
  return s;
}

}  // namespace

// ---- data-parallel shards (shard_plan): every rank holds the same order, the ranks' parts are
// disjoint and together complete, a global batch holds the same samples augmented the same way
// whatever the number of ranks, and an evaluation counts each test sample once.
TEST(ShardPlan, RanksTakeDisjointPartsThatTogetherCoverThePass) {
  const Dataset d = noise_images(1000, 3);
  for (int world : {1, 2, 3, 4, 8}) {
    const int global = 24 * world;  // 24 images per GPU
    const EpochPlan whole = train_plan(d, global, 7, 3);
    std::multiset<long> seen;
    for (int r = 0; r < world; ++r) {
      const EpochPlan part = shard_plan(train_plan(d, global, 7, 3), r, world);  // each rank makes its own
      EXPECT_EQ(part.order, whole.order) << "rank " << r << " of " << world << ": a different permutation";
      EXPECT_EQ(part.steps, whole.steps);
      EXPECT_EQ(part.batch, 24);
      for (long s : samples_of(part)) seen.insert(s);
    }
    // Complete and disjoint: the full global batches of the pass, each sample exactly once.
    const size_t used = size_t(whole.steps) * global;
    ASSERT_EQ(seen.size(), used) << world;
    const std::set<long> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), used) << "a sample taken by two ranks, " << world << " ranks";
    const std::set<long> expected(whole.order.begin(), whole.order.begin() + used);
    EXPECT_EQ(distinct, std::set<long>(expected.begin(), expected.end()));
  }
}

TEST(ShardPlan, AGlobalBatchIsTheSameWhateverTheNumberOfRanks) {
  // What makes a checkpoint resumable on another number of GPUs at the same global batch: the same
  // images in each global batch, cropped and flipped the same way.
  const Dataset d = noise_images(300, 3);
  const int global = 32, k = 5;
  const EpochPlan one = train_plan(d, global, 11, 2);
  std::vector<uint8_t> whole(d.image_bytes() * global);
  std::vector<int32_t> whole_labels(global);
  assemble_batch_u8(d, one, k, Layout::NHWC, whole.data(), whole_labels.data());
  for (int world : {2, 4, 8}) {
    const int b = global / world;
    for (int r = 0; r < world; ++r) {
      const EpochPlan part = shard_plan(train_plan(d, global, 11, 2), r, world);
      std::vector<uint8_t> images(d.image_bytes() * b);
      std::vector<int32_t> labels(b);
      assemble_batch_u8(d, part, k, Layout::NHWC, images.data(), labels.data());
      EXPECT_EQ(0, std::memcmp(images.data(), whole.data() + d.image_bytes() * b * r, images.size()))
          << "rank " << r << " of " << world;
      EXPECT_EQ(std::vector<int32_t>(whole_labels.begin() + b * r, whole_labels.begin() + b * (r + 1)), labels);
    }
  }
}

TEST(ShardPlan, EvaluationCountsEveryTestSampleOnce) {
  const Dataset d = noise_images(1000, 3);
  for (int world : {2, 3, 5}) {
    const int global = 21 * world;
    std::multiset<long> real;
    int padding = 0;
    const EpochPlan whole = eval_plan(d, global);
    for (int r = 0; r < world; ++r) {
      const EpochPlan part = shard_plan(eval_plan(d, global), r, world);
      EXPECT_EQ(part.steps, whole.steps);  // every rank runs the same number of batches
      int valid_in_last = 0;
      for (int k = 0; k < part.steps; ++k) {
        std::vector<uint8_t> images(d.image_bytes() * part.batch);
        std::vector<int32_t> labels(part.batch);
        assemble_batch_u8(d, part, k, Layout::NCHW, images.data(), labels.data());
        for (int i = 0; i < part.batch; ++i) {
          const size_t slot = part.slot(k, i);
          if (slot < part.order.size()) {
            real.insert(part.order[slot]);
            EXPECT_EQ(labels[i], d.labels[part.order[slot]]);
            valid_in_last += k == part.steps - 1;
          } else {
            EXPECT_EQ(labels[i], -1);  // not counted by the loss kernel
            ++padding;
          }
        }
      }
      EXPECT_EQ(part.valid_last, valid_in_last) << "rank " << r << " of " << world;
    }
    EXPECT_EQ(real.size(), 1000u) << world;
    EXPECT_EQ(std::set<long>(real.begin(), real.end()).size(), 1000u) << "a test sample counted twice";
    EXPECT_EQ(padding, whole.steps * global - 1000);
  }
}

TEST(ShardPlan, OneShardIsThePlanItself) {
  const Dataset d = noise_images(100, 3);
  const EpochPlan p = train_plan(d, 16, 1, 0);
  const EpochPlan s = shard_plan(p, 0, 1);
  EXPECT_EQ(samples_of(s), samples_of(p));
  EXPECT_EQ(s.valid_last, p.valid_last);
}

TEST(ShardPlan, ABatchThatDoesNotSplitIsRefused) {
  const Dataset d = noise_images(100, 3);
  EXPECT_THROW(shard_plan(train_plan(d, 30, 1, 0), 0, 4), std::invalid_argument);
  EXPECT_THROW(shard_plan(train_plan(d, 32, 1, 0), 4, 4), std::invalid_argument);
  EXPECT_THROW(shard_plan(shard_plan(train_plan(d, 32, 1, 0), 0, 2), 0, 2), std::invalid_argument);
}
