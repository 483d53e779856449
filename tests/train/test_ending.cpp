// What each ending of a run saves, and where (ending.h): the one table the trainer follows.
#include <gtest/gtest.h>

#include "train/ending.h"

namespace {

TEST(EndingSavePath, AFinishedRunSavesToSaveOnlyWhenGiven) {
  EXPECT_EQ(ending_save_path(Ending::Finished, "run.ckpt", false), "run.ckpt");
  EXPECT_EQ(ending_save_path(Ending::Finished, "run.ckpt", true), "run.ckpt");
  EXPECT_EQ(ending_save_path(Ending::Finished, "", false), "");
}

TEST(EndingSavePath, ARunStoppedEarlyWithGoodWeightsSavesToSaveOrInterrupted) {
  for (Ending e : {Ending::Signal, Ending::OutputFailed, Ending::BadImage}) {
    EXPECT_EQ(ending_save_path(e, "run.ckpt", false), "run.ckpt");
    EXPECT_EQ(ending_save_path(e, "", false), "interrupted.ckpt");
  }
  EXPECT_EQ(ending_save_path(Ending::Signal, "", true), "interrupted.ckpt");  // every rank stops at one step
  EXPECT_EQ(ending_save_path(Ending::OutputFailed, "run.ckpt", true), "run.ckpt");
}

TEST(EndingSavePath, NothingIsSavedAfterADivergenceNorAfterABadImageOnSeveralRanks) {
  EXPECT_EQ(ending_save_path(Ending::Diverged, "run.ckpt", false), "");
  EXPECT_EQ(ending_save_path(Ending::Diverged, "", true), "");
  EXPECT_EQ(ending_save_path(Ending::BadImage, "run.ckpt", true), "");  // the other ranks are elsewhere
}

}  // namespace
