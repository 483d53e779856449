// The host-side bookkeeping of gradient accumulation (dist/grad_accumulation.h): which micro-batch is
// first and last, the loader's index of each, and the claim the equality tests rest on: micro-batch
// j of rank r of a run with --accumulate N on W ranks takes, image for image and crop for crop,
// what rank j * W + r of a run on W * N ranks takes. CPU only.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "data/augment.h"
#include "dist/grad_accumulation.h"

namespace {

Dataset sized(int count) {
  Dataset d;
  d.name = "sized";
  d.count = count;
  d.channels = 1;
  d.side = 32;
  return d;
}

// A rank's plan as the trainer makes it: its part of the global batch of --batch x ranks.
EpochPlan rank_plan(const Dataset& d, int batch, int ranks, int rank, int epoch) {
  const EpochPlan p = train_plan(d, batch * ranks, 7, epoch);
  return ranks > 1 ? shard_plan(p, rank, ranks) : p;
}

}  // namespace

TEST(MicroBatch, FirstLastAndWhetherItAccumulates) {
  EXPECT_TRUE(MicroBatch{}.first());
  EXPECT_TRUE(MicroBatch{}.last());
  EXPECT_FALSE(MicroBatch{}.accumulates());
  const MicroBatch a{0, 3}, b{1, 3}, c{2, 3};
  EXPECT_TRUE(a.first() && !a.last() && a.accumulates());
  EXPECT_TRUE(!b.first() && !b.last());
  EXPECT_TRUE(!c.first() && c.last());
  EXPECT_EQ(micro_batch_index(0, 0, 3), 0);
  EXPECT_EQ(micro_batch_index(4, 2, 3), 14);
  EXPECT_EQ(micro_batch_index(4, 0, 1), 4);
}

TEST(MicroBatchPlan, CutsThePassAfterTheLastWholeStep) {
  const Dataset d = sized(1000);
  const EpochPlan p = rank_plan(d, 32, 2, 1, 0);  // 15 batches of 2 x 32
  EXPECT_EQ(p.steps, 15);
  const EpochPlan m = micro_batch_plan(p, 1000 / (32 * 2 * 4), 4);  // 3 steps of 4 micro-batches
  EXPECT_EQ(m.steps, 12);
  EXPECT_EQ(m.valid_last, 32);
  EXPECT_EQ(m.batch, 32);
  EXPECT_EQ(micro_batch_plan(p, 15, 1).steps, 15);  // no accumulation: the plan as it was
  EXPECT_THROW(micro_batch_plan(p, 8, 2), Fatal);   // 16 micro-batches from 15 batches
}

TEST(MicroBatchPlan, MicroBatchJOfRankRTakesWhatRankJWPlusRTakesOnMoreGpus) {
  const Dataset d = sized(1000);
  const int batch = 16;
  for (int ranks : {1, 2, 3}) {
    for (int n : {2, 3, 4}) {
      const int steps = d.count / (batch * ranks * n);
      for (int epoch : {0, 1}) {
        for (int r = 0; r < ranks; ++r) {
          const EpochPlan mine = micro_batch_plan(rank_plan(d, batch, ranks, r, epoch), steps, n);
          for (int j = 0; j < n; ++j) {
            const int other_rank = j * ranks + r;
            const EpochPlan wide = rank_plan(d, batch, ranks * n, other_rank, epoch);
            ASSERT_GE(wide.steps, steps);
            for (int k = 0; k < steps; ++k)
              for (int i = 0; i < batch; ++i) {
                const size_t a = mine.slot(static_cast<int>(micro_batch_index(k, j, n)), i), b = wide.slot(k, i);
                ASSERT_EQ(a, b) << ranks << " ranks, --accumulate " << n << ", rank " << r << ", micro-batch " << j
                                << ", step " << k << ", image " << i;
                ASSERT_EQ(mine.order[a], wide.order[b]);  // the same image
                const CropFlip x = crop_flip_for(mine.aug_seed, a, mine.crop_pad);
                const CropFlip y = crop_flip_for(wide.aug_seed, b, wide.crop_pad);
                ASSERT_EQ(x.dx, y.dx);  // augmented the same way
                ASSERT_EQ(x.dy, y.dy);
                ASSERT_EQ(x.flip, y.flip);
              }
          }
        }
      }
    }
  }
}
