// Fused batch-norm patterns by name (model/fused_patterns.h).
#include "model/fused_patterns.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace {
constexpr FusedPattern kAllPatterns[] = {FusedPattern::ConvStats,     FusedPattern::SbrConvStats, FusedPattern::SbrWgrad,
                                         FusedPattern::DgradDreluDbn, FusedPattern::ConvBn,       FusedPattern::ConvBnRelu,
                                         FusedPattern::ConvBnAddRelu, FusedPattern::GemmBn,     FusedPattern::GemmBnRelu,
                                         FusedPattern::GemmBnAddRelu};
}  // namespace

const char* fused_pattern_name(FusedPattern p) {
  switch (p) {
    case FusedPattern::ConvStats: return "conv + statistics";
    case FusedPattern::SbrConvStats: return "scale-bias-ReLU + conv + statistics";
    case FusedPattern::SbrWgrad: return "scale-bias-ReLU + weight gradient";
    case FusedPattern::DgradDreluDbn: return "data gradient + ReLU backward + BN backward weights";
    case FusedPattern::ConvBn: return "conv + BN";
    case FusedPattern::ConvBnRelu: return "conv + BN + ReLU";
    case FusedPattern::ConvBnAddRelu: return "conv + BN + residual add + ReLU";
    case FusedPattern::GemmBn: return "1x1 conv as a cuBLASLt GEMM + BN";
    case FusedPattern::GemmBnRelu: return "1x1 conv as a cuBLASLt GEMM + BN + ReLU";
    default: return "1x1 conv as a cuBLASLt GEMM + BN + residual add + ReLU";
  }
}

// Stable names, not the enum's values: a reordered enum must not mix up cached plans.
const char* fused_pattern_slug(FusedPattern p) {
  switch (p) {
    case FusedPattern::ConvStats: return "conv-stats";
    case FusedPattern::SbrConvStats: return "sbr-conv-stats";
    case FusedPattern::SbrWgrad: return "sbr-wgrad";
    case FusedPattern::DgradDreluDbn: return "dgrad-drelu-dbn";
    case FusedPattern::ConvBn: return "conv-bn";
    case FusedPattern::ConvBnRelu: return "conv-bn-relu";
    case FusedPattern::ConvBnAddRelu: return "conv-bn-add-relu";
    case FusedPattern::GemmBn: return "gemm-bn";
    case FusedPattern::GemmBnRelu: return "gemm-bn-relu";
    default: return "gemm-bn-add-relu";
  }
}

std::string fused_pattern_list_text(unsigned bits) {
  std::string text;
  int count = 0;
  for (FusedPattern p : kAllPatterns)
    if (bits & fused_pattern_bit(p)) text += std::string(count++ ? "," : "") + fused_pattern_slug(p);
  if (count == 0) return "none";
  return count == int(std::size(kAllPatterns)) ? "all" : text;
}

unsigned parse_fused_pattern_list(const std::string& list) {
  if (list == "none") return 0;  // the default, spelled out
  std::string names;
  for (FusedPattern p : kAllPatterns) names += std::string(names.empty() ? "" : ", ") + fused_pattern_slug(p);
  unsigned bits = 0;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    unsigned bit = 0;
    if (item == "all") bit = ~0u;
    for (FusedPattern p : kAllPatterns)
      if (item == fused_pattern_slug(p)) bit = fused_pattern_bit(p);
    if (!bit)
      throw std::invalid_argument((item.empty() ? std::string("an empty item") : "'" + item + "'") +
                                  " is not a pattern: give a comma list of " + names + ", or all");
    bits |= bit;
    if (end == list.size()) return bits;
    begin = end + 1;
  }
}
