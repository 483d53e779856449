// The frontend helpers and the plan picker of plan_picker.h.
#include "model/cudnn/plan_picker.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/check.h"
#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"

// ---- frontend helpers ---------------------------------------------------------------------------
fe::DataType_t fe_type(DType t) { return t == DType::F32 ? fe::DataType_t::FLOAT : fe::DataType_t::HALF; }

void set_virtual(const TensorPtr& t, const std::array<int64_t, 4>& dims, Layout l) {
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  const std::vector<int64_t> strides = l == Layout::NCHW ? std::vector{c * h * w, h * w, w, int64_t(1)}
                                                         : std::vector{h * w * c, int64_t(1), w * c, c};
  t->set_dim({dims.begin(), dims.end()}).set_stride(strides);
}

TensorPtr graph_tensor(fe::graph::Graph& g, int64_t uid, DType t, const std::array<int64_t, 4>& dims, Layout l) {
  const TensorPtr p = g.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name("t" + std::to_string(uid)));
  set_virtual(p, dims, l);
  p->set_data_type(fe_type(t));
  return p;
}

void set_stored(const TensorPtr& t, int64_t uid, DType type, const std::array<int64_t, 4>& dims, Layout l) {
  t->set_output(true).set_uid(uid).set_data_type(fe_type(type));
  set_virtual(t, dims, l);
}

// ---- the picker ---------------------------------------------------------------------------------
namespace {

constexpr int kTimedRuns = 3;

// The graph of `recipe`, validated and lowered to cuDNN's operation graph, its heuristics to target
// `sm_target` SMs where that is set; null with `why` where cuDNN refuses it.
std::shared_ptr<fe::graph::Graph> operation_graph(const GraphRecipe& recipe, cudnnHandle_t h, int sm_target,
                                                  std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm_target > 0) g->set_sm_count(sm_target);
  recipe(*g);
  fe::error_t st = g->validate();
  if (st.is_good()) st = g->build_operation_graph(h);
  if (st.is_bad()) {
    why = "cuDNN refused the operation graph: " + st.get_message();
    return nullptr;
  }
  return g;
}

// The rules as the frontend's filters (a filtered configuration neither builds nor runs).
void apply_rules(fe::graph::Graph& g, const PlanRules& r) {
  std::vector<fe::NumericalNote_t> barred{fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION};
  if (r.fma_only) barred.insert(barred.end(), {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  if (r.deterministic) barred.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  g.deselect_numeric_notes(barred);
  g.deselect_workspace_greater_than(static_cast<int64_t>(r.workspace_limit));
}

bool runtime_compiled(const fe::graph::Graph& g, int64_t i) {
  std::vector<fe::BehaviorNote_t> notes;
  if (g.get_behavior_notes_for_plan_at_index(i, notes).is_bad()) return false;
  return std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) != notes.end();
}

std::string engine_at(const fe::graph::Graph& g, int64_t i) {
  std::string name;
  return g.get_plan_name_at_index(i, name).is_good() ? name : std::string();
}

// Times the built configurations on scratch memory; returns the fastest's index and time.
std::pair<int64_t, float> fastest(fe::graph::Graph& g, cudnnHandle_t h, const std::vector<int64_t>& built,
                                  const ScratchPointers& scratch) {
  int64_t ws_bytes = 0;
  for (int64_t i : built) ws_bytes = std::max(ws_bytes, g.get_workspace_size_plan_at_index(i));
  DeviceBuffer ws(size_t(ws_bytes) + kCudnnAlignment, "cuDNN autotune workspace");
  std::unordered_map<int64_t, void*> pointers(scratch.begin(), scratch.end());
  cudaStream_t stream = nullptr;
  CUDNN_CHECK(cudnnGetStream(h, &stream));
  int64_t best = -1;
  float best_ms = -1;
  for (int64_t i : built) {
    bool failed = false;
    const float ms = fastest_ms(stream, kTimedRuns, [&] {
      failed |= g.execute_plan_at_index(h, pointers, ws.get(), i).is_bad();
    });
    if (!failed && (best < 0 || ms < best_ms)) best = i, best_ms = ms;
  }
  return {best, best_ms};
}

// An engine tag's engine and knobs, where every knob has a frontend name (cuDNN still hands out
// configurations with knobs it has deprecated, which the frontend's replay cannot name).
bool parse_engine(const std::string& tag, int64_t& id, std::unordered_map<fe::KnobType_t, int64_t>& knobs) {
  int consumed = 0;
  long long v = 0;
  if (std::sscanf(tag.c_str(), "eng%lld%n", &v, &consumed) != 1 || v < 0) return false;
  id = v;
  size_t at = size_t(consumed);
  while (at < tag.size()) {
    int type = 0, n = 0;
    long long value = 0;
    if (std::sscanf(tag.c_str() + at, "_k%d=%lld%n", &type, &value, &n) != 2 || type < 0) return false;
    const fe::KnobType_t k = fe::convert_from_backend_knob_type(static_cast<cudnnBackendKnobType_t>(type));
    if (k == fe::KnobType_t::NOT_SET) return false;
    knobs[k] = value;
    at += size_t(n);
  }
  return true;
}

// Adds the configuration `engine` names to g's list; its index, or -1 where cuDNN offers none by
// that tag. Replayed from its engine and knobs where it can be (no heuristics query), else found
// among the configurations of the heuristics' modes A, B and the fallback list. Never replayed under
// an SM target: the frontend builds a replayed engine without it, where the heuristics' carry it.
int64_t add_engine(fe::graph::Graph& g, const std::string& engine, bool replay) {
  int64_t id = -1;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
  if (replay && parse_engine(engine, id, knobs) && g.create_execution_plan(id, knobs).is_good() &&
      g.get_execution_plan_count() == 1 && engine_at(g, 0) == engine)
    return 0;
  for (fe::HeurMode_t mode : {fe::HeurMode_t::A, fe::HeurMode_t::B, fe::HeurMode_t::FALLBACK}) {
    const int64_t first = g.get_execution_plan_count();
    if (g.create_execution_plans({mode}).is_bad()) continue;
    for (int64_t i = first; i < g.get_execution_plan_count(); ++i)
      if (engine_at(g, i) == engine) return i;
  }
  return -1;
}

// The built plan at index i of g (add_engine's engine tag is the plan's name).
PlannedGraph built_plan(std::shared_ptr<fe::graph::Graph> g, int64_t i) {
  const std::string engine = engine_at(*g, i);
  const size_t workspace = size_t(g->get_workspace_size_plan_at_index(i));
  const bool compiled = runtime_compiled(*g, i);
  return {.graph = std::move(g), .index = i, .engine = engine, .workspace = workspace, .runtime_compiled = compiled};
}

}  // namespace

PlannedGraph pick_plan(const GraphRecipe& recipe, cudnnHandle_t h, const PlanRules& rules,
                       const ScratchPointers& scratch) {
  std::string why;
  std::shared_ptr<fe::graph::Graph> g = operation_graph(recipe, h, rules.sm_target, why);
  if (!g) return {.why = why};
  // Mode B ranks engines otherwise than A, and the fastest was in B's list for 42 of ResNet-50's 69
  // conv directions (H100, cuDNN 9.14); asked only when measuring (its query costs host time).
  fe::error_t st = g->create_execution_plans(rules.measure ? std::vector{fe::HeurMode_t::A, fe::HeurMode_t::B}
                                                           : std::vector{fe::HeurMode_t::A});
  if (st.is_bad() || g->get_execution_plan_count() == 0) st = g->create_execution_plans({fe::HeurMode_t::FALLBACK});
  if (st.is_bad() || g->get_execution_plan_count() == 0)
    return {.why = "cuDNN has no engine for it on this GPU" + (st.is_bad() ? " (" + st.get_message() + ")" : "")};
  apply_rules(*g, rules);
  const int64_t count = g->get_execution_plan_count();
  std::vector<int64_t> built;
  for (int64_t i = 0; i < count; ++i) {
    if (!rules.runtime_compiled && runtime_compiled(*g, i)) continue;
    if (g->build_plan_at_index(i).is_bad()) continue;
    built.push_back(i);
    if (!rules.measure) break;  // the heuristics' first that builds
  }
  if (built.empty())
    return {.why = std::string("no engine configuration could be built") +
                   (rules.deterministic ? " (deterministic)" : "") + " within a workspace of " +
                   format_bytes(rules.workspace_limit)};
  if (!rules.measure) return built_plan(std::move(g), built.front());  // the heuristics' first that builds
  const auto [chosen, ms] = fastest(*g, h, built, scratch);
  if (chosen < 0) return {.why = "every engine configuration failed to run"};
  // The chosen engine again, alone in a fresh graph (this one holds every plan built to time it),
  // as a later start builds it from the cache.
  PlannedGraph p = plan_engine(recipe, h, rules, engine_at(*g, chosen));
  p.ms = ms;
  return p;
}

PlannedGraph plan_engine(const GraphRecipe& recipe, cudnnHandle_t h, const PlanRules& rules, const std::string& engine) {
  if (engine.rfind("eng", 0) != 0) return {.why = "'" + engine + "' names no engine"};
  std::string why;
  std::shared_ptr<fe::graph::Graph> g = operation_graph(recipe, h, rules.sm_target, why);
  if (!g) return {.why = why};
  const int64_t i = add_engine(*g, engine, rules.sm_target <= 0);
  if (i < 0) return {.why = "engine " + engine + " is not offered for it"};
  apply_rules(*g, rules);
  if (!rules.runtime_compiled && runtime_compiled(*g, i)) return {.why = "engine " + engine + " is compiled at run time"};
  if (g->build_plan_at_index(i).is_bad()) return {.why = "engine " + engine + " does not build for it"};
  return built_plan(std::move(g), i);
}

void execute_plan(const PlannedGraph& p, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pointers, void* ws,
                  const std::string& what) {
  for (const auto& [uid, ptr] : pointers)
    if (reinterpret_cast<uintptr_t>(ptr) % kCudnnAlignment != 0)
      throw Fatal(what + ": tensor " + std::to_string(uid) + " is not " + std::to_string(kCudnnAlignment) +
                  "-byte aligned, as its graph promises");
  fe::error_t e = p.graph->execute_plan_at_index(h, pointers, ws, p.index);
  if (e.is_bad()) throw Fatal("cuDNN (frontend): " + what + ": " + e.get_message());
}
