// The inference network (model/inference_network.h): its table of decisions, buffers and forward.
#include "model/inference_network.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "core/elapsed.h"
#include "model/fused_conv.h"
#include "model/fusion_planner.h"
#include "model/gemm_conv.h"
#include "model/resnet50_layers.h"

// One conv: what writes its BN's output (a cuDNN epilogue pattern, a cuBLASLt GEMM, or neither: the
// plain conv and our apply pass), which may read the BN's coefficients in fp16 (wants_half).
struct InferenceNetwork::ConvRun {
  const ConvUnit* conv = nullptr;
  Bn* bn = nullptr;
  Shape4 out;
  FusedPattern pattern, as_gemm;  // its BN in cuDNN's epilogue pattern, or in a cuBLASLt GEMM's
  int x = -1, z = -1;           // the runs whose outputs it reads as input (-1: the images) and residual
  DeviceBuffer y{};             // its output: no conv output is stored apart from its BN's
  const FusedConv* fused = nullptr;
  const GemmConv* gemm = nullptr;
  void* gemm_filter = nullptr;  // the filter with the BN's scale folded in
  bool wants_half() const { return gemm || (fused && fused->scale_type() == DType::F16); }
};

InferenceNetwork::InferenceNetwork(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache)
    : Network(cfg, ctx, cache, false) {
  using P = FusedPattern;
  auto add = [&](const ConvUnit& c, Bn& bn, Shape4 out, P pattern, P as_gemm, int x, int z = -1) {
    runs_.push_back({&c, &bn, out, pattern, as_gemm, x, z});
    return int(runs_.size()) - 1;
  };
  int cur = add(layers_->stem, layers_->stem_bn, layers_->stem_out, P::ConvBnRelu, P::GemmBnRelu, -1);
  for (Block& b : layers_->blocks) {
    const int a1 = add(b.c1, b.b1, b.mid1, P::ConvBnRelu, P::GemmBnRelu, cur);
    const int a2 = add(b.c2, b.b2, b.mid2, P::ConvBnRelu, P::GemmBnRelu, a1);
    // The projection shortcut's BN has no ReLU: the join's comes after the add, in conv3's epilogue.
    const int shortcut = b.down ? add(*b.down, *b.bdown, b.out, P::ConvBn, P::GemmBn, cur) : cur;
    cur = add(b.c3, b.b3, b.out, P::ConvBnAddRelu, P::GemmBnAddRelu, a2, shortcut);
  }
  const size_t es = dtype_size(cfg.dtype);
  size_t act = 0;
  for (const ConvRun& r : runs_) act += r.out.count();
  activation_bytes_ = act * es;
  check_memory(activation_bytes_);
  if (cfg.fuses()) plan_convs(cache);
  size_t ws = conv_workspace_;
  for (const auto& [key, plan] : fused_plans_) ws = std::max(ws, plan->workspace());
  for (const auto& [key, plan] : gemm_plans_) ws = std::max(ws, plan->workspace());
  workspace_ = DeviceBuffer(ws, "cuDNN workspace (--workspace-mb)");
  algo_report_.workspace = ws;
  const std::string batch = " (batch " + std::to_string(cfg.batch) + ")";
  for (ConvRun& r : runs_) r.y = DeviceBuffer(r.out.count() * es, (r.x < 0 ? "stem output" : "activations") + batch);
  allocate_coefficients();
}

InferenceNetwork::~InferenceNetwork() = default;

// The table of decisions: each BN in the epilogue of the conv that writes its input, which saves
// our apply pass (conv3's also reads the residual). A 1x1 conv runs as a GEMM where measured faster
// than what cuDNN runs for it (nothing is chosen without measuring).
void InferenceNetwork::plan_convs(AutotuneCache& cache) {
  const auto start = std::chrono::steady_clock::now();
  size_t largest = layers_->stem_out.count();
  for (const ConvRun& r : runs_) largest = std::max(largest, r.out.count());
  FusionPlanner planner(cfg_, ctx_, cache, fusion_report_, largest, nullptr);
  for (ConvRun& r : runs_) {
    const BnPass saved = r.pattern == FusedPattern::ConvBnAddRelu ? BnPass::ApplyAdd : BnPass::Apply;
    const float unfused = total_ms({r.conv->conv->algorithms().fwd.ms, planner.pass_ms(saved, r.out)});
    r.fused = planner.fuse(*r.conv, r.pattern, unfused);
    r.gemm = planner.gemm(*r.conv, r.as_gemm, r.fused ? r.fused->ms() : unfused);
    if (!r.gemm) continue;
    ++fusion_report_.gemms;
    if (!r.fused) {  // the BN is fused after all: not a refusal
      ++fusion_report_.fused;
      std::erase_if(fusion_report_.refused, [&](const FusionRefusal& f) { return f.layer == r.conv->name; });
    }
    r.fused = nullptr;
  }
  fused_plans_ = planner.take_fused();
  gemm_plans_ = planner.take_gemms();
  fusion_report_.seconds = seconds_since(start);
}

// Every BN's coefficients in one launch (with fp16 copies for the convs that read them so), and the
// GEMM convs' filters with their BN's scale folded in, refreshed by each forward.
void InferenceNetwork::allocate_coefficients() {
  size_t halves = 0, folded = 0;
  for (const ConvRun& r : runs_) {
    if (r.wants_half()) halves += 2 * size_t(r.bn->channels);
    if (r.gemm) folded += r.conv->geometry().filter_count();
    widest_bn_ = std::max(widest_bn_, r.bn->channels);
  }
  coefficients_half_ = DeviceBuffer(halves * sizeof(uint16_t), "fused BN fp16 scale and shift");
  gemm_filters_ = DeviceBuffer(folded * sizeof(uint16_t), "filters with the BN folded in");
  uint16_t* half = coefficients_half_.as<uint16_t>();
  uint16_t* filter = gemm_filters_.as<uint16_t>();
  std::vector<BnEvalTarget> targets;  // every BN, each applied by one conv
  std::vector<FilterFold> folds;
  for (ConvRun& r : runs_) {
    if (r.wants_half()) {
      r.bn->scale_h = half;
      r.bn->shift_h = half + r.bn->channels;
      half += 2 * r.bn->channels;
    }
    targets.push_back({r.bn->st, r.bn->channels, r.bn->scale_h, r.bn->shift_h});
    if (!r.gemm) continue;
    const ConvGeometry& g = r.conv->geometry();
    r.gemm_filter = filter;
    folds.push_back({params_.working(r.conv->weight), r.bn->st.scale, filter, g.k, g.c});
    filter += g.filter_count();
    largest_fold_ = std::max(largest_fold_, g.filter_count());
  }
  fold_targets_ = DeviceBuffer(folds.size() * sizeof(FilterFold), "filter folds");
  if (!folds.empty())
    CUDA_CHECK(cudaMemcpy(fold_targets_.get(), folds.data(), fold_targets_.bytes(), cudaMemcpyHostToDevice));
  eval_targets_ = DeviceBuffer(targets.size() * sizeof(BnEvalTarget), "BN evaluation targets");
  CUDA_CHECK(cudaMemcpy(eval_targets_.get(), targets.data(), eval_targets_.bytes(), cudaMemcpyHostToDevice));
}

void InferenceNetwork::conv_bn(const ConvRun& r, const void* images) {
  const cudaStream_t stream = ctx_.stream;
  const void* x = r.x < 0 ? images : runs_[r.x].y.get();
  const void* z = r.z < 0 ? nullptr : runs_[r.z].y.get();
  void* y = r.y.get();
  if (r.gemm) {
    r.gemm->run(ctx_.cublas_lt, x, r.gemm_filter, r.bn->shift_h, z, y, workspace_.get(), workspace_.bytes(), stream);
    return;
  }
  const BnChannelState& st = r.bn->st;
  if (r.fused) {
    FusedArgs a{.x = x, .w = params_.working(r.conv->weight), .y = y, .z = z};
    r.bn->set_coefficients(a, *r.fused);
    r.fused->run(ctx_.cudnn, a, workspace_.get(), workspace_.bytes());
    return;
  }
  conv_forward(*r.conv, x, y);
  const bool relu = r.pattern != FusedPattern::ConvBn;
  bn_apply({y, st.scale, st.shift, z ? Residual::Tensor : Residual::None, z, nullptr, nullptr, relu, y}, r.out,
           cfg_.dtype, cfg_.layout, stream);
}

// Per block: out = relu(bn3(conv3(a2)) + shortcut), the shortcut bn_down(conv_down(in)) or in itself.
void InferenceNetwork::forward(const void* images) {
  // The weights and running statistics may have changed since the last forward (a checkpoint
  // restored into the network).
  bn_forward_eval_coefs_all(eval_targets_.as<BnEvalTarget>(), int(runs_.size()), widest_bn_, ctx_.stream);
  const int folds = int(fold_targets_.bytes() / sizeof(FilterFold));
  fold_bn_into_filters(fold_targets_.as<FilterFold>(), folds, largest_fold_, ctx_.stream);
  for (const ConvRun& r : runs_) conv_bn(r, images);
  classify(runs_.back().y.get());
}
