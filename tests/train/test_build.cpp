// The build's settings as the names and the start-up line users read (train/build.h).
#include "train/build.h"

#include <gtest/gtest.h>

namespace {

BuildSettings all_on() {
  return {true, LoaderKind::PinnedRing, AlgoPolicy::Autotune, DType::F16, Layout::NHWC, ConvApi::Graph,
          true, true, "train", true, true};
}

TEST(BuildSettings, NamesEveryRungInLadderOrder) {
  const std::vector<std::string> want{"devloss", "pinned", "autotune", "fp16", "nhwc",
                                      "graph", "fusedbn", "cudagraph", "wgradstream"};
  EXPECT_EQ(all_on().optimizations(), want);
  BuildSettings cudagraph = all_on();
  cudagraph.wgrad_stream = false;
  cudagraph.variant = "train-cudagraph";
  EXPECT_EQ(cudagraph.optimizations(), std::vector<std::string>(want.begin(), want.end() - 1));
}

TEST(BuildSettings, TheStartLineSaysWhatEachRungDoes) {
  const std::string on = all_on().describe();
  EXPECT_EQ(on.rfind("train: optimizations [devloss pinned autotune fp16 nhwc graph fusedbn cudagraph wgradstream] -> ", 0),
            0u) << on;
  EXPECT_NE(on.find("weight gradients on a second stream"), std::string::npos) << on;
  BuildSettings off = all_on();
  off.wgrad_stream = false;
  EXPECT_EQ(off.describe().find("second stream"), std::string::npos) << off.describe();
  const BuildSettings none{false, LoaderKind::Synchronous, AlgoPolicy::Heuristic, DType::F32, Layout::NCHW,
                           ConvApi::Legacy, false, false, "train-baseline"};
  EXPECT_EQ(none.describe().rfind("train-baseline: optimizations [none: the baseline] -> ", 0), 0u) << none.describe();
}

}  // namespace
