// What fusing batch norm into the convolutions did for a whole network, for the start-up report,
// and the rule that decides, conv by conv, whether a pattern cuDNN accepted runs fused. No CUDA here.
#pragma once

#include <string>
#include <vector>

#include "model/fused_patterns.h"

// Whether a conv runs a pattern that cuDNN accepted fused: where both ways were measured (autotuning),
// the fused kernel costs no more than the plain conv plus the passes of our BN kernels that fusing
// saves. Times of -1 were not measured.
bool run_fused(float fused_ms, float unfused_ms);
constexpr const char* kSlowerThanUnfused = "measured slower than the plain conv with our BN kernels";
constexpr const char* kSwitchedOff = "switched off by --no-fuse";

// What trying the patterns for a whole network found, for the start-up report: a pattern that
// cuDNN refused or that measured slower is "not fused", with the reason.
struct FusionRefusal {
  std::string layer;   // "layer1.0.conv2"
  FusedPattern pattern;
  std::string why;
};
struct FusionReport {
  int tried = 0, fused = 0;
  int gemms = 0;              // of the fused, inference's 1x1 convs run as cuBLASLt GEMMs (model/gemm_conv.h)
  int half_coefficients = 0;  // fused patterns whose engines take the BN scale/bias in fp16
  bool off_for_determinism = false;  // --deterministic: nothing tried (see fusion_report_lines)
  double seconds = -1;   // building (and, autotuning, timing) the patterns took; -1: not given
  int plans = 0, plans_cached = 0;  // distinct pattern-shape plans built, and of them taken from the autotune cache
  std::vector<FusionRefusal> refused;
};
// The report as lines for people: how many patterns run fused, then one line per distinct refusal
// (pattern and reason) with the layers it hit.
std::vector<std::string> fusion_report_lines(const FusionReport& r);
