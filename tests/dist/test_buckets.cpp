// Gradient bucket plans over the flat store's two gradient buffers (dist/buckets.h): every
// parameter in exactly one bucket, each bucket one contiguous range per buffer, sizes by the caps,
// and buckets launched in order, each as soon as backward has produced it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "dist/buckets.h"

namespace {

// The tensors of a ResNet-like network, registered in forward order as build_layers() does
// (stem conv + BN; per block conv1 bn1 conv2 bn2 conv3 bn3 [downsample conv + BN]; fc weight and
// bias), with offsets laid out as ParamStore::allocate() does: weights first, then the vectors.
struct Net {
  std::vector<ParamTensor> tensors;
  size_t n_weights = 0;
  // The order backward reports gradients in (training_backward.cpp): fc, then per block from the last:
  // bn3 (+ downsample BN), conv3, downsample conv, bn2, conv2, bn1, conv1; then the stem.
  std::vector<int> backward_order;
};

Net resnet_like(int blocks, int width) {
  Net n;
  auto add = [&](const std::string& name, ParamKind kind, size_t count) {
    ParamTensor t;
    t.name = name;
    t.kind = kind;
    t.count = count;
    n.tensors.push_back(t);
    return static_cast<int>(n.tensors.size()) - 1;
  };
  struct Block { int c1, g1, b1, c2, g2, b2, c3, g3, b3, dc = -1, dg = -1, db = -1; };
  const int stem = add("conv1.weight", ParamKind::ConvWeight, 27 * 64);
  const int sg = add("bn1.weight", ParamKind::BnGamma, 64), sb = add("bn1.bias", ParamKind::BnBeta, 64);
  std::vector<Block> bs;
  for (int i = 0; i < blocks; ++i) {
    const std::string p = "layer." + std::to_string(i) + ".";
    const size_t w = size_t(width) * (i + 1);
    Block b;
    b.c1 = add(p + "conv1.weight", ParamKind::ConvWeight, w * w);
    b.g1 = add(p + "bn1.weight", ParamKind::BnGamma, w);
    b.b1 = add(p + "bn1.bias", ParamKind::BnBeta, w);
    b.c2 = add(p + "conv2.weight", ParamKind::ConvWeight, 9 * w * w);
    b.g2 = add(p + "bn2.weight", ParamKind::BnGamma, w);
    b.b2 = add(p + "bn2.bias", ParamKind::BnBeta, w);
    b.c3 = add(p + "conv3.weight", ParamKind::ConvWeight, 4 * w * w);
    b.g3 = add(p + "bn3.weight", ParamKind::BnGamma, 4 * w);
    b.b3 = add(p + "bn3.bias", ParamKind::BnBeta, 4 * w);
    if (i % 2 == 0) {
      b.dc = add(p + "downsample.0.weight", ParamKind::ConvWeight, 4 * w * w);
      b.dg = add(p + "downsample.1.weight", ParamKind::BnGamma, 4 * w);
      b.db = add(p + "downsample.1.bias", ParamKind::BnBeta, 4 * w);
    }
    bs.push_back(b);
  }
  const int fw = add("fc.weight", ParamKind::LinearWeight, 2048 * 10), fb = add("fc.bias", ParamKind::LinearBias, 10);
  size_t off = 0;
  for (auto& t : n.tensors)
    if (t.is_weight()) t.offset = off, off += t.count;
  n.n_weights = off;
  for (auto& t : n.tensors)
    if (!t.is_weight()) t.offset = off, off += t.count;
  n.backward_order = {fw, fb};
  for (auto it = bs.rbegin(); it != bs.rend(); ++it) {
    const Block& b = *it;
    n.backward_order.insert(n.backward_order.end(), {b.g3, b.b3});
    if (b.dc >= 0) n.backward_order.insert(n.backward_order.end(), {b.dg, b.db});
    n.backward_order.push_back(b.c3);
    if (b.dc >= 0) n.backward_order.push_back(b.dc);
    n.backward_order.insert(n.backward_order.end(), {b.g2, b.b2, b.c2, b.g1, b.b1, b.c1});
  }
  n.backward_order.insert(n.backward_order.end(), {sg, sb, stem});
  return n;
}

size_t total_count(const Net& n, bool weights) {
  size_t s = 0;
  for (const auto& t : n.tensors) s += t.is_weight() == weights ? t.count : 0;
  return s;
}

// Every element of both buffers in exactly one bucket, and every tensor inside its bucket's ranges.
void expect_exact_cover(const Net& n, const BucketPlan& p) {
  std::vector<int> weight_owner(n.n_weights, -1), vector_owner(total_count(n, false), -1);
  for (size_t b = 0; b < p.buckets.size(); ++b) {
    const GradBucket& g = p.buckets[b];
    for (size_t e = g.weight_offset; e < g.weight_offset + g.weight_count; ++e) {
      ASSERT_EQ(weight_owner[e], -1) << "weight element " << e << " in two buckets";
      weight_owner[e] = int(b);
    }
    for (size_t e = g.vector_offset; e < g.vector_offset + g.vector_count; ++e) {
      ASSERT_EQ(vector_owner[e], -1) << "vector element " << e << " in two buckets";
      vector_owner[e] = int(b);
    }
  }
  EXPECT_EQ(std::count(weight_owner.begin(), weight_owner.end(), -1), 0);
  EXPECT_EQ(std::count(vector_owner.begin(), vector_owner.end(), -1), 0);
  for (size_t i = 0; i < n.tensors.size(); ++i) {
    const ParamTensor& t = n.tensors[i];
    const int b = p.bucket_of[i];
    ASSERT_GE(b, 0) << t.name;
    const size_t first = t.is_weight() ? t.offset : t.offset - n.n_weights;
    const auto& owner = t.is_weight() ? weight_owner : vector_owner;
    for (size_t e = first; e < first + t.count; ++e) ASSERT_EQ(owner[e], b) << t.name;
  }
}

}  // namespace

TEST(Buckets, EveryParameterInExactlyOneBucket) {
  const Net n = resnet_like(8, 64);
  for (size_t elem : {size_t(2), size_t(4)})
    for (double cap_mb : {0.05, 0.5, 25.0}) {
      const BucketPlan p = plan_buckets(n.tensors, n.n_weights, elem, size_t(0.01 * (1 << 20)), size_t(cap_mb * (1 << 20)));
      SCOPED_TRACE("cap " + std::to_string(cap_mb) + " MB, " + std::to_string(elem) + "-byte weights");
      expect_exact_cover(n, p);
    }
}

TEST(Buckets, SizesFollowTheCapsAndTheFirstBucketIsSmall) {
  const Net n = resnet_like(8, 64);
  const size_t first = 64 << 10, cap = 512 << 10;
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 2, first, cap);
  ASSERT_GE(p.buckets.size(), 3u);
  size_t total = 0;
  for (size_t b = 0; b < p.buckets.size(); ++b) {
    const GradBucket& g = p.buckets[b];
    EXPECT_EQ(g.bytes, g.weight_count * 2 + g.vector_count * 4);
    total += g.bytes;
    // A bucket closes with the tensor that reaches its cap: without that last tensor it was below.
    const ParamTensor& last_added = n.tensors[g.first_tensor];
    const size_t before = g.bytes - last_added.count * (last_added.is_weight() ? 2 : 4);
    if (b + 1 < p.buckets.size()) {
      EXPECT_GE(g.bytes, b == 0 ? first : cap) << "bucket " << b;
      EXPECT_LT(before, b == 0 ? first : cap) << "bucket " << b;
    }
  }
  EXPECT_EQ(total, n.n_weights * 2 + total_count(n, false) * 4);
  EXPECT_EQ(p.buckets[0].last_tensor, int(n.tensors.size()) - 1);  // the classifier's gradients go first
  EXPECT_EQ(p.buckets.back().first_tensor, 0);                     // the stem's last
}

TEST(Buckets, ALastCapCutsTheLastBucketFromTheFirstTensors) {
  const Net n = resnet_like(8, 64);
  const size_t first = 64 << 10, cap = 512 << 10, last_cap = 96 << 10;
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 2, first, cap, last_cap);
  expect_exact_cover(n, p);
  const GradBucket& tail = p.buckets.back();
  EXPECT_EQ(tail.first_tensor, 0);  // the stem's gradients, which backward produces last
  EXPECT_GE(tail.bytes, last_cap);
  const ParamTensor& closing = n.tensors[tail.last_tensor];
  EXPECT_LT(tail.bytes - closing.count * (closing.is_weight() ? 2 : 4), last_cap);  // closed by its last tensor
  EXPECT_EQ(p.buckets[0].last_tensor, int(n.tensors.size()) - 1);
  EXPECT_GE(p.buckets[0].bytes, first);
  // Launched in order as backward reports, every bucket but the tail goes before backward ends.
  BucketTracker tracker(p);
  for (size_t i = 0; i + 1 < n.backward_order.size(); ++i) tracker.ready(n.backward_order[i]);
  EXPECT_EQ(tracker.launched(), int(p.buckets.size()) - 1);
  // Without the last cap the tail is what is left over, here larger than the cap asked for.
  const BucketPlan plain = plan_buckets(n.tensors, n.n_weights, 2, first, cap);
  EXPECT_GT(plain.buckets.back().bytes, last_cap);
  EXPECT_EQ(plan_buckets(n.tensors, n.n_weights, 2, first, cap, 0).buckets.size(), plain.buckets.size());
  // The naive form stays one bucket whatever the last cap.
  EXPECT_EQ(plan_buckets(n.tensors, n.n_weights, 2, first, 0, last_cap).buckets.size(), 1u);
  // A last cap above everything leaves one tensor for the other buckets.
  const BucketPlan huge = plan_buckets(n.tensors, n.n_weights, 2, first, cap, size_t(1) << 40);
  expect_exact_cover(n, huge);
  EXPECT_EQ(huge.buckets.size(), 2u);
}

TEST(Buckets, CapZeroIsOneBucketForEverything) {
  const Net n = resnet_like(4, 32);
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 4, 1 << 20, 0);
  ASSERT_EQ(p.buckets.size(), 1u);
  EXPECT_EQ(p.buckets[0].weight_offset, 0u);
  EXPECT_EQ(p.buckets[0].weight_count, n.n_weights);
  EXPECT_EQ(p.buckets[0].vector_count, total_count(n, false));
  expect_exact_cover(n, p);
}

TEST(Buckets, BackwardOrderLaunchesEveryBucketInOrderAsSoonAsReady) {
  const Net n = resnet_like(8, 64);
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 2, 32 << 10, 256 << 10);
  BucketTracker tracker(p);
  for (int step = 0; step < 2; ++step) {  // and again after reset(), as every training step does
    std::vector<int> remaining(p.buckets.size());
    for (size_t b = 0; b < p.buckets.size(); ++b) remaining[b] = p.buckets[b].tensors();
    int launched = 0;
    for (size_t i = 0; i < n.backward_order.size(); ++i) {
      const int t = n.backward_order[i];
      --remaining[p.bucket_of[t]];
      const auto [first, end] = tracker.ready(t);
      EXPECT_EQ(first, launched);
      // Exactly the buckets that are now complete, with all before them, go, in index order.
      int expect_end = launched;
      while (expect_end < int(p.buckets.size()) && remaining[expect_end] == 0) ++expect_end;
      EXPECT_EQ(end, expect_end) << "after " << n.tensors[t].name;
      launched = end;
    }
    EXPECT_TRUE(tracker.all_launched());
    tracker.reset();
  }
}

TEST(Buckets, BackwardOrderOverlapsCommunication) {
  // In reverse registration order each bucket completes before backward reaches the next one, so all
  // but the last bucket are launched while backward still runs.
  const Net n = resnet_like(8, 64);
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 2, 32 << 10, 256 << 10);
  BucketTracker tracker(p);
  for (size_t i = 0; i + 1 < n.backward_order.size(); ++i) tracker.ready(n.backward_order[i]);
  EXPECT_EQ(tracker.launched(), int(p.buckets.size()) - 1);
  tracker.ready(n.backward_order.back());
  EXPECT_TRUE(tracker.all_launched());
}

TEST(Buckets, AGradientReportedTwiceOrUnknownIsABug) {
  const Net n = resnet_like(2, 16);
  const BucketPlan p = plan_buckets(n.tensors, n.n_weights, 4, 1 << 10, 4 << 10);
  BucketTracker tracker(p);
  EXPECT_FALSE(tracker.was_reported(3));
  tracker.ready(3);
  EXPECT_TRUE(tracker.was_reported(3));
  EXPECT_EQ(tracker.reported(), 1);
  EXPECT_THROW(tracker.ready(3), Fatal);
  EXPECT_THROW(tracker.ready(-1), Fatal);
  EXPECT_THROW(tracker.ready(int(n.tensors.size())), Fatal);
  tracker.reset();
  EXPECT_FALSE(tracker.was_reported(3));
  EXPECT_NO_THROW(tracker.ready(3));
}

TEST(Buckets, AStoreNotInRegistrationOrderIsRefused) {
  Net n = resnet_like(2, 16);
  std::swap(n.tensors[0].offset, n.tensors[3].offset);  // two weights swapped in the buffer
  n.tensors[0].count = n.tensors[3].count = std::min(n.tensors[0].count, n.tensors[3].count);
  EXPECT_THROW(plan_buckets(n.tensors, n.n_weights, 4, 1 << 10, 0), Fatal);
}
