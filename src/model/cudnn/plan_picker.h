// What the files of src/model/cudnn/ share, where every cuDNN graph of the project is built: cudnn-
// frontend (NVIDIA's header-only C++ graph API over cuDNN), helpers that build graphs with it, and
// the one plan picker for every graph, the plain conv directions (ConvGraph) and the fused batch-norm
// patterns (FusedConv). The library is slow to compile, so no public header includes it; the Makefile
// fetches it (PyPI's nvidia-cudnn-frontend, pinned) into build/deps/ and gives its include path to
// these files only.
//
// Measuring, the picker builds every engine configuration that cuDNN's heuristics (modes A and B)
// list and the rules allow, times each on scratch memory, and keeps the fastest; without measuring,
// the heuristics' first that builds. The choice is named by the frontend's engine tag ("eng58_k25=2":
// the engine and its knobs), which the autotune cache keeps with its time, and a later start
// rebuilds that engine alone from the tag, without timing (and without a heuristics query where the
// frontend can name all its knobs). The kept graph holds the one chosen plan, built the same way
// whether it was just measured or read from the cache.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include "core/types.h"
#include "model/conv.h"

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Every pointer handed to a plan must be aligned as its tensors promise (cuDNN's default, 16 bytes).
constexpr int64_t kCudnnAlignment = 16;

fe::DataType_t fe_type(DType t);

// A 4-d tensor given as N, C, H, W, whose strides follow the layout (filters K, C, R, S: KCRS or KRSC,
// as the activations). Per-channel vectors are [1, C, 1, 1].
TensorPtr graph_tensor(fe::graph::Graph& g, int64_t uid, DType t, const std::array<int64_t, 4>& dims, Layout l);
// A node's output that is stored: given its uid, type, shape and strides.
void set_stored(const TensorPtr& t, int64_t uid, DType type, const std::array<int64_t, 4>& dims, Layout l);
// Marks a node's output as living only inside the fused kernel, of the given shape.
void set_virtual(const TensorPtr& t, const std::array<int64_t, 4>& dims, Layout l);

// A conv operation's attributes for geometry g: forward, data gradient, weight gradient.
template <class Attributes>
Attributes conv_attributes(const ConvGeometry& g) {
  return Attributes().set_padding({g.pad, g.pad}).set_stride({g.stride, g.stride}).set_dilation({1, 1});
}
inline auto fprop_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_fprop_attributes>(g); }
inline auto dgrad_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_dgrad_attributes>(g); }
inline auto wgrad_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_wgrad_attributes>(g); }

// ---- the plan picker ----------------------------------------------------------------------------
// Which engines may run.
struct PlanRules {
  bool measure = false;        // time every allowed configuration and keep the fastest
  bool deterministic = false;  // no engine cuDNN marks non-deterministic (--deterministic)
  bool fma_only = false;       // fp32 without TF32: no tensor cores and no inputs rounded down
  // Engines compiled at start-up (NVRTC) cost time at every start, as the cache keeps only their tag:
  // never for the plain convs, which have precompiled engines enough. The fused patterns take them:
  // on an H100 (cuDNN 9.14) the first precompiled engine of cuDNN's list for conv + BN + ReLU in fp16
  // strayed 2.1% from the fp32 logits where the list's first, compiled one strayed 0.13%.
  bool runtime_compiled = false;
  size_t workspace_limit = size_t(1) << 30;
  // cuDNN's SM-count target for its heuristics (0: the device's): the configurations it offers are
  // sized to leave the other SMs free (the weight gradients' lane; ConvPolicy::wgrad_sm_target).
  int sm_target = 0;
};

// A graph's tensors and operations, added to a fresh graph (the picker builds a graph more than once).
using GraphRecipe = std::function<void(fe::graph::Graph&)>;

// A graph with one execution plan built, or, where nothing could be planned, why.
struct PlannedGraph {
  std::shared_ptr<fe::graph::Graph> graph{};
  int64_t index = -1;     // of the plan in the graph's list
  std::string engine{};   // the plan's engine tag: what the autotune cache keeps
  size_t workspace = 0;   // bytes
  float ms = -1;          // measured time of one run; -1 when not measured
  bool runtime_compiled = false;
  std::string why{};      // set where graph is null
  explicit operator bool() const { return graph != nullptr; }
};

// Scratch pointers by tensor uid, every tensor of the graph (non-zero bytes: never timed on zeros).
using ScratchPointers = std::unordered_map<int64_t, void*>;

PlannedGraph pick_plan(const GraphRecipe& recipe, cudnnHandle_t h, const PlanRules& rules,
                       const ScratchPointers& scratch);
// The engine of a cached tag alone; empty (with why) where it no longer builds here, breaks the
// rules, or names another engine now: the caller then picks again.
PlannedGraph plan_engine(const GraphRecipe& recipe, cudnnHandle_t h, const PlanRules& rules, const std::string& engine);

// Runs the graph's plan with these pointers (by uid) and workspace; throws Fatal on failure.
void execute_plan(const PlannedGraph& p, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pointers, void* ws,
                  const std::string& what);
