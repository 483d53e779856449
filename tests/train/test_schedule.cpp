// The learning-rate schedule: linear warm-up to the peak, cosine decay to the minimum.
#include <gtest/gtest.h>

#include "train/schedule.h"

namespace {

TEST(LrSchedule, WarmupRisesLinearlyFromPeakOverWarmupToPeak) {
  const LrSchedule s{0.4, 0.0, 8, 100};
  EXPECT_DOUBLE_EQ(s.at(0), 0.4 / 8);
  EXPECT_DOUBLE_EQ(s.at(7), 0.4);
  for (long k = 1; k < 8; ++k) EXPECT_NEAR(s.at(k) - s.at(k - 1), 0.4 / 8, 1e-12) << "step " << k;
}

TEST(LrSchedule, CosineStartsAtPeakAndHitsTheMeanAtItsMidpoint) {
  const LrSchedule s{0.1, 0.002, 100, 1100};  // decay over steps [100, 1100)
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);
  EXPECT_NEAR(s.at(600), (0.1 + 0.002) / 2, 1e-12);
  // A quarter of the way: min + (peak - min) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(s.at(350), 0.002 + 0.098 * (1 + 0.70710678118654752) / 2, 1e-12);
}

TEST(LrSchedule, MinimumAtAndAfterTheEnd) {
  const LrSchedule s{0.1, 0.002, 100, 1100};
  EXPECT_DOUBLE_EQ(s.at(1100), 0.002);
  EXPECT_DOUBLE_EQ(s.at(1101), 0.002);
  EXPECT_DOUBLE_EQ(s.at(1000000), 0.002);
  EXPECT_GT(s.at(1099), 0.002);
  EXPECT_LT(s.at(1099) - 0.002, 1e-6);
}

TEST(LrSchedule, MonotoneDecreasingAfterWarmup) {
  const LrSchedule s{0.1, 0.001, 50, 777};
  for (long k = 50; k < 777; ++k) ASSERT_LT(s.at(k + 1), s.at(k)) << "step " << k;
  for (long k = 777; k < 800; ++k) ASSERT_EQ(s.at(k + 1), s.at(k)) << "step " << k;
  for (long k = 0; k + 1 < 50; ++k) ASSERT_GT(s.at(k + 1), s.at(k)) << "warm-up step " << k;
  // Warm-up reaches the peak on its last step, and the cosine starts from it.
  EXPECT_DOUBLE_EQ(s.at(49), 0.1);
  EXPECT_DOUBLE_EQ(s.at(50), 0.1);
}

TEST(LrSchedule, NoWarmupStartsAtThePeak) {
  const LrSchedule s{0.05, 0.0, 0, 10};
  EXPECT_DOUBLE_EQ(s.at(0), 0.05);
  EXPECT_NEAR(s.at(5), 0.025, 1e-12);
  EXPECT_LT(s.at(1), 0.05);
  EXPECT_DOUBLE_EQ(s.at(10), 0.0);
}

TEST(LrSchedule, RunShorterThanWarmupNeverExceedsThePeak) {
  const LrSchedule s{0.1, 0.0, 20, 10};
  for (long k = 0; k < 40; ++k) {
    EXPECT_LE(s.at(k), 0.1) << "step " << k;
    EXPECT_GE(s.at(k), 0.0) << "step " << k;
  }
}

}  // namespace
