// The kinds of batch norm fused into the convolutions, by cuDNN (model/fused_conv.h says what each
// computes) or, for bin/predict's 1x1 convs, by cuBLASLt (model/gemm_conv.h), by name: for people,
// and the short stable names that the autotune cache's keys and the programs' --no-fuse flag use.
// No CUDA here: the flag parsers (and their fuzz targets) read it.
#pragma once

#include <string>

enum class FusedPattern {
  ConvStats, SbrConvStats, SbrWgrad, DgradDreluDbn,  // training (cuDNN)
  ConvBn, ConvBnRelu, ConvBnAddRelu,                 // inference (cuDNN)
  GemmBn, GemmBnRelu, GemmBnAddRelu                  // inference, 1x1 convs (cuBLASLt)
};

const char* fused_pattern_name(FusedPattern p);  // "scale-bias-ReLU + weight gradient"
const char* fused_pattern_slug(FusedPattern p);  // "sbr-wgrad"
constexpr unsigned fused_pattern_bit(FusedPattern p) { return 1u << static_cast<unsigned>(p); }
// --no-fuse's value: a comma list of slugs, "all" or "none", as a set of fused_pattern_bit()s. Throws
// std::invalid_argument naming an unknown or empty item and listing the slugs.
unsigned parse_fused_pattern_list(const std::string& list);
// Such a set as text: "none", "all", or its slugs in the enum's order, comma-separated (one spelling
// per set: what ranks compare).
std::string fused_pattern_list_text(unsigned bits);
// --no-fuse's help, the same in both programs.
constexpr const char* kNoFuseHelp =
    "fused batch-norm patterns to run plain, to measure what each buys (fusedbn builds): a comma list of "
    "conv-stats, sbr-conv-stats, sbr-wgrad, dgrad-drelu-dbn (training), conv-bn, conv-bn-relu, conv-bn-add-relu, "
    "gemm-bn, gemm-bn-relu, gemm-bn-add-relu (bin/predict), or all";
// The warning of a build that fuses nothing (OPT_FUSED_BN=0) given --no-fuse.
constexpr const char* kNoFuseWithoutFusion =
    "--no-fuse has no effect: this build does not fuse batch norm into the convolutions (OPT_FUSED_BN=0)";
