// bin/train (and each rung of the ladder): parse flags, run (or, with --gpus N, start N ranks of
// itself: dist/local_launch.h), and turn every failure into one line and an exit code: 2 for a bad
// command line, 1 for anything else (bad data, no GPU, a CUDA error, divergence). This file is
// compiled once per variant: it alone reads the switchboard.
#include <cstdio>

#include "core/errors.h"
#include "dist/local_launch.h"
#include "settings.h"
#include "train/options.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::printf("%s\nthis build: %s\n", usage_text().c_str(), kBuild.describe().c_str());
    return 0;
  }
  try {
    if (opt.gpus > 1) return launch_local_ranks(argc, argv, opt.gpus, opt.dist_timeout);
    return train_main(kBuild, opt);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
