// The one plan picker for every cuDNN graph: the plain conv directions (ConvGraph) and the fused
// batch-norm patterns (FusedConv).
//
// Measuring, it builds every engine configuration that cuDNN's heuristics (modes A and B) list and
// the rules allow, times each on scratch memory, and keeps the fastest; without measuring, the
// heuristics' first that builds. The choice is named by the frontend's engine tag ("eng58_k25=2":
// the engine and its knobs), which the autotune cache keeps with its time, and a later start
// rebuilds that engine alone from the tag, without timing (and without a heuristics query where
// the frontend can name all its knobs). The kept graph holds the one chosen plan, built the same
// way whether it was just measured or read from the cache.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include <cuda_runtime.h>

#include "model/cudnn/frontend.h"

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
