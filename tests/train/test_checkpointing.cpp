// Which save --save FILE holds (checkpointing.h, SaveKeeper): periodic saves wait in FILE.pending
// until a read proves them, end-of-run saves go straight to their path, and after a divergence the
// message says what FILE holds; a save that fails goes to a rescue file. Checkpoints here are made
// on the host; no GPU needed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "support/test_files.h"
#include "train/checkpointing.h"

namespace {

using test_files::TempDir;

Checkpoint at_step(long step, int skipped = 0) {
  Checkpoint c;
  c.meta.precision = "fp32";
  c.meta.layout = "NCHW";
  c.meta.step = step;  // in epoch 0 of 1
  c.meta.step_in_epoch = static_cast<int>(step);
  c.meta.epochs = 1;
  c.meta.batch = 1;
  c.meta.params = 1;
  c.meta.skipped_steps = skipped;
  c.master = {float(step)};
  c.momentum = {0.f};
  return c;
}

long step_in(const std::string& path) { return static_cast<long>(load_checkpoint(path).meta.step); }

Options saving_to(const TempDir& dir, long every) {
  Options o;
  o.save = dir / "run.ckpt";
  o.save_every = every;
  return o;
}

TEST(SaveKeeper, APeriodicSaveBecomesTheFileOnlyOnceProven) {
  TempDir dir;
  Options o = saving_to(dir, 10);
  SaveKeeper k(o);
  EXPECT_TRUE(k.due(20));
  EXPECT_FALSE(k.due(21));
  k.save(at_step(10), o.save, true);
  EXPECT_FALSE(std::filesystem::exists(o.save));
  EXPECT_EQ(step_in(o.save + ".pending"), 10);
  k.on_read(10, 0, false);
  EXPECT_FALSE(std::filesystem::exists(o.save)) << "a read of the saved state itself proves nothing";
  k.on_read(11, 0, false);
  EXPECT_EQ(step_in(o.save), 10);
  EXPECT_FALSE(std::filesystem::exists(o.save + ".pending"));
}

TEST(SaveKeeper, TheFinalSaveGoesStraightToItsPathAndDropsAnUnprovenPendingOne) {
  TempDir dir;
  Options o = saving_to(dir, 5);
  SaveKeeper k(o);
  k.save(at_step(5), o.save, true);
  k.save(at_step(5), o.save, false);
  EXPECT_EQ(step_in(o.save), 5);
  EXPECT_FALSE(std::filesystem::exists(o.save + ".pending"));
}

TEST(SaveKeeper, AfterADivergenceSaysWhatTheFileHolds) {
  TempDir dir;
  Options o = saving_to(dir, 1);
  {
    SaveKeeper k(o);
    EXPECT_EQ(k.after_divergence(0), "; no checkpoint was kept (no periodic save was shown good before the divergence)");
  }
  {
    SaveKeeper k(o);
    k.save(at_step(3), o.save, true);
    k.on_read(4, 0, false);
    k.save(at_step(4), o.save, true);
    EXPECT_EQ(k.after_divergence(0), "; " + o.save + " keeps its last good state (step 3)");
    EXPECT_FALSE(std::filesystem::exists(o.save + ".pending")) << "the unproven save is deleted";
  }
  SaveKeeper before(o);  // FILE existed before this run
  EXPECT_EQ(before.after_divergence(0), "; " + o.save + " keeps what it held before this run");
  o.resume = o.save;
  SaveKeeper resumed(o);
  EXPECT_EQ(resumed.after_divergence(40), "; " + o.save + " keeps the state this run resumed from (step 40)");
  o.save.clear();
  EXPECT_EQ(SaveKeeper(o).after_divergence(0), "");
}

// ---- a save that fails during the run (the disk filled up, the directory went away) -------------

// The message of the Fatal a failing save raises ("" and a failure when none was raised).
std::string save_failure(SaveKeeper& k, const Checkpoint& c, const std::string& to, bool periodic) {
  try {
    k.save(c, to, periodic);
  } catch (const Fatal& e) {
    return e.what();
  }
  ADD_FAILURE() << "the save to " << to << " did not fail";
  return "";
}

TEST(SaveKeeper, AFailedSaveGoesToTheRescueFileAndSaysHowToResume) {
  TempDir dir, rescue;
  std::filesystem::create_directory(dir / "out");
  Options o;
  o.save = dir / "out/run.ckpt";
  SaveKeeper k(o, {rescue.path});
  std::filesystem::remove_all(dir / "out");  // gone mid-run
  const std::string m = save_failure(k, at_step(42), o.save, false);
  const std::string kept = rescue / ("rescue-" + std::to_string(getpid()) + ".ckpt");
  EXPECT_HAS(m, "cannot save the checkpoint of step 42 to " + o.save);
  EXPECT_HAS(m, "saved it to " + kept + " instead: continue with --resume " + kept);
  EXPECT_EQ(step_in(kept), 42) << "the rescued state is the one that could not be saved";
}

TEST(SaveKeeper, APeriodicSaveThatFailsIsRescuedToo) {
  TempDir dir, rescue;
  std::filesystem::create_directory(dir / "out");
  Options o;
  o.save = dir / "out/run.ckpt";
  o.save_every = 5;
  SaveKeeper k(o, {rescue.path});
  std::filesystem::remove_all(dir / "out");
  const std::string m = save_failure(k, at_step(5), o.save, true);
  EXPECT_HAS(m, o.save + ".pending");
  EXPECT_HAS(m, "--resume " + rescue.path);
}

TEST(SaveKeeper, TheNextRescueDirectoryIsTriedAndAFailureOfAllSaysTheStateIsLost) {
  TempDir dir, rescue;
  Options o;
  o.save = dir / "gone/run.ckpt";
  SaveKeeper k(o, {dir / "also-gone", rescue.path});
  EXPECT_HAS(save_failure(k, at_step(7), o.save, false), "saved it to " + rescue.path);
  SaveKeeper nowhere(o, {dir / "also-gone"});
  const std::string m = save_failure(nowhere, at_step(7), o.save, false);
  EXPECT_HAS(m, "nor to a rescue file");
  EXPECT_HAS(m, "also-gone");
  EXPECT_HAS(m, "this state is lost");
}

TEST(SaveKeeper, TheDefaultRescueDirectoriesAreTheWorkingDirectoryThenTmp) {
  const std::vector<std::string> dirs = default_rescue_dirs();
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], std::filesystem::current_path().string());
  const char* tmp = std::getenv("TMPDIR");
  EXPECT_EQ(dirs[1], tmp && *tmp ? tmp : "/tmp");
}

}  // namespace
