// The fused batch-norm patterns as cuDNN operation graphs, built once per conv geometry.
#include "model/fused_conv.h"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "core/check.h"
#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"
#include "model/cudnn_backend.h"

namespace {

// Tensor ids by role; the virtual tensors inside a pattern count up from kVirtual.
enum Uid : int64_t {
  kX = 1, kW, kY, kDy, kDw, kScale, kBias, kSum, kSqSum, kMean, kInvstd, kGamma, kBeta, kG, kDgamma, kDbeta,
  kEqDy, kEqX, kEqB, kZ, kVirtual = 100
};
// How many of each heuristics list's first acceptable engines are timed (modes A and B, see EngineLists).
// Mode B's runtime-compiled engines are left out: each costs seconds of compiling at every start,
// and with them bin/train and bin/predict were no faster (bench/results/gpu-run-2026-11-24.md).
constexpr size_t kMeasuredPerList = 6;
constexpr int kTimedRuns = 3;
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

std::string fused_cache_key(FusedPattern p, const ConvGeometry& g) {
  return std::string("fused.") + fused_pattern_slug(p) + "." + g.key();
}

bool has_scale_bias(FusedPattern p) {
  return p != FusedPattern::ConvStats && p != FusedPattern::DgradDreluDbn;
}

bool run_fused(const PatternCost& c) {
  if (!c.accepted) return false;
  if (c.fused_ms < 0 || c.unfused_ms < 0) return true;  // not measured: fusion saves passes over memory
  return c.fused_ms <= c.unfused_ms;
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

namespace {

// The scale/bias type and the type of the virtual tensors are the engine's to accept: fp32 first
// (no rounding of BN's per-channel coefficients), then the activation type as the cudnn-frontend
// samples of these patterns use. A cached plan names its pair by index.
constexpr int kTypeTries = 4;
std::pair<DType, DType> type_try(int i, DType io) {
  const std::pair<DType, DType> tries[kTypeTries] = {{DType::F32, DType::F32}, {io, DType::F32}, {DType::F32, io}, {io, io}};
  return tries[i];
}

bool try_applies(FusedPattern p, std::pair<DType, DType> t) {
  if (!has_scale_bias(p) && t.first != DType::F32) return false;  // nothing to type
  return !(p == FusedPattern::ConvStats && t.second != DType::F32);  // no intermediate tensors either
}

}  // namespace

FusedConv::FusedConv(cudnnHandle_t h, FusedPattern p, const ConvGeometry& g, const FusedOptions& o,
                     const FusedChoice* cached)
    : pattern_(p), g_(g), o_(o) {
  if (o.measure && cached && cached->rank >= 0 && cached->types >= 0 && cached->types < kTypeTries &&
      try_applies(p, type_try(cached->types, o.io)) && try_build(h, cached->types, cached))
    return;
  why_.clear();  // a stale cached plan is no reason to report
  for (int i = 0; i < kTypeTries; ++i)
    if (try_applies(p, type_try(i, o.io)) && try_build(h, i, nullptr)) return;
}

FusedConv::~FusedConv() = default;

// One try at a scale/bias type and an intermediate type: the operation graph, then the choice of
// its engine (the fastest of the first few the heuristics offer, when measuring; the cached rank alone).
bool FusedConv::try_build(cudnnHandle_t h, int types, const FusedChoice* cached) {
  // Keep the (so far) first reason: later tries usually fail for the same one.
  auto refuse = [&](const std::string& why) {
    if (why_.empty()) why_ = why;
    graph_.reset();
    return false;
  };
  const auto [scale_type, intermediate] = type_try(types, o_.io);
  auto gr = std::make_unique<Graph>();
  const cudnnDataType_t sb = cudnn_type(scale_type), inter = cudnn_type(intermediate);
  const bool epilogue = pattern_ == FusedPattern::ConvBn || pattern_ == FusedPattern::ConvBnRelu ||
                        pattern_ == FusedPattern::ConvBnAddRelu;
  try {
    if (epilogue) add_epilogue_ops(*gr, sb, inter);
    else add_training_ops(*gr, sb, inter);
    gr->graph = operation_graph(h, gr->ops);
  } catch (const Fatal& e) {
    return refuse(std::string("cuDNN refused the operation graph: ") + e.what());
  }
  // Mode B's list only when measuring (or a cached rank lies in it): without, the heuristics' first
  // usable engine of A's list.
  EngineLists lists = engine_configs_first_list(gr->graph);
  if (cached ? size_t(cached->rank) >= lists.second : o_.measure) add_mode_b_list(lists, gr->graph);
  if (lists.configs.empty())
    return refuse("cuDNN has no engine for it on this GPU" + (lists.error.empty() ? "" : " (" + lists.error + ")"));
  std::string last = "no engine configuration could be finalized";
  struct Candidate {
    size_t rank;
    Plan plan;
    EngineNotes notes;
  };
  std::vector<Candidate> candidates;
  size_t timed[2] = {0, 0};  // per list
  const size_t first = cached ? size_t(cached->rank) : 0;
  const size_t end = cached ? std::min(first + 1, lists.configs.size()) : lists.configs.size();
  for (size_t i = first; i < end; ++i) {
    const Backend& c = lists.configs[i];
    const int list = lists.list_of(i);
    if (timed[list] == kMeasuredPerList) continue;
    const EngineNotes n = notes_of(c);
    if (list == 1 && n.runtime_compiled) continue;
    if (n.reduced_precision) { last = "its engines reduce in fp16"; continue; }
    if (o_.deterministic && n.nondeterministic) { last = "its engines are not deterministic (--deterministic)"; continue; }
    Plan plan = make_plan(h, c);
    if (!plan.desc) continue;
    if (plan.workspace > o_.workspace_limit) { last = "its engines need more workspace than --workspace-mb"; continue; }
    // A cached rank whose plan needs another workspace names another engine now (the lists moved
    // under the same context): its times are not this engine's, so it is searched again.
    if (cached && plan.workspace != cached->workspace) { last = "the cached engine changed"; continue; }
    candidates.push_back({i, std::move(plan), n});
    if (!o_.measure) break;  // the heuristics' first usable one
    ++timed[list];
  }
  if (candidates.empty()) return refuse(last);
  graph_ = std::move(gr);
  scale_type_ = scale_type;
  size_t best = 0;
  if (cached) {
    ms_ = cached->ms;
    from_cache_ = true;
  } else if (o_.measure) {
    size_t ws_bytes = 0;
    for (const auto& c : candidates) ws_bytes = std::max(ws_bytes, c.plan.workspace);
    DeviceBuffer scratch, ws(ws_bytes + kCudnnAlignment, "fused conv autotune workspace");
    const FusedArgs a = scratch_args(scratch);
    std::vector<const void*> ptrs;
    for (int64_t u : uids()) ptrs.push_back(pointer_of(u, a));
    const Backend pack = variant_pack(uids(), ptrs, ws.get());
    cudaStream_t stream = nullptr;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    for (size_t i = 0; i < candidates.size(); ++i) {
      const float t = fastest_ms(stream, kTimedRuns, [&] { execute(h, candidates[i].plan.desc, pack); });
      if (i == 0 || t < ms_) ms_ = t, best = i;
    }
  }
  Candidate& chosen = candidates[best];
  graph_->plan = std::move(chosen.plan);
  runtime_compiled_ = chosen.notes.runtime_compiled;
  workspace_ = graph_->plan.workspace;
  choice_ = {static_cast<int>(chosen.rank), types, workspace_, ms_};
  ok_ = true;
  why_.clear();
  return true;
}

// The training patterns: the conv's input read through the previous BN (SbrConvStats, SbrWgrad),
// statistics of its output (ConvStats, SbrConvStats), or the data gradient with the ReLU and BN
// backward in its epilogue (DgradDreluDbn).
void FusedConv::add_training_ops(Graph& gr, cudnnDataType_t sb, cudnnDataType_t inter) const {
  const cudnnDataType_t io = cudnn_type(o_.io), f32 = CUDNN_DATA_FLOAT;
  const Layout l = o_.layout;
  const std::array<int64_t, 4> in{g_.n, g_.c, g_.h, g_.w}, out{g_.n, g_.k, g_.out_h(), g_.out_w()},
      filt{g_.k, g_.c, g_.r, g_.r}, cin{1, g_.c, 1, 1}, cout{1, g_.k, 1, 1};
  const bool prologue = pattern_ == FusedPattern::SbrConvStats || pattern_ == FusedPattern::SbrWgrad;
  const Backend& conv = gr.add(convolution_descriptor(g_.stride, g_.pad));
  // The conv's input: x itself, or relu(x * s + b) computed as it is read.
  const Backend* conv_in = nullptr;
  if (pattern_ != FusedPattern::DgradDreluDbn) {
    const Backend& x = gr.tensor(kX, io, in, l);
    conv_in = &x;
    if (prologue) {
      const Backend& s = gr.tensor(kScale, sb, cin, l);
      const Backend& b = gr.tensor(kBias, sb, cin, l);
      const Backend &xs = gr.virtual_tensor(inter, in, l), &xb = gr.virtual_tensor(inter, in, l),
                    &xr = gr.virtual_tensor(inter, in, l);
      const Backend& mul = gr.add(pointwise_desc(CUDNN_POINTWISE_MUL));
      const Backend& add = gr.add(pointwise_desc(CUDNN_POINTWISE_ADD));
      const Backend& relu = gr.add(pointwise_desc(CUDNN_POINTWISE_RELU_FWD));
      gr.op(pointwise_op(mul, x, &s, xs));
      gr.op(pointwise_op(add, xs, &b, xb));
      gr.op(pointwise_op(relu, xb, nullptr, xr));
      conv_in = &xr;
    }
  }
  if (pattern_ == FusedPattern::ConvStats || pattern_ == FusedPattern::SbrConvStats) {
    const Backend& w = gr.tensor(kW, io, filt, l);
    const Backend& y = gr.tensor(kY, io, out, l);
    const Backend& sum = gr.tensor(kSum, f32, cout, l);
    const Backend& sqsum = gr.tensor(kSqSum, f32, cout, l);
    gr.op(convolution_op(ConvDirection::Forward, *conv_in, w, y, conv));
    gr.op(genstats_op(y, sum, sqsum, io));
  } else if (pattern_ == FusedPattern::SbrWgrad) {
    const Backend& dy = gr.tensor(kDy, io, out, l);
    const Backend& dw = gr.tensor(kDw, io, filt, l);
    gr.op(convolution_op(ConvDirection::BackwardFilter, *conv_in, dw, dy, conv));
  } else {  // DgradDreluDbn: bn(x) recomputed from x, then ReLU backward and BN backward weights
    const Backend& dy = gr.tensor(kDy, io, out, l);
    const Backend& w = gr.tensor(kW, io, filt, l);
    const Backend& dx = gr.virtual_tensor(inter, in, l);
    gr.op(convolution_op(ConvDirection::BackwardData, dx, w, dy, conv));
    const Backend& x = gr.tensor(kX, io, in, l);
    const Backend& mean = gr.tensor(kMean, f32, cin, l);
    const Backend& invstd = gr.tensor(kInvstd, f32, cin, l);
    const Backend& gamma = gr.tensor(kGamma, f32, cin, l);
    const Backend& beta = gr.tensor(kBeta, f32, cin, l);
    const Backend &xm = gr.virtual_tensor(inter, in, l), &xn = gr.virtual_tensor(inter, in, l),
                  &xg = gr.virtual_tensor(inter, in, l), &xb = gr.virtual_tensor(inter, in, l);
    const Backend& sub = gr.add(pointwise_desc(CUDNN_POINTWISE_SUB));
    const Backend& mul = gr.add(pointwise_desc(CUDNN_POINTWISE_MUL));
    const Backend& add = gr.add(pointwise_desc(CUDNN_POINTWISE_ADD));
    const Backend& drelu = gr.add(pointwise_desc(CUDNN_POINTWISE_RELU_BWD));
    gr.op(pointwise_op(sub, x, &mean, xm));
    gr.op(pointwise_op(mul, xm, &invstd, xn));
    gr.op(pointwise_op(mul, xn, &gamma, xg));
    gr.op(pointwise_op(add, xg, &beta, xb));
    const Backend& g = gr.tensor(kG, io, in, l);
    gr.op(relu_backward_op(drelu, dx, xb, g));
    const Backend& dgamma = gr.tensor(kDgamma, f32, cin, l);
    const Backend& dbeta = gr.tensor(kDbeta, f32, cin, l);
    const Backend& eq_dy = gr.tensor(kEqDy, f32, cin, l);
    const Backend& eq_x = gr.tensor(kEqX, f32, cin, l);
    const Backend& eq_b = gr.tensor(kEqB, f32, cin, l);
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
    gr.op(std::move(op));
  }
}

// The inference patterns: conv, then the BN's running-statistics scale and bias, the residual and
// the ReLU applied to each output value before it is written (y is the only tensor stored).
void FusedConv::add_epilogue_ops(Graph& gr, cudnnDataType_t sb, cudnnDataType_t inter) const {
  const cudnnDataType_t io = cudnn_type(o_.io);
  const Layout l = o_.layout;
  const std::array<int64_t, 4> in{g_.n, g_.c, g_.h, g_.w}, out{g_.n, g_.k, g_.out_h(), g_.out_w()},
      filt{g_.k, g_.c, g_.r, g_.r}, cout{1, g_.k, 1, 1};
  const bool add_z = pattern_ == FusedPattern::ConvBnAddRelu, relu = pattern_ != FusedPattern::ConvBn;
  const Backend& conv = gr.add(convolution_descriptor(g_.stride, g_.pad));
  const Backend& x = gr.tensor(kX, io, in, l);
  const Backend& w = gr.tensor(kW, io, filt, l);
  const Backend& s = gr.tensor(kScale, sb, cout, l);
  const Backend& b = gr.tensor(kBias, sb, cout, l);
  const Backend* z = add_z ? &gr.tensor(kZ, io, out, l) : nullptr;
  // Each step's output: y where it is the last step, else a virtual tensor.
  const int steps = 2 + add_z + relu;
  int step = 0;
  auto next = [&]() -> const Backend& {
    return ++step == steps ? gr.tensor(kY, io, out, l) : gr.virtual_tensor(inter, out, l);
  };
  const Backend& c = gr.virtual_tensor(inter, out, l);
  gr.op(convolution_op(ConvDirection::Forward, x, w, c, conv));
  const Backend& mul = gr.add(pointwise_desc(CUDNN_POINTWISE_MUL));
  const Backend& add = gr.add(pointwise_desc(CUDNN_POINTWISE_ADD));
  const Backend& cs = next();
  gr.op(pointwise_op(mul, c, &s, cs));
  const Backend* last = &next();
  gr.op(pointwise_op(add, cs, &b, *last));
  if (add_z) {
    const Backend& sum = next();
    gr.op(pointwise_op(add, *last, z, sum));
    last = &sum;
  }
  if (relu) {
    const Backend& mode = gr.add(pointwise_desc(CUDNN_POINTWISE_RELU_FWD));
    gr.op(pointwise_op(mode, *last, nullptr, next()));
  }
}

std::vector<int64_t> FusedConv::uids() const {
  std::vector<int64_t> u;
  for (Uid x : graph_->uids) u.push_back(x);
  return u;
}

FusedArgs FusedConv::scratch_args(DeviceBuffer& scratch) const {
  const size_t es = dtype_size(o_.io);
  const size_t in = g_.input().count() * es, out = g_.output().count() * es, filt = g_.filter_count() * es;
  // Per-channel vectors of the input's channels or (the epilogue's scale and bias) the output's.
  const size_t vc = size_t(g_.c) * 4, vk = size_t(g_.k) * 4, vs = std::max(vc, vk);
  const size_t sizes[] = {in, filt, out, out, filt, vs, vs, vk, vk, vc, vc, vc, vc, in, vc, vc, vc, vc, vc, out};
  constexpr int kTensors = sizeof(sizes) / sizeof(sizes[0]);
  auto round_up = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t total = 0;
  for (size_t b : sizes) total += round_up(b);
  scratch = DeviceBuffer(total, "fused conv autotune tensors " + g_.key());
  // Non-zero data, never zeros (0x3C bytes: about 1.06 in fp16, 0.0115 in fp32).
  CUDA_CHECK(cudaMemset(scratch.get(), 0x3C, total));
  char* p = scratch.as<char>();
  void* at[kTensors];
  for (int i = 0; i < kTensors; ++i) at[i] = p, p += round_up(sizes[i]);
  FusedArgs a;
  a.x = at[0], a.w = at[1], a.y = at[2], a.dy = at[3], a.dw = at[4], a.scale = at[5], a.bias = at[6];
  a.sum = static_cast<float*>(at[7]), a.sqsum = static_cast<float*>(at[8]);
  a.mean = static_cast<float*>(at[9]), a.invstd = static_cast<float*>(at[10]);
  a.gamma = static_cast<float*>(at[11]), a.beta = static_cast<float*>(at[12]), a.g = at[13];
  a.dgamma = static_cast<float*>(at[14]), a.dbeta = static_cast<float*>(at[15]);
  a.eq_dy = static_cast<float*>(at[16]), a.eq_x = static_cast<float*>(at[17]), a.eq_b = static_cast<float*>(at[18]);
  a.z = at[19];
  return a;
}

const void* FusedConv::pointer_of(int64_t uid, const FusedArgs& a) const {
  switch (uid) {
    case kX: return a.x;
    case kW: return a.w;
    case kY: return a.y;
    case kDy: return a.dy;
    case kDw: return a.dw;
    case kScale: return a.scale;
    case kBias: return a.bias;
    case kSum: return a.sum;
    case kSqSum: return a.sqsum;
    case kMean: return a.mean;
    case kInvstd: return a.invstd;
    case kGamma: return a.gamma;
    case kBeta: return a.beta;
    case kG: return a.g;
    case kDgamma: return a.dgamma;
    case kDbeta: return a.dbeta;
    case kEqDy: return a.eq_dy;
    case kEqX: return a.eq_x;
    case kEqB: return a.eq_b;
    case kZ: return a.z;
    default: return nullptr;
  }
}

void FusedConv::run(cudnnHandle_t h, const FusedArgs& a, void* ws, size_t ws_bytes) const {
  if (!ok_) throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + " for conv " + g_.key() +
                        " run though cuDNN refused it: " + why_);
  if (workspace_ > ws_bytes)
    throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + " for conv " + g_.key() + " needs " +
                format_bytes(workspace_) + " of workspace, given " + format_bytes(ws_bytes));
  std::vector<const void*> ptrs;
  for (Uid u : graph_->uids) {
    const void* p = pointer_of(u, a);
    if (!p) throw Fatal(std::string("fused ") + fused_pattern_name(pattern_) + ": tensor " + std::to_string(u) +
                        " has no pointer");
    ptrs.push_back(p);
  }
  auto& packs = graph_->packs;
  auto hit = std::find_if(packs.begin(), packs.end(), [&](const Graph::Pack& p) { return p.ptrs == ptrs && p.ws == ws; });
  if (hit == packs.end()) {
    if (packs.size() == kPacksKept) packs.erase(packs.begin());
    packs.push_back({ptrs, ws, variant_pack(uids(), ptrs, ws)});
    hit = packs.end() - 1;
  }
  execute(h, graph_->plan.desc, hit->desc);
}
