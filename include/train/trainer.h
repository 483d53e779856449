// The training program: data, GPU set-up, the epoch loop, evaluation, checkpoints and reports.
#pragma once

#include "train/build.h"
#include "train/options.h"

// Runs training as the options say, with the optimizations of `build`; returns the process exit
// code. Throws Fatal / InputError.
int train_main(const BuildSettings& build, const Options& opt);
