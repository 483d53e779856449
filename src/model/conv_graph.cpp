// Convolutions through cuDNN's graph (backend) API, with execution plans built once.
#include "model/conv_graph.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"

namespace {

// Tensor ids in every direction's graph: the conv input (x or dx), the filter (w or dw), the conv
// output (y or dy).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
constexpr int64_t kAlignment = 16;   // bytes; every pointer is checked against it
constexpr int kMeasuredCandidates = 6;  // how many of the heuristics' first choices are timed
constexpr int kTimedRuns = 3;
constexpr size_t kPacksKept = 8;     // distinct pointer sets remembered per direction

[[noreturn]] void backend_failure(cudnnStatus_t st, const char* what, int attribute) {
  const std::string call = std::string(what) + (attribute >= 0 ? " of attribute " + std::to_string(attribute) : "");
  throw_cudnn_error(st, call.c_str(), __FILE__, __LINE__);
}

// One backend descriptor, destroyed with its owner.
class Backend {
 public:
  Backend() = default;
  explicit Backend(cudnnBackendDescriptorType_t type) {
    const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d_);
    if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendCreateDescriptor", -1);
  }
  ~Backend() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Backend(Backend&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Backend& operator=(Backend&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  explicit operator bool() const { return d_ != nullptr; }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* out() { return &d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const void* values, int64_t n = 1) {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, n, values);
    if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendSetAttribute", name);
  }
  void set(cudnnBackendAttributeName_t name, const Backend& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &o);
  }
  void finalize() {
    const cudnnStatus_t st = cudnnBackendFinalize(d_);
    if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendFinalize", -1);
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

Backend tensor(int64_t uid, DType t, Layout l, int64_t n, int64_t c, int64_t h, int64_t w) {
  Backend d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t dt = t == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF;
  // Dimensions are always given as N, C, H, W; the strides say how they lie in memory.
  const int64_t dims[4] = {n, c, h, w};
  const int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc[4] = {h * w * c, 1, w * c, c};
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims, 4);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, l == Layout::NCHW ? nchw : nhwc, 4);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &kAlignment);
  d.finalize();
  return d;
}

// What cuDNN says about an engine configuration's kernels.
struct EngineNotes {
  bool tensor_core = false, down_convert = false, reduced_precision = false, nondeterministic = false;
  bool runtime_compiled = false;
};

EngineNotes notes_of(const Backend& config) {
  Backend engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  cudnnStatus_t st = cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine.out());
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINECFG_ENGINE);
  EngineNotes e;
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  st = cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, numerical);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINE_NUMERICAL_NOTE);
  for (int64_t i = 0; i < n; ++i) {
    e.tensor_core |= numerical[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    e.down_convert |= numerical[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
    e.reduced_precision |= numerical[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
    e.nondeterministic |= numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  st = cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behavior);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE);
  for (int64_t i = 0; i < n; ++i) e.runtime_compiled |= behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  return e;
}

// Whether an engine may run here: never with fp16 reductions; FMA only (no TF32, no inputs rounded
// down) under fp32 without TF32; deterministic when asked; no kernels compiled at start-up (they
// would be compiled again in every run, as the cache keeps only the configuration's rank).
bool acceptable(const EngineNotes& e, bool fma_only, bool deterministic) {
  if (e.reduced_precision || e.runtime_compiled) return false;
  if (fma_only && (e.tensor_core || e.down_convert)) return false;
  return !(deterministic && e.nondeterministic);
}

struct Plan {
  Backend desc;
  size_t workspace = 0;
};

// The execution plan of one configuration, or none when cuDNN cannot run it for this graph.
Plan make_plan(cudnnHandle_t h, const Backend& config) {
  Plan p{Backend(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 0};
  p.desc.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h);
  p.desc.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnBackendFinalize(p.desc.get()) != CUDNN_STATUS_SUCCESS) return {};
  int64_t n = 0, bytes = 0;
  const cudnnStatus_t st = cudnnBackendGetAttribute(p.desc.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &n, &bytes);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
  p.workspace = static_cast<size_t>(bytes);
  return p;
}

Backend variant_pack(const std::array<const void*, 3>& ptrs, void* ws) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % kAlignment != 0)
      throw Fatal("conv tensor at " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " is not " +
                  std::to_string(kAlignment) + "-byte aligned, as its cuDNN graph promises");
  Backend d(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* data[3] = {const_cast<void*>(ptrs[0]), const_cast<void*>(ptrs[1]), const_cast<void*>(ptrs[2])};
  d.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, 3);
  d.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data, 3);
  d.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws);
  d.finalize();
  return d;
}

void execute(cudnnHandle_t h, const Backend& plan, const Backend& pack) {
  const cudnnStatus_t st = cudnnBackendExecute(h, plan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendExecute", -1);
}

const char* op_name(ConvGraph::Op op) {
  switch (op) {
    case ConvGraph::kForward: return "forward";
    case ConvGraph::kBackwardData: return "backward-data";
    case ConvGraph::kBackwardDataAccumulate: return "accumulating backward-data";
    default: return "backward-filter";
  }
}

}  // namespace

struct ConvGraph::Direction {
  Backend x, w, y, conv, op, graph;
  std::vector<Backend> configs;               // the heuristics' list, best first
  std::vector<std::pair<int, Plan>> built;    // plans finalized while searching, by rank
  Plan plan;                                  // the one in use
  struct Pack {
    std::array<const void*, 3> ptrs;
    void* ws;
    Backend desc;
  };
  mutable std::vector<Pack> packs;

  // Builds the one-node operation graph and asks the heuristics for its configurations.
  void build(Op kind, cudnnHandle_t h, const ConvGeometry& g, DType t, Layout l) {
    x = tensor(kUidX, t, l, g.n, g.c, g.h, g.w);
    w = tensor(kUidW, t, l, g.k, g.c, g.r, g.r);  // KCRS (NCHW) or KRSC (NHWC), like the activations
    y = tensor(kUidY, t, l, g.n, g.k, g.out_h(), g.out_w());
    conv = Backend(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;  // fp32 accumulation for both precisions
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, ones[2] = {1, 1}, stride[2] = {g.stride, g.stride}, pad[2] = {g.pad, g.pad};
    conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &accumulate);
    conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode);
    conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims);
    conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, ones, 2);
    conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride, 2);
    conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
    conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad, 2);
    conv.finalize();

    // The operation's attribute names: its conv input, filter and output tensors, then the rest.
    struct OpAttributes {
      cudnnBackendDescriptorType_t type;
      cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
    };
    static const OpAttributes kForwardOp{
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
        CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
        CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
        CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    static const OpAttributes kBackwardDataOp{
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    static const OpAttributes kBackwardFilterOp{
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
    const OpAttributes& a = kind == kForward ? kForwardOp : kind == kBackwardFilter ? kBackwardFilterOp : kBackwardDataOp;
    const float alpha = 1.f, beta = kind == kBackwardDataAccumulate ? 1.f : 0.f;
    op = Backend(a.type);
    op.set(a.x, x);
    op.set(a.w, w);
    op.set(a.y, y);
    op.set(a.conv, conv);
    op.set(a.alpha, CUDNN_TYPE_FLOAT, &alpha);
    op.set(a.beta, CUDNN_TYPE_FLOAT, &beta);
    op.finalize();

    graph = Backend(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
    graph.finalize();

    Backend heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &heur_mode);
    heur.finalize();
    int64_t count = 0;
    cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINEHEUR_RESULTS);
    configs.clear();
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t got = 0;
    st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                  &got, raw.data());
    if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINEHEUR_RESULTS);
    configs.resize(static_cast<size_t>(got));
  }

  const Backend& pack_for(const std::array<const void*, 3>& ptrs, void* ws) const {
    for (const Pack& p : packs)
      if (p.ptrs == ptrs && p.ws == ws) return p.desc;
    if (packs.size() == kPacksKept) packs.erase(packs.begin());
    packs.push_back({ptrs, ws, variant_pack(ptrs, ws)});
    return packs.back().desc;
  }
};

ConvGraph::ConvGraph(const ConvGeometry& g, DType t, Layout l, bool tf32) : ConvLayer(g, t, tf32), layout_(l) {}

ConvGraph::~ConvGraph() = default;

namespace {

AlgoChoice choice_of(int rank, const Plan& p, const EngineNotes& e, float ms) {
  // "math" records whether the engine runs on tensor cores, in the legacy API's terms.
  return {rank, e.tensor_core ? int(CUDNN_TENSOR_OP_MATH) : int(CUDNN_FMA_MATH), p.workspace, ms};
}

AlgoChoice& choice_for(ConvAlgos& a, ConvGraph::Op op) {
  switch (op) {
    case ConvGraph::kForward: return a.fwd;
    case ConvGraph::kBackwardData: return a.bwd_data;
    case ConvGraph::kBackwardDataAccumulate: return a.bwd_data_acc;
    default: return a.bwd_filter;
  }
}

}  // namespace

ConvGraph::Direction& ConvGraph::direction(Op op, cudnnHandle_t h) {
  if (!dirs_[op]) {  // built on first use: the heuristics need the handle
    dirs_[op] = std::make_unique<Direction>();
    dirs_[op]->build(op, h, g_, t_, layout_);
  }
  return *dirs_[op];
}

ConvAlgos ConvGraph::search(cudnnHandle_t h, const ConvPolicy& p) {
  const bool measure = p.policy == AlgoPolicy::Autotune;
  const size_t es = dtype_size(t_);
  // Measured on non-zero data (0x3C bytes: about 1.06 in fp16, 0.0115 in fp32), never on zeros.
  DeviceBuffer x, w, y, ws;
  cudaStream_t stream = nullptr;
  if (measure) {
    x = DeviceBuffer(g_.input().count() * es, "autotune input " + g_.key());
    w = DeviceBuffer(g_.filter_count() * es, "autotune filter " + g_.key());
    y = DeviceBuffer(g_.output().count() * es, "autotune output " + g_.key());
    ws = DeviceBuffer(p.workspace_limit, "autotune workspace (--workspace-mb)");
    for (DeviceBuffer* b : {&x, &w, &y}) CUDA_CHECK(cudaMemset(b->get(), 0x3C, b->bytes()));
    CUDNN_CHECK(cudnnGetStream(h, &stream));
  }
  Event start, stop;
  ConvAlgos a;
  for (int op = 0; op < kOps; ++op) {
    Direction& d = direction(static_cast<Op>(op), h);
    d.built.clear();
    AlgoChoice best;
    for (int rank = 0; rank < static_cast<int>(d.configs.size()); ++rank) {
      const EngineNotes notes = notes_of(d.configs[rank]);
      if (!acceptable(notes, fma_only(), p.deterministic)) continue;
      Plan plan = make_plan(h, d.configs[rank]);
      if (!plan.desc || plan.workspace > p.workspace_limit) continue;
      float ms = -1;
      if (measure) {
        const Backend pack = variant_pack({x.get(), w.get(), y.get()}, ws.get());
        execute(h, plan.desc, pack);  // warm-up: loads the kernels
        for (int i = 0; i < kTimedRuns; ++i) {
          CUDA_CHECK(cudaEventRecord(start.get(), stream));
          execute(h, plan.desc, pack);
          CUDA_CHECK(cudaEventRecord(stop.get(), stream));
          CUDA_CHECK(cudaEventSynchronize(stop.get()));
          float t = 0;
          CUDA_CHECK(cudaEventElapsedTime(&t, start.get(), stop.get()));
          ms = ms < 0 ? t : std::min(ms, t);
        }
      }
      if (best.algo < 0 || (ms >= 0 && ms < best.ms)) best = choice_of(rank, plan, notes, ms);
      d.built.emplace_back(rank, std::move(plan));
      if (!measure || static_cast<int>(d.built.size()) == kMeasuredCandidates) break;
    }
    if (best.algo < 0)
      throw Fatal(std::string("cuDNN offers no usable ") + op_name(static_cast<Op>(op)) + " engine for conv " +
                  g_.key() + (p.deterministic ? " (deterministic)" : "") + " within a workspace of " +
                  format_bytes(p.workspace_limit) + "; try a larger --workspace-mb");
    choice_for(a, static_cast<Op>(op)) = best;
  }
  return a;
}

bool ConvGraph::use(cudnnHandle_t h, const ConvAlgos& a) {
  ConvAlgos chosen = a;
  for (int op = 0; op < kOps; ++op) {
    Direction& d = direction(static_cast<Op>(op), h);
    AlgoChoice& c = choice_for(chosen, static_cast<Op>(op));
    if (c.algo < 0 || c.algo >= static_cast<int>(d.configs.size())) return false;
    const EngineNotes notes = notes_of(d.configs[c.algo]);
    if (!acceptable(notes, fma_only(), false)) return false;
    auto kept = std::find_if(d.built.begin(), d.built.end(), [&](const auto& b) { return b.first == c.algo; });
    Plan plan = kept != d.built.end() ? std::move(kept->second) : make_plan(h, d.configs[c.algo]);
    if (!plan.desc) return false;
    c = choice_of(c.algo, plan, notes, c.ms);
    d.plan = std::move(plan);
    d.built.clear();
    d.packs.clear();
  }
  algos_ = chosen;
  return true;
}

void ConvGraph::run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws,
                    size_t ws_bytes) const {
  const Direction* d = dirs_[op].get();
  if (!d || !d->plan.desc) throw Fatal(std::string("conv ") + g_.key() + ": " + op_name(op) + " used before it was configured");
  if (d->plan.workspace > ws_bytes)
    throw Fatal(std::string("conv ") + g_.key() + ": " + op_name(op) + " needs " + format_bytes(d->plan.workspace) +
                " of workspace, given " + format_bytes(ws_bytes));
  execute(h, d->plan.desc, d->pack_for({x, w, y}, ws));
}

void ConvGraph::forward(cudnnHandle_t h, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) const {
  run(kForward, h, x, w, y, ws, ws_bytes);
}

void ConvGraph::backward_data(cudnnHandle_t h, const void* dy, const void* w, void* dx, bool accumulate, void* ws,
                              size_t ws_bytes) const {
  run(accumulate ? kBackwardDataAccumulate : kBackwardData, h, dx, w, dy, ws, ws_bytes);
}

void ConvGraph::backward_filter(cudnnHandle_t h, const void* x, const void* dy, void* dw, void* ws,
                                size_t ws_bytes) const {
  run(kBackwardFilter, h, x, dw, dy, ws, ws_bytes);
}
