// ResNet-50 (CIFAR stem): its layers, buffers, initialisation, forward, loss and backward.
#include "model/resnet50.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "core/check.h"
#include "model/linear.h"
#include "model/resnet50_spec.h"
#include "core/rng.h"
#include "kernels/pooling.h"
#include "model/resnet50_parts.h"

namespace {
constexpr int kStateVectors = 7;  // save_mean, save_invstd, scale, shift, 3 backward coefficients
}  // namespace

// A conv's weight gradient and its data gradient read the same output gradient and write different
// buffers: on two streams they run side by side, and in the step's CUDA graph they become two
// branches. The small convs of the later stages fill the GPU only in part, and one branch's launch
// gaps are the other's running time.
struct ResNet50::WgradLane {
  Stream stream{false};
  Event forked{false}, done{false};
  DeviceBuffer workspace;  // the main stream's convs keep workspace_: both run at once
};

ResNet50::ResNet50(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache) : cfg_(cfg), ctx_(ctx) {
  // Three stride-2 stages: the side must halve exactly three times.
  if (cfg.image_side < 8 || cfg.image_side % 8 != 0)
    throw Fatal("ResNet50: image side " + std::to_string(cfg.image_side) + " is not a positive multiple of 8");
  build();
  allocate();
  choose_algorithms(cache);
}

ResNet50::~ResNet50() = default;

// ---- construction -------------------------------------------------------------------------------
// The layers of resnet50_spec(), registered through the same conv_weight / bn_params / fc_params
// that resnet50_params() lists, in the same order: a checkpoint's model signature computed from that
// listing (before the GPU is touched) is the one of these parameters.
void ResNet50::build() {
  const NetSpec spec = resnet50_spec(cfg_);
  auto add = [&](const ParamSpec& p) { return params_.add(p.name, p.kind, p.shape); };
  auto conv_unit = [&](const ConvSpec& c) {
    ConvUnit u;
    u.conv = make_conv(cfg_.conv_api, c.g, cfg_.dtype, cfg_.layout, cfg_.tf32);
    u.weight = add(conv_weight(c));
    u.name = c.name;
    return u;
  };
  auto make_bn = [&](const BnSpec& spec_bn) {
    Bn b;
    b.name = spec_bn.name;
    b.channels = spec_bn.channels;
    const auto [gamma, beta] = bn_params(spec_bn);
    b.gamma = add(gamma);
    b.beta = add(beta);
    b.running_off = running_count_;
    running_count_ += 2 * size_t(b.channels);
    b.state_off = bn_state_floats_;
    bn_state_floats_ += kStateVectors * size_t(b.channels);
    return b;
  };

  stem_conv_ = std::make_unique<ConvUnit>(conv_unit(spec.stem));
  stem_bn_ = std::make_unique<Bn>(make_bn(spec.stem_bn));
  for (const BlockSpec& bs : spec.blocks) {
    auto b = std::make_unique<Block>();
    b->in = bs.in;
    b->mid1 = bs.mid1;
    b->mid2 = bs.mid2;
    b->out = bs.out;
    b->c1 = conv_unit(bs.c1);
    b->b1 = make_bn(bs.b1);
    b->c2 = conv_unit(bs.c2);
    b->b2 = make_bn(bs.b2);
    b->c3 = conv_unit(bs.c3);
    b->b3 = make_bn(bs.b3);
    if (bs.down) {
      b->down = conv_unit(*bs.down);
      b->bdown = make_bn(*bs.bdown);
    }
    blocks_.push_back(std::move(b));
  }
  features_ = spec.features;
  const auto [fc_weight, fc_bias] = fc_params(spec);
  fc_weight_ = add(fc_weight);
  fc_bias_ = add(fc_bias);
}

void ResNet50::allocate() {
  const DType t = cfg_.dtype;
  const size_t es = dtype_size(t);
  const Shape4 stem{cfg_.batch, 64, cfg_.image_side, cfg_.image_side};

  // Inference with each BN in its conv's epilogue writes every conv's BN output (or applies the BN
  // in place where a pattern was refused): the stem conv's output and a3 are never stored.
  const bool epilogues = fused_inference();
  // Sizes first, so that a batch too large for the GPU is one clear message, not a failed cudaMalloc.
  size_t act = (epilogues ? 1 : 2) * stem.count(), largest = stem.count();
  size_t scratch = bn_scratch_floats(stem, t, cfg_.layout);
  size_t relu_bits = 0;  // training: the joins' ReLU bits
  for (const auto& b : blocks_) {
    relu_bits += relu_bits_bytes(b->out, t);
    // a1, y1, a2, y2 (fused builds store no y1, y2), a3, ad, out
    const size_t ys = fused() ? 0 : b->mid1.count() + b->mid2.count();
    act += b->mid1.count() + b->mid2.count() + ys + ((b->down ? 3 : 2) - epilogues) * b->out.count();
    for (const Shape4& s : {b->in, b->mid1, b->mid2, b->out}) {
      largest = std::max(largest, s.count());
      scratch = std::max(scratch, bn_scratch_floats(s, t, cfg_.layout));
    }
  }
  activation_bytes_ = act * es;
  const size_t need = activation_bytes_ + (cfg_.inference ? 0 : 4 * largest * es + relu_bits);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b)
    throw Fatal("batch " + std::to_string(cfg_.batch) + " needs " + format_bytes(need) +
                " of GPU memory for activations and gradients, but only " + format_bytes(free_b) + " of " +
                format_bytes(total_b) + " are free; try --batch " +
                std::to_string(std::max(2, int(cfg_.batch * (double(free_b) / need) * 0.8))));

  params_.allocate(t, !cfg_.inference);
  const std::string batch = " (batch " + std::to_string(cfg_.batch) + ")";
  if (!epilogues) stem_a_ = DeviceBuffer(stem.count() * es, "stem conv output" + batch);
  stem_y_ = DeviceBuffer(stem.count() * es, "stem output" + batch);
  for (auto& b : blocks_) {
    b->a1 = DeviceBuffer(b->mid1.count() * es, "activations" + batch);
    b->a2 = DeviceBuffer(b->mid2.count() * es, "activations" + batch);
    if (!fused()) {  // fused builds allocate them only where a fallback needs them (build_fusion)
      b->y1 = DeviceBuffer(b->mid1.count() * es, "activations" + batch);
      b->y2 = DeviceBuffer(b->mid2.count() * es, "activations" + batch);
    }
    if (!epilogues) b->a3 = DeviceBuffer(b->out.count() * es, "activations" + batch);
    if (b->down) b->ad = DeviceBuffer(b->out.count() * es, "activations" + batch);
    b->out_buf = DeviceBuffer(b->out.count() * es, "activations" + batch);
  }
  feat_ = DeviceBuffer(size_t(cfg_.batch) * features_ * es, "pooled features");
  logits_ = DeviceBuffer(size_t(cfg_.batch) * cfg_.classes * sizeof(float), "logits");
  running_ = DeviceBuffer(running_count_ * sizeof(float), "BN running statistics");
  bn_state_ = DeviceBuffer(bn_state_floats_ * sizeof(float), "BN per-channel state");
  if (!cfg_.inference) {  // what only training reads: gradients and the BN statistics' partial sums
    for (auto& g : grad_) g = DeviceBuffer(largest * es, "activation gradients" + batch);
    for (auto& b : blocks_) b->relu_bits = DeviceBuffer(relu_bits_bytes(b->out, t), "ReLU bits" + batch);
    dfeat_ = DeviceBuffer(size_t(cfg_.batch) * features_ * es, "pooled feature gradients");
    dlogits_ = DeviceBuffer(size_t(cfg_.batch) * cfg_.classes * es, "logit gradients");
    bn_scratch_floats_ = scratch;
    bn_scratch_ = DeviceBuffer(scratch * sizeof(float), "BN partial sums");
  }

  for (Bn* b : all_bns()) {
    const int C = b->channels;
    float* run = running_.as<float>() + b->running_off;
    float* st = bn_state_.as<float>() + b->state_off;
    b->st = {params_.master(b->gamma), params_.master(b->beta), run, run + C,
             st, st + C, st + 2 * C, st + 3 * C, st + 4 * C};
  }
}

std::vector<ResNet50::Bn*> ResNet50::all_bns() const {
  std::vector<Bn*> v{stem_bn_.get()};
  for (const auto& b : blocks_) {
    v.push_back(&b->b1);
    v.push_back(&b->b2);
    v.push_back(&b->b3);
    if (b->bdown) v.push_back(&*b->bdown);
  }
  return v;
}

void ResNet50::choose_algorithms(AutotuneCache& cache) {
  AlgoChooser chooser(ctx_.cudnn, cfg_.conv, &cache);
  size_t ws = 0;
  std::set<std::string> shapes;
  for_each_conv([&](ConvUnit& u) {
    chooser.configure(*u.conv);
    ws = std::max(ws, u.conv->workspace_bytes());
    shapes.insert(u.conv->geometry().key());
  });
  if (fused()) ws = std::max(ws, build_fusion(cache));
  fusion_report_.off_for_determinism = cfg_.fused_bn && !fused();
  workspace_ = DeviceBuffer(ws, "cuDNN workspace (--workspace-mb)");
  size_t lane_ws = 0;
  if (cfg_.wgrad_beside && !cfg_.inference) {
    // Only weight gradients run on the lane: its workspace is the largest weight gradient's need, not
    // the shared one's (the stem's, on the main stream, counted too: one loop over the convs).
    lane_ws = wgrad_workspace_bytes();
    lane_ = std::make_unique<WgradLane>();
    lane_->workspace = DeviceBuffer(lane_ws, "cuDNN workspace of the weight gradients' stream");
  }
  algo_report_ = {static_cast<int>(shapes.size()), chooser.searched(), chooser.search_seconds(), ws, lane_ws};
}

size_t ResNet50::wgrad_workspace_bytes() const {
  size_t ws = 0;
  for_each_conv([&](ConvUnit& u) {
    ws = std::max(ws, u.conv->algorithms().bwd_filter.workspace);
    if (u.fused_wgrad) ws = std::max(ws, u.fused_wgrad->workspace());
  });
  return ws;
}

void ResNet50::for_each_conv(const std::function<void(ConvUnit&)>& f) const {
  f(*stem_conv_);
  for (const auto& b : blocks_) {
    f(b->c1);
    f(b->c2);
    f(b->c3);
    if (b->down) f(*b->down);
  }
}

// ---- initialisation -----------------------------------------------------------------------------
void ResNet50::init_params(uint64_t seed) {
  std::vector<float> host(params_.total());
  const auto& ts = params_.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const ParamTensor& t = ts[i];
    Rng rng(mix(seed, 0x1417u, i));
    float* p = host.data() + t.offset;
    switch (t.kind) {
      case ParamKind::ConvWeight: {  // Kaiming normal, fan_out, ReLU gain
        const double stdev = std::sqrt(2.0 / (double(t.shape[0]) * t.shape[2] * t.shape[3]));
        for (size_t e = 0; e < t.count; ++e) p[e] = static_cast<float>(rng.normal() * stdev);
        break;
      }
      case ParamKind::LinearWeight:  // PyTorch's default: U(-1/sqrt(in), 1/sqrt(in)) for both
      case ParamKind::LinearBias: {
        const double bound = 1.0 / std::sqrt(double(features_));
        for (size_t e = 0; e < t.count; ++e) p[e] = static_cast<float>((2 * rng.uniform() - 1) * bound);
        break;
      }
      case ParamKind::BnGamma: std::fill(p, p + t.count, 1.f); break;
      case ParamKind::BnBeta: std::fill(p, p + t.count, 0.f); break;
    }
  }
  CUDA_CHECK(cudaMemcpy(params_.master_all(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (params_.momentum_all()) CUDA_CHECK(cudaMemset(params_.momentum_all(), 0, params_.total() * sizeof(float)));
  std::vector<float> run(running_count_);
  for (const Bn* bn : all_bns()) {  // running mean 0, running var 1
    float* r = run.data() + bn->running_off;
    std::fill(r, r + bn->channels, 0.f);
    std::fill(r + bn->channels, r + 2 * bn->channels, 1.f);
  }
  CUDA_CHECK(cudaMemcpy(running_.get(), run.data(), run.size() * sizeof(float), cudaMemcpyHostToDevice));
  params_.refresh_working_copy(ctx_.stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

void ResNet50::init_params_for_parity(uint64_t seed) {
  init_params(seed);  // running statistics and momentum as usual
  // Every value is a hash of (seed, tensor index, element index in PyTorch order), uniform with the
  // variance of the usual init; tests/make_parity_fixture.py computes the same numbers.
  std::vector<float> host(params_.total());
  const auto& ts = params_.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const ParamTensor& t = ts[i];
    for (size_t e = 0; e < t.count; ++e) {
      const double u = 2 * to_unit(mix(seed, i, e)) - 1;  // [-1, 1)
      double v = 0;
      switch (t.kind) {
        case ParamKind::ConvWeight: v = u * std::sqrt(3.0 * 2.0 / (double(t.shape[0]) * t.shape[2] * t.shape[3])); break;
        case ParamKind::LinearWeight:
        case ParamKind::LinearBias: v = u / std::sqrt(double(features_)); break;
        case ParamKind::BnGamma: v = 1 + 0.1 * u; break;
        // shifted from 0 so that few ReLU inputs lie within rounding of 0 (tests/make_parity_fixture.py)
        case ParamKind::BnBeta: v = 0.5 + 0.1 * u; break;
      }
      host[t.offset + filter_storage_index(t, e, cfg_.layout)] = static_cast<float>(v);
    }
  }
  CUDA_CHECK(cudaMemcpy(params_.master_all(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  params_.refresh_working_copy(ctx_.stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

// The registration order of build(), without building: a stem conv + BN, the blocks' conv + BN
// pairs (the projection shortcut's after conv3's), then the classifier.
TensorLayout ResNet50::tensor_layout(int classes) {
  // From the same description build() registers its layers from (model/resnet50_spec.h).
  NetConfig cfg;
  cfg.classes = classes;
  ParamStore store;
  for (const ParamSpec& p : resnet50_params(cfg).tensors) store.add(p.name, p.kind, p.shape);
  store.assign_offsets();
  TensorLayout layout;
  layout.params = store.tensors();
  const NetSpec spec = resnet50_spec(cfg);
  layout.bns.emplace_back(spec.stem_bn.name, spec.stem_bn.channels);
  for (const BlockSpec& b : spec.blocks)
    for (const BnSpec* bn : {&b.b1, &b.b2, &b.b3, b.bdown ? &*b.bdown : nullptr})
      if (bn) layout.bns.emplace_back(bn->name, bn->channels);
  return layout;
}

std::vector<std::string> ResNet50::running_stats_names() const {
  std::vector<std::string> names;
  for (const Bn* b : all_bns()) {
    names.push_back(b->name + ".running_mean");
    names.push_back(b->name + ".running_var");
  }
  return names;
}

// ---- forward ------------------------------------------------------------------------------------
void ResNet50::conv_forward(ConvUnit& c, const void* x, void* y) {
  c.conv->forward(ctx_.cudnn, x, params_.working(c.weight), y, workspace_.get(), workspace_.bytes());
}

void ResNet50::bn_forward(Bn& bn, const void* x, Shape4 s, bool train) {
  if (train) bn_forward_train_stats(x, s, cfg_.dtype, cfg_.layout, bn.st, bn_scratch_.as<float>(), ctx_.stream);
  else bn_forward_eval_coefs(bn.st, bn.channels, ctx_.stream);
}

void ResNet50::block_forward(Block& b, const void* in, bool train) {
  if (fused_inference()) return inference_block_forward(b, in);
  if (fused()) return fused_block_forward(b, in, train);
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  conv_forward(b.c1, in, b.a1.get());
  bn_forward(b.b1, b.a1.get(), b.mid1, train);
  bn_apply({b.a1.get(), b.b1.st.scale, b.b1.st.shift, Residual::None, nullptr, nullptr, nullptr, true, b.y1.get()},
           b.mid1, t, l, ctx_.stream);
  conv_forward(b.c2, b.y1.get(), b.a2.get());
  bn_forward(b.b2, b.a2.get(), b.mid2, train);
  bn_apply({b.a2.get(), b.b2.st.scale, b.b2.st.shift, Residual::None, nullptr, nullptr, nullptr, true, b.y2.get()},
           b.mid2, t, l, ctx_.stream);
  conv_forward(b.c3, b.y2.get(), b.a3.get());
  bn_forward(b.b3, b.a3.get(), b.out, train);
  if (b.down) {
    conv_forward(*b.down, in, b.ad.get());
    bn_forward(*b.bdown, b.ad.get(), b.out, train);
  }
  join_forward(b, in, train);
}

// One pass: the shortcut's BN is applied as it is read (its output is never stored).
void ResNet50::join_forward(Block& b, const void* in, bool train) {
  ApplyArgs a{b.a3.get(), b.b3.st.scale, b.b3.st.shift, Residual::Tensor, in, nullptr, nullptr, true, b.out_buf.get()};
  if (b.down) {
    a.residual = Residual::BatchNorm;
    a.res = b.ad.get();
    a.res_scale = b.bdown->st.scale;
    a.res_shift = b.bdown->st.shift;
  }
  if (train) a.relu_bits = b.relu_bits.as<uint8_t>();
  bn_apply(a, b.out, cfg_.dtype, cfg_.layout, ctx_.stream);
}

void ResNet50::forward(const void* images, bool train) {
  if (train && cfg_.inference) throw Fatal("ResNet50: training forward on a network built for inference");
  images_ = images;
  const Shape4 stem{cfg_.batch, 64, cfg_.image_side, cfg_.image_side};
  if (fused_inference()) {
    // Every BN's coefficients in one launch, then the GEMM convs' filters with their BN's scale
    // folded in: the weights and running statistics may have changed since the last forward (a
    // checkpoint restored into the network).
    bn_forward_eval_coefs_all(eval_targets_.as<BnEvalTarget>(), eval_target_count_, widest_bn_, ctx_.stream);
    fold_bn_into_filters(fold_targets_.as<FilterFold>(), fold_count_, largest_fold_, ctx_.stream);
    inference_conv(*stem_conv_, images, stem_y_.get(), *stem_bn_, stem, true, nullptr);
  } else {
    conv_forward(*stem_conv_, images, stem_a_.get());
    bn_forward(*stem_bn_, stem_a_.get(), stem, train);
    bn_apply({stem_a_.get(), stem_bn_->st.scale, stem_bn_->st.shift, Residual::None, nullptr, nullptr, nullptr, true,
              stem_y_.get()},
             stem, cfg_.dtype, cfg_.layout, ctx_.stream);
  }
  const void* cur = stem_y_.get();
  for (auto& b : blocks_) {
    block_forward(*b, cur, train);
    cur = b->out_buf.get();
  }
  global_avgpool_forward(cur, blocks_.back()->out, cfg_.dtype, cfg_.layout, feat_.get(), ctx_.stream);
  linear_forward(ctx_.cublas, {cfg_.batch, features_, cfg_.classes}, cfg_.dtype, cfg_.tf32, feat_.get(),
                 params_.working(fc_weight_), logits_.as<float>());
}

void ResNet50::loss(const int32_t* labels, LossTotals* totals, const float* loss_scale, const long long* step) {
  const bool train = loss_scale != nullptr;
  if (train && cfg_.inference) throw Fatal("ResNet50: training loss on a network built for inference");
  softmax_xent(logits_.as<float>(), params_.master(fc_bias_), labels, cfg_.batch, cfg_.classes,
               train ? dlogits_.get() : nullptr, cfg_.dtype, train ? params_.vector_grad(fc_bias_) : nullptr,
               loss_scale, totals, step, ctx_.stream);
}

// ---- the weight gradients' lane ------------------------------------------------------------------
void ResNet50::wgrad_beside(const std::function<void(cudaStream_t, void*, size_t)>& work) {
  if (!lane_) return work(ctx_.stream, workspace_.get(), workspace_.bytes());
  lane_->forked.record(ctx_.stream);
  CUDA_CHECK(cudaStreamWaitEvent(lane_->stream, lane_->forked, 0));
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

void ResNet50::lane_join() {
  if (lane_) CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, lane_->done, 0));
}

// ---- backward -----------------------------------------------------------------------------------

void ResNet50::bn_grads_ready(const Bn& bn) const {
  grad_ready(bn.gamma);
  grad_ready(bn.beta);
}

// Gradient buffers: g[0] holds the gradient flowing between blocks (a block's output gradient on
// entry, its input gradient on exit); g[1..3] hold the gradients inside a block.
// The join: out = relu(bn3(a3) + shortcut). From g[0] (the output's gradient): g[1] = the gradient
// of a3, and g[2] = that of the shortcut conv's output, or g[0] = the identity shortcut's gradient.
void ResNet50::join_backward(Block& b) {
  BnBackwardArgs last{};
  last.dy = grad_[0].get();
  last.relu = ReluMask::FromBits;  // the ReLU came after the residual add: join_forward's bits
  last.relu_bits = b.relu_bits.as<uint8_t>();
  last.x = b.a3.get();
  last.bn = &b.b3.st;
  last.dgamma = params_.vector_grad(b.b3.gamma);
  last.dbeta = params_.vector_grad(b.b3.beta);
  last.dx = grad_[1].get();
  if (b.down) {
    last.x2 = b.ad.get();
    last.bn2 = &b.bdown->st;
    last.dgamma2 = params_.vector_grad(b.bdown->gamma);
    last.dbeta2 = params_.vector_grad(b.bdown->beta);
    last.dx2 = grad_[2].get();
  } else {
    last.dres = grad_[0].get();  // identity shortcut: the input's gradient starts as dz
  }
  bn_backward(last, b.out, cfg_.dtype, cfg_.layout, bn_scratch_.as<float>(), ctx_.stream);
  bn_grads_ready(b.b3);
  if (b.down) bn_grads_ready(*b.bdown);
}

void ResNet50::block_backward(Block& b, const void* in) {
  if (fused()) return fused_block_backward(b, in);
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  void *gA = grad_[0].get(), *gB = grad_[1].get(), *gC = grad_[2].get(), *gD = grad_[3].get();
  float* scratch = bn_scratch_.as<float>();

  join_backward(b);

  conv_backward(b.c3, b.y2.get(), gB, gD, false);
  if (b.down) conv_backward(*b.down, in, gC, gA, false);

  BnBackwardArgs mid{};
  mid.dy = gD;
  mid.relu = ReluMask::FromInput;
  mid.x = b.a2.get();
  mid.bn = &b.b2.st;
  mid.dgamma = params_.vector_grad(b.b2.gamma);
  mid.dbeta = params_.vector_grad(b.b2.beta);
  mid.dx = gD;
  bn_backward(mid, b.mid2, t, l, scratch, ctx_.stream);
  bn_grads_ready(b.b2);
  conv_backward(b.c2, b.y1.get(), gD, gB, false);

  BnBackwardArgs first{};
  first.dy = gB;
  first.relu = ReluMask::FromInput;
  first.x = b.a1.get();
  first.bn = &b.b1.st;
  first.dgamma = params_.vector_grad(b.b1.gamma);
  first.dbeta = params_.vector_grad(b.b1.beta);
  first.dx = gB;
  bn_backward(first, b.mid1, t, l, scratch, ctx_.stream);
  bn_grads_ready(b.b1);
  conv_backward(b.c1, in, gB, gA, true);
}

void ResNet50::conv_backward(ConvUnit& c, const void* x, const void* dy, void* dx, bool accumulate) {
  wgrad_beside([&](cudaStream_t, void* ws, size_t wsb) {
    c.conv->backward_filter(ctx_.cudnn, x, dy, params_.weight_grad(c.weight), ws, wsb);
  });
  c.conv->backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, accumulate, workspace_.get(),
                        workspace_.bytes());
  lane_join();
  grad_ready(c.weight);
}

void ResNet50::backward() {
  if (cfg_.inference) throw Fatal("ResNet50: backward on a network built for inference");
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  linear_backward(ctx_.cublas, {cfg_.batch, features_, cfg_.classes}, t, cfg_.tf32, feat_.get(),
                  params_.working(fc_weight_), dlogits_.get(), params_.weight_grad(fc_weight_), dfeat_.get());
  grad_ready(fc_weight_);
  grad_ready(fc_bias_);  // written by loss(), before backward
  global_avgpool_backward(dfeat_.get(), blocks_.back()->out, t, l, grad_[0].get(), ctx_.stream);
  for (size_t i = blocks_.size(); i-- > 0;) {
    const void* in = i == 0 ? stem_y_.get() : blocks_[i - 1]->out_buf.get();
    block_backward(*blocks_[i], in);
  }
  BnBackwardArgs stem{};
  stem.dy = grad_[0].get();
  stem.relu = ReluMask::FromInput;
  stem.x = stem_a_.get();
  stem.bn = &stem_bn_->st;
  stem.dgamma = params_.vector_grad(stem_bn_->gamma);
  stem.dbeta = params_.vector_grad(stem_bn_->beta);
  stem.dx = grad_[0].get();
  bn_backward(stem, {cfg_.batch, 64, cfg_.image_side, cfg_.image_side}, t, l, bn_scratch_.as<float>(), ctx_.stream);
  bn_grads_ready(*stem_bn_);
  // The images need no gradient: only the stem's filter gradient.
  stem_conv_->conv->backward_filter(ctx_.cudnn, images_, grad_[0].get(), params_.weight_grad(stem_conv_->weight),
                                    workspace_.get(), workspace_.bytes());
  grad_ready(stem_conv_->weight);
}
