// The fused batch-norm patterns as cudnn-frontend graphs, one per pattern and conv geometry.
#include "model/fused_conv.h"

#include <algorithm>
#include <optional>

#include "core/errors.h"
#include "core/memory.h"
#include "model/cudnn/plan_picker.h"

namespace {

// Tensor ids by role (the graph's stored tensors); the frontend numbers the virtual ones.
enum Uid : int64_t {
  kX = 1, kW, kY, kDy, kDw, kScale, kBias, kSum, kSqSum, kMean, kInvstd, kGamma, kBeta, kG, kDgamma, kDbeta,
  kEqDy, kEqX, kEqB, kZ
};

// The scale/bias type and the type of the virtual tensors are the engine's to accept: fp32 first
// (no rounding of BN's per-channel coefficients), then the activation type as the cudnn-frontend
// samples of these patterns use. A cached plan names its pair by index.
constexpr int kTypeTries = 4;
std::pair<DType, DType> type_try(int i, DType io) {
  const std::pair<DType, DType> tries[kTypeTries] = {{DType::F32, DType::F32}, {io, DType::F32}, {DType::F32, io}, {io, io}};
  return tries[i];
}

bool try_applies(FusedPattern p, std::pair<DType, DType> t) {
  if (!has_scale_bias(p) && t.first != DType::F32) return false;   // nothing to type
  return !(p == FusedPattern::ConvStats && t.second != DType::F32);  // no intermediate tensors either
}

fe::graph::Pointwise_attributes pointwise(fe::PointwiseMode_t mode) {
  return fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
}

// The graph of pattern p for conv g: scale/bias in `sb`, virtual tensors in `inter`.
struct PatternGraph {
  FusedPattern p;
  ConvGeometry g;
  DType io, sb, inter;
  Layout l;

  std::array<int64_t, 4> in() const { return {g.n, g.c, g.h, g.w}; }
  std::array<int64_t, 4> out() const { return {g.n, g.k, g.out_h(), g.out_w()}; }
  std::array<int64_t, 4> filt() const { return {g.k, g.c, g.r, g.r}; }
  std::array<int64_t, 4> per_channel(int c) const { return {1, c, 1, 1}; }

  void operator()(fe::graph::Graph& gr) const {
    gr.set_io_data_type(fe_type(io)).set_intermediate_data_type(fe_type(inter));
    if (p == FusedPattern::ConvBn || p == FusedPattern::ConvBnRelu || p == FusedPattern::ConvBnAddRelu)
      return epilogue(gr);
    if (p == FusedPattern::DgradDreluDbn) return dgrad_drelu_dbn(gr);
    // The conv's input: x itself, or relu(x * s + b) computed as it is read (the previous BN applied).
    TensorPtr x = graph_tensor(gr, kX, io, in(), l);
    if (p != FusedPattern::ConvStats) x = scale_bias_relu(gr, x, g.c);
    if (p == FusedPattern::SbrWgrad) {
      const TensorPtr dw = gr.conv_wgrad(graph_tensor(gr, kDy, io, out(), l), x, wgrad_attributes(g));
      return set_stored(dw, kDw, io, filt(), l);
    }
    const TensorPtr y = gr.conv_fprop(x, graph_tensor(gr, kW, io, filt(), l), fprop_attributes(g));
    set_stored(y, kY, io, out(), l);
    // Statistics in the activation type's precision, as the engines of this pattern take them.
    const auto [sum, sqsum] = gr.genstats(y, fe::graph::Genstats_attributes().set_compute_data_type(fe_type(io)));
    set_stored(sum, kSum, DType::F32, per_channel(g.k), l);
    set_stored(sqsum, kSqSum, DType::F32, per_channel(g.k), l);
  }

  TensorPtr scale_bias_relu(fe::graph::Graph& gr, const TensorPtr& x, int c) const {
    const TensorPtr s = graph_tensor(gr, kScale, sb, per_channel(c), l), b = graph_tensor(gr, kBias, sb, per_channel(c), l);
    const TensorPtr xs = gr.pointwise(x, s, pointwise(fe::PointwiseMode_t::MUL));
    const TensorPtr xb = gr.pointwise(xs, b, pointwise(fe::PointwiseMode_t::ADD));
    return gr.pointwise(xb, pointwise(fe::PointwiseMode_t::RELU_FWD));
  }

  // g = dgrad(dy, w) * (bn(x) > 0), bn(x) recomputed from x; then BN backward's weights and the
  // coefficients of dx = eq_dy * g + eq_x * x + eq_b.
  void dgrad_drelu_dbn(fe::graph::Graph& gr) const {
    const TensorPtr dx = gr.conv_dgrad(graph_tensor(gr, kDy, io, out(), l), graph_tensor(gr, kW, io, filt(), l),
                                       dgrad_attributes(g));
    set_virtual(dx, in(), l);
    const TensorPtr x = graph_tensor(gr, kX, io, in(), l);
    const TensorPtr mean = graph_tensor(gr, kMean, DType::F32, per_channel(g.c), l);
    const TensorPtr invstd = graph_tensor(gr, kInvstd, DType::F32, per_channel(g.c), l);
    const TensorPtr gamma = graph_tensor(gr, kGamma, DType::F32, per_channel(g.c), l);
    const TensorPtr beta = graph_tensor(gr, kBeta, DType::F32, per_channel(g.c), l);
    const TensorPtr xm = gr.pointwise(x, mean, pointwise(fe::PointwiseMode_t::SUB));
    const TensorPtr xn = gr.pointwise(xm, invstd, pointwise(fe::PointwiseMode_t::MUL));
    const TensorPtr xg = gr.pointwise(xn, gamma, pointwise(fe::PointwiseMode_t::MUL));
    const TensorPtr xb = gr.pointwise(xg, beta, pointwise(fe::PointwiseMode_t::ADD));
    const TensorPtr grad = gr.pointwise(dx, xb, pointwise(fe::PointwiseMode_t::RELU_BWD));
    set_stored(grad, kG, io, in(), l);
    const auto [dgamma, dbeta, eq_dy, eq_x, eq_b] =
        gr.dbn_weight(grad, x, mean, invstd, gamma, fe::graph::DBN_weight_attributes().set_compute_data_type(fe::DataType_t::FLOAT));
    const std::pair<const TensorPtr*, Uid> outputs[] = {{&dgamma, kDgamma}, {&dbeta, kDbeta}, {&eq_dy, kEqDy},
                                                        {&eq_x, kEqX}, {&eq_b, kEqB}};
    for (const auto& [t, uid] : outputs) set_stored(*t, uid, DType::F32, per_channel(g.c), l);
  }

  // y = relu?(conv(x) * s + b + z?): the BN (running statistics), the residual and the ReLU applied
  // to each output value before it is written.
  void epilogue(fe::graph::Graph& gr) const {
    TensorPtr y = gr.conv_fprop(graph_tensor(gr, kX, io, in(), l), graph_tensor(gr, kW, io, filt(), l), fprop_attributes(g));
    y = gr.pointwise(y, graph_tensor(gr, kScale, sb, per_channel(g.k), l), pointwise(fe::PointwiseMode_t::MUL));
    y = gr.pointwise(y, graph_tensor(gr, kBias, sb, per_channel(g.k), l), pointwise(fe::PointwiseMode_t::ADD));
    if (p == FusedPattern::ConvBnAddRelu)
      y = gr.pointwise(y, graph_tensor(gr, kZ, io, out(), l), pointwise(fe::PointwiseMode_t::ADD));
    if (p != FusedPattern::ConvBn) y = gr.pointwise(y, pointwise(fe::PointwiseMode_t::RELU_FWD));
    set_stored(y, kY, io, out(), l);
  }
};

// Every tensor a pattern may have, in scratch memory (scratch_buffer): the plan picker times the
// engines on it.
struct Scratch {
  DeviceBuffer memory;
  ScratchPointers pointers;
  Scratch(const ConvGeometry& g, DType io) {
    const size_t es = dtype_size(io), in = g.input().count() * es, out = g.output().count() * es,
                 filt = g.filter_count() * es, vec = size_t(std::max(g.c, g.k)) * 4;
    const std::pair<Uid, size_t> sizes[] = {
        {kX, in},       {kW, filt},     {kY, out},      {kDy, out},     {kDw, filt},    {kScale, vec}, {kBias, vec},
        {kSum, vec},    {kSqSum, vec},  {kMean, vec},   {kInvstd, vec}, {kGamma, vec},  {kBeta, vec},  {kG, in},
        {kDgamma, vec}, {kDbeta, vec},  {kEqDy, vec},   {kEqX, vec},    {kEqB, vec},    {kZ, out}};
    auto round_up = [](size_t b) { return (b + 255) / 256 * 256; };
    size_t total = 0;
    for (const auto& [uid, bytes] : sizes) total += round_up(bytes);
    memory = scratch_buffer(total, "fused conv autotune tensors " + g.key());
    char* at = memory.as<char>();
    for (const auto& [uid, bytes] : sizes) pointers[uid] = at, at += round_up(bytes);
  }
};

}  // namespace

std::string fused_cache_key(FusedPattern p, const ConvGeometry& g) {
  return std::string("fused.") + fused_pattern_slug(p) + "." + g.key();
}

bool has_scale_bias(FusedPattern p) {
  return p != FusedPattern::ConvStats && p != FusedPattern::DgradDreluDbn;
}

FusedConv::FusedConv(cudnnHandle_t h, FusedPattern p, const ConvGeometry& g, const FusedOptions& o,
                     const FusedChoice* cached)
    : FusedPlan(p, g), o_(o) {
  if (o.measure && cached && !cached->engine.empty() && cached->types >= 0 && cached->types < kTypeTries &&
      try_applies(p, type_try(cached->types, o.io)) && try_types(h, cached->types, cached))
    return;
  why_.clear();  // a stale cached plan is no reason to report
  for (int i = 0; i < kTypeTries; ++i)
    if (try_applies(p, type_try(i, o.io)) && try_types(h, i, nullptr)) return;
}

bool FusedConv::try_types(cudnnHandle_t h, int types, const FusedChoice* cached) {
  const auto [scale_type, intermediate] = type_try(types, o_.io);
  const PatternGraph recipe{pattern_, g_, o_.io, scale_type, intermediate, o_.layout};
  const PlanRules rules{.measure = o_.measure, .deterministic = o_.deterministic, .runtime_compiled = true,
                        .workspace_limit = o_.workspace_limit};
  std::optional<Scratch> scratch;
  if (o_.measure && !cached) scratch.emplace(g_, o_.io);
  PlannedGraph plan = cached ? plan_engine(recipe, h, rules, cached->engine)
                             : pick_plan(recipe, h, rules, scratch ? scratch->pointers : ScratchPointers{});
  if (!plan) {
    if (why_.empty()) why_ = plan.why;  // the first reason: later tries usually fail for the same one
    return false;
  }
  choice_ = {plan.engine, types, plan.workspace, cached ? cached->ms : plan.ms, -1};
  ok_ = true;
  from_cache_ = cached != nullptr;
  scale_type_ = scale_type;
  plan_ = std::make_shared<const PlannedGraph>(std::move(plan));
  why_.clear();
  return true;
}

bool FusedConv::runtime_compiled() const { return plan_ && plan_->runtime_compiled; }

void FusedConv::run(cudnnHandle_t h, const FusedArgs& a, void* ws, size_t ws_bytes) const {
  const std::string what = std::string("fused ") + fused_pattern_name(pattern_) + " for conv " + g_.key();
  if (!plan_) throw Fatal(what + " run though cuDNN refused it: " + why_);
  if (plan_->workspace > ws_bytes)
    throw Fatal(what + " needs " + format_bytes(plan_->workspace) + " of workspace, given " + format_bytes(ws_bytes));
  const std::pair<Uid, const void*> roles[] = {
      {kX, a.x},         {kW, a.w},           {kY, a.y},         {kDy, a.dy},         {kDw, a.dw},
      {kScale, a.scale}, {kBias, a.bias},     {kSum, a.sum},     {kSqSum, a.sqsum},   {kMean, a.mean},
      {kInvstd, a.invstd}, {kGamma, a.gamma}, {kBeta, a.beta},   {kG, a.g},           {kDgamma, a.dgamma},
      {kDbeta, a.dbeta}, {kEqDy, a.eq_dy},    {kEqX, a.eq_x},    {kEqB, a.eq_b},      {kZ, a.z}};
  std::unordered_map<int64_t, void*> pointers;
  for (const auto& [uid, p] : roles)
    if (p) pointers[uid] = const_cast<void*>(p);
  execute_plan(*plan_, h, pointers, ws, what);
}
