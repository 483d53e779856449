// The training network (model/training_network.h): its table of decisions, buffers, forward, loss
// and backward.
#include "model/training_network.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>
#include <tuple>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/stream_reads.h"
#include "kernels/chained_launch.h"
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_dgrad_join.h"
#include "kernels/conv1x1_stats.h"
#include "kernels/conv3x3.h"
#include "kernels/loss.h"
#include "kernels/pooling.h"
#include "kernels/stem_conv.h"
#include "model/fused_conv.h"
#include "model/fusion_planner.h"
#include "model/gemm_wgrad.h"
#include "model/linear.h"
#include "model/resnet50_layers.h"

// A fused pattern as one conv runs it: the plan (one per pattern and shape, shared by the convs of
// that shape) and a workspace of this conv's own. cuDNN zeroes counters in the workspace before
// every run; in a workspace no other conv touches, the step's graph zeroes them once at its start
// instead (zeroed_at_step_start), a node less in the chain for each.
struct FusedCall {
  const FusedConv* plan = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  explicit operator bool() const { return plan != nullptr; }
  void run(cudnnHandle_t h, const FusedArgs& a) const { plan->run(h, a, ws, ws_bytes); }
};

// One block: the fused pattern each of its convs runs (empty: the plain conv and our BN kernels),
// and what its forward stores for backward. y1 and y2, the inner BN outputs, are stored only where
// conv2 or conv3 or its weight gradient reads them plain. relu_bits: where the join's ReLU (after the add) passed; its
// backward reads these bits, not the output (1/16 of the bytes).
struct TrainingNetwork::BlockRun {
  FusedCall c1_stats;           // ConvStats
  struct Inner {
    FusedCall fwd, wgrad, dgrad;  // SbrConvStats (conv2 reading y1: ConvStats), SbrWgrad, DgradDreluDbn
    // Training's forward reads relu(bn(x)), stored by a BN pass before it, instead of applying the
    // previous BN as it reads x: conv2 by cuDNN's ConvStats (StoredConvStats, plan_blocks), conv3 by
    // our kernel (OwnPrologue, plan_own_convs). Its weight gradient reads that as stored.
    bool reads_stored = false;
    // The plain weight gradient recomputes relu(bn(x)): the forward applied bn fused and stored nothing.
    bool recomputes_input() const { return fwd && !reads_stored; }
  } c2, c3;
  FusedCall down_stats;         // ConvStats
  // Training's forward with statistics by our kernel instead (kernels/conv1x1_stats.h: OwnConvStats).
  bool c1_own = false, c3_own = false, down_own = false;
  // conv1's data gradient by our kernel that takes the previous block's join backward (dz and its
  // sums; kernels/conv1x1_dgrad_join.h: OwnJoinDgrad), instead of writing its part of the gradient;
  // the first block's takes the stem's BN + ReLU backward so (OwnStemJoin).
  bool c1_joins = false;
  // Training's forward: conv1, ours, applies the previous block's join as it reads the join's inputs
  // and stores it with its ReLU bits (kernels/conv1x1_stats.h, Conv1x1Join: OwnJoinPrologue), and
  // the previous block runs no join pass. Every block's but the first (the stem's BN is no join).
  bool c1_applies_join = false;
  // conv3's data gradient with bn2's ReLU and backward sums by our kernel (kernels/conv1x1_dgrad_bn.h:
  // OwnDgradDbn), where its forward was ours (c3_own: the ReLU mask is the prologue's test, fp16
  // x * scale + shift > 0, also where the forward read a stored y2).
  bool c3_dgrad_own = false;
  // That kernel also takes conv3's weight gradient from the same loads of dy, with relu(bn2(a2))
  // made from the a2 it reads anyway (Conv1x1DgradBn::dw_partials: OwnDgradWgrad), where the forward
  // applied bn2 in its prologue (the same fp16 y) and the kernel holds dw's k (layer1's 256). It does
  // where dw_parts, its CTAs' parts of dw, is allocated: a buffer a block, so that the chain never
  // waits for the lane's sum.
  DeviceBuffer dw_parts;
  bool c3_dgrad_dw() const { return dw_parts.get() != nullptr; }
  // The same for a stride-1 1x1 projection shortcut (layer1.0's, whose input is the stem's output):
  // its data gradient, written as it is, and its weight gradient from x as stored, by one kernel
  // (Conv1x1DgradDw), where down_dw_parts is allocated.
  DeviceBuffer down_dw_parts;
  bool down_dgrad_dw() const { return down_dw_parts.get() != nullptr; }
  // That conv3 kernel also makes dy, the join's gradient of a3, as it reads the join's dz and a3
  // (Conv1x1DgradBn::dy_x: OwnJoinApply), where the next block's conv1 left dz (its c1_joins): the
  // join's backward runs its finalize alone, and a3's gradient is stored nowhere. In a projection
  // block the shortcut's data gradient, which takes its weight gradient too (down_dgrad_dw), makes
  // its dy from the join's dz and ad so as well (or neither does: plan_own_convs), and writes its
  // data gradient to g[2], where this block's conv1 join reads it (Conv1x1DgradJoin::g), as g[0]
  // still holds dz for conv3.
  bool c3_applies_join = false;
  // Layer1's 3x3 conv2 by our kernel (kernels/conv3x3.h): training's forward with its statistics,
  // where conv2 reads y1 stored (Inner::reads_stored: OwnConv3x3), and the data gradient with bn1's
  // ReLU and backward sums (OwnDgrad3x3), by conv2's filter turned into c2_turned in each training
  // forward (the weights change at each step).
  bool c2_own = false, c2_dgrad_own = false;
  DeviceBuffer c2_turned;
  // A stride-2 projection shortcut's data gradient at its output pixels alone, as a stride-1 1x1
  // conv's over them (CompactShortcutDgrad), into g[2]; this block's conv1 (c1_joins) reads it as
  // the shortcut's part at the even pixels. Null: cuDNN's strided data gradient, zeros included.
  std::unique_ptr<ConvLayer> down_compact;
  DeviceBuffer a1, y1, a2, y2, a3, ad, out, relu_bits;
  bool stores_y1() const { return !c2.fwd || !c2.wgrad; }
  bool stores_y2() const { return !c3.fwd || !c3.wgrad; }
  std::vector<FusedCall*> fused_calls() { return {&c1_stats, &c2.fwd, &c2.wgrad, &c2.dgrad, &c3.fwd, &c3.wgrad, &c3.dgrad, &down_stats}; }
};

// A conv's weight gradient and its data gradient read the same output gradient and write different
// buffers: on two streams they run side by side, and in the step's CUDA graph they become two
// branches. The small convs of the later stages fill the GPU only in part, and one branch's launch
// gaps are the other's running time. The lane runs at the normal priority, below the compute
// stream's (core/handles.h, GpuContext): where both wait for SMs, the chain goes first.
struct TrainingNetwork::Lane {
  Stream stream{false};
  Event forked{false}, done{false};
  Event turned{false};  // layer1's conv2 filters turned for this step's data gradients (turn_filters)
  DeviceBuffer workspace;  // the main stream's convs keep workspace_: both run at once
};

// The shape of block b's conv2 as kernels/conv3x3.h takes it, and whether it is a 3x3 stride-1 conv
// with a pad of 1 at all.
namespace {
Conv3x3Shape conv2_shape(const Block& b) {
  const ConvGeometry& g = b.c2.geometry();
  return {b.mid1.n, b.mid1.h, b.mid1.w, g.c, g.k};
}
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

// ---- construction -------------------------------------------------------------------------------
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

// ---- forward ------------------------------------------------------------------------------------
void TrainingNetwork::bn_forward(const Bn& bn, const void* x, Shape4 s, bool train) {
  // With the fp16 copies the next conv's prologue may read.
  if (train)
    bn_forward_train_stats(x, s, cfg_.dtype, cfg_.layout, bn.st, bn_scratch_.as<float>(), ctx_.stream, bn.scale_h,
                           bn.shift_h);
  else
    bn_forward_eval_coefs(bn.st, bn.channels, ctx_.stream, bn.scale_h, bn.shift_h);
}

void TrainingNetwork::forward(const void* images, bool train) {
  set_chained_launches(chained_);  // this network's, for the thread that runs it
  images_ = images;
  if (train) turn_filters();  // beside the stem's forward
  const Shape4 stem = layers_->stem_out;
  const Bn& bn = layers_->stem_bn;
  // Our kernel sums the statistics as it writes (training); evaluation reads the running ones.
  const bool sums_taken = stem_conv_own_ && train;
  int rows = 0;
  if (stem_conv_own_)
    rows = stem_conv_forward({images, params_.working(layers_->stem.weight), stem_a_.get(),
                              sums_taken ? stem_partials_.as<float>() : nullptr, stem_shape()},
                             ctx_.stream);
  else
    conv_forward(layers_->stem, images, stem_a_.get());
  if (sums_taken)
    bn_finalize_partials(stem_partials_.as<float>(), rows, bn.channels, stem.per_channel(), bn.st, bn.channels,
                         bn.scale_h, bn.shift_h, ctx_.stream);
  else
    bn_forward(bn, stem_a_.get(), stem, train);
  // Training, the ReLU's bits too where the first block's conv1 data gradient takes the stem's BN backward.
  uint8_t* bits = train && stem_relu_bits_.get() ? stem_relu_bits_.as<uint8_t>() : nullptr;
  store_relu_bn(bn, stem_a_.get(), stem_y_.get(), stem, ctx_.stream, bits);
  const void* cur = stem_y_.get();
  ApplyArgs join{};
  const ApplyArgs* deferred = nullptr;  // the previous block's join, where this block's conv1 applies it
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    block_forward(b, r, cur, train, deferred);
    join = join_args(b, r, cur, train);
    deferred = train && i + 1 < runs_.size() && runs_[i + 1].c1_applies_join ? &join : nullptr;
    if (!deferred) bn_apply(join, b.out, cfg_.dtype, cfg_.layout, ctx_.stream);
    cur = r.out.get();
  }
  classify(cur);
}

// Layer1's conv2 filters turned for their data gradients by our kernel (BlockRun::c2_dgrad_own), from
// this step's weights, as the forward uses them. On the lane, beside the forward, where there is one;
// backward() waits for them. Why: on the chain, between conv2's finalize and conv3, they took 3.3 µs
// each of the step (H200, batch 256, 2026-12-01).
void TrainingNetwork::turn_filters() {
  const bool any = std::any_of(runs_.begin(), runs_.end(), [](const BlockRun& r) { return r.c2_dgrad_own; });
  turns_on_lane_ = any && lane_;
  if (turns_on_lane_) lane_fork();
  const cudaStream_t stream = turns_on_lane_ ? lane_->stream : ctx_.stream;
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (!runs_[i].c2_dgrad_own) continue;
    const Block& b = layers_->blocks[i];
    conv3x3_turn_filter(params_.working(b.c2.weight), runs_[i].c2_turned.get(), conv2_shape(b), stream);
  }
  if (turns_on_lane_) lane_->turned.record(lane_->stream);
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

void TrainingNetwork::store_relu_bn(const Bn& bn, const void* x, void* y, Shape4 s, cudaStream_t stream,
                                    uint8_t* bits) const {
  bn_apply({.x = x, .scale = bn.st.scale, .shift = bn.st.shift, .y = y, .relu_bits = bits}, s, cfg_.dtype,
           cfg_.layout, stream);
}

void TrainingNetwork::conv_stats(const ConvUnit& c, const FusedCall& fused, const void* x, void* y, const Bn& bn,
                                 Shape4 s, bool train, const Bn* prologue, void* stored, Shape4 s_prev, bool own,
                                 bool reads_stored, const Conv1x1Join* join) {
  const cudaStream_t stream = ctx_.stream;
  if (join && !(own && train && !prologue))
    throw Fatal("conv_stats: " + bn.name + "'s conv applies the previous join only by our kernel, in training, "
                "without a BN prologue");
  if (prologue && reads_stored) {  // relu(bn_prev(x)) stored by a BN pass, then read as it is
    if (!stored) throw Fatal("conv_stats: " + bn.name + "'s conv reads its stored input, and none is allocated");
    store_relu_bn(*prologue, x, stored, s_prev, stream);
    x = stored;
    prologue = nullptr;
  }
  if (own && train) {
    const ConvGeometry& g = c.geometry();
    const int m = s.n * s.h * s.w;
    float* partials = own_partials_.as<float>();
    const Conv1x1Finalize finalize = finalize_in_kernel(bn, g.k, false);
    int rows = 0;
    if (g.r == 3) {  // layer1's conv2 (BlockRun::c2_own), reading y1 stored: no prologue left
      if (prologue || join) throw Fatal("conv_stats: " + bn.name + "'s 3x3 conv of ours reads its input as stored");
      const Conv3x3Shape s3{s.n, s.h, s.w, g.c, g.k};
      conv3x3_stats({.x = x, .w = params_.working(c.weight), .y = y, .s = s3, .partials = partials, .finalize = finalize},
                    stream);
      rows = conv3x3_partial_rows(s3);
    } else {
      conv1x1_stats({x, params_.working(c.weight), y, m, g.k, g.c, prologue ? prologue->scale_h : nullptr,
                     prologue ? prologue->shift_h : nullptr, partials, Conv1x1Schedule::PingPong, finalize,
                     join ? *join : Conv1x1Join{}},
                    stream);
      rows = conv1x1_partial_rows(m, g.k);
    }
    if (!finalize.arrivals)
      bn_finalize_partials(partials, rows, g.k, s.per_channel(), bn.st, bn.channels, bn.scale_h, bn.shift_h, stream);
    return;
  }
  if (fused) {
    FusedArgs a{.x = x, .w = params_.working(c.weight), .y = y, .sum = bn.sum, .sqsum = bn.sqsum};
    if (prologue) prologue->set_coefficients(a, *fused.plan);  // the previous BN, applied as x is read
    fused.run(ctx_.cudnn, a);
    if (train) {  // the fp16 copies are written with the rest
      bn_finalize_sums(bn.sum, bn.sqsum, s.per_channel(), bn.st, bn.channels, bn.scale_h, bn.shift_h, stream);
      return;
    }
    // The sums are not read in evaluation; zeroed as bn_finalize_sums leaves them (statistics_kept_zero).
    CUDA_CHECK(cudaMemsetAsync(bn.sum, 0, 2 * size_t(bn.channels) * sizeof(float), stream));
    bn_forward(bn, y, s, false);
  } else {
    const void* in = x;
    if (prologue) {
      store_relu_bn(*prologue, x, stored, s_prev, stream);
      in = stored;
    }
    conv_forward(c, in, y);
    bn_forward(bn, y, s, train);
  }
}

void TrainingNetwork::block_forward(const Block& b, BlockRun& r, const void* in, bool train, const ApplyArgs* join) {
  if (join) {  // in (the join's output) is written by conv1, from the join's inputs
    const Conv1x1Join j{.res = join->res, .scale = join->scale, .shift = join->shift,
                        .res_scale = join->residual == Residual::BatchNorm ? join->res_scale : nullptr,
                        .res_shift = join->residual == Residual::BatchNorm ? join->res_shift : nullptr,
                        .out = join->y, .bits = join->relu_bits};
    if (join->y != in) throw Fatal("block_forward: the join conv1 applies must write the block's input");
    conv_stats(b.c1, r.c1_stats, join->x, r.a1.get(), b.b1, b.mid1, train, nullptr, nullptr, {}, r.c1_own, false, &j);
  } else {
    conv_stats(b.c1, r.c1_stats, in, r.a1.get(), b.b1, b.mid1, train, nullptr, nullptr, {}, r.c1_own);
  }
  conv_stats(b.c2, r.c2.fwd, r.a1.get(), r.a2.get(), b.b2, b.mid2, train, &b.b1, r.y1.get(), b.mid1, r.c2_own,
             r.c2.reads_stored);
  // Our conv3 kernel runs in training only: evaluation runs cuDNN's SbrConvStats, bn2 in its prologue.
  conv_stats(b.c3, r.c3.fwd, r.a2.get(), r.a3.get(), b.b3, b.out, train, &b.b2, r.y2.get(), b.mid2, r.c3_own,
             r.c3.reads_stored && train);
  if (b.down)
    conv_stats(*b.down, r.down_stats, in, r.ad.get(), *b.bdown, b.out, train, nullptr, nullptr, {}, r.down_own);
}

ApplyArgs TrainingNetwork::join_args(const Block& b, BlockRun& r, const void* in, bool train) const {
  ApplyArgs a{r.a3.get(), b.b3.st.scale, b.b3.st.shift, Residual::Tensor, in, nullptr, nullptr, true, r.out.get()};
  if (b.down) {
    a.residual = Residual::BatchNorm;
    a.res = r.ad.get();
    a.res_scale = b.bdown->st.scale;
    a.res_shift = b.bdown->st.shift;
  }
  if (train) a.relu_bits = r.relu_bits.as<uint8_t>();
  return a;
}

void TrainingNetwork::loss(const int32_t* labels, LossTotals* totals, const float* loss_scale, const long long* step,
                           float label_smoothing) {
  const bool train = loss_scale != nullptr;
  softmax_xent(logits_.as<float>(), params_.master(layers_->fc_bias), labels, cfg_.batch, cfg_.classes,
               train ? dlogits_.get() : nullptr, cfg_.dtype, train ? params_.vector_grad(layers_->fc_bias) : nullptr,
               loss_scale, label_smoothing, totals, step, ctx_.stream);
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

// ---- the weight gradients' lane ------------------------------------------------------------------
void TrainingNetwork::lane_fork() {
  lane_->forked.record(ctx_.stream);
  CUDA_CHECK(cudaStreamWaitEvent(lane_->stream, lane_->forked, 0));
}

void TrainingNetwork::wgrad_beside(const std::function<void(cudaStream_t, void*, size_t)>& work) {
  if (!lane_) return work(ctx_.stream, workspace_.get(), workspace_.bytes());
  lane_fork();
  CUDNN_CHECK(cudnnSetStream(ctx_.cudnn, lane_->stream));
  try {
    work(lane_->stream, lane_->workspace.get(), lane_->workspace.bytes());
  } catch (...) {
    cudnnSetStream(ctx_.cudnn, ctx_.stream);
    throw;
  }
  CUDNN_CHECK(cudnnSetStream(ctx_.cudnn, ctx_.stream));
  lane_->done.record(lane_->stream);
}

void TrainingNetwork::weight_grad_from_parts(const ConvUnit& c, const float* parts, int rows) {
  const ConvGeometry& g = c.geometry();
  wgrad_beside([&](cudaStream_t lane, void*, size_t) {
    conv1x1_dw_from_partials(parts, rows, g.k, g.c, params_.weight_grad(c.weight), lane);
  });
}

void TrainingNetwork::weight_grad(const ConvUnit& c, const void* x, const void* dy, cudaStream_t stream, void* ws,
                                  size_t ws_bytes) const {
  const auto lt = lane_gemms_.find(c.weight);
  if (lt != lane_gemms_.end())
    lt->second->run(ctx_.cublas_lt, x, dy, params_.weight_grad(c.weight), ws, ws_bytes, stream);
  else
    c.conv->backward_filter(ctx_.cudnn, x, dy, params_.weight_grad(c.weight), ws, ws_bytes);
}

void TrainingNetwork::lane_join() {
  if (lane_) CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, lane_->done, 0));
  if (lane_reads_) lane_reads_->reset();
}

void TrainingNetwork::lane_read(const void* dy) {
  if (lagging_) lane_reads_->read(dy, lane_->stream);
}

void TrainingNetwork::before_write(const void* g) {
  if (lagging_) lane_reads_->before_write(g, ctx_.stream);
}

void TrainingNetwork::conv_done(int weight) {
  if (!lagging_) lane_join();
  grad_ready(weight);
}

// ---- backward -----------------------------------------------------------------------------------
void TrainingNetwork::bn_grads_ready(const Bn& bn) const {
  grad_ready(bn.gamma);
  grad_ready(bn.beta);
}

// Gradient buffers: a block's output gradient arrives in g[0], and, but for the last block, with a
// second part in g[2]; a block leaves its input's gradient in the same two parts: the shortcut's in
// g[0] and the main path's (conv1's data gradient) in g[2]. Whoever reads a block's input gradient
// next (the previous block's join, the stem's BN) sums the two as it reads them. (cuDNN's graph API
// through cudnn-frontend cannot accumulate a data gradient into its output, as the legacy calls
// could with beta = 1.) Where conv1 joins (BlockRun::c1_joins), our kernel adds its part to g[0]
// itself and leaves the previous join's dz there; g[2] then holds only a shortcut's data gradient
// on its way to conv1's join: a stride-2 one's compact (BlockRun::down_compact), or one that read
// the join's dz from g[0] (BlockRun::c3_applies_join). g[1] and g[3] hold the
// gradients inside a block, or, where the weight gradients' lane runs behind (lagging_), one of
// kLaggingSets sets of four by turns from block to block (inner_grads).
void TrainingNetwork::backward() {
  set_chained_launches(chained_);
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  // A gradient reported as written must be written: data-parallel training joins the lane after
  // each conv. The lane's reads pending from an earlier backward were joined at its end.
  lagging_ = lane_reads_ && !on_grad_ready;
  if (lane_reads_) lane_reads_->reset();
  if (turns_on_lane_) CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, lane_->turned, 0));
  turns_on_lane_ = false;
  linear_backward(ctx_.cublas, {cfg_.batch, layers_->features, cfg_.classes}, t, cfg_.tf32, feat_.get(),
                  params_.working(layers_->fc_weight), dlogits_.get(), params_.weight_grad(layers_->fc_weight),
                  dfeat_.get());
  grad_ready(layers_->fc_weight);
  grad_ready(layers_->fc_bias);  // written by loss(), before backward
  global_avgpool_backward(dfeat_.get(), layers_->blocks.back().out, t, l, grad_[0].get(), ctx_.stream);
  for (size_t i = runs_.size(); i-- > 0;) block_backward(i);
  const Bn& bn = layers_->stem_bn;
  const Shape4 s = layers_->stem_out;
  void* g0 = grad_[0].get();
  const BnBackwardArgs stem{.dy = g0, .dy2 = grad_[2].get(), .relu = ReluMask::FromInput, .x = stem_a_.get(),
                            .bn = &bn.st, .dgamma = params_.vector_grad(bn.gamma),
                            .dbeta = params_.vector_grad(bn.beta), .dx = g0};
  // Where the first block's conv1 joined the stem, dz (masked) is in g[0], its sums in own_partials_; our
  // weight gradient then applies the BN backward as it reads dz, and dx is never stored.
  const bool joined = !runs_.empty() && runs_[0].c1_joins;
  const bool applied_in_wgrad = joined && stem_wgrad_own_;
  if (joined) {
    BnBackwardArgs dz = stem;
    dz.dy2 = nullptr;
    dz.relu = ReluMask::None;
    const int rows = conv1x1_dgrad_join_rows(s.n * s.h * s.w, s.c);
    if (applied_in_wgrad)
      bn_backward_finalize(dz, own_partials_.as<float>(), rows, s, ctx_.stream);
    else
      bn_backward_from_sums(dz, own_partials_.as<float>(), rows, s, t, l, ctx_.stream);
  } else {
    bn_backward(stem, s, t, l, bn_scratch_.as<float>(), ctx_.stream);
  }
  bn_grads_ready(bn);
  // The images need no gradient: only the stem's filter gradient.
  const ConvUnit& c = layers_->stem;
  if (stem_wgrad_own_) {
    StemWgrad w{images_, g0, params_.weight_grad(c.weight), stem_partials_.as<float>(), stem_shape()};
    if (applied_in_wgrad) {
      w.bn_x = stem_a_.get();
      w.coef = bn.st.bwd_coef;
    }
    stem_wgrad(w, ctx_.stream);
  } else {
    c.conv->backward_filter(ctx_.cudnn, images_, g0, params_.weight_grad(c.weight), workspace_.get(),
                            workspace_.bytes());
  }
  grad_ready(c.weight);
  if (runs_.empty()) return;
  lane_join();  // the first block's conv1 weight gradient (block_backward); with the lane behind, all of it
  grad_ready(layers_->blocks[0].c1.weight);
}

// Block i's output gradient arrives from the head (g[0] alone, the last block), in two parts (g[0]
// and the next block's conv1's in g[2]), or, where the next block's conv1 joins (BlockRun::c1_joins),
// already as dz in g[0] with its sums in own_partials_.
void TrainingNetwork::block_backward(size_t i) {
  const Block& b = layers_->blocks[i];
  BlockRun& r = runs_[i];
  const void* in = i == 0 ? stem_y_.get() : runs_[i - 1].out.get();
  void *g0 = grad_[0].get(), *g2 = grad_[2].get();
  const InnerGrads grads = inner_grads(i);
  const bool last = i + 1 == runs_.size(), joined = !last && runs_[i + 1].c1_joins;
  join_backward(b, r, last || joined ? nullptr : g2, joined, grads);
  // The shortcut's part of the input's gradient: in g[0], or compact in g[2] (down_compact: g[2] is
  // free once join_backward has read it, and this block's conv1 joins, writing g[0]). After conv3's
  // where conv3 reads the join's dz from g[0]; in g[2] where the shortcut reads dz there too.
  const bool compact = bool(r.down_compact);
  auto shortcut = [&] {
    if (!b.down) return;
    if (r.c3_applies_join) {  // the shortcut's dy made from the join too
      const DyFromJoin from{.a3 = r.ad.get(), .coef = b.bdown->st.bwd_coef};
      return conv_backward(*b.down, in, g0, g2, nullptr, false, nullptr, r.down_dw_parts.as<float>(), &from);
    }
    conv_backward(*b.down, in, grads.shortcut, compact ? g2 : g0, nullptr, false, r.down_compact.get(),
                  r.down_dw_parts.as<float>());
  };
  if (!r.c3_applies_join) shortcut();
  const DyFromJoin from_join{.a3 = r.a3.get(), .coef = b.b3.st.bwd_coef};
  inner_backward(b.c3, r.c3.wgrad, r.c3.dgrad, r.c3.recomputes_input(), r.a2.get(), b.b2, r.y2.get(), b.mid2,
                 r.c3_applies_join ? g0 : grads.a3, grads.mid2, r.c3_dgrad_own, nullptr, r.dw_parts.as<float>(),
                 r.c3_applies_join ? &from_join : nullptr);
  if (r.c3_applies_join) shortcut();
  inner_backward(b.c2, r.c2.wgrad, r.c2.dgrad, r.c2.recomputes_input(), r.a1.get(), b.b1, r.y1.get(), b.mid1, grads.mid2,
                 grads.mid1, r.c2_dgrad_own, r.c2_turned.get());
  // The first block's conv1: its weight gradient may run on beside the stem's backward, which
  // touches neither its input nor its gradient; backward() joins the lane after the stem.
  const bool lane_after_stem = i == 0;
  if (!r.c1_joins) return conv_backward(b.c1, in, grads.mid1, g2, nullptr, lane_after_stem);
  // g[0] holds this block's shortcut gradient, the previous block output's first part: dz over it
  // (a compact one is in g[2], and dz is only written). Before the first block, the stem's BN +
  // ReLU: a join with no shortcut of its own.
  const Block* prev = i > 0 ? &layers_->blocks[i - 1] : nullptr;
  const BlockRun* pr = i > 0 ? &runs_[i - 1] : nullptr;
  const BnChannelState& st = prev ? prev->b3.st : layers_->stem_bn.st;
  const ConvGeometry& g = b.c1.geometry();
  Conv1x1DgradJoin joins{.dy = grads.mid1, .w = params_.working(b.c1.weight), .dz = g0,
                         .relu_bits = (pr ? pr->relu_bits : stem_relu_bits_).as<uint8_t>(),
                         .x = pr ? pr->a3.get() : stem_a_.get(), .mean = st.save_mean, .invstd = st.save_invstd,
                         .partials = own_partials_.as<float>(), .m = b.in.n * b.in.h * b.in.w, .k = g.k, .c = g.c};
  if (prev && prev->down) {
    joins.x2 = pr->ad.get();
    joins.mean2 = prev->bdown->st.save_mean;
    joins.invstd2 = prev->bdown->st.save_invstd;
  }
  if (compact) {  // dz is only written: the shortcut's part comes from g[2]
    joins.g_even = g2;
    joins.img_h = b.in.h;
    joins.img_w = b.in.w;
  }
  if (b.down && r.c3_applies_join) joins.g = g2;  // the shortcut's data gradient, at every pixel
  conv_backward(b.c1, in, grads.mid1, nullptr, &joins, lane_after_stem);
}

// Without the lane behind, g[1] and g[3] by turns (each conv's data gradient waits for the previous
// conv's weight gradient, which reads the buffer it overwrites). Behind, kLaggingSets sets of four
// buffers, by turns from block to block (the first set's a3 and shortcut gradients in g[1] and
// g[3]): the lane may finish a block's weight gradients while the data gradients go on through the
// next blocks on the other sets; a block's writes wait only for the lane's reads of the same set
// kLaggingSets blocks before (before_write, lane_reads_). Measured on an H200 (2026-11-29,
// bench/ab.py, 3 rounds): two sets against --no-fuse ...,lagging-wgrad, batch 128 5.109 -> 4.962 ms
// a step, batch 256 8.953 -> 8.766 ms; three against two, 4.917 -> 4.887 ms and 8.864 -> 8.856 ms
// (bench/results/levers-session25-nvidia-h200-2026-11-29.md and levers-session26-...-29.md).
TrainingNetwork::InnerGrads TrainingNetwork::inner_grads(size_t block) const {
  void *g1 = grad_[1].get(), *g3 = grad_[3].get();
  if (!lagging_) return {.a3 = g1, .shortcut = g3, .mid2 = g3, .mid1 = g1};
  const size_t k = block % kLaggingSets;
  const DeviceBuffer* l = &lagging_grads_[4 * k];
  return {.a3 = k ? l[0].get() : g1, .shortcut = k ? l[1].get() : g3, .mid2 = l[2].get(), .mid1 = l[3].get()};
}

// The join: out = relu(bn3(a3) + shortcut). From its output's gradient (g[0] + dy2, or, joined, dz
// already in g[0]): g[1] = the gradient of a3, and g[3] = that of the shortcut conv's output, or
// g[0] = the identity shortcut's.
void TrainingNetwork::join_backward(const Block& b, BlockRun& r, const void* dy2, bool joined, const InnerGrads& g) {
  if (!r.c3_applies_join) {
    before_write(g.a3);
    if (b.down) before_write(g.shortcut);
  }
  // The ReLU came after the residual add: the forward's bits (join_args).
  BnBackwardArgs last{.dy = grad_[0].get(), .dy2 = dy2, .relu = ReluMask::FromBits,
                      .relu_bits = r.relu_bits.as<uint8_t>(), .x = r.a3.get(), .bn = &b.b3.st,
                      .dgamma = params_.vector_grad(b.b3.gamma), .dbeta = params_.vector_grad(b.b3.beta),
                      .dx = g.a3};
  if (b.down) {
    last.x2 = r.ad.get();
    last.bn2 = &b.bdown->st;
    last.dgamma2 = params_.vector_grad(b.bdown->gamma);
    last.dbeta2 = params_.vector_grad(b.bdown->beta);
    last.dx2 = g.shortcut;
  } else {
    last.dres = grad_[0].get();  // identity shortcut: the input's gradient starts as dz
  }
  if (joined) {  // dz, masked, is in g[0] already (the identity shortcut's gradient too), its sums beside
    last.relu = ReluMask::None;
    last.relu_bits = nullptr;
    last.dres = nullptr;
    const int m = b.out.n * b.out.h * b.out.w;
    const int rows = conv1x1_dgrad_join_rows(m, b.out.c);
    if (r.c3_applies_join) {  // the data gradients apply as they read dz (the shortcut's too)
      bn_backward_finalize(last, own_partials_.as<float>(), rows, b.out, ctx_.stream);
    } else {
      bn_backward_from_sums(last, own_partials_.as<float>(), rows, b.out, cfg_.dtype, cfg_.layout, ctx_.stream);
    }
  } else {
    bn_backward(last, b.out, cfg_.dtype, cfg_.layout, bn_scratch_.as<float>(), ctx_.stream);
  }
  bn_grads_ready(b.b3);
  if (b.down) bn_grads_ready(*b.bdown);
}

void TrainingNetwork::conv_backward(const ConvUnit& c, const void* x, const void* dy, void* dx,
                                    const Conv1x1DgradJoin* joined, bool lane_joined_later, const ConvLayer* dgrad,
                                    float* dw_parts, const DyFromJoin* from_join) {
  if (dgrad && dw_parts) throw Fatal("conv_backward: a compact data gradient cannot take the weight gradient too");
  if (from_join && !dw_parts) throw Fatal("conv_backward: dy is made from the join only where dw is taken too");
  if (!dw_parts) {
    wgrad_beside([&](cudaStream_t s, void* ws, size_t wsb) { weight_grad(c, x, dy, s, ws, wsb); });
    lane_read(dy);
  }
  const ConvLayer& data_grad = dgrad ? *dgrad : *c.conv;
  before_write(joined ? joined->dz : dx);  // g[0] or g[2] today, which the lane never reads: no wait
  if (joined) {
    conv1x1_dgrad_join(*joined, ctx_.stream);
  } else if (dw_parts) {  // dw's parts beside dx; their sum on the lane, which reads nothing else
    const ConvGeometry& g = c.geometry();
    const int m = g.n * g.h * g.w;
    conv1x1_dgrad_dw({.dy = dy, .w = params_.working(c.weight), .dx = dx, .x = x, .dw_partials = dw_parts, .m = m,
                      .k = g.k, .c = g.c, .dy_x = from_join ? from_join->a3 : nullptr,
                      .dy_coef = from_join ? from_join->coef : nullptr},
                     ctx_.stream);
    weight_grad_from_parts(c, dw_parts, conv1x1_dgrad_bn_rows(m, g.c));
  } else {
    data_grad.backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, workspace_.get(), workspace_.bytes());
  }
  if (!lane_joined_later) conv_done(c.weight);
}

void TrainingNetwork::inner_backward(const ConvUnit& c, const FusedCall& wgrad, const FusedCall& dgrad,
                                     bool recompute_input, const void* x, const Bn& bn, void* stored, Shape4 s_in,
                                     void* dy, void* dx, bool own_dgrad, const void* turned, float* dw_parts,
                                     const DyFromJoin* from_join) {
  const bool dw_in_dgrad = dw_parts != nullptr;
  if (from_join && !(own_dgrad && dw_in_dgrad))
    throw Fatal("inner_backward: dy is made from the join only by our data gradient that takes dw too");
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  const cudaStream_t stream = ctx_.stream;
  if (!dw_in_dgrad) wgrad_beside([&](cudaStream_t lane, void* lane_ws, size_t lane_wsb) {
    if (wgrad) {
      FusedArgs a{.x = x, .dy = dy, .dw = params_.weight_grad(c.weight)};
      bn.set_coefficients(a, *wgrad.plan);
      wgrad.run(ctx_.cudnn, a);
      return;
    }
    if (recompute_input)  // the forward read relu(bn(x)) fused and did not store it
      store_relu_bn(bn, x, stored, s_in, lane);
    weight_grad(c, stored, dy, lane, lane_ws, lane_wsb);
  });
  if (!dw_in_dgrad) lane_read(dy);
  before_write(dx);
  float* coef = bn.st.bwd_coef;  // dx = coef[c] * g + coef[C + c] * x + coef[2C + c]
  const int C = bn.channels;
  if (own_dgrad) {  // dz over dx, its sums beside; then the BN backward's apply
    const ConvGeometry& g = c.geometry();
    const int m = s_in.n * s_in.h * s_in.w;
    float* partials = own_partials_.as<float>();
    const Conv1x1Finalize finalize = finalize_in_kernel(bn, g.c, true);
    int rows = 0;
    if (g.r == 3) {  // layer1's conv2 (BlockRun::c2_dgrad_own), by its filter turned in the forward
      const Conv3x3Shape s3{s_in.n, s_in.h, s_in.w, g.c, g.k};
      conv3x3_dgrad_bn({.dy = dy, .turned = turned, .dz = dx, .x = x, .mean = bn.st.save_mean,
                        .invstd = bn.st.save_invstd, .scale = bn.scale_h, .shift = bn.shift_h, .partials = partials,
                        .s = s3, .finalize = finalize},
                       stream);
      rows = conv3x3_dgrad_partial_rows(s3);
    } else {
      conv1x1_dgrad_bn({.dy = dy, .w = params_.working(c.weight), .dz = dx, .x = x, .mean = bn.st.save_mean,
                        .invstd = bn.st.save_invstd, .scale = bn.scale_h, .shift = bn.shift_h, .partials = partials,
                        .m = m, .k = g.k, .c = g.c, .finalize = finalize, .dw_partials = dw_parts,
                        .dy_x = from_join ? from_join->a3 : nullptr, .dy_coef = from_join ? from_join->coef : nullptr},
                       stream);
      rows = conv1x1_dgrad_bn_rows(m, g.c);
      if (dw_parts) weight_grad_from_parts(c, dw_parts, rows);  // beside the BN backward's apply
    }
    const BnBackwardArgs mid{.dy = dx, .x = x, .bn = &bn.st, .dgamma = params_.vector_grad(bn.gamma),
                             .dbeta = params_.vector_grad(bn.beta), .dx = dx};
    if (finalize.arrivals)  // finalized by the kernel
      bn_backward_apply(mid, s_in, t, l, stream);
    else
      bn_backward_from_sums(mid, partials, rows, s_in, t, l, stream);
  } else if (dgrad) {
    const FusedArgs a{.x = x, .w = params_.working(c.weight), .dy = dy, .mean = bn.st.save_mean,
                      .invstd = bn.st.save_invstd, .gamma = bn.st.gamma, .beta = bn.st.beta, .g = dx,
                      .dgamma = params_.vector_grad(bn.gamma), .dbeta = params_.vector_grad(bn.beta),
                      .eq_dy = coef, .eq_x = coef + C, .eq_b = coef + 2 * C};
    dgrad.run(ctx_.cudnn, a);
    // dx = eq_dy * g + eq_b + eq_x * x: the join kernel with x as the "second BN" and no ReLU, in place.
    bn_apply({dx, coef, coef + 2 * C, Residual::BatchNorm, x, coef + C, zeros_.as<float>(), false, dx}, s_in, t, l,
             stream);
  } else {
    c.conv->backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, workspace_.get(), workspace_.bytes());
    const BnBackwardArgs mid{.dy = dx, .relu = ReluMask::FromInput, .x = x, .bn = &bn.st,
                             .dgamma = params_.vector_grad(bn.gamma), .dbeta = params_.vector_grad(bn.beta),
                             .dx = dx};
    bn_backward(mid, s_in, t, l, bn_scratch_.as<float>(), stream);
  }
  conv_done(c.weight);
  bn_grads_ready(bn);
}
