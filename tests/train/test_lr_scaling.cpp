// The learning rate of several GPUs (train/lr_scaling.h): the linear rule for each global batch, which
// runs it applies to (GPU count, --no-lr-scaling, the checkpoint resumed), and the start line.
#include <gtest/gtest.h>

#include "train/lr_scaling.h"

namespace {

const LrPlan kRecipe{0.02, 0.0, 1.0};  // bin/train's defaults: --lr 0.02 --min-lr 0 --warmup-epochs 1

void expect_plan(const LrPlan& got, double peak, double min, double warmup) {
  EXPECT_DOUBLE_EQ(got.peak, peak);
  EXPECT_DOUBLE_EQ(got.min, min);
  EXPECT_DOUBLE_EQ(got.warmup_epochs, warmup);
}

TEST(LinearLrScaling, RatesFollowTheGlobalBatchFromTheReference) {
  expect_plan(linear_lr_scaling(kRecipe, 128, 128, 2.0), 0.02, 0.0, 1.0);
  expect_plan(linear_lr_scaling(kRecipe, 128, 256, 2.0), 0.04, 0.0, 2.0);
  expect_plan(linear_lr_scaling(kRecipe, 128, 512, 2.0), 0.08, 0.0, 2.0);   // warm-up 4 epochs, capped at 2
  expect_plan(linear_lr_scaling(kRecipe, 128, 1024, 2.0), 0.16, 0.0, 2.0);
  expect_plan(linear_lr_scaling({0.02, 0.002, 1.0}, 128, 384, 2.0), 0.06, 0.006, 2.0);  // the whole schedule scales
  expect_plan(linear_lr_scaling({0.08, 0.0, 1.0}, 256, 512, 2.0), 0.16, 0.0, 2.0);      // a recipe of 256 images
  expect_plan(linear_lr_scaling({0.08, 0.0, 1.0}, 256, 1024, 3.0), 0.32, 0.0, 3.0);
}

TEST(LinearLrScaling, TheWarmUpGrowsUpToTheCapAndNeverShrinks) {
  expect_plan(linear_lr_scaling(kRecipe, 128, 192, 2.0), 0.03, 0.0, 1.5);   // in proportion below the cap
  expect_plan(linear_lr_scaling(kRecipe, 128, 512, 3.0), 0.08, 0.0, 3.0);   // another cap
  expect_plan(linear_lr_scaling(kRecipe, 128, 64, 2.0), 0.01, 0.0, 1.0);    // smaller batch: smaller rate, same warm-up
  expect_plan(linear_lr_scaling({0.02, 0, 3.0}, 128, 512, 2.0), 0.08, 0.0, 3.0);  // a warm-up above the cap is kept
  expect_plan(linear_lr_scaling({0.02, 0, 0.0}, 128, 512, 2.0), 0.08, 0.0, 0.0);  // no warm-up stays none
}

TEST(ChooseLr, SeveralGpusScaleOneGpuKeepsTheFlags) {
  // --gpus N --batch 128: N x 128 images a step.
  for (int world : {2, 4, 8}) {
    const LrChoice c = choose_lr(kRecipe, 128 * world, world, true, 2.0, nullptr);
    EXPECT_EQ(c.how, LrScaling::Scaled) << world;
    expect_plan(c.used, 0.02 * world, 0.0, 2.0);
    expect_plan(c.base, 0.02, 0.0, 1.0);
  }
  // --accumulate 2 on one GPU is a step of two batches, as --gpus 2 is: scaled the same.
  const LrChoice acc = choose_lr(kRecipe, 256, 2, true, 2.0, nullptr);
  EXPECT_EQ(acc.how, LrScaling::Scaled);
  expect_plan(acc.used, 0.04, 0.0, 2.0);
  // One GPU, whatever its batch: the flags as given, as before the rule.
  for (int batch : {64, 128, 512}) {
    const LrChoice c = choose_lr(kRecipe, batch, 1, true, 2.0, nullptr);
    EXPECT_EQ(c.how, LrScaling::OneGpu) << batch;
    expect_plan(c.used, 0.02, 0.0, 1.0);
  }
  // --batch is the recipe's batch, whatever it is: --gpus 2 --batch 256 --lr 0.08 takes 0.16 for 512.
  const LrChoice b256 = choose_lr({0.08, 0.0, 1.0}, 512, 2, true, 2.0, nullptr);
  EXPECT_EQ(b256.reference_batch, 256);
  expect_plan(b256.used, 0.16, 0.0, 2.0);
  // Four GPUs of 32: four times the rate of one GPU's --batch 32 (the one-GPU recipe of 128 images a
  // step on four GPUs is --no-lr-scaling, or --lr / 4).
  const LrChoice b32 = choose_lr(kRecipe, 128, 4, true, 2.0, nullptr);
  EXPECT_EQ(b32.reference_batch, 32);
  expect_plan(b32.used, 0.08, 0.0, 2.0);
}

TEST(ChooseLr, NoLrScalingTakesTheFlagsAsGiven) {
  const LrChoice c = choose_lr(kRecipe, 512, 4, false, 2.0, nullptr);
  EXPECT_EQ(c.how, LrScaling::Off);
  expect_plan(c.used, 0.02, 0.0, 1.0);
  EXPECT_EQ(choose_lr(kRecipe, 512, 1, false, 2.0, nullptr).how, LrScaling::OneGpu);
}

// A resume keeps the rule its checkpoint recorded, on any number of GPUs: the checkpoint fixes the
// global batch, so the rates go on as they were.
TEST(ChooseLr, AResumeKeepsTheCheckpointsRule) {
  const ResumedLrRule scaled{true, 128}, not_scaled{false, 128};
  // Trained on 4 GPUs x 128 (scaled from 128), resumed on one GPU with --batch 512: still 0.08.
  LrChoice c = choose_lr(kRecipe, 512, 1, true, 2.0, &scaled);
  EXPECT_EQ(c.how, LrScaling::Scaled);
  EXPECT_EQ(c.reference_batch, 128);
  expect_plan(c.used, 0.08, 0.0, 2.0);
  // ... or on 2 GPUs x 256, or 8 x 64: the same, the reference is the checkpoint's, not this --batch.
  expect_plan(choose_lr(kRecipe, 512, 2, true, 2.0, &scaled).used, 0.08, 0.0, 2.0);
  expect_plan(choose_lr(kRecipe, 512, 8, true, 2.0, &scaled).used, 0.08, 0.0, 2.0);
  // Trained on 2 GPUs x 256 (scaled from 256), resumed on 4 x 128: 0.16 as trained.
  const ResumedLrRule from_256{true, 256};
  expect_plan(choose_lr({0.08, 0.0, 1.0}, 512, 4, true, 2.0, &from_256).used, 0.16, 0.0, 2.0);
  // Trained on one GPU with --batch 512 (or before the rule: a file without it), resumed on 4 x 128:
  // still 0.02, as trained.
  c = choose_lr(kRecipe, 512, 4, true, 2.0, &not_scaled);
  EXPECT_EQ(c.how, LrScaling::AsCheckpointed);
  expect_plan(c.used, 0.02, 0.0, 1.0);
  EXPECT_EQ(choose_lr(kRecipe, 512, 1, true, 2.0, &not_scaled).how, LrScaling::OneGpu);
  EXPECT_EQ(c.reference_batch, 128) << "not scaled: the reference is one part's batch, 512 / 4";
  // --no-lr-scaling on the resume of a scaled run: the flags, and the warning says what changed.
  c = choose_lr(kRecipe, 512, 1, false, 2.0, &scaled);
  EXPECT_EQ(c.how, LrScaling::Off);
  expect_plan(c.used, 0.02, 0.0, 1.0);
}

TEST(LrLine, SaysTheRateTheGlobalBatchAndTheWarmUp) {
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 512, 4, true, 2.0, nullptr)),
            "lr: 0.08 for global batch 512 (0.02 x 512/128), warm-up 2 epochs");
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 256, 2, true, 2.0, nullptr)),
            "lr: 0.04 for global batch 256 (0.02 x 256/128), warm-up 2 epochs");
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 192, 2, true, 2.0, nullptr)),
            "lr: 0.04 for global batch 192 (0.02 x 192/96), warm-up 2 epochs");
  const ResumedLrRule legacy{true, 128};  // a checkpoint of 2 x 96 written when the rule scaled from 128
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 192, 2, true, 2.0, &legacy)),
            "lr: 0.03 for global batch 192 (0.02 x 192/128), warm-up 1.5 epochs");
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 128, 4, true, 2.0, nullptr)),
            "lr: 0.08 for global batch 128 (0.02 x 128/32), warm-up 2 epochs");
  EXPECT_EQ(lr_line(choose_lr({0.08, 0.0, 1.0}, 512, 2, true, 2.0, nullptr)),
            "lr: 0.16 for global batch 512 (0.08 x 512/256), warm-up 2 epochs");
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 512, 4, false, 2.0, nullptr)),
            "lr: 0.02 for global batch 512 (--no-lr-scaling: --lr as given), warm-up 1 epoch");
  const ResumedLrRule not_scaled{false, 128};
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 512, 4, true, 2.0, &not_scaled)),
            "lr: 0.02 for global batch 512 (--lr as given: the checkpoint's run was not scaled), warm-up 1 epoch");
  EXPECT_EQ(lr_line(choose_lr(kRecipe, 256, 1, true, 2.0, nullptr)),
            "lr: 0.02 for global batch 256 (one GPU: --lr as given), warm-up 1 epoch");
}

TEST(LrLine, ShownOnSeveralGpusAndWhereverTheRuleScaled) {
  const ResumedLrRule scaled{true, 128};
  EXPECT_FALSE(lr_line_shown(choose_lr(kRecipe, 128, 1, true, 2.0, nullptr), 1));  // one GPU prints what it did
  EXPECT_TRUE(lr_line_shown(choose_lr(kRecipe, 256, 2, true, 2.0, nullptr), 2));
  EXPECT_TRUE(lr_line_shown(choose_lr(kRecipe, 256, 2, false, 2.0, nullptr), 2));
  EXPECT_TRUE(lr_line_shown(choose_lr(kRecipe, 256, 1, true, 2.0, &scaled), 1));
}

TEST(LrResume, ADifferentScheduleIsNamedTheSameIsNot) {
  EXPECT_EQ(lr_resume_difference({0.08, 0, 2}, {0.08, 0, 2}), "");
  EXPECT_EQ(lr_resume_difference({0.08, 0, 2}, {0.02, 0, 1}),
            "the checkpoint was trained with lr 0.08 and warm-up 2 epochs; continuing with lr 0.02 and warm-up "
            "1 epoch changes the learning rate");
  EXPECT_EQ(lr_resume_difference({0.08, 0.001, 2}, {0.08, 0, 2}),
            "the checkpoint was trained with lr 0.08 (min 0.001) and warm-up 2 epochs; continuing with lr 0.08 and "
            "warm-up 2 epochs changes the learning rate");
}

}  // namespace
