// What each rank prints and which part of the data it takes (ranks.h).
#include "train/ranks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

void Ranks::silence_stdout_unless_writing() const {
  if (writes()) return;
  std::fflush(stdout);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDOUT_FILENO);
    ::close(null_fd);
  }
}

std::string Ranks::prefix() const { return several() ? "rank " + std::to_string(launch_.rank) + ": " : ""; }

void Ranks::warn_once(const std::string& w) const {
  if (launch_.is_root()) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

void Ranks::warn_once_per_machine(const std::string& w) const {
  if (launch_.local_rank == 0) std::fprintf(stderr, "%swarning: %s\n", prefix().c_str(), w.c_str());
}

EpochPlan Ranks::my_part(EpochPlan p) const {
  return several() ? shard_plan(std::move(p), launch_.rank, launch_.world) : p;
}
