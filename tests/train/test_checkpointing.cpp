// Which save --save FILE holds (checkpointing.h, SaveKeeper): periodic saves wait in FILE.pending
// until a read proves them, end-of-run saves go straight to their path, and after a divergence the
// message says what FILE holds. Checkpoints here are made on the host; no GPU needed.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/test_files.h"
#include "train/checkpointing.h"

namespace {

using test_files::TempDir;

Checkpoint at_step(long step, int skipped = 0) {
  Checkpoint c;
  c.meta.precision = "fp32";
  c.meta.layout = "NCHW";
  c.meta.step = step;
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

}  // namespace
