// Memsets dropped from a captured CUDA graph where their bytes are zero already, and the rest run
// as kernels.
//
// Stream capture records every memset a library issues as a node of the chain, and each node costs
// the GPU a dependency hop of 1-2 µs, longer than a small memset itself. cuDNN zeroes the
// statistics outputs of its fused conv + statistics patterns that way before every such conv (about
// a hundred memsets in a ResNet-50 training step). When the code that owns those buffers leaves
// them zero after use (bn_finalize_sums), the memsets write what is there already: dropping them,
// with their predecessors joined to their successors, changes nothing the graph computes.
// Making the memsets siblings instead of links was measured slower (the graph ran them on other
// streams, with longer hops): removing them is what shortens the chain.
//
// The other memsets cost more than their bytes too: on an H100 the GPU waits about 1.5 µs before a
// memset node and 2.5 µs after it before the next kernel starts, against 0.4 µs between two
// kernels. Those of memory that only the work right after them writes within a step (the counters
// cuDNN zeroes in a fused conv's workspace, where each conv has its own, and the BN weight gradients
// its fused data-gradient pattern accumulates) move to the graph's start: one kernel zeroes them
// all before the step begins. A chain of the rest rewritten as one kernel node that fills the same
// bytes (kernels/fill.cu) keeps the order and the result and pays only a kernel's hops.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

// The bytes [begin, begin + bytes) of device memory whose owner keeps them zero between uses.
struct ZeroedRange {
  const void* begin = nullptr;
  size_t bytes = 0;
};

// Removes from `graph` (before it is instantiated) every memset node that writes zeros only inside
// `range`; returns how many. The same captured work gives the same topology, so an executable graph
// can still be updated in place from a later capture.
size_t drop_memsets_of_zeroed_range(cudaGraph_t graph, ZeroedRange range);

// Moves to the graph's start every memset node that writes zeros only inside one of `ranges` and
// whose bytes no other memset node of the graph writes: all of them run as one kernel (or a few,
// kZeroSpans spans each) before everything else, and each leaves the chain with its predecessors
// joined to its successors; returns how many moved.
// A range qualifies when, within one launch of the graph, its bytes are written only by the work
// each memset precedes: a fused conv's own workspace (cuDNN zeroes its counters there before every
// run) and the BN weight gradients its fused data-gradient pattern accumulates. Zeroing them once
// at the start then leaves the same bytes where that work begins, and the chain loses a node per
// memset. Bytes that two memsets of one launch zero (one range run twice) are left where they are.
// The same captured work gives the same topology, so updates in place still apply.
size_t hoist_memsets_to_start(cudaGraph_t graph, const std::vector<ZeroedRange>& ranges);

// Rewrites each chain of memset nodes in `graph` (before it is instantiated) as kernel nodes of
// fill_regions, up to kFillRegions memsets each, with the chain's dependencies and dependents. A
// memset whose value has bits beyond its element size stays as it is.
// The same captured work gives the same topology, so updates in place still apply.
struct MemsetRewrite {
  size_t memsets = 0;  // memset nodes removed
  size_t kernels = 0;  // kernel nodes that took their place
};
MemsetRewrite memsets_to_kernels(cudaGraph_t graph);
