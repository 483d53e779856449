// Launchers of the memsets as a kernel (kernels/fill.cu).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

// What up to kFillRegions memset nodes of a CUDA graph do, as one kernel node (core/graph_memsets.h):
// each region as cudaMemset2D fills it (value truncated to element_size bytes; height rows of width
// elements, pitch bytes apart), in order.
constexpr int kFillRegions = 8;
struct FillRegion {
  void* dst;
  size_t pitch;         // bytes between rows (unused when height is 1)
  size_t width;         // elements a row
  size_t height;        // rows
  unsigned value;
  unsigned element_size;  // 1, 2 or 4 bytes
};
struct FillRegions {
  FillRegion region[kFillRegions];
  int count = 0;
};
// A kernel node's parameters that fill f; args is the one argument pointer's storage and, with f,
// must outlive the call that creates or updates the node (which copies the argument).
cudaKernelNodeParams fill_regions_node(const FillRegions& f, void* args[1]);
void fill_regions(const FillRegions& f, cudaStream_t stream);

// Up to kZeroSpans byte ranges zeroed by one kernel, all at once: the memsets a CUDA graph moves to
// its start (core/graph_memsets.h). Kept small enough to pass by value (under 4 KiB).
constexpr int kZeroSpans = 192;
struct ZeroSpans {
  void* dst[kZeroSpans];
  unsigned bytes[kZeroSpans];
  int count = 0;
};
// As fill_regions_node: s and args must outlive the call that creates the node.
cudaKernelNodeParams zero_spans_node(const ZeroSpans& s, void* args[1]);
void zero_spans(const ZeroSpans& s, cudaStream_t stream);
