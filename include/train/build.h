// What a binary was built with: the optimizations of the ladder as plain values.
//
// The defines themselves are read in include/settings.h alone, which only the programs' mains
// (src/programs/) include; everything else receives a BuildSettings, so the trainer and its tests
// are compiled once and can run any combination.
#pragma once

#include <string>
#include <vector>

#include "core/types.h"

struct BuildSettings {
  bool device_loss;
  LoaderKind loader;
  AlgoPolicy algo;
  DType precision;
  Layout layout;
  ConvApi conv_api;
  bool fused_bn;    // batch norm fused into the convolutions
  bool cuda_graph;  // the step replayed as one CUDA graph
  const char* variant;
  bool ddp_overlap = true;  // several GPUs: gradient buckets all-reduced during backward, not after it
  bool wgrad_stream = false;  // each conv's weight gradient on a second stream, beside its data gradient

  // The optimizations that are on, in ladder order, as short names ("devloss", "pinned", ...).
  std::vector<std::string> optimizations() const;
  // The line the binary prints at start and under --help: its optimizations and what they mean.
  std::string describe() const;
};
