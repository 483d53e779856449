// ResNet-50's bottleneck blocks with batch norm fused into the convolutions (OPT_FUSED_BN), as
// NVIDIA's MLPerf ResNet-50 does it (../shared/design.md, "Fusion and graphs"):
//   forward   conv1 and the shortcut conv emit their output's BN statistics (ConvStats); conv2 and
//             conv3 apply the previous BN's scale/bias + ReLU while reading their input and emit
//             their own statistics (SbrConvStats); a per-channel finalize turns sums into scale/bias;
//             one of our kernels applies both branches' BN + add + ReLU at the join. y1 and y2, the
//             inner BN outputs, are never stored.
//   backward  the join's BN backward is ours; conv3 and conv2 take their weight gradient from the
//             BN output recomputed as they read (SbrWgrad) and their data gradient with the ReLU and
//             BN backward weights in its epilogue (DgradDreluDbn), after which one elementwise pass
//             of ours applies dx = eq_dy * g + eq_x * x + eq_b.
//   inference the BN's coefficients come from its running statistics, known before the conv runs:
//             every conv (the stem's too) applies its BN, the ReLU and at conv3 the residual in its
//             epilogue (ConvBnRelu, ConvBn, ConvBnAddRelu), so no BN pass of ours remains; a 1x1
//             conv measured faster so runs instead as one cuBLASLt GEMM with the BN's scale folded
//             into its filter and the rest in the GEMM's epilogue (GemmConv, model/gemm_conv.h).
// A pattern cuDNN refused for a conv runs as the plain conv and our BN kernels instead (unfused,
// as src/model/resnet50.cpp runs every block), storing y1/y2 where that needs them.
#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>
#include <tuple>

#include "core/check.h"
#include "core/elapsed.h"
#include "kernels/cast.h"
#include "model/resnet50.h"
#include "model/resnet50_parts.h"

namespace {

bool usable(const std::shared_ptr<FusedConv>& f) { return f && f->ok(); }

// The prologue's or epilogue's scale and bias: bn's coefficients in the type the pattern's engine takes.
template <class Bn>
void set_coefficients(FusedArgs& a, const FusedConv& f, const Bn& bn) {
  const bool half = f.scale_type() == DType::F16;
  a.scale = half ? bn.scale_h : bn.st.scale;
  a.bias = half ? bn.shift_h : bn.st.shift;
}

// bn's scale and shift in fp16, where a fused pattern's engine reads them so (Bn::wants_half).
template <class Bn>
void copy_coefficients_to_half(const Bn& bn, cudaStream_t stream) {
  if (!bn.wants_half) return;
  cast_f32_to_f16(bn.st.scale, bn.scale_h, bn.channels, stream);
  cast_f32_to_f16(bn.st.shift, bn.shift_h, bn.channels, stream);
}

// What the fallbacks of a block need stored: relu(bn1(a1)) when conv2 cannot read it fused, and
// likewise relu(bn2(a2)) for conv3.
bool needs_stored_input(const std::shared_ptr<FusedConv>& fwd, const std::shared_ptr<FusedConv>& wgrad) {
  return !usable(fwd) || !usable(wgrad);
}

}  // namespace

// The time of one pass of our BN kernels at a shape, measured on scratch memory: what a fused
// pattern saves (or, for the data gradient, what it adds). -1 when not measuring.
namespace {
enum class BnPass { Apply, ApplyAdd, Stats, Backward, DxApply };

float total_ms(std::initializer_list<float> parts) {
  float t = 0;
  for (float p : parts) {
    if (p < 0) return -1;
    t += p;
  }
  return t;
}

class BnPassTimer {
 public:
  // Scratch: two activations of `largest` elements and one BN's vectors; `bn_scratch` is the
  // network's BN partial sums (training only: the statistics passes need it).
  BnPassTimer(bool measure, size_t largest, DType t, Layout l, float* bn_scratch, cudaStream_t stream)
      : measure_(measure), t_(t), l_(l), bn_scratch_(bn_scratch), stream_(stream) {
    if (!measure) return;
    const size_t es = dtype_size(t);
    tx_ = DeviceBuffer(largest * es, "fusion timing");
    ty_ = DeviceBuffer(largest * es, "fusion timing");
    tv_ = DeviceBuffer(9 * kWidest * sizeof(float), "fusion timing");
    for (DeviceBuffer* d : {&tx_, &ty_, &tv_}) CUDA_CHECK(cudaMemset(d->get(), 0x3C, d->bytes()));
    float* v = tv_.as<float>();
    bn_ = {v, v + kWidest, v + 2 * kWidest, v + 3 * kWidest, v + 4 * kWidest, v + 5 * kWidest, v + 6 * kWidest,
           v + 7 * kWidest, v + 8 * kWidest};
  }

  float operator()(BnPass p, Shape4 s) {
    if (!measure_) return -1;
    float& ms = ms_[{p, s.count() * 65536 + s.c}];
    if (ms > 0) return ms;
    ms = fastest_ms(stream_, 3, [&] { run(p, s); });
    return ms;
  }

 private:
  static constexpr size_t kWidest = 2048;  // channels
  void run(BnPass p, Shape4 s) {
    void *x = tx_.get(), *y = ty_.get();
    switch (p) {
      case BnPass::Apply:
        bn_apply({x, bn_.scale, bn_.shift, Residual::None, nullptr, nullptr, nullptr, true, y}, s, t_, l_, stream_);
        break;
      case BnPass::ApplyAdd:
        bn_apply({x, bn_.scale, bn_.shift, Residual::Tensor, x, nullptr, nullptr, true, y}, s, t_, l_, stream_);
        break;
      case BnPass::Stats: bn_forward_train_stats(x, s, t_, l_, bn_, bn_scratch_, stream_); break;
      case BnPass::Backward: {
        BnBackwardArgs a{};
        a.dy = x;
        a.relu = ReluMask::FromInput;
        a.x = x;
        a.bn = &bn_;
        a.dgamma = bn_.save_mean;
        a.dbeta = bn_.save_invstd;
        a.dx = y;
        bn_backward(a, s, t_, l_, bn_scratch_, stream_);
        break;
      }
      case BnPass::DxApply:
        bn_apply({x, bn_.scale, bn_.shift, Residual::BatchNorm, x, bn_.scale, bn_.shift, false, y}, s, t_, l_, stream_);
        break;
    }
  }
  bool measure_;
  DType t_;
  Layout l_;
  float* bn_scratch_;
  cudaStream_t stream_;
  DeviceBuffer tx_, ty_, tv_;
  BnChannelState bn_{};
  std::map<std::pair<BnPass, size_t>, float> ms_;
};
}  // namespace

// Tries every pattern each conv needs (one FusedConv per pattern and shape, shared by the convs of
// that shape) and keeps it where cuDNN accepts it and, when autotuning, where it measures no slower
// than the plain conv with the BN passes it saves; then gives each BN its fused state and each
// block the buffers its unfused convs need. Returns the largest workspace a fused plan needs.
// Autotuning, each pattern's measured plan goes into `cache`, and a plan found there is built
// alone (the runtime-compiled engines of the inference patterns made bin/predict's start 8 s longer).
size_t ResNet50::build_fusion(AutotuneCache& cache) {
  const auto start = std::chrono::steady_clock::now();
  const bool measure = cfg_.conv.policy == AlgoPolicy::Autotune;
  const FusedOptions o{cfg_.dtype, cfg_.layout, cfg_.conv.deterministic, cfg_.conv.workspace_limit, measure};
  const Shape4 stem{cfg_.batch, 64, cfg_.image_side, cfg_.image_side};
  size_t largest = stem.count();
  for (const auto& b : blocks_) largest = std::max({largest, b->mid1.count(), b->mid2.count(), b->out.count()});
  BnPassTimer pass(measure, largest, cfg_.dtype, cfg_.layout, bn_scratch_.as<float>(), ctx_.stream);

  size_t ws = 0;
  // One plan per pattern and shape (`key`), shared by the convs of that shape, whether cuDNN's
  // (FusedConv) or cuBLASLt's (GemmConv): built once by make(); measuring, its choice goes into the
  // cache with the alternative's time it is weighed against (`alternative_ms`), and a cached plan
  // that no longer plans is dropped from it. A cached plan is weighed against the alternative's time
  // measured with it: alternative_ms becomes that, so the choice stays as it was made (our BN passes,
  // timed again, would turn near ties from start to start).
  auto plan_once = [&](auto& made, const std::string& key, const FusedChoice* cached, float& alternative_ms,
                       auto make) -> auto& {
    auto& plan = made[key];
    if (!plan) {
      plan = make();
      ++fusion_report_.plans;
      fusion_report_.plans_cached += plan->from_cache();
      if (measure && plan->ok() && (!plan->from_cache() || cached->unfused_ms < 0)) {
        FusedChoice c = plan->choice();  // measured now, or cached without the alternative's time
        c.unfused_ms = alternative_ms;
        cache.put_fused(key, c);
      } else if (cached && !plan->ok()) {
        cache.erase_fused(key);  // refused now: nothing to rebuild at the next start
      }
    }
    if (plan->from_cache() && cached->unfused_ms >= 0) alternative_ms = cached->unfused_ms;
    return plan;
  };
  std::map<std::string, std::shared_ptr<FusedConv>> made;
  auto fuse = [&](ConvUnit& u, FusedPattern p, float unfused_ms) -> std::shared_ptr<FusedConv> {
    if (cfg_.unfused_patterns & fused_pattern_bit(p)) {  // not even planned: nothing to measure or cache
      ++fusion_report_.tried;
      fusion_report_.refused.push_back({u.name, p, kSwitchedOff});
      return nullptr;
    }
    const std::string key = fused_cache_key(p, u.conv->geometry());
    const FusedChoice* cached = measure ? cache.find_fused(key) : nullptr;
    const std::shared_ptr<FusedConv>& f = plan_once(made, key, cached, unfused_ms, [&] {
      return std::make_shared<FusedConv>(ctx_.cudnn, p, u.conv->geometry(), o, cached);
    });
    ++fusion_report_.tried;
    if (!f->ok()) {
      fusion_report_.refused.push_back({u.name, p, f->why()});
      return nullptr;
    }
    if (!run_fused({true, f->ms(), unfused_ms})) {
      fusion_report_.refused.push_back({u.name, p, kSlowerThanUnfused});
      return nullptr;
    }
    ++fusion_report_.fused;
    fusion_report_.half_coefficients += has_scale_bias(p) && f->scale_type() == DType::F16;
    ws = std::max(ws, f->workspace());
    return f;
  };
  // Inference, a 1x1 conv as one cuBLASLt GEMM (model/gemm_conv.h): only where measured faster than
  // what cuDNN runs for it (`alternative_ms`, kept in the GEMM's cache entry as `unfused`, so that a
  // later start makes the same choice). Returns null where it is not taken.
  std::map<std::string, std::shared_ptr<GemmConv>> made_gemm;
  auto gemm = [&](ConvUnit& u, FusedPattern p, float alternative_ms) -> std::shared_ptr<GemmConv> {
    const ConvGeometry& g = u.conv->geometry();
    if (!measure || !GemmConv::applies(g) || cfg_.dtype != DType::F16 || cfg_.layout != Layout::NHWC ||
        (cfg_.unfused_patterns & fused_pattern_bit(p)))
      return nullptr;
    const std::string key = fused_cache_key(p, g);
    const FusedChoice* cached = cache.find_fused(key);
    const std::shared_ptr<GemmConv>& m = plan_once(made_gemm, key, cached, alternative_ms, [&] {
      return std::make_shared<GemmConv>(ctx_.cublas_lt, p, g, cfg_.conv.workspace_limit, ctx_.stream, cached);
    });
    if (!m->ok() || alternative_ms < 0 || m->ms() >= alternative_ms) return nullptr;
    ws = std::max(ws, m->workspace());
    return m;
  };
  if (cfg_.inference) {
    // Each BN in the epilogue of the conv that writes its input: saves the apply pass (conv3's also
    // reads the residual). The projection shortcut's BN has no ReLU: the join's comes after the add.
    auto epilogue = [&](ConvUnit& u, FusedPattern p, FusedPattern as_gemm, Shape4 out) {
      const BnPass saved = p == FusedPattern::ConvBnAddRelu ? BnPass::ApplyAdd : BnPass::Apply;
      const float unfused = total_ms({u.conv->algorithms().fwd.ms, pass(saved, out)});
      u.fused_fwd = fuse(u, p, unfused);
      u.gemm = gemm(u, as_gemm, u.fused_fwd ? u.fused_fwd->ms() : unfused);
      if (!u.gemm) return;
      ++fusion_report_.gemms;
      if (u.fused_fwd) {
        u.fused_fwd = nullptr;
        return;
      }
      ++fusion_report_.fused;  // the BN is fused after all: not a refusal
      auto& r = fusion_report_.refused;
      r.erase(std::remove_if(r.begin(), r.end(), [&](const FusionRefusal& f) { return f.layer == u.name; }), r.end());
    };
    epilogue(*stem_conv_, FusedPattern::ConvBnRelu, FusedPattern::GemmBnRelu, stem);
    for (auto& b : blocks_) {
      epilogue(b->c1, FusedPattern::ConvBnRelu, FusedPattern::GemmBnRelu, b->mid1);
      epilogue(b->c2, FusedPattern::ConvBnRelu, FusedPattern::GemmBnRelu, b->mid2);
      if (b->down) epilogue(*b->down, FusedPattern::ConvBn, FusedPattern::GemmBn, b->out);
      epilogue(b->c3, FusedPattern::ConvBnAddRelu, FusedPattern::GemmBnAddRelu, b->out);
    }
  } else {
    for (auto& b : blocks_) {
      const ConvAlgos& a1 = b->c1.conv->algorithms();
      b->c1.fused_fwd = fuse(b->c1, FusedPattern::ConvStats, total_ms({a1.fwd.ms, pass(BnPass::Stats, b->mid1)}));
      for (auto [u, in, out] : {std::tuple{&b->c2, b->mid1, b->mid2}, std::tuple{&b->c3, b->mid2, b->out}}) {
        const ConvAlgos& a = u->conv->algorithms();
        u->fused_fwd = fuse(*u, FusedPattern::SbrConvStats,
                            total_ms({pass(BnPass::Apply, in), a.fwd.ms, pass(BnPass::Stats, out)}));
        // Unfused, the weight gradient reads relu(bn(x)): stored by an unfused forward, else recomputed.
        u->fused_wgrad = fuse(*u, FusedPattern::SbrWgrad,
                              total_ms({a.bwd_filter.ms, u->fused_fwd ? pass(BnPass::Apply, in) : 0.f}));
        // Fused, the data gradient still needs our dx pass: it saves the BN backward's other pass.
        const float unfused = total_ms({a.bwd_data.ms, pass(BnPass::Backward, in)});
        const float dx = pass(BnPass::DxApply, in);
        u->fused_dgrad = fuse(*u, FusedPattern::DgradDreluDbn, unfused < 0 || dx < 0 ? -1 : unfused - dx);
      }
      if (b->down) {
        const ConvAlgos& a = b->down->conv->algorithms();
        b->down->fused_fwd =
            fuse(*b->down, FusedPattern::ConvStats, total_ms({a.fwd.ms, pass(BnPass::Stats, b->out)}));
      }
    }
  }
  allocate_fused_state();
  fusion_report_.seconds = seconds_since(start);
  return ws;
}

ZeroedRange ResNet50::statistics_kept_zero() const {
  if (!fused() || cfg_.inference) return {};
  return {fused_sums_.get(), fused_sums_.bytes()};
}

// Per BN of the blocks (and the stem's, in inference): sum and sum of squares (fp32), and
// scale/shift in fp16 (C halves each) for the patterns whose engines take them so; and, training,
// the stored BN outputs an unfused conv of a block needs.
void ResNet50::allocate_fused_state() {
  std::vector<Bn*> bns = all_bns();
  if (!cfg_.inference) bns.erase(bns.begin());  // the stem's BN is ours in training
  size_t channels = 0, widest = 0;
  for (const Bn* bn : bns) channels += size_t(bn->channels), widest = std::max(widest, size_t(bn->channels));
  fused_sums_ = DeviceBuffer(2 * channels * sizeof(float), "fused BN statistics");
  CUDA_CHECK(cudaMemset(fused_sums_.get(), 0, fused_sums_.bytes()));  // zero between uses (statistics_kept_zero)
  fused_half_ = DeviceBuffer(2 * channels * sizeof(uint16_t), "fused BN fp16 scale and shift");
  zeros_ = DeviceBuffer(widest * sizeof(float), "fused BN zero vector");
  CUDA_CHECK(cudaMemset(zeros_.get(), 0, zeros_.bytes()));
  float* sums = fused_sums_.as<float>();
  uint16_t* halves = fused_half_.as<uint16_t>();
  for (Bn* bn : bns) {
    const int C = bn->channels;
    bn->sum = sums;
    bn->sqsum = sums + C;
    bn->scale_h = halves;
    bn->shift_h = halves + C;
    sums += 2 * C;
    halves += 2 * C;
  }
  auto reads_half = [](const std::shared_ptr<FusedConv>& f) { return usable(f) && f->scale_type() == DType::F16; };
  if (cfg_.inference) {  // each conv's epilogue reads its own BN's coefficients (a GEMM's bias: the fp16 shift)
    std::vector<std::pair<ConvUnit*, Bn*>> convs = {{stem_conv_.get(), stem_bn_.get()}};
    for (auto& b : blocks_) {
      convs.insert(convs.end(), {{&b->c1, &b->b1}, {&b->c2, &b->b2}, {&b->c3, &b->b3}});
      if (b->down) convs.push_back({&*b->down, &*b->bdown});
    }
    size_t folded = 0;
    for (auto [u, bn] : convs) {
      bn->wants_half = reads_half(u->fused_fwd) || u->gemm;
      if (u->gemm) folded += u->conv->geometry().filter_count();
    }
    // The GEMM convs' filters with the BN's scale folded in, refreshed by each forward (forward()).
    gemm_filters_ = DeviceBuffer(folded * sizeof(uint16_t), "filters with the BN folded in");
    std::vector<FilterFold> folds;
    uint16_t* next = gemm_filters_.as<uint16_t>();
    for (auto [u, bn] : convs) {
      if (!u->gemm) continue;
      const ConvGeometry& g = u->conv->geometry();
      u->gemm_filter = next;
      folds.push_back({params_.working(u->weight), bn->st.scale, next, g.k, g.c});
      next += g.filter_count();
      largest_fold_ = std::max(largest_fold_, g.filter_count());
    }
    fold_targets_ = DeviceBuffer(folds.size() * sizeof(FilterFold), "filter folds");
    if (!folds.empty())
      CUDA_CHECK(cudaMemcpy(fold_targets_.get(), folds.data(), fold_targets_.bytes(), cudaMemcpyHostToDevice));
    fold_count_ = static_cast<int>(folds.size());
    // All of them are computed in one launch at the start of each forward (forward()).
    std::vector<BnEvalTarget> targets;
    for (const Bn* bn : bns)
      targets.push_back({bn->st, bn->channels, bn->wants_half ? bn->scale_h : nullptr,
                         bn->wants_half ? bn->shift_h : nullptr});
    eval_targets_ = DeviceBuffer(targets.size() * sizeof(BnEvalTarget), "BN evaluation targets");
    CUDA_CHECK(cudaMemcpy(eval_targets_.get(), targets.data(), eval_targets_.bytes(), cudaMemcpyHostToDevice));
    eval_target_count_ = static_cast<int>(targets.size());
    widest_bn_ = static_cast<int>(widest);
    return;
  }
  const size_t es = dtype_size(cfg_.dtype);
  const std::string batch = " (batch " + std::to_string(cfg_.batch) + ")";
  for (auto& b : blocks_) {  // conv2 and conv3 read the previous BN's coefficients in their prologue
    for (auto [u, bn] : {std::pair{&b->c2, &b->b1}, std::pair{&b->c3, &b->b2}})
      for (const auto& f : {u->fused_fwd, u->fused_wgrad}) bn->wants_half |= reads_half(f);
    if (needs_stored_input(b->c2.fused_fwd, b->c2.fused_wgrad))
      b->y1 = DeviceBuffer(b->mid1.count() * es, "activations for an unfused conv" + batch);
    if (needs_stored_input(b->c3.fused_fwd, b->c3.fused_wgrad))
      b->y2 = DeviceBuffer(b->mid2.count() * es, "activations for an unfused conv" + batch);
  }
}

// y = conv(x) or conv(relu(bn_prev(x))), then `bn`'s coefficients from y's statistics (training)
// or its running statistics (evaluation). `stored` receives relu(bn_prev(x)) when the conv cannot
// read it fused.
void ResNet50::fused_conv_stats(ConvUnit& c, const void* x, void* y, Bn& bn, Shape4 s, bool train, const Bn* prologue,
                                void* stored, Shape4 s_prev) {
  const cudaStream_t stream = ctx_.stream;
  if (usable(c.fused_fwd)) {
    FusedArgs a;
    a.x = x;
    a.w = params_.working(c.weight);
    a.y = y;
    a.sum = bn.sum;
    a.sqsum = bn.sqsum;
    if (prologue) set_coefficients(a, *c.fused_fwd, *prologue);
    c.fused_fwd->run(ctx_.cudnn, a, workspace_.get(), workspace_.bytes());
    if (train) {
      bn_finalize_sums(bn.sum, bn.sqsum, s.per_channel(), bn.st, bn.channels, bn.wants_half ? bn.scale_h : nullptr,
                       bn.shift_h, stream);
      return;  // the fp16 copies are written with the rest
    }
    // The sums are not read in evaluation; zeroed as bn_finalize_sums leaves them (statistics_kept_zero).
    CUDA_CHECK(cudaMemsetAsync(bn.sum, 0, 2 * size_t(bn.channels) * sizeof(float), stream));
    bn_forward_eval_coefs(bn.st, bn.channels, stream);
  } else {
    const void* in = x;
    if (prologue) {
      bn_apply({x, prologue->st.scale, prologue->st.shift, Residual::None, nullptr, nullptr, nullptr, true, stored},
               s_prev, cfg_.dtype, cfg_.layout, stream);
      in = stored;
    }
    conv_forward(c, in, y);
    bn_forward(bn, y, s, train);
  }
  copy_coefficients_to_half(bn, stream);  // for the next conv's prologue
}

void ResNet50::fused_block_forward(Block& b, const void* in, bool train) {
  fused_conv_stats(b.c1, in, b.a1.get(), b.b1, b.mid1, train, nullptr, nullptr, {});
  fused_conv_stats(b.c2, b.a1.get(), b.a2.get(), b.b2, b.mid2, train, &b.b1, b.y1.get(), b.mid1);
  fused_conv_stats(b.c3, b.a2.get(), b.a3.get(), b.b3, b.out, train, &b.b2, b.y2.get(), b.mid2);
  if (b.down) fused_conv_stats(*b.down, in, b.ad.get(), *b.bdown, b.out, train, nullptr, nullptr, {});
  join_forward(b, in, train);
}

// Inference: conv + BN (+ z) (+ ReLU) in one cuDNN kernel, or the plain conv and our apply pass in
// place over its output; the BN's coefficients (from its running statistics) were computed for
// every BN at the start of the forward.
void ResNet50::inference_conv(ConvUnit& c, const void* x, void* y, Bn& bn, Shape4 s, bool relu, const void* z) {
  const cudaStream_t stream = ctx_.stream;
  if (c.gemm) {
    c.gemm->run(ctx_.cublas_lt, x, c.gemm_filter, bn.shift_h, z, y, workspace_.get(), workspace_.bytes(), stream);
    return;
  }
  if (usable(c.fused_fwd)) {
    FusedArgs a;
    a.x = x;
    a.w = params_.working(c.weight);
    a.y = y;
    a.z = z;
    set_coefficients(a, *c.fused_fwd, bn);
    c.fused_fwd->run(ctx_.cudnn, a, workspace_.get(), workspace_.bytes());
    return;
  }
  conv_forward(c, x, y);
  bn_apply({y, bn.st.scale, bn.st.shift, z ? Residual::Tensor : Residual::None, z, nullptr, nullptr, relu, y}, s,
           cfg_.dtype, cfg_.layout, stream);
}

// out = relu(bn3(conv3(a2)) + shortcut), the shortcut bn_down(conv_down(in)) or in itself; a1 and a2
// hold the BN + ReLU outputs (inference stores no conv output it will not read again).
void ResNet50::inference_block_forward(Block& b, const void* in) {
  inference_conv(b.c1, in, b.a1.get(), b.b1, b.mid1, true, nullptr);
  inference_conv(b.c2, b.a1.get(), b.a2.get(), b.b2, b.mid2, true, nullptr);
  const void* shortcut = in;
  if (b.down) {
    inference_conv(*b.down, in, b.ad.get(), *b.bdown, b.out, false, nullptr);
    shortcut = b.ad.get();
  }
  inference_conv(b.c3, b.a2.get(), b.out_buf.get(), b.b3, b.out, true, shortcut);
}

// The backward of conv c whose input was relu(bn(x)): its weight gradient, and dx, the gradient of
// bn's input x, from dy. `stored` is where relu(bn(x)) is (or is recomputed) when a pattern was refused.
void ResNet50::fused_inner_backward(ConvUnit& c, const void* x, Bn& bn, void* stored, Shape4 s_in, void* dy,
                                    void* dx) {
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  const cudaStream_t stream = ctx_.stream;
  void* ws = workspace_.get();
  const size_t wsb = workspace_.bytes();
  wgrad_beside([&](cudaStream_t lane, void* lane_ws, size_t lane_wsb) {
    if (usable(c.fused_wgrad)) {
      FusedArgs a;
      a.x = x;
      set_coefficients(a, *c.fused_wgrad, bn);
      a.dy = dy;
      a.dw = params_.weight_grad(c.weight);
      c.fused_wgrad->run(ctx_.cudnn, a, lane_ws, lane_wsb);
    } else {
      if (usable(c.fused_fwd))  // the forward read relu(bn(x)) fused: recompute it
        bn_apply({x, bn.st.scale, bn.st.shift, Residual::None, nullptr, nullptr, nullptr, true, stored}, s_in, t,
                 l, lane);
      c.conv->backward_filter(ctx_.cudnn, stored, dy, params_.weight_grad(c.weight), lane_ws, lane_wsb);
    }
  });
  float* coef = bn.st.bwd_coef;  // dx = coef[c] * g + coef[C + c] * x + coef[2C + c]
  const int C = bn.channels;
  if (usable(c.fused_dgrad)) {
    FusedArgs a;
    a.dy = dy;
    a.w = params_.working(c.weight);
    a.x = x;
    a.mean = bn.st.save_mean;
    a.invstd = bn.st.save_invstd;
    a.gamma = bn.st.gamma;
    a.beta = bn.st.beta;
    a.g = dx;
    a.dgamma = params_.vector_grad(bn.gamma);
    a.dbeta = params_.vector_grad(bn.beta);
    a.eq_dy = coef;
    a.eq_x = coef + C;
    a.eq_b = coef + 2 * C;
    c.fused_dgrad->run(ctx_.cudnn, a, ws, wsb);
    // dx = eq_dy * g + eq_b + eq_x * x: the join kernel with x as the "second BN" and no ReLU, in place.
    bn_apply({dx, coef, coef + 2 * C, Residual::BatchNorm, x, coef + C, zeros_.as<float>(), false, dx}, s_in, t, l,
             stream);
  } else {
    c.conv->backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, false, ws, wsb);
    BnBackwardArgs mid{};
    mid.dy = dx;
    mid.relu = ReluMask::FromInput;
    mid.x = x;
    mid.bn = &bn.st;
    mid.dgamma = params_.vector_grad(bn.gamma);
    mid.dbeta = params_.vector_grad(bn.beta);
    mid.dx = dx;
    bn_backward(mid, s_in, t, l, bn_scratch_.as<float>(), stream);
  }
  lane_join();
  grad_ready(c.weight);
  bn_grads_ready(bn);
}

// Gradient buffers as in block_backward: g[0] between blocks, g[1..3] inside.
void ResNet50::fused_block_backward(Block& b, const void* in) {
  void *gA = grad_[0].get(), *gB = grad_[1].get(), *gC = grad_[2].get(), *gD = grad_[3].get();

  join_backward(b);  // ours, as unfused
  fused_inner_backward(b.c3, b.a2.get(), b.b2, b.y2.get(), b.mid2, gB, gD);  // gD: gradient of a2
  if (b.down) conv_backward(*b.down, in, gC, gA, false);
  fused_inner_backward(b.c2, b.a1.get(), b.b1, b.y1.get(), b.mid1, gD, gB);  // gB: gradient of a1
  conv_backward(b.c1, in, gB, gA, true);
}
