// bin/train --gpus N: the program starts N ranks of itself on this machine, as torchrun would (each
// a fork+exec of this executable with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a
// free MASTER_PORT), passes SIGINT/SIGTERM on to them, waits for all, and exits with the first
// failing rank's code after one line naming it; the other ranks are then stopped (SIGTERM, and
// SIGKILL after a grace period).
#pragma once

#include <string>
#include <vector>

#include "dist/launch_env.h"

struct LocalLaunch {
  std::string program;              // the executable to start (this one: /proc/self/exe)
  std::vector<std::string> args;    // argv[1..] for every rank (without --gpus)
  int ranks = 2;
  int port = 0;                     // MASTER_PORT; 0: a free port of 127.0.0.1
  double grace_s = 60;              // after a failure, how long the others get to stop before SIGKILL
};

// The command line without --gpus N / --gpus=N.
std::vector<std::string> args_without_gpus(int argc, const char* const* argv);
// A TCP port that is free on 127.0.0.1 right now.
int free_local_port();
// The executable of this process.
std::string this_executable();
// Refuses --gpus inside a launcher that already made this process one rank of several (a UsageError).
void check_gpus_flag_allowed(const EnvLookup& env);

// The GPUs the ranks will be shown, counted without CUDA: the driver's entries in `gpus_dir`
// (/proc/driver/nvidia/gpus), or as many as `visible` (CUDA_VISIBLE_DEVICES, nullptr: unset) names
// before its first entry CUDA would refuse. -1 where the driver lists none, or `visible` holds what
// only CUDA reads for sure (UUIDs, MIG instances, a repeated index): then CUDA counts, and says why.
// (CUDA's own count, in this process, would cost 0.5-1 s of driver set-up that every rank, started
// after it, waits out: measured 1.1 s on a 4-GPU H100 host, 2026-11-27.)
int gpus_without_cuda(const std::string& gpus_dir, const char* visible);

// Starts the ranks and waits for them; returns the exit code the launcher should exit with.
int run_local_ranks(const LocalLaunch& l);

// bin/train --gpus N as a whole: checks that this machine has N GPUs and that no launcher started
// this process already, then runs this executable's command line (without --gpus) on N ranks.
// MASTER_PORT is kept when set. Throws UsageError / InputError.
int launch_local_ranks(int argc, const char* const* argv, int gpus, double timeout_s);
