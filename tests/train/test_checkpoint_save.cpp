// Atomic checkpoint saves (checkpoint.h): a failed save leaves the old file intact, and a process
// killed at any moment of a save leaves a checkpoint that loads, the last completed one or newer.
#include <gtest/gtest.h>

#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>

#include "train/checkpoint.h"
#include "core/errors.h"
#include "support/test_files.h"
#include "checkpoint_test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;       // TempDir
using namespace checkpoint_test;  // sample, expect_same

TEST(CheckpointSave, FailedSaveLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir / "ck.bin";
  const Checkpoint old = sample(2000, 50);
  save_checkpoint(path, old);
  // The temporary file cannot be created: the directory takes no new files. Checked in a child
  // that drops to user "nobody", since root writes anywhere.
  chmod(dir.path.c_str(), 0555);
  EXPECT_EXIT(
      {
        if (geteuid() == 0 && setuid(65534) != 0) _exit(3);
        try {
          save_checkpoint(path, sample(2000, 50, 1));
        } catch (const Fatal& e) {
          std::fprintf(stderr, "%s\n", e.what());
          _exit(0);
        }
        _exit(1);
      },
      ::testing::ExitedWithCode(0), "ck.bin.tmp-[0-9]+-[0-9]+: cannot create: Permission denied");
  chmod(dir.path.c_str(), 0755);
  expect_same(load_checkpoint(path), old);
  // The target is a directory: the rename fails, and no temporary file is left behind.
  const std::string as_dir = dir / "dir.bin";
  fs::create_directory(as_dir);
  EXPECT_THROW(save_checkpoint(as_dir, old), Fatal);
  EXPECT_TRUE(temporary_files_of(as_dir).empty());
  // A missing directory names the path.
  try {
    save_checkpoint(dir / "missing/ck.bin", old);
    ADD_FAILURE() << "saving into a missing directory should fail";
  } catch (const Fatal& e) {
    EXPECT_HAS(e.what(), dir / "missing/ck.bin");
  }
  expect_same(load_checkpoint(path), old);
}

// Weights of "version" v: every element is a function of (v, i), so a file mixing two saves, or a
// partial one, can be recognised even if its checksum happened to pass.
Checkpoint versioned(int v, size_t n) {
  Checkpoint c = sample(4, 2);
  c.meta.step = v;  // in epoch 0
  c.meta.epoch = 0;
  c.meta.step_in_epoch = v;
  c.meta.skipped_steps = 0;
  c.meta.params = n;
  c.meta.running = 1024;
  c.master.assign(n, 0.f);
  c.momentum.assign(n, 0.f);
  c.running.assign(1024, static_cast<float>(v));
  for (size_t i = 0; i < n; ++i) {
    c.master[i] = static_cast<float>(v) + static_cast<float>(i % 1000) * 1e-3f;
    c.momentum[i] = -static_cast<float>(v);
  }
  return c;
}

// Polls `done` every 0.2 ms for up to `seconds`; true once it holds.
bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    usleep(200);
  }
  return true;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

TEST(CheckpointSave, KilledMidSaveLeavesALoadableCheckpoint) {
  TempDir dir;
  const std::string path = dir / "ck.bin";
  // The save's temporary file (path.tmp-<pid>-<n>, AtomicFile): there while a save is under way.
  const auto saving = [&] { return !temporary_files_of(path).empty(); };
  const size_t n = 2'500'000;  // 2 arrays x 10 MB: a save takes long enough to be interrupted
  save_checkpoint(path, versioned(0, n));
  std::mt19937 rng(1234);
  int mid_save_kills = 0, last = 0;
  for (int round = 0; round < 20; ++round) {
    // The previous round's half-written file.
    for (const std::string& f : temporary_files_of(path)) fs::remove(dir / f);
    int done[2];
    ASSERT_EQ(pipe(done), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {
      // Keep saving ever newer versions until killed, telling the parent after each save. No gtest,
      // no exit handlers in here.
      close(done[0]);
      fcntl(done[1], F_SETFL, O_NONBLOCK);
      try {
        for (int v = last + 1;; ++v) {
          save_checkpoint(path, versioned(v, n));
          const char b = 1;
          if (write(done[1], &b, 1) < 0) {}  // a full pipe is fine: the parent reads only the first
        }
      } catch (...) {
      }
      _exit(3);
    }
    close(done[1]);
    // Time the writing phase of the child's first save (from its temporary file's appearance to the
    // save's end), then kill the second save at a random moment from its temporary file's appearance
    // to twice that time later: inside write, fsync, rename or the directory's fsync, or just after,
    // whatever the disk's speed.
    const bool first_started = wait_until([&] { return saving() || readable(done[0]); }, 30);
    const auto t_tmp = std::chrono::steady_clock::now();
    const bool first_done = first_started && wait_until([&] { return readable(done[0]); }, 30);
    const double write_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t_tmp).count();
    const bool second_started = first_done && wait_until(saving, 30);
    if (second_started) usleep(std::uniform_int_distribution<int>(0, static_cast<int>(2 * write_us) + 1000)(rng));
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    close(done[0]);
    ASSERT_TRUE(second_started) << "the saver did not get through one save and into the next in time";
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver stopped by itself (status " << status << ")";
    mid_save_kills += saving();
    Checkpoint c;
    try {
      c = load_checkpoint(path);
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": after the kill the checkpoint does not load: " << e.what();
    }
    const int v = static_cast<int>(c.meta.step);
    ASSERT_GT(v, last) << "round " << round << ": the save completed before the kill is gone";
    ASSERT_EQ(c.master.size(), n);
    for (size_t i = 0; i < n; i += 4999)
      ASSERT_EQ(c.master[i], static_cast<float>(v) + static_cast<float>(i % 1000) * 1e-3f) << "round " << round;
    ASSERT_EQ(c.momentum[n - 1], -static_cast<float>(v));
    last = v;
  }
  EXPECT_GT(mid_save_kills, 0) << "no kill landed while a temporary file was being written";
}

}  // namespace
