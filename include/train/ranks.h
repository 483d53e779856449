// This process among the ranks of a run (one rank when no launcher started it): who prints and who
// writes files, and which part of each pass over the data is its own.
#pragma once

#include <string>

#include "data/augment.h"
#include "dist/launch_env.h"

class Ranks {
 public:
  explicit Ranks(const LaunchInfo& launch) : launch_(launch) {}
  const LaunchInfo& launch() const { return launch_; }
  bool several() const { return launch_.distributed(); }
  // Rank 0 alone writes files and prints to stdout; the others print nothing but their errors.
  bool writes() const { return launch_.is_root(); }
  void silence_stdout_unless_writing() const;
  // "rank N: " before each line a rank of several prints, "" for a rank alone.
  std::string prefix() const;
  // A warning every rank finds alike (about the data, the checkpoint) is printed by rank 0 alone: N
  // ranks would print it N times. One about a file of this machine (the autotune cache) is printed
  // by each machine's first rank, with its rank.
  void warn_once(const std::string& w) const;
  void warn_once_per_machine(const std::string& w) const;
  // Images per step over all ranks, and this rank's part of a pass.
  int global_batch(int batch) const { return batch * launch_.world; }
  EpochPlan my_part(EpochPlan p) const;

 private:
  LaunchInfo launch_;
};
