// bin/train --gpus N's launcher (dist/local_launch.h), with /bin/sh scripts as the ranks: each rank
// gets its variables, the first failure decides the exit code and stops the others, and SIGTERM is
// passed on to every rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/elapsed.h"
#include "core/flags.h"
#include "dist/local_launch.h"
#include "dist/socket.h"
#include "support/test_files.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

LocalLaunch shell(const std::string& script, int ranks) {
  LocalLaunch l;
  l.program = "/bin/sh";
  l.args = {"-c", script};
  l.ranks = ranks;
  l.port = 29999;
  l.grace_s = 5;
  return l;
}

}  // namespace

TEST(LocalLaunch, GpusFlagIsRemovedFromTheRanksCommandLine) {
  const char* argv[] = {"train", "--gpus", "4", "--batch", "64", "--gpus=2", "--data=synthetic"};
  EXPECT_EQ(args_without_gpus(7, argv), (std::vector<std::string>{"--batch", "64", "--data=synthetic"}));
}

TEST(LocalLaunch, EachRankGetsItsVariablesAndNoOuterLaunchers) {
  test_files::TempDir dir;
  setenv("SLURM_PROCID", "0", 1);  // as in a Slurm allocation's shell: not for the ranks
  setenv("SLURM_NTASKS", "3", 1);
  setenv("SLURM_LOCALID", "0", 1);
  const int rc = run_local_ranks(shell("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                                       "${SLURM_PROCID:-none}\" > " + dir.path + "/rank$RANK", 3));
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  unsetenv("SLURM_LOCALID");
  EXPECT_EQ(rc, 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(read_file(dir.path + "/rank" + std::to_string(r)),
              std::to_string(r) + " 3 " + std::to_string(r) + " 3 127.0.0.1 29999 none\n");
}

TEST(LocalLaunch, FirstFailureDecidesTheExitCodeAndStopsTheOthers) {
  testing::internal::CaptureStderr();
  const auto t0 = SteadyClock::now();
  const int rc = run_local_ranks(shell("trap 'kill $! 2>/dev/null; exit 143' TERM; if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 20 & wait", 3));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 3);
  EXPECT_LT(seconds_since(t0), 10);  // the sleeping ranks were stopped
  EXPECT_EQ(err, "error: --gpus: rank 1 exited with code 3 first; the other ranks were stopped\n");
}

TEST(LocalLaunch, ARankKilledByASignalIsNamed) {
  testing::internal::CaptureStderr();
  const int rc = run_local_ranks(shell("trap 'kill $! 2>/dev/null; exit 143' TERM; if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 20 & wait", 2));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 128 + SIGKILL);
  EXPECT_NE(err.find("rank 0 was killed by signal"), std::string::npos) << err;
}

TEST(LocalLaunch, SigtermIsPassedOnToEveryRank) {
  test_files::TempDir dir;
  std::thread terminate([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(getpid(), SIGTERM);
  });
  const int rc = run_local_ranks(
      shell("trap 'echo stopped > " + dir.path + "/term$RANK; kill $! 2>/dev/null; exit 0' TERM; sleep 20 & wait", 2));
  terminate.join();
  EXPECT_EQ(rc, 0);  // each rank stopped cleanly, as bin/train does after saving
  EXPECT_EQ(read_file(dir.path + "/term0"), "stopped\n");
  EXPECT_EQ(read_file(dir.path + "/term1"), "stopped\n");
}

TEST(LocalLaunch, GpusInsideALauncherIsRefused) {
  auto env = [](std::initializer_list<std::pair<const char*, const char*>> vars) {
    return [vars](const char* n) -> const char* {
      for (const auto& [k, v] : vars)
        if (std::string(k) == n) return v;
      return nullptr;
    };
  };
  EXPECT_THROW(check_gpus_flag_allowed(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), UsageError);
  EXPECT_THROW(check_gpus_flag_allowed(env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}})), UsageError);
  EXPECT_NO_THROW(check_gpus_flag_allowed(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}})));
  EXPECT_NO_THROW(check_gpus_flag_allowed(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})));
}

TEST(LocalLaunch, FreePortIsFree) {
  const int port = free_local_port();
  EXPECT_GT(port, 0);
  EXPECT_NO_THROW(listen_on(port));
}

// The launcher counts the GPUs the ranks will see without CUDA (whose set-up in the launcher would
// delay every rank): the driver's entries, cut by CUDA_VISIBLE_DEVICES as CUDA cuts it.
TEST(LocalLaunch, GpusAreCountedFromTheDriversEntriesAndTheVisibleList) {
  test_files::TempDir proc("gpus");
  EXPECT_EQ(gpus_without_cuda(proc / "missing", nullptr), -1) << "no driver: CUDA says why";
  EXPECT_EQ(gpus_without_cuda(proc.path, nullptr), -1) << "a driver without GPUs: CUDA says why";
  for (const char* pci : {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"})
    std::filesystem::create_directory(proc / pci);
  EXPECT_EQ(gpus_without_cuda(proc.path, nullptr), 4);
  EXPECT_EQ(gpus_without_cuda(proc.path, "2,3"), 2);
  EXPECT_EQ(gpus_without_cuda(proc.path, "3"), 1);
  EXPECT_EQ(gpus_without_cuda(proc.path, "0, 1"), 2) << "spaces aside";
  EXPECT_EQ(gpus_without_cuda(proc.path, "GPU-8f2c"), -1) << "UUIDs: CUDA counts";
  EXPECT_EQ(gpus_without_cuda(proc.path, "MIG-1a,MIG-2b"), -1) << "MIG: CUDA shows one instance";
  EXPECT_EQ(gpus_without_cuda(proc.path, "0,0"), -1) << "a repeat: CUDA shows none, and says so";
  EXPECT_EQ(gpus_without_cuda(proc.path, "0,1,7,2"), 2) << "CUDA stops at the first device that does not exist";
  EXPECT_EQ(gpus_without_cuda(proc.path, "0,x"), 1);
  EXPECT_EQ(gpus_without_cuda(proc.path, "-1"), 0);
  EXPECT_EQ(gpus_without_cuda(proc.path, ""), 0);
  EXPECT_EQ(gpus_without_cuda(proc.path, "99999999"), 0);
}
