// The dynamic loss-scaling rule (kernels/optimizer.h), on the CPU: the single-step cases one by
// one, then a long random run against a reference written from the rule's closed form rather than
// step by step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/optimizer.h"

namespace {

ScalerState state(float scale, int good = 0, int found_inf = 0) {
  ScalerState s{};
  s.scale = scale;
  s.good_steps = good;
  s.found_inf = found_inf;
  return s;
}

TEST(LossScaleRule, OverflowSkipsHalvesAndResetsTheCount) {
  ScalerState s = state(1024.f, 5, 1);
  s.skipped_steps = 2;
  apply_loss_scale_rule(s, true, 10);
  EXPECT_EQ(s.scale, 512.f);
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_EQ(s.skipped_steps, 3);
  EXPECT_EQ(s.found_inf, 0) << "the flag must be clear for the next step's check";
  EXPECT_EQ(s.diverged, 0);
}

TEST(LossScaleRule, DoublesAfterWindowGoodStepsAndNotBefore) {
  ScalerState s = state(256.f);
  for (int k = 1; k < 4; ++k) {
    apply_loss_scale_rule(s, true, 4);
    EXPECT_EQ(s.scale, 256.f) << "after " << k << " good steps";
    EXPECT_EQ(s.good_steps, k);
  }
  apply_loss_scale_rule(s, true, 4);
  EXPECT_EQ(s.scale, 512.f);
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_EQ(s.skipped_steps, 0);
  // An overflow in the middle of a window restarts it.
  for (int k = 0; k < 3; ++k) apply_loss_scale_rule(s, true, 4);
  s.found_inf = 1;
  apply_loss_scale_rule(s, true, 4);
  EXPECT_EQ(s.scale, 256.f);
  for (int k = 0; k < 3; ++k) apply_loss_scale_rule(s, true, 4);
  EXPECT_EQ(s.scale, 256.f) << "good steps before the overflow must not count";
  apply_loss_scale_rule(s, true, 4);
  EXPECT_EQ(s.scale, 512.f);
}

TEST(LossScaleRule, WindowOfOneDoublesEveryGoodStep) {
  ScalerState s = state(1.f);
  for (int k = 1; k <= 5; ++k) {
    apply_loss_scale_rule(s, true, 1);
    EXPECT_EQ(s.scale, std::ldexp(1.f, k));
  }
}

TEST(LossScaleRule, NeverExceedsTheMaximum) {
  ScalerState s = state(kMaxLossScale / 2);
  for (int k = 0; k < 100; ++k) {
    apply_loss_scale_rule(s, true, 2);
    ASSERT_LE(s.scale, kMaxLossScale) << "step " << k;
  }
  EXPECT_EQ(s.scale, kMaxLossScale) << "it reaches the maximum and stays";
  EXPECT_EQ(s.diverged, 0);
  s.found_inf = 1;
  apply_loss_scale_rule(s, true, 2);
  EXPECT_EQ(s.scale, kMaxLossScale / 2) << "an overflow at the maximum still halves";
}

TEST(LossScaleRule, FixedScaleForFp32AndNonFiniteMeansDiverged) {
  ScalerState s = state(1.f);
  for (int k = 0; k < 50; ++k) apply_loss_scale_rule(s, false, 3);
  EXPECT_EQ(s.scale, 1.f) << "fp32 never scales";
  EXPECT_EQ(s.diverged, 0);
  EXPECT_EQ(s.skipped_steps, 0);
  s.found_inf = 1;
  apply_loss_scale_rule(s, false, 3);
  EXPECT_EQ(s.scale, 1.f);
  EXPECT_EQ(s.diverged, 1);
  EXPECT_EQ(s.found_inf, 0);
}

TEST(LossScaleRule, CollapseBelowTheMinimumIsDivergence) {
  ScalerState s = state(2 * kMinLossScale, 0, 1);
  apply_loss_scale_rule(s, true, 10);
  EXPECT_EQ(s.scale, kMinLossScale);
  EXPECT_EQ(s.diverged, 0) << "reaching the minimum is still a (very small) scale";
  s.found_inf = 1;
  apply_loss_scale_rule(s, true, 10);
  EXPECT_LT(s.scale, kMinLossScale);
  EXPECT_EQ(s.diverged, 1);
}

// The reference: with overflows at known steps, the scale after step t is a closed form. Within a
// run of j consecutive good steps that started at exponent e0, the exponent is
// min(e0 + j / window, e_max) and the count j % window; an overflow takes one off the exponent.
struct Expected {
  int exponent, good, skipped;
  bool diverged;
};
std::vector<Expected> reference(const std::vector<bool>& overflow, int e_start, int window) {
  const int e_max = static_cast<int>(std::log2(kMaxLossScale)), e_min = static_cast<int>(std::log2(kMinLossScale));
  std::vector<Expected> out;
  int run_start_exponent = e_start, run_length = 0, skipped = 0;
  bool diverged = false;
  for (bool inf : overflow) {
    int e;
    if (inf) {
      const int before = out.empty() ? e_start : out.back().exponent;
      e = before - 1;
      ++skipped;
      run_start_exponent = e;
      run_length = 0;
      diverged = diverged || e < e_min;
    } else {
      ++run_length;
      e = std::min(run_start_exponent + run_length / window, e_max);
    }
    out.push_back({e, run_length % window, skipped, diverged});
  }
  return out;
}

TEST(LossScaleRule, MatchesAClosedFormReferenceOverLongRandomRuns) {
  std::mt19937 rng(2024);
  // Overflow rates from rare (the scale climbs to the maximum and sits there) to frequent (it
  // collapses); each run ends at divergence, where training would stop.
  for (double rate : {0.001, 0.02, 0.1, 0.25, 0.6})
    for (int window : {1, 7, 50}) {
      std::bernoulli_distribution overflow_at(rate);
      std::vector<bool> flags(20000);
      for (size_t t = 0; t < flags.size(); ++t) flags[t] = overflow_at(rng);
      const std::vector<Expected> want = reference(flags, 16, window);
      ScalerState s = state(65536.f);
      for (size_t t = 0; t < flags.size(); ++t) {
        s.found_inf = flags[t];
        apply_loss_scale_rule(s, true, window);
        ASSERT_EQ(s.scale, std::ldexp(1.f, want[t].exponent)) << "rate " << rate << " window " << window << " step " << t;
        ASSERT_EQ(s.good_steps, want[t].good) << "rate " << rate << " window " << window << " step " << t;
        ASSERT_EQ(s.skipped_steps, want[t].skipped) << "step " << t;
        ASSERT_EQ(s.diverged != 0, want[t].diverged) << "rate " << rate << " window " << window << " step " << t;
        ASSERT_EQ(s.found_inf, 0);
        if (want[t].diverged) break;
      }
    }
}

}  // namespace
