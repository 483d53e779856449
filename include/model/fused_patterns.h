// The kinds of batch norm fused into the convolutions, by cuDNN (model/fused_conv.h says what each
// computes) or, for bin/predict's 1x1 convs, by cuBLASLt (model/gemm_conv.h), by name: for people,
// and the short stable names that the autotune cache's keys and the programs' --no-fuse flag use;
// the rule that decides, conv by conv, whether a pattern runs fused, and the start-up report of what
// fusing did for a whole network. No CUDA here: the flag parsers (and their fuzz targets) read it.
#pragma once

#include <string>
#include <vector>

enum class FusedPattern {
  ConvStats, SbrConvStats, SbrWgrad, DgradDreluDbn,  // training (cuDNN)
  OwnConvStats,                                      // training, 1x1 convs (ours: kernels/conv1x1_stats.h)
  OwnJoinDgrad,                                      // training, conv1's dgrad (ours: kernels/conv1x1_dgrad_join.h)
  OwnDgradDbn,                                       // training, conv3's dgrad (ours: kernels/conv1x1_dgrad_bn.h)
  OwnFinalize,                                       // training, the BN finalize in those (kernels/conv1x1_finalize.h)
  OwnPrologue,                                       // training, bn2 in our conv3 kernel's prologue
  StoredConvStats,                                   // training, conv2's ConvStats on a stored relu(bn1)
  OwnStemConv,                                       // training, the stem's forward + statistics (ours: kernels/stem_conv.h)
  OwnStemWgrad,                                      // training, the stem's weight gradient (ours: kernels/stem_conv.h)
  OwnStemJoin,                                       // training, the stem's BN backward in layer1.0's conv1 dgrad (ours)
  OwnJoinPrologue,                                   // training, the previous join in our conv1 kernel's prologue
  CompactShortcutDgrad,                              // training, a stride-2 shortcut's dgrad at its output pixels, read by conv1's join
  LaggingWgrad,                                      // training, the weight gradients' lane up to three blocks behind the data gradients
  OwnConv3x3,                                        // training, layer1's 3x3 conv + statistics (ours: kernels/conv3x3.h)
  OwnDgrad3x3,                                       // training, layer1's 3x3 dgrad + ReLU + BN backward sums (ours: kernels/conv3x3.h)
  LaneGemmWgrad,                                     // training, one GPU, the lane's 1x1 weight gradients as cuBLASLt GEMMs on half the SMs
  OwnDgradWgrad,                                     // training, layer1's conv3 and shortcut weight gradients in their dgrad (ours: kernels/conv1x1_dgrad_bn.h)
  LaneCudnnSms,                                      // training, one GPU, the lane's cuDNN weight gradients planned for 3/4 of the SMs
  OwnJoinApply,                                      // training, the join's BN backward apply made by layer1's conv3 and shortcut dgrads as they read dz
  ChainedLaunch,                                     // training, the chain's kernels of ours launched chained (kernels/chained_launch.h)
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
// Where training's conv3 kernel of ours reads a stored relu(bn2(a2)) rather than apply bn2 in its
// prologue (OwnPrologue; TrainingNetwork::plan_own_convs): from 8 columns of tiles (512 output
// channels; layers 2-4 of ResNet-50). Measured on an H200 (2026-11-29, bench/ab.py, 3 rounds): from 8
// columns 5.251 -> 5.198 ms a step, from 16 5.212, at every conv3 5.204
// (bench/results/levers-session19-nvidia-h200-2026-11-29.md).
constexpr int kY2Columns = 8;
// --no-fuse's help, the same in both programs.
constexpr const char* kNoFuseHelp =
    "fused batch-norm patterns to run plain, to measure what each buys (fusedbn builds): a comma list of "
    "conv-stats, sbr-conv-stats, sbr-wgrad, dgrad-drelu-dbn, own-conv, own-join-dgrad, own-dgrad-dbn, own-finalize, own-prologue, stored-conv-stats, own-stem-conv, own-stem-wgrad, own-stem-join, own-join-prologue, compact-shortcut-dgrad, lagging-wgrad, own-conv3x3, own-dgrad3x3, lane-gemm-wgrad, own-dgrad-wgrad, lane-cudnn-sms, own-join-apply, chained-launch (training), conv-bn, conv-bn-relu, conv-bn-add-relu, "
    "gemm-bn, gemm-bn-relu, gemm-bn-add-relu (bin/predict), or all; the list replaces the default, so list "
    "the default's patterns too to change one thing";
// bin/train's patterns that run plain unless --no-fuse says otherwise: with the weight gradients on
// their own stream (OPT_WGRAD_STREAM), the fused weight gradient. Each conv's SbrWgrad is timed
// faster alone than relu(bn(x)) recomputed and the plain weight gradient, yet the step is slower
// with them: on an H200 (2026-11-28, bench/ab.py, 4 rounds) 5.751 ms a step with them and 5.694
// without (-1.0%, in every round); bench/results/levers-session13-nvidia-h200-2026-11-28.md.
// Before the weight gradients had their own stream they paid 0.8% (H100, gpu-run-2026-11-25.md).
// And our 1x1 kernels' finalize in their last CTA of a column (own-finalize): the finalize kernel
// after them is faster at the step, 5.150 -> 5.122 ms (-0.55%, in every round; H200, 2026-11-29,
// bench/ab.py, 3 rounds, bench/results/levers-session20-nvidia-h200-2026-11-29.md); again with the
// chain's kernels launched chained, 0.38-1.12% slower with it (H200, 2026-12-01,
// bench/results/levers-session39-nvidia-h200-2026-12-01.md).
// And, everywhere, the joins in the next conv1's prologue (own-join-prologue): with the join's output
// stored from the kernel the step was slower than with the join passes (H200, 2026-11-29, bench/ab.py,
// bench/results/levers-session23-nvidia-h200-2026-11-29.md).
unsigned default_unfused_patterns(bool wgrad_beside);
constexpr const char* kDefaultUnfusedText =
    "sbr-wgrad,own-finalize,own-join-prologue where the weight gradients run on their own stream (bin/train, "
    "train-wgradstream), else own-join-prologue";
// The warning of a build that fuses nothing (OPT_FUSED_BN=0) given --no-fuse.
constexpr const char* kNoFuseWithoutFusion =
    "--no-fuse has no effect: this build does not fuse batch norm into the convolutions (OPT_FUSED_BN=0)";

// Whether a conv runs a pattern that cuDNN accepted fused: where both ways were measured (autotuning),
// the fused kernel costs no more than the plain conv plus the passes of our BN kernels that fusing
// saves. Times of -1 were not measured.
bool run_fused(float fused_ms, float unfused_ms);
constexpr const char* kSlowerThanUnfused = "measured slower than the plain conv with our BN kernels";
constexpr const char* kSwitchedOff = "switched off by --no-fuse";
constexpr const char* kOffByDefault = "off by default, slower at the step than the plain conv (--no-fuse none plans it)";

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
  int own = 0;                // training's 1x1 convs whose forward with statistics runs our kernel (OwnConvStats)
  int own_join = 0;           // conv1s whose data gradient takes the previous join's backward sums (OwnJoinDgrad)
  int own_dgrad = 0;          // conv3s whose data gradient takes bn2's backward sums (OwnDgradDbn)
  int own_finalize = 0;       // of those, the convs that finalize their BN themselves (OwnFinalize)
  int own_prologue = 0;       // conv3s of ours that apply bn2 as they read a2 (OwnPrologue)
  int own_stored = 0;         // conv3s of ours that read relu(bn2(a2)) stored by a BN pass before them
  int stored_conv2 = 0;       // conv2s whose ConvStats reads relu(bn1(a1)) stored by a BN pass (StoredConvStats)
  bool own_stem_conv = false;   // the stem's forward with its BN statistics runs our kernel (OwnStemConv)
  bool own_stem_wgrad = false;  // the stem's weight gradient runs our kernel (OwnStemWgrad)
  bool own_stem_join = false;   // layer1.0's conv1 data gradient takes the stem's BN backward sums (OwnStemJoin)
  int own_join_prologue = 0;    // conv1s of ours that apply the previous block's join as they read it (OwnJoinPrologue)
  int compact_shortcut_dgrad = 0;  // stride-2 shortcuts whose data gradient is compact (CompactShortcutDgrad)
  bool lagging_wgrad = false;      // the weight gradients' lane runs up to three blocks behind (LaggingWgrad)
  int own_conv3x3 = 0;             // layer1's conv2s whose forward with statistics runs our kernel (OwnConv3x3)
  int own_dgrad3x3 = 0;            // layer1's conv2s whose data gradient takes bn1's backward sums (OwnDgrad3x3)
  int lane_gemm_wgrads = 0;        // 1x1 convs whose weight gradient runs as a cuBLASLt GEMM (LaneGemmWgrad)
  int lane_gemm_sms = 0;           // the SM count those GEMMs were planned for
  int own_dgrad_wgrad = 0;         // conv3s whose data gradient kernel takes their weight gradient too (OwnDgradWgrad)
  int own_shortcut_dgrad_wgrad = 0;  // stride-1 projection shortcuts whose data gradient kernel does so (OwnDgradWgrad)
  int lane_cudnn_sms = 0;          // the SM count the lane's cuDNN weight gradients were planned for (LaneCudnnSms); 0: all
  int own_join_apply = 0;          // conv3s whose data gradient kernel makes dy from the join's dz and a3 (OwnJoinApply)
  int own_shortcut_join_apply = 0;  // projection shortcuts whose data gradient kernel does so from dz and ad (OwnJoinApply)
  bool chained_launch = false;     // the chain's kernels of ours launch chained (ChainedLaunch)
  int half_coefficients = 0;  // fused patterns whose engines take the BN scale/bias in fp16
  bool off_for_determinism = false;  // --deterministic: nothing tried (see fusion_report_lines)
  double seconds = -1;   // building (and, autotuning, timing) the patterns took; -1: not given
  int plans = 0, plans_cached = 0;  // distinct pattern-shape plans built, and of them taken from the autotune cache
  std::vector<FusionRefusal> refused;
};
// The report as lines for people: how many patterns run fused, then one line per distinct refusal
// (pattern and reason) with the layers it hit.
std::vector<std::string> fusion_report_lines(const FusionReport& r);
