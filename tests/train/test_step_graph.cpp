// The host side of the step graph (train/step_graph.h): the per-step parameter block the kernels
// read, and the plan that says, step by step, whether to run eagerly, capture or replay. No GPU.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "train/step_graph.h"

namespace {

// ---- the parameter block --------------------------------------------------------------------------

// The kernels read the block's fields through pointers into one 16-byte device copy of it: the
// layout is part of that contract (and a 64-bit step must not straddle a padding change).
TEST(StepParams, LayoutIsSixteenBytesStepLrSlot) {
  EXPECT_EQ(sizeof(StepParams), 16u);
  EXPECT_EQ(offsetof(StepParams, step), 0u);
  EXPECT_EQ(offsetof(StepParams, lr), 8u);
  EXPECT_EQ(offsetof(StepParams, loss_slot), 12u);
  EXPECT_EQ(alignof(StepParams), alignof(long long));
  EXPECT_TRUE(std::is_trivially_copyable_v<StepParams>);
  EXPECT_TRUE(std::is_standard_layout_v<StepParams>);
}

TEST(StepParams, CarryTheStepItsSlotAndTheSchedulesLearningRateAsAFloat) {
  const LrSchedule s{0.4, 0.001, 10, 100};
  for (const long step : {0L, 1L, 9L, 10L, 37L, 99L, 100L, 250L}) {
    const int slot = static_cast<int>(step % 30);
    const StepParams p = make_step_params(step, slot, s);
    EXPECT_EQ(p.step, step);
    EXPECT_EQ(p.loss_slot, slot);
    EXPECT_EQ(p.lr, static_cast<float>(s.at(step))) << "step " << step << ": the kernel gets the schedule's value";
  }
  // The values differ from step to step: a graph that baked in one of them would be caught.
  EXPECT_NE(make_step_params(3, 3, s).lr, make_step_params(4, 4, s).lr);
  EXPECT_NE(make_step_params(50, 20, s).lr, make_step_params(51, 21, s).lr);
}

TEST(StepParams, StepsPastTwoToThe31stKeepTheirValue) {
  const long big = static_cast<long>(INT_MAX) + 12345;
  const StepParams p = make_step_params(big, 7, LrSchedule{0.1, 0.0, 0, 1});
  EXPECT_EQ(p.step, static_cast<long long>(big));
  EXPECT_EQ(p.lr, 0.f) << "past the schedule's end: its minimum";
}

// ---- the plan ------------------------------------------------------------------------------------

constexpr int kRows = 128;
int images_a, images_b, labels_a;  // their addresses stand for device buffers
const StepShape kFull{kRows, &images_a, &labels_a};

std::string letters(const std::vector<StepAction>& actions) {
  std::string s;
  for (StepAction a : actions) s += a == StepAction::Eager ? 'E' : a == StepAction::Capture ? 'C' : 'R';
  return s;
}

std::string run(StepGraphPlan& plan, int steps, const StepShape& shape = kFull) {
  std::vector<StepAction> actions;
  for (int i = 0; i < steps; ++i) actions.push_back(plan.next(shape));
  return letters(actions);
}

TEST(StepGraphPlan, GraphsOffRunsEveryStepEagerly) {
  StepGraphPlan plan(false, kRows, kStepGraphWarmupSteps);
  EXPECT_EQ(run(plan, 6), "EEEEEE");
  plan.invalidate();
  EXPECT_EQ(run(plan, 2), "EE");
  EXPECT_EQ(plan.captures(), 0);
}

TEST(StepGraphPlan, WarmsUpEagerlyCapturesOnceThenReplays) {
  StepGraphPlan plan(true, kRows, 2);
  EXPECT_EQ(run(plan, 7), "EECRRRR");
  EXPECT_EQ(plan.captures(), 1);
  StepGraphPlan none(true, kRows, 0);
  EXPECT_EQ(run(none, 3), "CRR") << "no warm-up: the first step is captured";
}

TEST(StepGraphPlan, TheDefaultWarmupIsAFewSteps) {
  EXPECT_GE(kStepGraphWarmupSteps, 1) << "the first step loads modules and sets up library state: never captured";
  EXPECT_LE(kStepGraphWarmupSteps, 5) << "every eager step is a step without the graph's speed";
  StepGraphPlan plan(true, kRows, kStepGraphWarmupSteps);
  EXPECT_EQ(run(plan, kStepGraphWarmupSteps + 2), std::string(kStepGraphWarmupSteps, 'E') + "CR");
}

TEST(StepGraphPlan, APartialBatchRunsEagerlyAndKeepsTheGraph) {
  StepGraphPlan plan(true, kRows, 2);
  const StepShape partial{kRows - 29, &images_a, &labels_a};
  EXPECT_EQ(run(plan, 1, partial), "E");
  EXPECT_EQ(run(plan, 3), "EEC") << "a partial batch is no warm-up step of the graph's shape";
  EXPECT_EQ(run(plan, 1, partial), "E");
  EXPECT_EQ(run(plan, 2), "RR") << "the graph survives a step of another size";
  EXPECT_EQ(plan.captures(), 1);
}

TEST(StepGraphPlan, ChangedBatchBuffersCaptureAgain) {
  StepGraphPlan plan(true, kRows, 1);
  EXPECT_EQ(run(plan, 3), "ECR");
  const StepShape moved{kRows, &images_b, &labels_a};
  EXPECT_EQ(run(plan, 2, moved), "CR") << "new images pointer";
  EXPECT_EQ(run(plan, 2), "CR") << "back to the first pointer: one graph is kept, so capture again";
  const StepShape labels_moved{kRows, &images_a, &images_b};
  EXPECT_EQ(run(plan, 1, labels_moved), "C") << "new labels pointer";
  EXPECT_EQ(plan.captures(), 4);
}

TEST(StepGraphPlan, AnEvaluationPassInBetweenCapturesAgain) {
  StepGraphPlan plan(true, kRows, 2);
  std::string actions;
  for (int epoch = 0; epoch < 3; ++epoch) {  // 4 steps an epoch, an evaluation after each
    actions += run(plan, 4) + "|";
    plan.invalidate();
  }
  EXPECT_EQ(actions, "EECR|CRRR|CRRR|");
  EXPECT_EQ(plan.captures(), 3);
}

TEST(StepGraphPlan, AnEvaluationDuringWarmupDoesNotEndIt) {
  StepGraphPlan plan(true, kRows, 2);
  EXPECT_EQ(run(plan, 1), "E");
  plan.invalidate();
  EXPECT_EQ(run(plan, 3), "ECR");
}

TEST(StepGraphPlan, AFailedCaptureTurnsGraphsOffForTheRestOfTheRun) {
  StepGraphPlan plan(true, kRows, 1);
  EXPECT_EQ(run(plan, 2), "EC");
  plan.disable();
  EXPECT_FALSE(plan.enabled());
  EXPECT_EQ(run(plan, 3), "EEE");
  plan.invalidate();
  EXPECT_EQ(run(plan, 1), "E");
}

}  // namespace
