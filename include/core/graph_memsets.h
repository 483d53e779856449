// Memsets dropped from a captured CUDA graph where their bytes are zero already.
//
// Stream capture records every memset a library issues as a node of the chain, and each node costs
// the GPU a dependency hop of 1-2 µs, longer than a small memset itself. cuDNN zeroes the
// statistics outputs of its fused conv + statistics patterns that way before every such conv (about
// a hundred memsets in a ResNet-50 training step). When the code that owns those buffers leaves
// them zero after use (bn_finalize_sums), the memsets write what is there already: dropping them,
// with their predecessors joined to their successors, changes nothing the graph computes.
// Making the memsets siblings instead of links was measured slower (the graph ran them on other
// streams, with longer hops): removing them is what shortens the chain.
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
