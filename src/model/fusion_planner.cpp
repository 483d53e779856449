// The fusion planner (fusion_planner.h).
#include "model/fusion_planner.h"

float total_ms(std::initializer_list<float> parts) {
  float t = 0;
  for (float p : parts) {
    if (p < 0) return -1;
    t += p;
  }
  return t;
}

// Times our BN kernels' passes on scratch memory: two activations of the largest size and one
// BN's vectors, each pass and shape measured once.
class FusionPlanner::PassTimer {
 public:
  PassTimer(size_t largest, DType t, Layout l, float* bn_scratch, cudaStream_t stream)
      : t_(t), l_(l), bn_scratch_(bn_scratch), stream_(stream) {
    const size_t es = dtype_size(t);
    tx_ = scratch_buffer(largest * es, "fusion timing");
    ty_ = scratch_buffer(largest * es, "fusion timing");
    tv_ = scratch_buffer(9 * kWidest * sizeof(float), "fusion timing");
    float* v = tv_.as<float>();
    bn_ = {v, v + kWidest, v + 2 * kWidest, v + 3 * kWidest, v + 4 * kWidest, v + 5 * kWidest, v + 6 * kWidest,
           v + 7 * kWidest, v + 8 * kWidest};
  }

  float operator()(BnPass p, Shape4 s) {
    float& ms = ms_[{p, s.count() * 65536 + s.c}];
    if (ms <= 0) ms = fastest_ms(stream_, 3, [&] { run(p, s); });
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
      case BnPass::Backward:
        bn_backward({.dy = x, .relu = ReluMask::FromInput, .x = x, .bn = &bn_, .dgamma = bn_.save_mean,
                     .dbeta = bn_.save_invstd, .dx = y},
                    s, t_, l_, bn_scratch_, stream_);
        break;
      case BnPass::DxApply:
        bn_apply({x, bn_.scale, bn_.shift, Residual::BatchNorm, x, bn_.scale, bn_.shift, false, y}, s, t_, l_, stream_);
        break;
    }
  }
  DType t_;
  Layout l_;
  float* bn_scratch_;
  cudaStream_t stream_;
  DeviceBuffer tx_, ty_, tv_;
  BnChannelState bn_{};
  std::map<std::pair<BnPass, size_t>, float> ms_;
};

FusionPlanner::FusionPlanner(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache, FusionReport& report,
                             size_t largest_activation, float* bn_scratch)
    : cfg_(cfg), ctx_(ctx), cache_(cache), report_(report), measure_(cfg.conv.policy == AlgoPolicy::Autotune),
      options_{cfg.dtype, cfg.layout, cfg.conv.deterministic, cfg.conv.workspace_limit, measure_} {
  if (measure_) timer_ = std::make_unique<PassTimer>(largest_activation, cfg.dtype, cfg.layout, bn_scratch, ctx.stream);
}

FusionPlanner::~FusionPlanner() = default;

float FusionPlanner::pass_ms(BnPass p, Shape4 s) { return timer_ ? (*timer_)(p, s) : -1.f; }

template <class Plan, class Make>
const Plan& FusionPlanner::plan_once(std::map<std::string, std::shared_ptr<Plan>>& made, const std::string& key,
                                     const FusedChoice* cached, float& alternative_ms, Make make) {
  std::shared_ptr<Plan>& plan = made[key];
  if (!plan) {
    plan = make();
    ++report_.plans;
    report_.plans_cached += plan->from_cache();
    if (measure_ && plan->ok() && (!plan->from_cache() || cached->unfused_ms < 0)) {
      FusedChoice c = plan->choice();  // measured now, or cached without the alternative's time
      c.unfused_ms = alternative_ms;
      cache_.put_fused(key, c);
    } else if (cached && !plan->ok()) {
      cache_.erase_fused(key);  // refused now: nothing to rebuild at the next start
    }
  }
  if (plan->from_cache() && cached->unfused_ms >= 0) alternative_ms = cached->unfused_ms;
  return *plan;
}

const FusedConv* FusionPlanner::plan_fused(const ConvUnit& u, FusedPattern p, float unfused_ms, std::string& why) {
  // Switched off: not even planned, nothing to measure or cache.
  if (cfg_.unfused_patterns & fused_pattern_bit(p)) {
    why = cfg_.unfused_by_default ? kOffByDefault : kSwitchedOff;
    return nullptr;
  }
  const std::string key = fused_cache_key(p, u.geometry());
  const FusedChoice* cached = measure_ ? cache_.find_fused(key) : nullptr;
  const FusedConv& f = plan_once(fused_, key, cached, unfused_ms, [&] {
    return std::make_shared<FusedConv>(ctx_.cudnn, p, u.geometry(), options_, cached);
  });
  if (!f.ok()) {
    why = f.why();
    return nullptr;
  }
  if (!run_fused(f.ms(), unfused_ms)) {
    why = kSlowerThanUnfused;
    return nullptr;
  }
  ++report_.fused;
  report_.half_coefficients += has_scale_bias(p) && f.scale_type() == DType::F16;
  return &f;
}

const FusedConv* FusionPlanner::fuse(const ConvUnit& u, FusedPattern p, float unfused_ms) {
  ++report_.tried;
  std::string why;
  const FusedConv* f = plan_fused(u, p, unfused_ms, why);
  if (!f) report_.refused.push_back({u.name, p, why});
  return f;
}

const FusedConv* FusionPlanner::fuse_first_choice(const ConvUnit& u, FusedPattern p, float unfused_ms) {
  std::string why;
  const FusedConv* f = plan_fused(u, p, unfused_ms, why);
  report_.tried += f != nullptr;
  return f;
}

const GemmConv* FusionPlanner::gemm(const ConvUnit& u, FusedPattern p, float alternative_ms) {
  const ConvGeometry& g = u.geometry();
  if (!measure_ || !GemmConv::applies(g) || cfg_.dtype != DType::F16 || cfg_.layout != Layout::NHWC ||
      (cfg_.unfused_patterns & fused_pattern_bit(p)))
    return nullptr;
  const std::string key = fused_cache_key(p, g);
  const FusedChoice* cached = cache_.find_fused(key);
  const GemmConv& m = plan_once(gemms_, key, cached, alternative_ms, [&] {
    return std::make_shared<GemmConv>(ctx_.cublas_lt, p, g, cfg_.conv.workspace_limit, ctx_.stream, cached);
  });
  if (!m.ok() || alternative_ms < 0 || m.ms() >= alternative_ms) return nullptr;
  return &m;
}
