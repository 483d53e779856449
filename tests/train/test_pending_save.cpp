// When a periodic save becomes the --save file (pending_save.h): the rule on its own, then the two
// divergences of tests/python/test_training_runs.py replayed with a save and a read after every step,
// as the trainer (src/train/trainer.cpp, checkpointing.cpp) makes them under --save-every 1.
#include <gtest/gtest.h>

#include <vector>

#include "train/pending_save.h"

namespace {

TEST(PendingSave, NothingPendingIsNeverProven) {
  EXPECT_FALSE(pending_save_proven(PendingSave{}, 10, 0, false));
}

TEST(PendingSave, NeedsAStepRunFromIt) {
  const PendingSave p{5, 0};
  EXPECT_FALSE(pending_save_proven(p, 4, 0, false)) << "a read from before the save";
  EXPECT_FALSE(pending_save_proven(p, 5, 0, false)) << "a read of the very state saved: no step has used it";
  EXPECT_TRUE(pending_save_proven(p, 6, 0, false));
}

TEST(PendingSave, SkippedStepsProveNothing) {
  const PendingSave p{5, 3};  // three steps skipped before the save do not count against it
  EXPECT_TRUE(pending_save_proven(p, 6, 3, false));
  EXPECT_FALSE(pending_save_proven(p, 6, 4, false)) << "the one step since was skipped";
  EXPECT_FALSE(pending_save_proven(p, 9, 7, false)) << "all four steps since were skipped";
  EXPECT_TRUE(pending_save_proven(p, 9, 6, false)) << "one of the four was applied";
}

TEST(PendingSave, ADivergenceProvesNothing) {
  EXPECT_FALSE(pending_save_proven(PendingSave{5, 0}, 6, 0, true));
  EXPECT_FALSE(pending_save_proven(PendingSave{5, 0}, 20, 1, true));
}

// A run with a save after every step (step 0's state included) and a read after every step:
// `skipped[s]` says whether step s was skipped, and step `diverged_at` diverges. Returns the step of
// the state the --save file keeps (-1: none), and checks that a pending save is only ever replaced
// once it is proven or holds the same weights as its replacement (every step since it skipped).
long kept_after(const std::vector<bool>& skipped, long diverged_at) {
  PendingSave pending;
  long kept = -1, skipped_total = 0;
  for (long steps = 0;; ++steps) {
    // the read after `steps` steps
    const bool diverged = steps > diverged_at;
    if (pending_save_proven(pending, steps, skipped_total, diverged)) {
      kept = pending.step;
      pending = {};
    }
    if (diverged) return kept;
    if (pending.step >= 0) {
      EXPECT_EQ(steps - pending.step, skipped_total - pending.skipped) << "at " << steps;
    }
    pending = {steps, skipped_total};  // the periodic save
    // step `steps` runs
    if (skipped[steps] || steps == diverged_at) ++skipped_total;
  }
}

TEST(PendingSave, Fp32NanLossKeepsTheStateTheLastGoodStepRanFrom) {
  // fp32: a NaN loss at step 5 (the scaler skips it and declares the divergence)
  EXPECT_EQ(kept_after(std::vector<bool>(100, false), 5), 4);
  EXPECT_EQ(kept_after(std::vector<bool>(100, false), 0), -1) << "even the starting state failed";
}

TEST(PendingSave, Fp16CollapseKeepsTheLastStateAStepWasAppliedFrom) {
  // fp16 from --loss-scale 1: step 0 applied, steps 1..11 skipped, the scale collapses in step 11
  std::vector<bool> skipped(100, false);
  for (int s = 1; s <= 11; ++s) skipped[s] = true;
  EXPECT_EQ(kept_after(skipped, 11), 0);
  // a skipped step in the middle of good ones delays the proof of one save, not of the next
  std::vector<bool> one(100, false);
  one[3] = true;
  for (int s = 7; s <= 20; ++s) one[s] = true;
  EXPECT_EQ(kept_after(one, 20), 6);
}

}  // namespace
