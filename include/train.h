// The training program: data, GPU set-up, the epoch loop, evaluation, checkpoints and reports.
#pragma once

#include "options.h"

// Runs training as the options say; returns the process exit code. Throws Fatal / InputError.
int train_main(const Options& opt);

// The build's settings as the start-up line and the --help footer show them.
std::string describe_build();
