// Fused batch-norm patterns by name (model/fused_patterns.h).
#include "model/fused_patterns.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace {
// Each pattern's name for people and its slug, in the enum's order. Slugs are stable names, not the
// enum's values: a reordered enum must not mix up cached plans.
struct PatternNames {
  FusedPattern pattern;
  const char* name;
  const char* slug;
};
constexpr PatternNames kPatterns[] = {
    {FusedPattern::ConvStats, "conv + statistics", "conv-stats"},
    {FusedPattern::SbrConvStats, "scale-bias-ReLU + conv + statistics", "sbr-conv-stats"},
    {FusedPattern::SbrWgrad, "scale-bias-ReLU + weight gradient", "sbr-wgrad"},
    {FusedPattern::DgradDreluDbn, "data gradient + ReLU backward + BN backward weights", "dgrad-drelu-dbn"},
    {FusedPattern::ConvBn, "conv + BN", "conv-bn"},
    {FusedPattern::ConvBnRelu, "conv + BN + ReLU", "conv-bn-relu"},
    {FusedPattern::ConvBnAddRelu, "conv + BN + residual add + ReLU", "conv-bn-add-relu"},
    {FusedPattern::GemmBn, "1x1 conv as a cuBLASLt GEMM + BN", "gemm-bn"},
    {FusedPattern::GemmBnRelu, "1x1 conv as a cuBLASLt GEMM + BN + ReLU", "gemm-bn-relu"},
    {FusedPattern::GemmBnAddRelu, "1x1 conv as a cuBLASLt GEMM + BN + residual add + ReLU", "gemm-bn-add-relu"}};

const PatternNames& names_of(FusedPattern p) {
  return *std::find_if(std::begin(kPatterns), std::end(kPatterns), [&](const PatternNames& n) { return n.pattern == p; });
}
}  // namespace

const char* fused_pattern_name(FusedPattern p) { return names_of(p).name; }
const char* fused_pattern_slug(FusedPattern p) { return names_of(p).slug; }

std::string fused_pattern_list_text(unsigned bits) {
  std::string text;
  int count = 0;
  for (const PatternNames& n : kPatterns)
    if (bits & fused_pattern_bit(n.pattern)) text += std::string(count++ ? "," : "") + n.slug;
  if (count == 0) return "none";
  return count == int(std::size(kPatterns)) ? "all" : text;
}

unsigned parse_fused_pattern_list(const std::string& list) {
  if (list == "none") return 0;  // the default, spelled out
  std::string names;
  for (const PatternNames& n : kPatterns) names += std::string(names.empty() ? "" : ", ") + n.slug;
  unsigned bits = 0;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    unsigned bit = 0;
    if (item == "all") bit = ~0u;
    for (const PatternNames& n : kPatterns)
      if (item == n.slug) bit = fused_pattern_bit(n.pattern);
    if (!bit)
      throw std::invalid_argument((item.empty() ? std::string("an empty item") : "'" + item + "'") +
                                  " is not a pattern: give a comma list of " + names + ", or all");
    bits |= bit;
    if (end == list.size()) return bits;
    begin = end + 1;
  }
}
