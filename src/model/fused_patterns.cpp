// Fused batch-norm patterns by name, the fused-or-plain rule and the fusion report
// (model/fused_patterns.h).
#include "model/fused_patterns.h"

#include <algorithm>
#include <cstdio>
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
    {FusedPattern::OwnConvStats, "1x1 conv + statistics by a kernel of ours", "own-conv"},
    {FusedPattern::OwnJoinDgrad, "1x1 data gradient + the previous join's BN backward sums by a kernel of ours",
     "own-join-dgrad"},
    {FusedPattern::OwnDgradDbn, "1x1 data gradient + ReLU backward + BN backward sums by a kernel of ours",
     "own-dgrad-dbn"},
    {FusedPattern::OwnFinalize, "the BN finalize in the last CTA of each column of our 1x1 conv kernels",
     "own-finalize"},
    {FusedPattern::OwnPrologue, "the previous BN applied as our conv3 kernel reads its input", "own-prologue"},
    {FusedPattern::StoredConvStats, "conv2 + statistics reading relu(bn1(x)) stored for its weight gradient",
     "stored-conv-stats"},
    {FusedPattern::OwnStemConv, "the stem's conv + statistics by a kernel of ours", "own-stem-conv"},
    {FusedPattern::OwnStemWgrad, "the stem's weight gradient by a kernel of ours", "own-stem-wgrad"},
    {FusedPattern::OwnStemJoin, "layer1.0's conv1 data gradient + the stem's BN backward sums by a kernel of ours",
     "own-stem-join"},
    {FusedPattern::OwnJoinPrologue, "the previous block's join applied as our conv1 kernel reads its input",
     "own-join-prologue"},
    {FusedPattern::CompactShortcutDgrad, "a stride-2 shortcut's data gradient at its output pixels alone, read by conv1's join",
     "compact-shortcut-dgrad"},
    {FusedPattern::LaggingWgrad, "the weight gradients' stream up to three blocks behind the data gradients, on buffers of its own",
     "lagging-wgrad"},
    {FusedPattern::OwnConv3x3, "layer1's 3x3 conv + statistics by a kernel of ours", "own-conv3x3"},
    {FusedPattern::OwnDgrad3x3, "layer1's 3x3 data gradient + ReLU backward + BN backward sums by a kernel of ours",
     "own-dgrad3x3"},
    {FusedPattern::LaneGemmWgrad, "the weight gradients' stream's 1x1 convs as cuBLASLt GEMMs sized for half the SMs",
     "lane-gemm-wgrad"},
    {FusedPattern::OwnDgradWgrad, "a 1x1 conv's weight gradient taken by its data gradient kernel of ours from the same loads (layer1's conv3s and projection shortcut)",
     "own-dgrad-wgrad"},
    {FusedPattern::LaneCudnnSms, "the weight gradients' stream's cuDNN convs planned for three quarters of the SMs",
     "lane-cudnn-sms"},
    {FusedPattern::OwnJoinApply, "the join's BN backward apply made by a data gradient kernel of ours as it reads the join's dz (layer1's conv3s and projection shortcut)",
     "own-join-apply"},
    {FusedPattern::ChainedLaunch, "the chain's kernels of ours launched chained, each while the one before it ends (programmatic dependent launch)",
     "chained-launch"},
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

unsigned default_unfused_patterns(bool wgrad_beside) {
  const unsigned beside =
      wgrad_beside ? fused_pattern_bit(FusedPattern::SbrWgrad) | fused_pattern_bit(FusedPattern::OwnFinalize) : 0u;
  return beside | fused_pattern_bit(FusedPattern::OwnJoinPrologue);
}

bool run_fused(float fused_ms, float unfused_ms) {
  if (fused_ms < 0 || unfused_ms < 0) return true;  // not measured: fusion saves passes over memory
  return fused_ms <= unfused_ms;
}

std::vector<std::string> fusion_report_lines(const FusionReport& r) {
  if (r.off_for_determinism)
    return {"fused batch norm: off under --deterministic (cuDNN's fused statistics and gradients reduce in an order "
            "that changes from run to run); every conv runs as the plain conv with our BN kernels"};
  std::vector<std::string> lines;
  std::vector<std::string> notes;
  if (r.half_coefficients) notes.push_back(std::to_string(r.half_coefficients) + " read the BN scale/bias in fp16");
  if (r.seconds >= 0) {
    char s[64];
    std::snprintf(s, sizeof s, "chosen in %.1f s", r.seconds);
    notes.push_back(s);
  }
  if (r.plans_cached > 0)
    notes.push_back(std::to_string(r.plans_cached) + " of " + std::to_string(r.plans) +
                    " plans from the autotune cache");
  std::string noted;
  for (const std::string& n : notes) noted += (noted.empty() ? " (" : "; ") + n;
  const std::string how = r.gemms ? ": " + std::to_string(r.fused - r.gemms) + " through cuDNN, " +
                                         std::to_string(r.gemms) + " as cuBLASLt GEMMs with the BN folded into the filter"
                                   : " through cuDNN";
  lines.push_back("fused batch norm: " + std::to_string(r.fused) + " of " + std::to_string(r.tried) +
                  " conv patterns run fused" + how + (noted.empty() ? "" : noted + ")") +
                  (r.refused.empty() ? "" : "; the rest run as the plain conv and our BN kernels:"));
  std::vector<bool> done(r.refused.size(), false);
  for (size_t i = 0; i < r.refused.size(); ++i) {
    if (done[i]) continue;
    std::vector<std::string> layers;
    for (size_t j = i; j < r.refused.size(); ++j)
      if (!done[j] && r.refused[j].pattern == r.refused[i].pattern && r.refused[j].why == r.refused[i].why) {
        layers.push_back(r.refused[j].layer);
        done[j] = true;
      }
    std::string names;
    for (size_t k = 0; k < layers.size() && k < 3; ++k) names += (k ? ", " : "") + layers[k];
    if (layers.size() > 3) names += ", ...";
    lines.push_back("  " + std::string(fused_pattern_name(r.refused[i].pattern)) + " not fused for " +
                    std::to_string(layers.size()) + (layers.size() == 1 ? " conv (" : " convs (") + names +
                    "): " + r.refused[i].why);
  }
  if (r.own)
    lines.push_back("  and for " + std::to_string(r.own) +
                    " 1x1 stride-1 convs the forward with its BN statistics runs a kernel of ours in training "
                    "(kernels/conv1x1_stats.h), in place of cuDNN's pattern or the plain conv (--no-fuse own-conv: not)");
  if (r.own_join)
    lines.push_back("  and for " + std::to_string(r.own_join) +
                    " conv1s the data gradient takes the previous block's join backward as it is written, by a kernel "
                    "of ours (kernels/conv1x1_dgrad_join.h), in place of the plain data gradient and our reduction "
                    "pass (--no-fuse own-join-dgrad: not)");
  if (r.own_dgrad)
    lines.push_back("  and for " + std::to_string(r.own_dgrad) +
                    " conv3s the data gradient with the ReLU and BN backward sums runs a kernel of ours "
                    "(kernels/conv1x1_dgrad_bn.h), in place of cuDNN's pattern or the plain data gradient "
                    "(--no-fuse own-dgrad-dbn: not)");
  if (r.own_conv3x3 || r.own_dgrad3x3) {
    const char* what = !r.own_dgrad3x3 ? "forward with its BN statistics runs"
                       : !r.own_conv3x3 ? "data gradient with the ReLU and BN backward sums runs"
                                        : "forward with its BN statistics and the data gradient with the ReLU and BN "
                                          "backward sums run";
    lines.push_back("  and for " + std::to_string(std::max(r.own_conv3x3, r.own_dgrad3x3)) + " of layer1's 3x3 conv2s the " +
                    what + " a kernel of ours (kernels/conv3x3.h), in place of cuDNN's patterns (--no-fuse "
                    "own-conv3x3,own-dgrad3x3: not)");
  }
  if (r.own_finalize)
    lines.push_back("  and " + std::to_string(r.own_finalize) +
                    " of those kernels of ours (the forward's, the data gradients of conv3 and layer1's conv2) finalize "
                    "their BN in the last CTA of each "
                    "column of tiles (kernels/conv1x1_finalize.h), in place of a finalize kernel after them (--no-fuse "
                    "own-finalize: not)");
  if (r.own_prologue || r.own_stored)
    lines.push_back("  and of the conv3s of ours " + std::to_string(r.own_prologue) +
                    " apply bn2 as they read its input, " + std::to_string(r.own_stored) +
                    " read relu(bn2(x)) stored by a BN pass before them, where " + std::to_string(kY2Columns) +
                    " or more columns of tiles would each apply it (--no-fuse sbr-wgrad,own-prologue: all of them)");
  if (r.stored_conv2)
    lines.push_back("  and " + std::to_string(r.stored_conv2) +
                    " conv2s read relu(bn1(x)), stored by a BN pass for their plain weight gradient, with cuDNN's conv + "
                    "statistics, in place of applying bn1 as they read x (--no-fuse sbr-wgrad,stored-conv-stats: not)");
  if (r.own_stem_conv || r.own_stem_wgrad) {
    const char* what = !r.own_stem_wgrad ? "forward with its BN statistics runs a kernel"
                       : !r.own_stem_conv ? "weight gradient runs a kernel"
                                          : "forward with its BN statistics and its weight gradient run kernels";
    lines.push_back(std::string("  and the stem's ") + what + " of ours (kernels/stem_conv.h), in place of cuDNN's "
                    "(--no-fuse own-stem-conv,own-stem-wgrad: not)");
  }
  if (r.own_stem_join)
    lines.push_back(std::string("  and layer1.0's conv1 data gradient takes the stem's BN backward sums as it is written "
                                "(kernels/conv1x1_dgrad_join.h)") +
                    (r.own_stem_wgrad ? ", the stem's weight gradient its apply as it reads the gradient" : "") +
                    ", in place of the plain data gradient and our reduction pass (--no-fuse own-stem-join: not)");
  if (r.own_join_prologue)
    lines.push_back("  and " + std::to_string(r.own_join_prologue) +
                    " conv1s of ours apply the previous block's join as they read its inputs, and store it with its "
                    "ReLU bits, in place of the join's pass before them (kernels/cutlass_join_mainloop.cuh; --no-fuse "
                    "own-join-prologue: not)");
  if (r.compact_shortcut_dgrad)
    lines.push_back("  and " + std::to_string(r.compact_shortcut_dgrad) +
                    " stride-2 shortcuts' data gradients run at their output pixels alone, read by conv1's join at the "
                    "even pixels, in place of cuDNN's strided data gradient, zeros included (--no-fuse "
                    "compact-shortcut-dgrad: not)");
  if (r.lagging_wgrad)
    lines.push_back("  and the weight gradients' stream runs up to three blocks behind the data gradients, which write "
                    "each block's gradients to one of three sets of buffers by turns instead of waiting for each "
                    "conv's weight gradient (one GPU; --no-fuse lagging-wgrad: not)");
  if (r.lane_gemm_wgrads)
    lines.push_back("  and " + std::to_string(r.lane_gemm_wgrads) +
                    " 1x1 convs' weight gradients run as cuBLASLt GEMMs planned for " + std::to_string(r.lane_gemm_sms) +
                    " SMs, leaving the rest to the data gradients, in place of cuDNN's split-K plans that hold every "
                    "SM (one GPU; --no-fuse lane-gemm-wgrad: not)");
  if (r.own_dgrad_wgrad)
    lines.push_back("  and for " + std::to_string(r.own_dgrad_wgrad) +
                    " conv3s the data gradient's kernel takes the weight gradient too from the same loads of dy, with "
                    "relu(bn2(x)) made from the x it reads anyway (kernels/conv1x1_dgrad_bn.h), in place of the weight "
                    "gradient's GEMM and the BN pass that recomputes its input (--no-fuse own-dgrad-wgrad: not)");
  if (r.own_shortcut_dgrad_wgrad)
    lines.push_back("  and for " + std::to_string(r.own_shortcut_dgrad_wgrad) +
                    " projection shortcut the data gradient's kernel takes the weight gradient too from the same loads "
                    "of dy, with its stored input (kernels/conv1x1_dgrad_bn.h), in place of cuDNN's data gradient and "
                    "the weight gradient's GEMM (--no-fuse own-dgrad-wgrad: not)");
  if (r.lane_cudnn_sms)
    lines.push_back("  and the weight gradients cuDNN runs beside the chain (3x3 convs, stride-2 shortcuts) are planned "
                    "for " + std::to_string(r.lane_cudnn_sms) + " SMs, in place of plans that hold every SM (one GPU; "
                    "--no-fuse lane-cudnn-sms: not)");
  if (r.own_join_apply)
    lines.push_back("  and for " + std::to_string(r.own_join_apply) +
                    " conv3s the data gradient's kernel makes its output gradient from the join's dz and bn3's input "
                    "as it reads them (bn3's backward apply, kernels/conv1x1_dgrad_bn.h), in place of the apply's pass "
                    "(--no-fuse own-join-apply: not)");
  if (r.own_shortcut_join_apply)
    lines.push_back("  and for " + std::to_string(r.own_shortcut_join_apply) +
                    " projection shortcut the data gradient's kernel makes its output gradient from the join's dz and "
                    "its BN's input as it reads them, in place of the apply's pass (--no-fuse own-join-apply: not)");
  if (r.chained_launch)
    lines.push_back("  and the chain's kernels of ours (the BN passes, their finalizes, our convs, the stem's, the pooling, "
                    "the loss, the SGD update) are launched chained, each while the kernel "
                    "before it ends, waiting on the GPU for its writes (programmatic dependent launch, "
                    "kernels/chained_launch.h; --no-fuse chained-launch: not)");
  return lines;
}
