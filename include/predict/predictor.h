// bin/predict: a network trained by bin/train, run in inference mode over a data set, its outputs
// taken out of the GPU through the egress pipeline (pipeline/egress.h) and written as files.
//
// A batch is: get batch (the loader) -> compute (forward with BN running statistics) -> copy to CPU
// -> process output (probabilities, top-k, CSV rows, features), each in its NVTX range, as in seed
// 001's second case study; what each rung of the egress ladder changes is asked of EgressSettings
// here and in the copy engine only. Everything the user gave (flags, output paths, the checkpoint,
// the data) is checked before the GPU is touched; --export needs no GPU at all.
#pragma once

#include <string>

#include "pipeline/egress.h"
#include "predict/options.h"
#include "train/build.h"

// What the network runs with, from the training ladder's settings that inference uses: "fp16,
// NHWC, pinned-ring loader, autotune conv algorithms (cuDNN graph API)".
std::string network_description(const BuildSettings& build);

// Runs as the options say; returns the exit code. Throws Fatal / InputError (exit 1) and
// UsageError (exit 2, for what only the data set can tell: --top-k above its class count).
int predict_main(const BuildSettings& build, const EgressSettings& egress, const PredictOptions& opt);
