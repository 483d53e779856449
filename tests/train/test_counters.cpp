// How a counter read shows a divergence (counters.h, DivergenceWatch): which reads stop the run in
// fp32 and fp16, and how the step is named. Needs no GPU: the watch only reads host copies.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "train/counters.h"

namespace {

CounterRead healthy(long steps) { return {initial_counters(1.f), steps}; }

std::string message_of(DivergenceWatch& w, const CounterRead& r) {
  try {
    w.check(r);
  } catch (const Diverged& d) {
    return d.what();
  }
  return "";
}

TEST(DivergenceWatch, HealthyReadsPass) {
  DivergenceWatch w(false);
  EXPECT_NO_THROW(w.check(healthy(10)));
  EXPECT_NO_THROW(w.check(healthy(20)));
}

TEST(DivergenceWatch, ANonFiniteLossNamesItsStepAndTheLastFiniteLoss) {
  for (bool fp16 : {false, true}) {
    DivergenceWatch w(fp16);
    CounterRead r = healthy(50);
    r.counters.train.first_bad_step = 37;
    r.counters.train.last_good_loss = 0.25f;
    if (fp16) {
      EXPECT_EQ(message_of(w, r), "") << "fp16: an overflow only skips the step";
      r.counters.scaler.diverged = 1;
    }
    EXPECT_EQ(message_of(w, r), "training diverged: the loss became NaN/Inf at step 37 (last finite loss 0.25); "
                                "stopping without saving");
  }
}

TEST(DivergenceWatch, GradientDivergenceIsNamedBetweenTheLastCleanReadAndThisOne) {
  DivergenceWatch w(false);
  w.start_at(100);
  w.check(healthy(150));
  CounterRead r = healthy(200);
  r.counters.scaler.diverged = 1;
  EXPECT_EQ(message_of(w, r), "training diverged at one of steps 150 to 199: non-finite gradients "
                              "(no finite loss in this run); stopping without saving");
  DivergenceWatch every_step(true);
  every_step.check(healthy(7));
  r = healthy(8);
  r.counters.scaler.diverged = 1;
  r.counters.train.last_good_loss = 1.5f;
  EXPECT_EQ(message_of(every_step, r), "training diverged at step 7: non-finite gradients even at a tiny loss "
                                       "scale (last finite loss 1.5); stopping without saving");
}

TEST(DivergenceWatch, InitialCountersHaveNoBadStepAndNoFiniteLoss) {
  const DeviceCounters c = initial_counters(65536.f);
  EXPECT_EQ(c.train.first_bad_step, -1);
  EXPECT_EQ(c.eval.first_bad_step, -1);
  EXPECT_TRUE(std::isnan(c.train.last_good_loss));
  EXPECT_EQ(c.scaler.scale, 65536.f);
  EXPECT_EQ(fresh_totals(0.5f).last_good_loss, 0.5f);
  EXPECT_EQ(fresh_totals(0.5f).count, 0u);
}

}  // namespace
