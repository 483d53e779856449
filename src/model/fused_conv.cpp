// The fused batch-norm patterns as cuDNN operation graphs, built once per conv geometry.
#include "model/fused_conv.h"

#include <algorithm>
#include <deque>

#include "core/check.h"
#include "core/errors.h"
#include "core/memory.h"
#include "model/cudnn_backend.h"

namespace {

// Tensor ids by role; the virtual tensors inside a pattern count up from kVirtual.
enum Uid : int64_t {
  kX = 1, kW, kY, kDy, kDw, kScale, kBias, kSum, kSqSum, kMean, kInvstd, kGamma, kBeta, kG, kDgamma, kDbeta,
  kEqDy, kEqX, kEqB, kVirtual = 100
};
constexpr size_t kPacksKept = 32;  // distinct pointer sets remembered (one object serves every conv of its shape)

Backend pointwise_desc(cudnnPointwiseMode_t mode) {
  Backend d(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  d.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
  d.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
  d.finalize();
  return d;
}

// y = mode(x, b) (b may be null for a unary mode).
Backend pointwise_op(const Backend& mode, const Backend& x, const Backend* b, const Backend& y) {
  Backend op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, mode);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  op.finalize();
  return op;
}

Backend relu_backward_op(const Backend& mode, const Backend& dy, const Backend& x, const Backend& dx) {
  Backend op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, mode);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
  op.finalize();
  return op;
}

Backend genstats_op(const Backend& x, const Backend& sum, const Backend& sqsum, cudnnDataType_t prec) {
  Backend op(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  op.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, &mode);
  op.set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
  op.set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, x);
  op.set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum);
  op.set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum);
  op.finalize();
  return op;
}

}  // namespace

const char* fused_pattern_name(FusedPattern p) {
  switch (p) {
    case FusedPattern::ConvStats: return "conv + statistics";
    case FusedPattern::SbrConvStats: return "scale-bias-ReLU + conv + statistics";
    case FusedPattern::SbrWgrad: return "scale-bias-ReLU + weight gradient";
    default: return "data gradient + ReLU backward + BN backward weights";
  }
}

std::vector<std::string> fusion_report_lines(const FusionReport& r) {
  std::vector<std::string> lines;
  lines.push_back("fused batch norm: " + std::to_string(r.fused) + " of " + std::to_string(r.tried) +
                  " conv patterns run fused through cuDNN" +
                  (r.refused.empty() ? "" : "; the rest fall back to the plain conv and our BN kernels:"));
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
    lines.push_back("  " + std::string(fused_pattern_name(r.refused[i].pattern)) + " refused for " +
                    std::to_string(layers.size()) + (layers.size() == 1 ? " conv (" : " convs (") + names +
                    "): " + r.refused[i].why);
  }
  return lines;
}

// One pattern's tensors, operations, graph and plan; the descriptors live as long as the plan.
struct FusedConv::Graph {
  std::deque<Backend> keep;        // tensors and operations, alive while the plan is (a deque: ops point at them)
  std::vector<const Backend*> ops;
  std::vector<Uid> uids;           // the non-virtual tensors, in the order run() passes them
  Backend graph;
  Plan plan;
  int64_t next_virtual = kVirtual;
  struct Pack {
    std::vector<const void*> ptrs;
    void* ws;
    Backend desc;
  };
  mutable std::vector<Pack> packs;

  const Backend& add(Backend b) {
    keep.push_back(std::move(b));
    return keep.back();
  }
  const Backend& tensor(Uid uid, cudnnDataType_t t, std::array<int64_t, 4> dims, Layout l) {
    uids.push_back(uid);
    return add(backend_tensor({uid, t, dims, l}));
  }
  const Backend& virtual_tensor(cudnnDataType_t t, std::array<int64_t, 4> dims, Layout l) {
    return add(backend_tensor({next_virtual++, t, dims, l, true}));
  }
  void op(Backend b) { ops.push_back(&add(std::move(b))); }
};

FusedConv::FusedConv(cudnnHandle_t h, FusedPattern p, const ConvGeometry& g, const FusedOptions& o)
    : pattern_(p), g_(g), o_(o) {
  // The scale/bias type and the type of the virtual tensors are the engine's to accept: fp32 first
  // (no rounding of BN's per-channel coefficients), then the activation type as the cudnn-frontend
  // samples of these patterns use.
  const DType io = o.io;
  const bool has_scale = p == FusedPattern::SbrConvStats || p == FusedPattern::SbrWgrad;
  const std::pair<DType, DType> tries[] = {{DType::F32, DType::F32}, {io, DType::F32}, {DType::F32, io}, {io, io}};
  for (const auto& [scale, inter] : tries) {
    if (!has_scale && scale != DType::F32) continue;  // nothing to type
    if (p == FusedPattern::ConvStats && inter != DType::F32) continue;  // no intermediate tensors either
    if (try_build(h, scale, inter)) return;
  }
}

FusedConv::~FusedConv() = default;

bool FusedConv::try_build(cudnnHandle_t h, DType scale_type, DType intermediate) {
  // Keep the (so far) first reason: later tries usually fail for the same one.
  auto refuse = [&](const std::string& why) {
    if (why_.empty()) why_ = why;
    graph_.reset();
    return false;
  };
  auto gr = std::make_unique<Graph>();
  const cudnnDataType_t io = cudnn_type(o_.io), sb = cudnn_type(scale_type), inter = cudnn_type(intermediate);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Layout l = o_.layout;
  const std::array<int64_t, 4> in{g_.n, g_.c, g_.h, g_.w}, out{g_.n, g_.k, g_.out_h(), g_.out_w()},
      filt{g_.k, g_.c, g_.r, g_.r}, cin{1, g_.c, 1, 1}, cout{1, g_.k, 1, 1};
  const bool prologue = pattern_ == FusedPattern::SbrConvStats || pattern_ == FusedPattern::SbrWgrad;
  try {
    const Backend& conv = gr->add(convolution_descriptor(g_.stride, g_.pad));
    // The conv's input: x itself, or relu(x * s + b) computed as it is read.
    const Backend* conv_in = nullptr;
    if (pattern_ != FusedPattern::DgradDreluDbn) {
      const Backend& x = gr->tensor(kX, io, in, l);
      conv_in = &x;
      if (prologue) {
        const Backend& s = gr->tensor(kScale, sb, cin, l);
        const Backend& b = gr->tensor(kBias, sb, cin, l);
        const Backend &xs = gr->virtual_tensor(inter, in, l), &xb = gr->virtual_tensor(inter, in, l),
                      &xr = gr->virtual_tensor(inter, in, l);
        const Backend& mul = gr->add(pointwise_desc(CUDNN_POINTWISE_MUL));
        const Backend& add = gr->add(pointwise_desc(CUDNN_POINTWISE_ADD));
        const Backend& relu = gr->add(pointwise_desc(CUDNN_POINTWISE_RELU_FWD));
        gr->op(pointwise_op(mul, x, &s, xs));
        gr->op(pointwise_op(add, xs, &b, xb));
        gr->op(pointwise_op(relu, xb, nullptr, xr));
        conv_in = &xr;
      }
    }
    if (pattern_ == FusedPattern::ConvStats || pattern_ == FusedPattern::SbrConvStats) {
      const Backend& w = gr->tensor(kW, io, filt, l);
      const Backend& y = gr->tensor(kY, io, out, l);
      const Backend& sum = gr->tensor(kSum, f32, cout, l);
      const Backend& sqsum = gr->tensor(kSqSum, f32, cout, l);
      gr->op(convolution_op(ConvDirection::Forward, *conv_in, w, y, conv));
      gr->op(genstats_op(y, sum, sqsum, io));
    } else if (pattern_ == FusedPattern::SbrWgrad) {
      const Backend& dy = gr->tensor(kDy, io, out, l);
      const Backend& dw = gr->tensor(kDw, io, filt, l);
      gr->op(convolution_op(ConvDirection::BackwardFilter, *conv_in, dw, dy, conv));
    } else {  // DgradDreluDbn: bn(x) recomputed from x, then ReLU backward and BN backward weights
      const Backend& dy = gr->tensor(kDy, io, out, l);
      const Backend& w = gr->tensor(kW, io, filt, l);
      const Backend& dx = gr->virtual_tensor(inter, in, l);
      gr->op(convolution_op(ConvDirection::BackwardData, dx, w, dy, conv));
      const Backend& x = gr->tensor(kX, io, in, l);
      const Backend& mean = gr->tensor(kMean, f32, cin, l);
      const Backend& invstd = gr->tensor(kInvstd, f32, cin, l);
      const Backend& gamma = gr->tensor(kGamma, f32, cin, l);
      const Backend& beta = gr->tensor(kBeta, f32, cin, l);
      const Backend &xm = gr->virtual_tensor(inter, in, l), &xn = gr->virtual_tensor(inter, in, l),
                    &xg = gr->virtual_tensor(inter, in, l), &xb = gr->virtual_tensor(inter, in, l);
      const Backend& sub = gr->add(pointwise_desc(CUDNN_POINTWISE_SUB));
      const Backend& mul = gr->add(pointwise_desc(CUDNN_POINTWISE_MUL));
      const Backend& add = gr->add(pointwise_desc(CUDNN_POINTWISE_ADD));
      const Backend& drelu = gr->add(pointwise_desc(CUDNN_POINTWISE_RELU_BWD));
      gr->op(pointwise_op(sub, x, &mean, xm));
      gr->op(pointwise_op(mul, xm, &invstd, xn));
      gr->op(pointwise_op(mul, xn, &gamma, xg));
      gr->op(pointwise_op(add, xg, &beta, xb));
      const Backend& g = gr->tensor(kG, io, in, l);
      gr->op(relu_backward_op(drelu, dx, xb, g));
      const Backend& dgamma = gr->tensor(kDgamma, f32, cin, l);
      const Backend& dbeta = gr->tensor(kDbeta, f32, cin, l);
      const Backend& eq_dy = gr->tensor(kEqDy, f32, cin, l);
      const Backend& eq_x = gr->tensor(kEqX, f32, cin, l);
      const Backend& eq_b = gr->tensor(kEqB, f32, cin, l);
      Backend op(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &f32);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, g);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, invstd);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, gamma);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, dgamma);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, dbeta);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, eq_dy);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, eq_x);
      op.set(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, eq_b);
      op.finalize();
      gr->op(std::move(op));
    }
    gr->graph = operation_graph(h, gr->ops);
  } catch (const Fatal& e) {
    return refuse(std::string("cuDNN refused the operation graph: ") + e.what());
  }
  std::vector<Backend> configs;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    try {
      configs = engine_configs(gr->graph, mode);
    } catch (const Fatal&) {
      configs.clear();
    }
    if (!configs.empty()) break;
  }
  if (configs.empty()) return refuse("cuDNN has no engine for it on this GPU");
  std::string last = "no engine configuration could be finalized";
  for (const Backend& c : configs) {
    const EngineNotes n = notes_of(c);
    if (n.reduced_precision) { last = "its engines reduce in fp16"; continue; }
    if (o_.deterministic && n.nondeterministic) { last = "its engines are not deterministic (--deterministic)"; continue; }
    Plan plan = make_plan(h, c);
    if (!plan.desc) continue;
    if (plan.workspace > o_.workspace_limit) { last = "its engines need more workspace than --workspace-mb"; continue; }
    gr->plan = std::move(plan);
    runtime_compiled_ = n.runtime_compiled;
    workspace_ = gr->plan.workspace;
    scale_type_ = scale_type;
    graph_ = std::move(gr);
    ok_ = true;
    why_.clear();
    return true;
  }
  return refuse(last);
}

void FusedConv::run(cudnnHandle_t h, const FusedArgs& a, void* ws, size_t ws_bytes) const {
  if (!ok_) throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + " for conv " + g_.key() +
                        " run though cuDNN refused it: " + why_);
  if (workspace_ > ws_bytes)
    throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + " for conv " + g_.key() + " needs " +
                format_bytes(workspace_) + " of workspace, given " + format_bytes(ws_bytes));
  std::vector<const void*> ptrs;
  std::vector<int64_t> uids;
  for (Uid u : graph_->uids) {
    const void* p = nullptr;
    switch (u) {
      case kX: p = a.x; break;
      case kW: p = a.w; break;
      case kY: p = a.y; break;
      case kDy: p = a.dy; break;
      case kDw: p = a.dw; break;
      case kScale: p = a.scale; break;
      case kBias: p = a.bias; break;
      case kSum: p = a.sum; break;
      case kSqSum: p = a.sqsum; break;
      case kMean: p = a.mean; break;
      case kInvstd: p = a.invstd; break;
      case kGamma: p = a.gamma; break;
      case kBeta: p = a.beta; break;
      case kG: p = a.g; break;
      case kDgamma: p = a.dgamma; break;
      case kDbeta: p = a.dbeta; break;
      case kEqDy: p = a.eq_dy; break;
      case kEqX: p = a.eq_x; break;
      case kEqB: p = a.eq_b; break;
      default: break;
    }
    if (!p) throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + ": tensor " + std::to_string(u) +
                        " has no pointer");
    ptrs.push_back(p);
    uids.push_back(u);
  }
  auto& packs = graph_->packs;
  auto hit = std::find_if(packs.begin(), packs.end(), [&](const Graph::Pack& p) { return p.ptrs == ptrs && p.ws == ws; });
  if (hit == packs.end()) {
    if (packs.size() == kPacksKept) packs.erase(packs.begin());
    packs.push_back({ptrs, ws, variant_pack(uids, ptrs, ws)});
    hit = packs.end() - 1;
  }
  execute(h, graph_->plan.desc, hit->desc);
}
