// Convolutions through cuDNN's graph (backend) API, with execution plans built once.
#include "model/conv_graph.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"
#include "model/cudnn_backend.h"

namespace {

// Tensor ids in every direction's graph: the conv input (x or dx), the filter (w or dw), the conv
// output (y or dy).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// How many of each heuristics list's first acceptable configurations are timed (modes A and B, see
// EngineLists). 8 of each against A's first 6 alone, with the fused patterns' wider search: bin/train
// 17,962-18,068 -> 18,303-18,391 images/s at batch 128 on an H100, for 3.7 s of measuring at the
// first start instead of 1.0 s (later starts read the choices from the cache).
constexpr int kMeasuredPerList = 8;
constexpr int kTimedRuns = 3;
constexpr size_t kPacksKept = 8;     // distinct pointer sets remembered per direction

// Whether an engine may run here: never with fp16 reductions; FMA only (no TF32, no inputs rounded
// down) under fp32 without TF32; deterministic when asked; no kernels compiled at start-up (they
// would be compiled again in every run, as the cache keeps only the configuration's rank).
bool acceptable(const EngineNotes& e, bool fma_only, bool deterministic) {
  if (e.reduced_precision || e.runtime_compiled) return false;
  if (fma_only && (e.tensor_core || e.down_convert)) return false;
  return !(deterministic && e.nondeterministic);
}

Backend variant_pack(const std::array<const void*, 3>& ptrs, void* ws) {
  return ::variant_pack({kUidX, kUidW, kUidY}, {ptrs[0], ptrs[1], ptrs[2]}, ws);
}

const char* op_name(ConvGraph::Op op) {
  switch (op) {
    case ConvGraph::kForward: return "forward";
    case ConvGraph::kBackwardData: return "backward-data";
    case ConvGraph::kBackwardDataAccumulate: return "accumulating backward-data";
    default: return "backward-filter";
  }
}

// One direction's operation graph and the heuristics' lists for it, shared by every layer of the
// same shape (ResNet-50 has 53 convs of 23 shapes). Mode B's heuristics are slow on the host (asked
// for every layer and direction, they added about 4 s to bin/train's start), so B is asked once a
// shape, and only when a search or a cached choice needs its list.
struct Heuristics {
  Backend x, w, y, conv, op, graph;
  EngineLists lists;
  bool has_b = false;  // no lock: each is keyed by its cuDNN handle, which one thread uses at a time

  Heuristics(ConvGraph::Op kind, cudnnHandle_t h, const ConvGeometry& g, DType t, Layout l) {
    const cudnnDataType_t dt = cudnn_type(t);
    x = backend_tensor({kUidX, dt, {g.n, g.c, g.h, g.w}, l});
    w = backend_tensor({kUidW, dt, {g.k, g.c, g.r, g.r}, l});  // KCRS (NCHW) or KRSC (NHWC), like the activations
    y = backend_tensor({kUidY, dt, {g.n, g.k, g.out_h(), g.out_w()}, l});
    conv = convolution_descriptor(g.stride, g.pad);
    const ConvDirection dir = kind == ConvGraph::kForward          ? ConvDirection::Forward
                              : kind == ConvGraph::kBackwardFilter ? ConvDirection::BackwardFilter
                                                                   : ConvDirection::BackwardData;
    op = convolution_op(dir, x, w, y, conv, kind == ConvGraph::kBackwardDataAccumulate ? 1.f : 0.f);
    graph = operation_graph(h, {&op});
    lists = engine_configs_first_list(graph);
  }
  const EngineLists& with_mode_b() {
    if (!has_b) add_mode_b_list(lists, graph);
    has_b = true;
    return lists;
  }
};

// The Heuristics of a direction, made on first use and kept while a layer holds it.
std::shared_ptr<Heuristics> shared_heuristics(ConvGraph::Op kind, cudnnHandle_t h, const ConvGeometry& g, DType t,
                                              Layout l) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<Heuristics>> made;
  const std::string key = g.key() + "/" + dtype_name(t) + "/" + layout_name(l) + "/" + std::to_string(kind) + "/" +
                          std::to_string(reinterpret_cast<uintptr_t>(h));
  const std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<Heuristics> p = made[key].lock();
  if (!p) {
    p = std::make_shared<Heuristics>(kind, h, g, t, l);
    made[key] = p;
  }
  return p;
}

}  // namespace

struct ConvGraph::Direction {
  std::shared_ptr<Heuristics> heuristics;
  std::vector<std::pair<int, Plan>> built;    // plans finalized while searching, by rank
  Plan plan;                                  // the one in use
  struct Pack {
    std::array<const void*, 3> ptrs;
    void* ws;
    Backend desc;
  };
  mutable std::vector<Pack> packs;

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
    dirs_[op]->heuristics = shared_heuristics(op, h, g_, t_, layout_);
  }
  return *dirs_[op];
}

ConvGraph::ListSizes ConvGraph::heuristic_lists(Op op, cudnnHandle_t h) {
  const EngineLists& l = direction(op, h).heuristics->with_mode_b();
  return {l.second, l.configs.size()};
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
  ConvAlgos a;
  for (int op = 0; op < kOps; ++op) {
    Direction& d = direction(static_cast<Op>(op), h);
    d.built.clear();
    AlgoChoice best;
    // Without measuring: the first usable configuration of A's list (B's, which another layer of
    // this shape may have asked for, is left out).
    const EngineLists& lists = measure ? d.heuristics->with_mode_b() : d.heuristics->lists;
    const std::vector<Backend>& configs = lists.configs;
    const int searched = static_cast<int>(measure ? configs.size() : lists.second);
    int timed[2] = {0, 0};  // per list
    for (int rank = 0; rank < searched; ++rank) {
      const int list = lists.list_of(rank);
      if (timed[list] == kMeasuredPerList) continue;
      const EngineNotes notes = notes_of(configs[rank]);
      if (!acceptable(notes, fma_only(), p.deterministic)) continue;
      Plan plan = make_plan(h, configs[rank]);
      if (!plan.desc || plan.workspace > p.workspace_limit) continue;
      float ms = -1;
      if (measure) {
        const Backend pack = variant_pack({x.get(), w.get(), y.get()}, ws.get());
        ms = fastest_ms(stream, kTimedRuns, [&] { execute(h, plan.desc, pack); });
      }
      if (best.algo < 0 || (ms >= 0 && ms < best.ms)) best = choice_of(rank, plan, notes, ms);
      d.built.emplace_back(rank, std::move(plan));
      if (!measure) break;  // the heuristics' first usable one
      ++timed[list];
    }
    if (best.algo < 0)
      throw Fatal(std::string("cuDNN offers no usable ") + op_name(static_cast<Op>(op)) + " engine for conv " +
                  g_.key() + (p.deterministic ? " (deterministic)" : "") + " within a workspace of " +
                  format_bytes(p.workspace_limit) + "; try a larger --workspace-mb" +
                  (d.heuristics->lists.error.empty() ? "" : " (cuDNN's heuristics: " + d.heuristics->lists.error + ")"));
    choice_for(a, static_cast<Op>(op)) = best;
  }
  return a;
}

bool ConvGraph::use(cudnnHandle_t h, const ConvAlgos& a) {
  ConvAlgos chosen = a;
  for (int op = 0; op < kOps; ++op) {
    Direction& d = direction(static_cast<Op>(op), h);
    AlgoChoice& c = choice_for(chosen, static_cast<Op>(op));
    const EngineLists& lists = c.algo >= 0 && size_t(c.algo) >= d.heuristics->lists.second
                                   ? d.heuristics->with_mode_b()  // a rank in B's list
                                   : d.heuristics->lists;
    const std::vector<Backend>& configs = lists.configs;
    if (c.algo < 0 || c.algo >= static_cast<int>(configs.size())) return false;
    const EngineNotes notes = notes_of(configs[c.algo]);
    if (!acceptable(notes, fma_only(), false)) return false;
    auto kept = std::find_if(d.built.begin(), d.built.end(), [&](const auto& b) { return b.first == c.algo; });
    Plan plan = kept != d.built.end() ? std::move(kept->second) : make_plan(h, configs[c.algo]);
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
