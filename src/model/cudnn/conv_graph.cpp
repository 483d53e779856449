// Convolutions through cuDNN's graph API (cudnn-frontend), with execution plans built once.
#include "model/conv.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/errors.h"
#include "core/memory.h"
#include "model/cudnn/plan_picker.h"

namespace {

// Tensor ids in every direction's graph: the conv input (x or dx), the filter (w or dw), the conv
// output (y or dy).
enum Uid : int64_t { kUidX = 1, kUidW, kUidY };

// One direction as a graph of one operation, x, w and y as the forward pass sees them.
GraphRecipe direction_recipe(ConvLayer::Op op, const ConvGeometry& g, DType t, Layout l) {
  return [=](fe::graph::Graph& gr) {
    const std::array<int64_t, 4> in{g.n, g.c, g.h, g.w}, out{g.n, g.k, g.out_h(), g.out_w()},
        filt{g.k, g.c, g.r, g.r};
    gr.set_io_data_type(fe_type(t)).set_intermediate_data_type(fe::DataType_t::FLOAT);
    if (op == ConvLayer::kForward) {
      const TensorPtr y = gr.conv_fprop(graph_tensor(gr, kUidX, t, in, l), graph_tensor(gr, kUidW, t, filt, l),
                                        fprop_attributes(g));
      set_stored(y, kUidY, t, out, l);
    } else if (op == ConvLayer::kBackwardData) {
      const TensorPtr dx = gr.conv_dgrad(graph_tensor(gr, kUidY, t, out, l), graph_tensor(gr, kUidW, t, filt, l),
                                         dgrad_attributes(g));
      set_stored(dx, kUidX, t, in, l);
    } else {
      const TensorPtr dw = gr.conv_wgrad(graph_tensor(gr, kUidY, t, out, l), graph_tensor(gr, kUidX, t, in, l),
                                         wgrad_attributes(g));
      set_stored(dw, kUidW, t, filt, l);
    }
  };
}

PlanRules rules_of(const ConvPolicy& p, ConvLayer::Op op, bool fma_only, bool measure) {
  return {.measure = measure,
          .deterministic = p.deterministic,
          .fma_only = fma_only,
          .workspace_limit = p.workspace_limit,
          .sm_target = op == ConvLayer::kBackwardFilter ? p.wgrad_sm_target : 0};
}

// The plans built from an engine, shared by every layer of the same shape (ResNet-50 has 53 convs
// of 23 shapes) and kept while a layer holds them.
std::shared_ptr<const PlannedGraph> shared_plan(const std::string& key, const std::function<PlannedGraph()>& build) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const PlannedGraph>> made;
  const std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<const PlannedGraph> p = made[key].lock();
  if (!p) {
    PlannedGraph built = build();
    if (!built) return nullptr;
    p = std::make_shared<const PlannedGraph>(std::move(built));
    made[key] = p;
  }
  return p;
}

}  // namespace

ConvAlgos ConvGraph::search(cudnnHandle_t h, const ConvPolicy& p) {
  const bool measure = p.policy == AlgoPolicy::Autotune;
  const size_t es = measure ? dtype_size(t_) : 0;  // nothing to time on without measuring
  const DeviceBuffer x = scratch_buffer(g_.input().count() * es, "autotune input " + g_.key());
  const DeviceBuffer w = scratch_buffer(g_.filter_count() * es, "autotune filter " + g_.key());
  const DeviceBuffer y = scratch_buffer(g_.output().count() * es, "autotune output " + g_.key());
  const ScratchPointers scratch{{kUidX, x.get()}, {kUidW, w.get()}, {kUidY, y.get()}};
  ConvAlgos a;
  for (int op = 0; op < kOps; ++op) {
    const PlanRules rules = rules_of(p, Op(op), fma_only(), measure);
    PlannedGraph plan = pick_plan(direction_recipe(Op(op), g_, t_, layout_), h, rules, scratch);
    if (!plan)
      throw Fatal(std::string("cuDNN offers no usable ") + op_name(Op(op)) + " engine for conv " + g_.key() + ": " +
                  plan.why + "; try a larger --workspace-mb");
    a[op] = {plan.engine, 0, plan.workspace, plan.ms};
    // Held until use() takes it, so that the plan just built is the one kept, not built again.
    searched_[op] = shared_plan(plan_key(Op(op), h, plan.engine, rules.sm_target), [&] { return std::move(plan); });
  }
  return a;
}

std::string ConvGraph::plan_key(Op op, cudnnHandle_t h, const std::string& engine, int sm_target) const {
  return g_.key() + "/" + dtype_name(t_) + "/" + layout_name(layout_) + "/" + op_name(op) + "/" +
         (fma_only() ? "fma" : "any") + "/" + engine + "/sms" + std::to_string(sm_target) + "/" +
         std::to_string(reinterpret_cast<uintptr_t>(h));
}

bool ConvGraph::use(cudnnHandle_t h, const ConvAlgos& a, const ConvPolicy& p) {
  const auto searched = std::exchange(searched_, {});  // kept alive while the plans are looked up
  // Deterministic runs keep no cache (autotune-cache.txt is not written under --deterministic), so
  // a choice handed here met the rules it was made under; only p's SM target still matters (a plan
  // under one is found among its heuristics' configurations, not replayed).
  const ConvPolicy target{.wgrad_sm_target = p.wgrad_sm_target};
  std::array<std::shared_ptr<const PlannedGraph>, kOps> plans;
  ConvAlgos chosen = a;
  for (int op = 0; op < kOps; ++op) {
    AlgoChoice& c = chosen[op];
    const PlanRules rules = rules_of(target, Op(op), fma_only(), false);
    plans[op] = shared_plan(plan_key(Op(op), h, c.algo, rules.sm_target),
                            [&] { return plan_engine(direction_recipe(Op(op), g_, t_, layout_), h, rules, c.algo); });
    if (!plans[op]) return false;  // a stale choice: the caller searches again
    c.workspace = plans[op]->workspace;
    c.math = 0;
  }
  plans_ = plans;
  algos_ = chosen;
  return true;
}

void ConvGraph::run(Op op, cudnnHandle_t h, const void* x, const void* w, const void* y, void* ws,
                    size_t ws_bytes) const {
  const PlannedGraph* p = plans_[op].get();
  if (!p) throw Fatal(std::string("conv ") + g_.key() + ": " + op_name(op) + " used before it was configured");
  if (p->workspace > ws_bytes)
    throw Fatal(std::string("conv ") + g_.key() + ": " + op_name(op) + " needs " + format_bytes(p->workspace) +
                " of workspace, given " + format_bytes(ws_bytes));
  std::unordered_map<int64_t, void*> pointers{
      {kUidX, const_cast<void*>(x)}, {kUidW, const_cast<void*>(w)}, {kUidY, const_cast<void*>(y)}};
  execute_plan(*p, h, pointers, ws, std::string("conv ") + g_.key() + " " + op_name(op));
}
