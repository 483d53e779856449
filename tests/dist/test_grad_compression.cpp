// The host-side bookkeeping of int8 compression (dist/grad_compression.h): where each bucket's chunk
// maxima live, the levels that keep the ranks' int8 sum from overflowing, and the bytes a step sends
// on ResNet-50 (half of fp16's, plus 0.4% of scales). CPU only.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "dist/grad_compression.h"
#include "kernels/compress.h"
#include "model/resnet50_spec.h"

namespace {

GradBucket bucket(size_t weight_offset, size_t weights, size_t vectors) {
  GradBucket b;
  b.weight_offset = weight_offset;
  b.weight_count = weights;
  b.vector_count = vectors;
  return b;
}

// ResNet-50's flat store, laid out as the trainer lays it out (no GPU: offsets only).
ParamStore resnet50_store() {
  ParamStore store;
  for (const ParamSpec& p : resnet50_params(NetConfig{}).tensors) store.add(p.name, p.kind, p.shape);
  store.assign_offsets();
  return store;
}

}  // namespace

TEST(Int8Levels, TheRanksSumFitsInInt8) {
  EXPECT_EQ(int8_levels(1), 127);
  EXPECT_EQ(int8_levels(2), 63);
  EXPECT_EQ(int8_levels(3), 42);
  EXPECT_EQ(int8_levels(8), 15);
  EXPECT_EQ(int8_levels(kInt8MaxWorld), 1);
  for (int world = 1; world <= kInt8MaxWorld; ++world) EXPECT_LE(world * int8_levels(world), 127) << world;
}

TEST(CompressionPlan, ChunksOfEachBucketFollowOneAnother) {
  BucketPlan buckets;
  buckets.buckets = {bucket(5000, 3000, 20), bucket(2000, 3000, 10), bucket(0, 2000, 0), bucket(0, 0, 7)};
  const CompressionPlan p = plan_compression(buckets, 4, 1024);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.levels, 31);
  EXPECT_EQ(p.chunks, (std::vector<size_t>{3, 3, 2, 0}));  // rounded up: the last chunk of each is short
  EXPECT_EQ(p.first_chunk, (std::vector<size_t>{0, 3, 6, 8}));
  EXPECT_EQ(p.total_chunks, 8u);
  // int8 weights, one fp32 maximum a chunk, fp32 vectors
  EXPECT_EQ(p.bytes(buckets.buckets[0], 0), 3000u + 3 * 4 + 20 * 4);
  EXPECT_EQ(p.bytes(buckets.buckets[2], 2), 2000u + 2 * 4);
  EXPECT_EQ(p.bytes(buckets.buckets[3], 3), 7u * 4);
}

TEST(CompressionPlan, RefusesMoreRanksThanInt8CanSum) {
  BucketPlan buckets;
  buckets.buckets = {bucket(0, 10, 0)};
  EXPECT_NO_THROW(plan_compression(buckets, kInt8MaxWorld));
  try {
    plan_compression(buckets, kInt8MaxWorld + 1);
    FAIL() << "128 ranks were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 127 ranks (this run has 128)"), std::string::npos) << e.what();
  }
}

TEST(CompressionPlan, HalvesResNet50sFp16Bytes) {
  const ParamStore store = resnet50_store();
  // Buckets cut by the fp16 gradients' size, as DataParallel cuts them when it compresses.
  const BucketPlan buckets = plan_buckets(store.tensors(), store.weight_count(), 2, 1 << 20, 25 << 20);
  const CompressionPlan p = plan_compression(buckets, 2);
  size_t fp16 = 0, int8 = 0, chunks = 0;
  for (size_t b = 0; b < buckets.buckets.size(); ++b) {
    fp16 += buckets.buckets[b].bytes;
    int8 += p.bytes(buckets.buckets[b], static_cast<int>(b));
    EXPECT_EQ(p.first_chunk[b], chunks);
    chunks += p.chunks[b];
  }
  EXPECT_EQ(chunks, p.total_chunks);
  EXPECT_GE(p.total_chunks, store.weight_count() / kCompressionChunk);
  EXPECT_NEAR(double(fp16) / 1e6, 47.1, 0.3);  // the 47 MB of the issue
  const double expected = double(store.weight_count()) * (1 + 4.0 / kCompressionChunk) +
                          double(store.total() - store.weight_count()) * 4;
  EXPECT_NEAR(double(int8), expected, 4.0 * buckets.buckets.size());  // the chunks rounded up in each bucket
  EXPECT_LT(double(int8) / double(fp16), 0.51);
}
