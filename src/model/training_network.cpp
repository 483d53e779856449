// The training network (model/training_network.h): its construction, its table of decisions (which
// fused pattern or kernel of ours each conv runs) and its buffers. The forward and loss are in
// training_forward.cpp, the lane and the backward in training_backward.cpp.
#include "model/training_network.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/stream_reads.h"
#include "kernels/chained_launch.h"
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_dgrad_join.h"
#include "kernels/conv1x1_stats.h"
#include "kernels/conv3x3.h"
#include "kernels/stem_conv.h"
#include "model/fusion_planner.h"
#include "model/gemm_wgrad.h"
#include "model/training_network_state.h"

namespace {
// Whether block b's conv2 is a 3x3 stride-1 conv with a pad of 1 that kernels/conv3x3.h takes.
bool conv3x3_takes(const Block& b) {
  const ConvGeometry& g = b.c2.geometry();
  return g.r == 3 && g.stride == 1 && g.pad == 1 && conv3x3_refusal(conv2_shape(b)).empty();
}

// Whether the lane's plans are sized to leave SMs to the chain (LaneGemmWgrad, LaneCudnnSms): only
// beside the chain, in fp16 NHWC, and not under --deterministic (cuDNN's plans are then the
// deterministic ones). Nor data-parallel: there the all-reduce's kernels share the SMs too, and on
// two H200s training was faster with cuDNN's plans for every SM, 49,388 -> 49,571 images/s (+0.37%,
// in every round of 3; batch 128 a GPU, 2026-11-30, bench/results/levers-session31-nvidia-h200-2026-11-30.md).
bool lane_shares_sms(const NetConfig& cfg) {
  return cfg.wgrad_beside && !cfg.data_parallel && cfg.dtype == DType::F16 && cfg.layout == Layout::NHWC &&
         !cfg.conv.deterministic;
}

// `cfg` with the lane's cuDNN weight gradients planned for TrainingNetwork::lane_cudnn_sm_target()
// SMs where the lane shares them (LaneCudnnSms): the convs are configured by Network's constructor.
NetConfig with_lane_targets(NetConfig cfg) {
  if (lane_shares_sms(cfg) && cfg.conv_api == ConvApi::Graph &&
      !(cfg.unfused_patterns & fused_pattern_bit(FusedPattern::LaneCudnnSms)))
    cfg.conv.wgrad_sm_target = TrainingNetwork::lane_cudnn_sm_target();
  return cfg;
}
}  // namespace

int TrainingNetwork::lane_cudnn_sm_target() { return std::max(1, current_device_sms() * 3 / 4); }

TrainingNetwork::TrainingNetwork(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache)
    : Network(with_lane_targets(cfg), ctx, cache, true), runs_(layers_->blocks.size()) {
  fusion_report_.lane_cudnn_sms = cfg_.conv.wgrad_sm_target;
  // The chain's kernels chained (kernels/chained_launch.h) in the builds that fuse, on one GPU (not
  // measured data-parallel), where the GPU can.
  chained_ = cfg_.fuses() && !cfg_.data_parallel &&
             !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::ChainedLaunch)) && device_chains_launches();
  fusion_report_.chained_launch = chained_;
  const DType t = cfg.dtype;
  const Shape4 stem = layers_->stem_out;
  // Sizes first, so that a batch too large for the GPU is one clear message, not a failed cudaMalloc.
  size_t act = 2 * stem.count(), largest = stem.count(), scratch = bn_scratch_floats(stem, t, cfg.layout),
         bits = relu_bits_bytes(stem, t);  // the stem's, counted always: allocated where the first
                                           // block's conv1 joins it (plan_own_convs)
  // y1 and y2 are stored only where a conv reads them plain: counted unless every conv2 and conv3
  // may run fused forward and weight gradient alike.
  const unsigned sbr = fused_pattern_bit(FusedPattern::SbrConvStats) | fused_pattern_bit(FusedPattern::SbrWgrad);
  const bool stores_ys = !cfg.fuses() || (cfg.unfused_patterns & sbr);
  size_t out_max = 0, mid2_max = 0, mid1_max = 0;  // the lagging buffers' roles (below)
  for (const Block& b : layers_->blocks) {
    out_max = std::max(out_max, b.out.count());
    mid2_max = std::max(mid2_max, b.mid2.count());
    mid1_max = std::max(mid1_max, b.mid1.count());
    bits += relu_bits_bytes(b.out, t);
    // a1, y1, a2, y2, a3, ad, out
    const size_t ys = stores_ys ? b.mid1.count() + b.mid2.count() : 0;
    act += b.mid1.count() + b.mid2.count() + ys + (b.down ? 3 : 2) * b.out.count();
    for (const Shape4& s : {b.in, b.mid1, b.mid2, b.out}) {
      largest = std::max(largest, s.count());
      scratch = std::max(scratch, bn_scratch_floats(s, t, cfg.layout));
    }
  }
  activation_bytes_ = act * dtype_size(t);
  // The lane may run behind (LaggingWgrad) in unfused and deterministic runs too: the same work in
  // another order, so GpuWgradStream.TrainsBitForBitAsOneStream checks it bit for bit.
  const bool lags = cfg.wgrad_beside && !cfg.data_parallel &&
                    !(cfg.unfused_patterns & fused_pattern_bit(FusedPattern::LaggingWgrad));
  // The lagging sets' buffers sized by role, 4 a set in InnerGrads' order: the gradients of a3 and
  // of the shortcut's output of the largest block output, those of a2 and a1 of the largest inner
  // ones; 0 for the first set's a3 and shortcut gradients, which are g[1] and g[3].
  std::vector<size_t> lag_counts;
  for (int k = 0; lags && k < kLaggingSets; ++k)
    lag_counts.insert(lag_counts.end(), {k ? out_max : 0, k ? out_max : 0, mid2_max, mid1_max});
  const size_t lag_elems = std::accumulate(lag_counts.begin(), lag_counts.end(), size_t(0));
  check_memory(activation_bytes_ + (4 * largest + lag_elems) * dtype_size(t) + bits);
  bn_scratch_ = DeviceBuffer(scratch * sizeof(float), "BN partial sums");
  const size_t ws = conv_workspace_;  // the fused patterns have their own (give_fused_workspaces)
  if (cfg.fuses()) plan_blocks(cache, largest);
  allocate(largest);
  plan_own_convs();
  const size_t compact_ws = plan_compact_shortcuts(cache);
  give_fused_workspaces();
  const size_t lane_gemm_ws = plan_lane_gemms();
  workspace_ = DeviceBuffer(std::max(ws, compact_ws), "cuDNN workspace (--workspace-mb)");
  algo_report_.workspace = workspace_.bytes();
  if (cfg.wgrad_beside) {
    // Only weight gradients run on the lane: its workspace is the largest plain weight gradient's
    // need, cuDNN's or a GEMM's.
    size_t lane_ws = lane_gemm_ws;
    for (ConvUnit* u : layers_->convs()) lane_ws = std::max(lane_ws, u->conv->algorithms().bwd_filter.workspace);
    lane_ = std::make_unique<Lane>();
    lane_->workspace = DeviceBuffer(lane_ws, "cuDNN workspace of the weight gradients' stream");
    algo_report_.lane_workspace = lane_ws;
  }
  if (lags) {
    std::vector<const void*> tracked{grad_[1].get(), grad_[3].get()};
    lagging_grads_.resize(lag_counts.size());
    for (size_t i = 0; i < lag_counts.size(); ++i) {
      if (!lag_counts[i]) continue;
      lagging_grads_[i] = DeviceBuffer(lag_counts[i] * dtype_size(t), "activation gradients of the lagging weight "
                                                                      "gradients (batch " + std::to_string(cfg.batch) + ")");
      tracked.push_back(lagging_grads_[i].get());
    }
    lane_reads_ = std::make_unique<StreamReads>(tracked);
    fusion_report_.lagging_wgrad = true;
  }
}

TrainingNetwork::~TrainingNetwork() = default;

// The table of decisions: each pattern a block's convs need, kept where cuDNN accepts it and, when
// autotuning, where it measures no slower than the plain conv with the BN passes it saves.
void TrainingNetwork::plan_blocks(AutotuneCache& cache, size_t largest) {
  const auto start = std::chrono::steady_clock::now();
  FusionPlanner planner(cfg_, ctx_, cache, fusion_report_, largest, bn_scratch_.as<float>());
  auto pass = [&](BnPass p, Shape4 s) { return planner.pass_ms(p, s); };
  // Where conv2's weight gradient runs plain (sbr-wgrad switched off: bin/train's default), y1 =
  // relu(bn1(a1)) is in memory for it either way: stored in the forward, or recomputed in the
  // backward on the weight gradients' stream. Stored by a BN pass before conv2, cuDNN's ConvStats
  // reads it, not SbrConvStats applying bn1 to a1 as it reads it (each input element nine times, for
  // a 3x3), and the backward recomputes nothing: on an H200 (2026-11-29, bench/ab.py, 3 rounds)
  // 5.249 -> 5.187 ms a step (bench/results/levers-session19-nvidia-h200-2026-11-29.md). Where
  // cuDNN refuses ConvStats or it measures slower than the plain conv and a statistics pass,
  // SbrConvStats is tried as before, and the report gives its outcome alone. --no-fuse
  // sbr-wgrad,stored-conv-stats: not (nor where conv-stats is listed: the pattern it would run).
  const unsigned off = cfg_.unfused_patterns;
  const bool conv2_reads_y1 = (off & fused_pattern_bit(FusedPattern::SbrWgrad)) &&
                              !(off & fused_pattern_bit(FusedPattern::StoredConvStats));
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    r.c1_stats.plan = planner.fuse(b.c1, FusedPattern::ConvStats,
                                   total_ms({b.c1.conv->algorithms().fwd.ms, pass(BnPass::Stats, b.mid1)}));
    for (auto [u, inner, in, out] : {std::tuple{&b.c2, &r.c2, b.mid1, b.mid2}, std::tuple{&b.c3, &r.c3, b.mid2, b.out}}) {
      const ConvAlgos& a = u->conv->algorithms();
      if (u == &b.c2 && conv2_reads_y1) {
        inner->fwd.plan = planner.fuse_first_choice(*u, FusedPattern::ConvStats,
                                                    total_ms({a.fwd.ms, pass(BnPass::Stats, out)}));
        inner->reads_stored = bool(inner->fwd);
        fusion_report_.stored_conv2 += inner->reads_stored;
      }
      if (!inner->fwd)
        inner->fwd.plan = planner.fuse(*u, FusedPattern::SbrConvStats,
                                       total_ms({pass(BnPass::Apply, in), a.fwd.ms, pass(BnPass::Stats, out)}));
      // Unfused, the weight gradient reads relu(bn(x)): stored by an unfused forward, else recomputed.
      inner->wgrad.plan = planner.fuse(*u, FusedPattern::SbrWgrad,
                                       total_ms({a.bwd_filter.ms, inner->recomputes_input() ? pass(BnPass::Apply, in) : 0.f}));
      // Fused, the data gradient still needs our dx pass: it saves the BN backward's other pass.
      const float unfused = total_ms({a.bwd_data.ms, pass(BnPass::Backward, in)}), dx = pass(BnPass::DxApply, in);
      inner->dgrad.plan = planner.fuse(*u, FusedPattern::DgradDreluDbn, unfused < 0 || dx < 0 ? -1 : unfused - dx);
    }
    if (b.down)
      r.down_stats.plan = planner.fuse(*b.down, FusedPattern::ConvStats,
                                       total_ms({b.down->conv->algorithms().fwd.ms, pass(BnPass::Stats, b.out)}));
  }
  plans_ = planner.take_fused();
  fusion_report_.seconds = seconds_since(start);
}

// One arena, a slice for each fused pattern a conv runs, sized as its plan asks.
void TrainingNetwork::give_fused_workspaces() {
  constexpr size_t kAlign = 256;  // as cudaMalloc aligns
  auto slice = [](const FusedCall& f) { return (f.plan->workspace() + kAlign - 1) / kAlign * kAlign; };
  size_t total = 0;
  for (BlockRun& r : runs_)
    for (FusedCall* f : r.fused_calls())
      if (*f) total += slice(*f);
  if (total == 0) return;
  // The sum of the plans' needs: a clear message, not a failed cudaMalloc.
  check_memory(total, "the fused patterns' cuDNN workspaces");
  fused_workspaces_ = DeviceBuffer(total, "cuDNN workspaces of the fused patterns, one for each conv");
  char* next = static_cast<char*>(fused_workspaces_.get());
  for (BlockRun& r : runs_)
    for (FusedCall* f : r.fused_calls())
      if (*f) {
        f->ws_bytes = f->plan->workspace();
        f->ws = f->ws_bytes ? next : nullptr;  // a plan that asks for none gets none
        next += slice(*f);
      }
  algo_report_.fused_workspace = total;
}

std::vector<ZeroedRange> TrainingNetwork::zeroed_at_step_start() const {
  std::vector<ZeroedRange> r;
  if (fused_workspaces_.bytes()) r.push_back({fused_workspaces_.get(), fused_workspaces_.bytes()});
  // The BN weight gradients a fused data gradient accumulates (after cuDNN's memsets): nothing else
  // writes them before it in a step; data-parallel averaging and the optimizer come after.
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    for (auto [bn, inner] : {std::pair{&b.b1, &runs_[i].c2}, std::pair{&b.b2, &runs_[i].c3}})
      if (inner->dgrad)
        for (int id : {bn->gamma, bn->beta}) r.push_back({params_.vector_grad(id), size_t(bn->channels) * sizeof(float)});
  }
  return r;
}

// The activations each block stores, the gradients, and the fused BNs' state.
void TrainingNetwork::allocate(size_t largest) {
  const DType t = cfg_.dtype;
  const size_t es = dtype_size(t);
  const std::string batch = " (batch " + std::to_string(cfg_.batch) + ")";
  stem_a_ = DeviceBuffer(layers_->stem_out.count() * es, "stem conv output" + batch);
  stem_y_ = DeviceBuffer(layers_->stem_out.count() * es, "stem output" + batch);
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    r.a1 = DeviceBuffer(b.mid1.count() * es, "activations" + batch);
    r.a2 = DeviceBuffer(b.mid2.count() * es, "activations" + batch);
    if (r.stores_y1()) r.y1 = DeviceBuffer(b.mid1.count() * es, "activations" + batch);
    if (r.stores_y2()) r.y2 = DeviceBuffer(b.mid2.count() * es, "activations" + batch);
    r.a3 = DeviceBuffer(b.out.count() * es, "activations" + batch);
    if (b.down) r.ad = DeviceBuffer(b.out.count() * es, "activations" + batch);
    r.out = DeviceBuffer(b.out.count() * es, "activations" + batch);
    r.relu_bits = DeviceBuffer(relu_bits_bytes(b.out, t), "ReLU bits" + batch);
  }
  for (auto& g : grad_) g = DeviceBuffer(largest * es, "activation gradients" + batch);
  dfeat_ = DeviceBuffer(size_t(cfg_.batch) * layers_->features * es, "pooled feature gradients");
  dlogits_ = DeviceBuffer(size_t(cfg_.batch) * cfg_.classes * es, "logit gradients");
  if (!cfg_.fuses()) return;
  // Each BN of the blocks (the stem's is ours): sums, and fp16 scale/shift (C halves each).
  size_t channels = 0, widest = 0;
  for (const Block& b : layers_->blocks)
    for (const Bn* bn : {&b.b1, &b.b2, &b.b3, b.bdown ? &*b.bdown : nullptr})
      if (bn) channels += size_t(bn->channels), widest = std::max(widest, size_t(bn->channels));
  fused_sums_ = DeviceBuffer(2 * channels * sizeof(float), "fused BN statistics");
  CUDA_CHECK(cudaMemset(fused_sums_.get(), 0, fused_sums_.bytes()));  // zero between uses (statistics_kept_zero)
  fused_half_ = DeviceBuffer(2 * channels * sizeof(uint16_t), "fused BN fp16 scale and shift");
  zeros_ = DeviceBuffer(widest * sizeof(float), "fused BN zero vector");
  CUDA_CHECK(cudaMemset(zeros_.get(), 0, zeros_.bytes()));
  float* sums = fused_sums_.as<float>();
  uint16_t* halves = fused_half_.as<uint16_t>();
  for (size_t i = 0; i < runs_.size(); ++i) {
    Block& b = layers_->blocks[i];
    for_each_layer(b, [](ConvUnit&) {}, [&](Bn& bn) {
      bn.sum = sums;
      bn.sqsum = sums + bn.channels;
      sums += 2 * bn.channels;
    });
    // conv2 and conv3 read the previous BN's coefficients in their prologue
    auto reads_half = [](const FusedCall& f) { return f && f.plan->scale_type() == DType::F16; };
    for (auto [bn, inner] : {std::pair{&b.b1, &runs_[i].c2}, std::pair{&b.b2, &runs_[i].c3}}) {
      // and our 3x3 data gradient's ReLU mask (conv2_dgrad_may_be_own) reads bn1's
      const bool mask = bn == &b.b1 && conv2_dgrad_may_be_own(b);
      if (!reads_half(inner->fwd) && !reads_half(inner->wgrad) && !mask) continue;
      bn->scale_h = halves;
      bn->shift_h = halves + bn->channels;
      halves += 2 * bn->channels;
    }
  }
}

// Where our 1x1 conv with statistics (kernels/conv1x1_stats.h) runs training's forward in place of
// cuDNN's ConvStats or SbrConvStats, or of the plain conv and our statistics pass: fp16 NHWC, fusing,
// not switched off by --no-fuse own-conv, on a GPU it runs on, at every 1x1 stride-1 conv. Not
// planned conv by conv: timed alone it beats cuDNN's fused patterns at most shapes and ties at the
// rest, and in the step only the whole set was measured (bench/results/levers-session16-*).
// conv3 needs the previous BN's fp16 copies (its prologue, or its data gradient's ReLU mask, reads
// them) and SbrConvStats planned (where it is not, the network stores relu(bn2(a2)) in the forward
// for the backward).
// In the backward, every conv1's data gradient takes the previous block's join backward (--no-fuse
// own-join-dgrad: not), the first block's the stem's BN + ReLU, an identity join without a shortcut
// (--no-fuse own-stem-join: not), and conv3's, where its forward was ours, bn2's ReLU and backward
// sums (--no-fuse own-dgrad-dbn: not).
// The forward's and conv3's can finalize their BN in their last CTA of a column, where own-finalize
// is not listed (bin/train lists it by default: the finalize kernel after them measured faster); the
// joining conv1s' never do (kernels/conv1x1_finalize.h).
// Our conv3 kernel applies bn2 to a2 as it reads it (the prologue), except where y2 = relu(bn2(a2)) is
// stored anyway for conv3's weight gradient (sbr-wgrad not fused) and the GEMM has kY2Columns or more
// columns of tiles: each column's CTAs apply bn2 to every tile of a2 again, and a BN pass that stores
// y2 once, read by the kernel without a prologue, costs less; the weight gradient then reads y2 as
// stored instead of recomputing it (--no-fuse sbr-wgrad,own-prologue: every conv3 so; own-prologue
// alone re-fuses sbr-wgrad, and y2 is then stored nowhere).
void TrainingNetwork::plan_own_convs() {
  if (!cfg_.fuses() || cfg_.dtype != DType::F16 || cfg_.layout != Layout::NHWC) return;
  const bool forward = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnConvStats));
  const bool joins = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnJoinDgrad));
  const bool dgrads = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnDgradDbn));
  const bool finalizes = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnFinalize));
  const bool prologues = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnPrologue));
  const bool stem_joins = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnStemJoin));
  const bool join_prologues = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnJoinPrologue));
  const bool convs3x3 = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnConv3x3));
  const bool dgrad_dws = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnDgradWgrad));
  size_t bytes = 0;
  int columns = 0;
  // Whether one of our kernels takes conv u, over the pixels of `s`: switched on, a 1x1 stride-1
  // conv, a shape it runs (refusal(m, k, c)); counted in `report`, its partial sums (sized by
  // partials_bytes(m, k, c)) in the shared buffer; `finalizing`: a kernel that can finalize its BN.
  auto takes = [&](bool on, const ConvUnit& u, Shape4 s, auto refusal, auto partials_bytes, int& report,
                   bool finalizing) {
    const ConvGeometry& g = u.geometry();
    const int m = s.n * s.h * s.w;
    if (!on || g.r != 1 || g.stride != 1 || g.pad != 0 || !refusal(m, g.k, g.c).empty()) return false;
    bytes = std::max(bytes, partials_bytes(m, g.k, g.c));
    columns = std::max(columns, conv1x1_finalize_counters(std::max(g.k, g.c)));
    ++report;
    fusion_report_.own_finalize += finalizing && finalizes;
    return true;
  };
  auto stats = [&](const ConvUnit& u, Shape4 out) {
    return takes(forward, u, out, conv1x1_stats_refusal, [](int m, int k, int) { return conv1x1_partials_bytes(m, k); },
                 fusion_report_.own, true);
  };
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    r.c1_own = stats(b.c1, b.mid1);
    r.c1_applies_join = i > 0 && join_prologues && r.c1_own;
    fusion_report_.own_join_prologue += r.c1_applies_join;
    r.c3_own = r.c3.fwd && b.b2.scale_h && stats(b.c3, b.out);
    r.c3.reads_stored = r.c3_own && r.stores_y2() && (!prologues || conv1x1_columns(b.c3.geometry().k) >= kY2Columns);
    fusion_report_.own_prologue += r.c3_own && !r.c3.reads_stored;
    fusion_report_.own_stored += r.c3.reads_stored;
    r.down_own = b.down && stats(*b.down, b.out);
    int stem_joined = 0;  // the first block's conv1 joins the stem's BN + ReLU, counted apart
    r.c1_joins = takes(i > 0 ? joins : stem_joins, b.c1, b.in, conv1x1_dgrad_join_refusal,
                       [](int m, int, int c) { return conv1x1_dgrad_join_partials_bytes(m, c); },
                       i > 0 ? fusion_report_.own_join : stem_joined, false);
    if (i == 0) fusion_report_.own_stem_join = r.c1_joins;
    r.c3_dgrad_own = r.c3_own && takes(dgrads, b.c3, b.mid2, conv1x1_dgrad_bn_refusal,
                                       [](int m, int, int c) { return conv1x1_dgrad_bn_partials_bytes(m, c); },
                                       fusion_report_.own_dgrad, true);
    const ConvGeometry& g3 = b.c3.geometry();
    const int m3 = b.mid2.n * b.mid2.h * b.mid2.w;
    if (r.c3_dgrad_own && dgrad_dws && !r.c3.wgrad && r.c3.recomputes_input() &&
        conv1x1_dgrad_bn_dw_refusal(m3, g3.k, g3.c).empty()) {
      r.dw_parts = DeviceBuffer(conv1x1_dw_partials_bytes(m3, g3.k, g3.c), "parts of a layer1 conv3's weight gradient");
      r.y2 = DeviceBuffer();  // relu(bn2(a2)) is made in the data gradient, stored nowhere
    }
    fusion_report_.own_dgrad_wgrad += r.c3_dgrad_dw();
    // The shortcut's dy is otherwise read twice, by cuDNN's data gradient and the lane's GEMM (134 MB
    // at layer1 at batch 256); its input, the stem's output, is always stored. -0.41% a step at batch
    // 256, -0.17% at 128 (H200, 2026-11-30, bench/results/levers-session35-nvidia-h200-2026-11-30.md).
    if (b.down && dgrad_dws) {
      const ConvGeometry& gd = b.down->geometry();
      const int md = gd.n * gd.h * gd.w;
      if (gd.r == 1 && gd.stride == 1 && gd.pad == 0 && conv1x1_dgrad_bn_dw_refusal(md, gd.k, gd.c).empty())
        r.down_dw_parts = DeviceBuffer(conv1x1_dw_partials_bytes(md, gd.k, gd.c), "parts of a shortcut's weight gradient");
    }
    fusion_report_.own_shortcut_dgrad_wgrad += r.down_dgrad_dw();
    // Layer1's 3x3 conv2: the forward where it reads y1 stored (our kernel has no BN prologue), the
    // data gradient where bn1 has its fp16 coefficients (allocate: conv2_dgrad_may_be_own).
    if (!conv3x3_takes(b)) continue;
    const Conv3x3Shape s3 = conv2_shape(b);
    r.c2_own = convs3x3 && r.c2.reads_stored;
    r.c2_dgrad_own = conv2_dgrad_may_be_own(b) && b.b1.scale_h;
    for (bool taken : {r.c2_own, r.c2_dgrad_own}) {
      if (!taken) continue;
      bytes = std::max(bytes, conv3x3_partials_bytes(s3));
      columns = std::max(columns, conv1x1_finalize_counters(std::max(s3.c, s3.k)));
      fusion_report_.own_finalize += finalizes;
    }
    fusion_report_.own_conv3x3 += r.c2_own;
    fusion_report_.own_dgrad3x3 += r.c2_dgrad_own;
    if (r.c2_dgrad_own)
      r.c2_turned = DeviceBuffer(size_t(9) * s3.c * s3.k * sizeof(uint16_t), "layer1 conv2's filter turned for its data gradient");
  }
  // conv3's data gradient makes its dy from the join where it takes its weight gradient (the kernel
  // that does both) and the next block's conv1 leaves the join's dz. In a projection block both
  // data gradients do, or neither: conv3's runs before the shortcut's there (block_backward), and
  // without the lane behind conv3 writes g[3], where the apply pass would leave the shortcut's dy.
  const bool join_applies = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnJoinApply));
  for (size_t i = 0; i + 1 < runs_.size(); ++i) {
    BlockRun& r = runs_[i];
    const bool shortcut_can = !layers_->blocks[i].down || (r.down_dgrad_dw() && r.c1_joins);
    r.c3_applies_join = join_applies && r.c3_dgrad_dw() && runs_[i + 1].c1_joins && shortcut_can;
    fusion_report_.own_join_apply += r.c3_applies_join;
    fusion_report_.own_shortcut_join_apply += r.c3_applies_join && layers_->blocks[i].down;
  }
  // One buffer for all, on one stream: each forward conv's and conv3's finalize reads its partial
  // sums right after it (or in its last CTA); a joining conv1's are read by the previous block's
  // join_backward (the first block's by backward()'s stem finalize), next on the stream, before any
  // other of these kernels runs. The counters too are
  // shared: these kernels never run beside one another (the weight-gradient lane runs none; it adds
  // up conv3's weight gradient parts, BlockRun::dw_parts, which touches neither).
  if (bytes) own_partials_ = DeviceBuffer(bytes, "partial BN sums of our 1x1 convs");
  if (bytes && finalizes) {  // zero once: each launch leaves its counters zero
    own_arrivals_ = DeviceBuffer(columns * sizeof(unsigned), "our 1x1 convs' column counters");
    CUDA_CHECK(cudaMemset(own_arrivals_.get(), 0, own_arrivals_.bytes()));
  }
  // The stem's forward with its statistics and its weight gradient (kernels/stem_conv.h), each
  // unless switched off, where the kernels take the stem's shape.
  const ConvGeometry& stem = layers_->stem.geometry();
  if (stem_conv_refusal(stem.c, stem.k, stem.r, stem.stride, stem.pad).empty()) {
    stem_conv_own_ = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnStemConv));
    stem_wgrad_own_ = !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnStemWgrad));
  }
  fusion_report_.own_stem_conv = stem_conv_own_;
  fusion_report_.own_stem_wgrad = stem_wgrad_own_;
  if (stem_conv_own_ || stem_wgrad_own_)
    stem_partials_ = DeviceBuffer(stem_conv_partials_bytes(stem_shape()), "partial sums of the stem's kernels");
  if (!runs_.empty() && runs_[0].c1_joins)  // the mask the first block's conv1 reads for the stem's ReLU
    stem_relu_bits_ = DeviceBuffer(relu_bits_bytes(layers_->stem_out, cfg_.dtype),
                                   "the stem's ReLU bits (batch " + std::to_string(cfg_.batch) + ")");
}

bool TrainingNetwork::conv2_dgrad_may_be_own(const Block& b) const {
  return cfg_.fuses() && cfg_.dtype == DType::F16 && cfg_.layout == Layout::NHWC &&
         !(cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::OwnDgrad3x3)) && conv3x3_takes(b);
}

// At stride 2 a projection shortcut's input gradient is nonzero only at the even rows and columns,
// and cuDNN's strided data gradient computes and writes all of it: at layer4.0 68 µs of the
// backward's chain for a GEMM of 8.6 GFLOP (H200 trace, 2026-11-29). The same GEMM as a stride-1
// 1x1 conv over the shortcut's output pixels writes a quarter of the bytes, and conv1's join kernel
// reads each row where it belongs (Conv1x1DgradJoin::g_even): wherever that conv1 joins, unless
// switched off (--no-fuse compact-shortcut-dgrad). On an H200 (2026-11-29) the three took 30.6, 30.3
// and 17.9 µs against 68.4, 37.7 and 42.5 (layer4.0, 3.0, 2.0), and the step 5.045 ms against 5.099
// (bench/ab.py, 5 rounds). Our resident kernel, tried first, took 34, 35 and 21 µs: its 128 x 64
// tiles suit the memory-bound 1x1 convs, not these GEMMs of 8.6 GFLOP. Returns the workspace the
// convs' choices need.
size_t TrainingNetwork::plan_compact_shortcuts(AutotuneCache& cache) {
  if (cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::CompactShortcutDgrad)) return 0;
  AlgoChooser chooser(ctx_.cudnn, cfg_.conv, &cache);
  size_t ws = 0;
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    if (!b.down || !r.c1_joins) continue;
    const ConvGeometry& g = b.down->geometry();
    if (g.r != 1 || g.pad != 0 || g.stride != 2) continue;
    const ConvGeometry compact{.n = g.n, .c = g.c, .h = g.out_h(), .w = g.out_w(), .k = g.k, .r = 1, .stride = 1, .pad = 0};
    r.down_compact = make_conv(cfg_.conv_api, compact, cfg_.dtype, cfg_.layout, cfg_.tf32);
    chooser.configure(*r.down_compact);  // all three directions, as every conv: only the data gradient runs
    ws = std::max(ws, r.down_compact->algorithms().bwd_data.workspace);
    ++fusion_report_.compact_shortcut_dgrad;
  }
  // Shapes of their own (no conv of the network is a stride-1 1x1 from these channels to those).
  algo_report_.shapes += fusion_report_.compact_shortcut_dgrad;
  algo_report_.searched += chooser.searched();
  algo_report_.search_s += chooser.search_seconds();
  return ws;
}

StemShape TrainingNetwork::stem_shape() const {
  const ConvGeometry& g = layers_->stem.geometry();
  return {g.n, g.h, g.w, g.c, g.k, g.r};
}

Conv1x1Finalize TrainingNetwork::finalize_in_kernel(const Bn& bn, int channels, bool backward) const {
  // The kernel finalizes the GEMM's columns: they must be the BN's channels, all of them.
  if (bn.channels != channels)
    throw Fatal("finalize of " + bn.name + " in a 1x1 conv of ours: " + std::to_string(channels) +
                " columns for " + std::to_string(bn.channels) + " channels");
  Conv1x1Finalize f{.bn = bn.st, .arrivals = own_arrivals_.as<unsigned>()};
  if (!backward) {
    f.scale_h = bn.scale_h;
    f.shift_h = bn.shift_h;
    return f;
  }
  f.dgamma = params_.vector_grad(bn.gamma);
  f.dbeta = params_.vector_grad(bn.beta);
  return f;
}

// The lane's 1x1 weight gradients as cuBLASLt GEMMs planned for half the SMs (LaneGemmWgrad;
// model/gemm_wgrad.h says why), one plan per shape, where the lane shares the SMs (lane_shares_sms).
// Returns the workspace the plans need.
size_t TrainingNetwork::plan_lane_gemms() {
  if (!lane_shares_sms(cfg_) || (cfg_.unfused_patterns & fused_pattern_bit(FusedPattern::LaneGemmWgrad))) return 0;
  const int sms = lane_gemm_sm_target();
  std::map<std::string, std::shared_ptr<const GemmWgrad>> by_shape;  // refused ones too: planned once
  std::set<int> in_dgrad;  // weights whose gradient their data gradient takes (BlockRun::c3_dgrad_dw, down_dgrad_dw)
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (runs_[i].c3_dgrad_dw()) in_dgrad.insert(layers_->blocks[i].c3.weight);
    if (runs_[i].down_dgrad_dw()) in_dgrad.insert(layers_->blocks[i].down->weight);
  }
  size_t ws = 0;
  for (ConvUnit* u : layers_->convs()) {
    const ConvGeometry& g = u->geometry();
    if (!GemmWgrad::applies(g) || in_dgrad.count(u->weight)) continue;
    std::shared_ptr<const GemmWgrad>& gemm = by_shape[g.key()];
    if (!gemm) gemm = std::make_shared<const GemmWgrad>(ctx_.cublas_lt, g, kLaneGemmWorkspace, sms, ctx_.stream);
    if (!gemm->ok()) continue;  // cuDNN's plan stays
    ws = std::max(ws, gemm->workspace());
    lane_gemms_[u->weight] = gemm;
  }
  fusion_report_.lane_gemm_wgrads = int(lane_gemms_.size());
  fusion_report_.lane_gemm_sms = lane_gemms_.empty() ? 0 : sms;
  return ws;
}

