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
// The memsets that must stay (cuDNN's counters in its workspace, the BN weight gradients its fused
// data-gradient pattern accumulates) cost more than their bytes too: on an H100 the GPU waits about
// 1.5 µs before a memset node and 2.5 µs after it before the next kernel starts, against 0.4 µs
// between two kernels. A chain of memsets rewritten as one kernel node that fills the same bytes
// (kernels/fill.cu) keeps the order and the result and pays only a kernel's hops.
#pragma once

#include <cstddef>

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

// Rewrites each chain of memset nodes in `graph` (before it is instantiated) as kernel nodes of
// fill_regions, up to kFillRegions memsets each, with the chain's dependencies and dependents. A
// memset whose value has bits beyond its element size stays as it is.
// The same captured work gives the same topology, so updates in place still apply.
struct MemsetRewrite {
  size_t memsets = 0;  // memset nodes removed
  size_t kernels = 0;  // kernel nodes that took their place
};
MemsetRewrite memsets_to_kernels(cudaGraph_t graph);
