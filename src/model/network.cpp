// What the training and the inference network share: the layers, parameters and BN state, the conv
// layers' algorithms, initialisation and the classifier.
#include "model/network.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include "core/check.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/pooling.h"
#include "model/linear.h"
#include "model/resnet50_layers.h"
#include "model/resnet50_spec.h"

namespace {
constexpr int kStateVectors = 7;  // save_mean, save_invstd, scale, shift, 3 backward coefficients
}  // namespace

// ---- the layers ---------------------------------------------------------------------------------
// The parameters registered are resnet50_params()'s, so that a checkpoint's model signature computed
// from that listing (before the GPU is touched) is the one of these parameters; the layers take
// their ids walking the spec in the listing's order.
ResNetLayers build_layers(const NetConfig& cfg, ParamStore& params) {
  for (const ParamSpec& p : resnet50_params(cfg).tensors) params.add(p.name, p.kind, p.shape);
  const NetSpec spec = resnet50_spec(cfg);
  ResNetLayers L;
  int id = 0;
  auto conv_unit = [&](const ConvSpec& c) {
    return ConvUnit{make_conv(cfg.conv_api, c.g, cfg.dtype, cfg.layout, cfg.tf32), id++, c.name};
  };
  auto make_bn = [&](const BnSpec& s) {
    Bn b;
    b.name = s.name;
    b.channels = s.channels;
    b.gamma = id++;
    b.beta = id++;
    b.running_off = L.running_count;
    L.running_count += 2 * size_t(b.channels);
    b.state_off = L.state_floats;
    L.state_floats += kStateVectors * size_t(b.channels);
    return b;
  };
  L.stem = conv_unit(spec.stem);
  L.stem_bn = make_bn(spec.stem_bn);
  L.stem_out = spec.stem.g.output();
  for (const BlockSpec& bs : spec.blocks) {
    Block b;
    b.in = bs.in, b.mid1 = bs.mid1, b.mid2 = bs.mid2, b.out = bs.out;
    b.c1 = conv_unit(bs.c1);
    b.b1 = make_bn(bs.b1);
    b.c2 = conv_unit(bs.c2);
    b.b2 = make_bn(bs.b2);
    b.c3 = conv_unit(bs.c3);
    b.b3 = make_bn(bs.b3);
    if (bs.down) {
      b.down = conv_unit(*bs.down);
      b.bdown = make_bn(*bs.bdown);
    }
    L.blocks.push_back(std::move(b));
  }
  L.features = spec.features;
  L.fc_weight = id++;
  L.fc_bias = id++;
  return L;
}

std::vector<Bn*> ResNetLayers::bns() {
  std::vector<Bn*> v{&stem_bn};
  for (Block& b : blocks) for_each_layer(b, [](ConvUnit&) {}, [&](Bn& bn) { v.push_back(&bn); });
  return v;
}

std::vector<ConvUnit*> ResNetLayers::convs() {
  std::vector<ConvUnit*> v{&stem};
  for (Block& b : blocks) for_each_layer(b, [&](ConvUnit& c) { v.push_back(&c); }, [](Bn&) {});
  return v;
}

// ---- the network --------------------------------------------------------------------------------
void Network::check_image_side(const NetConfig& cfg) {
  // Three stride-2 stages take the side to ceil(side / 8): at 8 the last stage is 1x1, the smallest
  // side --image-size takes.
  if (cfg.image_side < 8) throw Fatal("ResNet-50: image side " + std::to_string(cfg.image_side) + " is below 8");
  // Every BN's tensor against the batch-norm kernels' layout rule (kernels/batchnorm.h): in NCHW it
  // depends on the side, and a side they cannot take is then one message at start rather than a
  // failure in the first step.
  const NetSpec spec = resnet50_spec(cfg);
  std::vector<std::pair<std::string, Shape4>> bns{{spec.stem_bn.name, spec.stem.g.output()}};
  std::string sides = std::to_string(cfg.image_side);
  for (const BlockSpec& b : spec.blocks) {
    bns.insert(bns.end(), {{b.b1.name, b.mid1}, {b.b2.name, b.mid2}, {b.b3.name, b.out}});  // bdown's is b3's
    if (b.out.h != b.in.h) sides += ", " + std::to_string(b.out.h);
  }
  for (const auto& [name, shape] : bns) {
    const std::string why = bn_layout_refusal(shape, cfg.dtype, cfg.layout);
    if (why.empty()) continue;
    throw Fatal("ResNet-50 at image side " + std::to_string(cfg.image_side) + " (stages at " + sides + "): " + name +
                ": " + why + "; this " + layout_name(cfg.layout) + " build takes a side whose every stage qualifies "
                "(32 does)" + (cfg.layout == Layout::NCHW ? ", the NHWC builds (bin/train) any side" : ""));
  }
}

Network::Network(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache, bool training) : cfg_(cfg), ctx_(ctx) {
  check_image_side(cfg);
  layers_ = std::make_unique<ResNetLayers>(build_layers(cfg, params_));
  params_.allocate(cfg.dtype, training);
  running_ = DeviceBuffer(layers_->running_count * sizeof(float), "BN running statistics");
  bn_state_ = DeviceBuffer(layers_->state_floats * sizeof(float), "BN per-channel state");
  for (Bn* b : layers_->bns()) {  // each BN's state in the buffers
    const int C = b->channels;
    float* run = running_.as<float>() + b->running_off;
    float* st = bn_state_.as<float>() + b->state_off;
    b->st = {params_.master(b->gamma), params_.master(b->beta), run, run + C, st, st + C, st + 2 * C, st + 3 * C, st + 4 * C};
  }
  const size_t es = dtype_size(cfg.dtype);
  feat_ = DeviceBuffer(size_t(cfg.batch) * layers_->features * es, "pooled features");
  logits_ = DeviceBuffer(size_t(cfg.batch) * cfg.classes * sizeof(float), "logits");

  AlgoChooser chooser(ctx_.cudnn, cfg_.conv, &cache);
  // ConvPolicy::wgrad_sm_target is for the weight gradients that run beside the data gradients; the
  // stem's runs after them, alone (TrainingNetwork::backward): planned for every SM.
  ConvPolicy alone = cfg_.conv;
  alone.wgrad_sm_target = 0;
  AlgoChooser stem_chooser(ctx_.cudnn, alone, &cache);
  std::set<std::string> shapes;
  for (ConvUnit* u : layers_->convs()) {
    (u == &layers_->stem ? stem_chooser : chooser).configure(*u->conv);
    conv_workspace_ = std::max(conv_workspace_, u->conv->workspace_bytes());
    shapes.insert(u->geometry().key());
  }
  algo_report_ = {static_cast<int>(shapes.size()), chooser.searched() + stem_chooser.searched(),
                  chooser.search_seconds() + stem_chooser.search_seconds(), conv_workspace_, 0};
  fusion_report_.off_for_determinism = cfg.fused_bn && !cfg.fuses();
}

Network::~Network() = default;

int Network::feature_count() const { return layers_->features; }

void Network::check_memory(size_t need, const std::string& what) const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b)
    throw Fatal("batch " + std::to_string(cfg_.batch) + " needs " + format_bytes(need) +
                " of GPU memory for " + what + ", but only " + format_bytes(free_b) + " of " +
                format_bytes(total_b) + " are free; try --batch " +
                std::to_string(std::max(2, int(cfg_.batch * (double(free_b) / need) * 0.8))));
}

void Network::conv_forward(const ConvUnit& c, const void* x, void* y) {
  c.conv->forward(ctx_.cudnn, x, params_.working(c.weight), y, workspace_.get(), workspace_.bytes());
}

void Network::classify(const void* last_out) {
  global_avgpool_forward(last_out, layers_->blocks.back().out, cfg_.dtype, cfg_.layout, feat_.get(), ctx_.stream);
  linear_forward(ctx_.cublas, {cfg_.batch, layers_->features, cfg_.classes}, cfg_.dtype, cfg_.tf32, feat_.get(),
                 params_.working(layers_->fc_weight), logits_.as<float>());
}

// ---- initialisation -----------------------------------------------------------------------------
std::vector<float> Network::initial_params(const NetConfig& cfg, uint64_t seed, bool zero_init_residual) {
  const ParamListing listing = resnet50_params(cfg);
  const std::vector<ParamTensor> ts = tensor_layout(cfg.classes).params;  // with the network's offsets
  const double linear_bound = 1.0 / std::sqrt(double(resnet50_spec(cfg).features));
  std::vector<float> host(listing.total);
  // Each tensor has a generator of its own, so the tensors fill on threads in any order with the same
  // values: 23.5M normal draws took 0.8 s of the start-up on one thread. Largest first, so that the
  // last one started is small.
  std::vector<int> order(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ts[a].count > ts[b].count; });
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  parallel_for(static_cast<int>(order.size()), threads, [&](int k) {
    const size_t i = static_cast<size_t>(order[k]);
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
      case ParamKind::LinearBias:
        for (size_t e = 0; e < t.count; ++e) p[e] = static_cast<float>((2 * rng.uniform() - 1) * linear_bound);
        break;
      case ParamKind::BnGamma: std::fill(p, p + t.count, 1.f); break;
      case ParamKind::BnBeta: std::fill(p, p + t.count, 0.f); break;
    }
  });
  if (zero_init_residual)
    for (int id : listing.block_last_gammas) std::fill_n(host.data() + ts[id].offset, ts[id].count, 0.f);
  return host;
}

void Network::init_params(uint64_t seed, bool zero_init_residual) {
  // The same layout as params_: build_layers() registered resnet50_params(cfg_) (Resnet50SpecGpu).
  const std::vector<float> host = initial_params(cfg_, seed, zero_init_residual);
  CUDA_CHECK(cudaMemcpy(params_.master_all(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (params_.momentum_all()) CUDA_CHECK(cudaMemset(params_.momentum_all(), 0, params_.total() * sizeof(float)));
  std::vector<float> run(running_stats_count());  // running mean 0, running var 1
  for (const Bn* bn : layers_->bns()) {
    float* var = run.data() + bn->running_off + bn->channels;
    std::fill(var, var + bn->channels, 1.f);
  }
  CUDA_CHECK(cudaMemcpy(running_.get(), run.data(), run.size() * sizeof(float), cudaMemcpyHostToDevice));
  params_.refresh_working_copy(ctx_.stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

// What build_layers() registers (resnet50_params()), without building; the BNs read off their gammas
// ("<bn>.weight"), in registration order, which is running_stats() order.
TensorLayout Network::tensor_layout(int classes) {
  NetConfig cfg;
  cfg.classes = classes;
  ParamStore store;
  for (const ParamSpec& p : resnet50_params(cfg).tensors) store.add(p.name, p.kind, p.shape);
  store.assign_offsets();
  TensorLayout layout{store.tensors(), {}};
  for (const ParamTensor& t : layout.params)
    if (t.kind == ParamKind::BnGamma) layout.bns.emplace_back(t.name.substr(0, t.name.rfind('.')), t.shape[0]);
  return layout;
}

std::vector<std::string> Network::running_stats_names() const {
  std::vector<std::string> names;
  for (const Bn* b : layers_->bns())
    names.insert(names.end(), {b->name + ".running_mean", b->name + ".running_var"});
  return names;
}
