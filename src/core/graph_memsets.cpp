// Memsets of a zeroed range dropped from a captured graph (graph_memsets.h).
#include "core/graph_memsets.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace {

// The nodes just before n (cudaGraphNodeGetDependencies) or just after it (cudaGraphNodeGetDependentNodes).
using NeighbourQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);
std::vector<cudaGraphNode_t> neighbours(cudaGraphNode_t n, NeighbourQuery query) {
  size_t count = 0;
  CUDA_CHECK(query(n, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> v(count);
  if (count) CUDA_CHECK(query(n, v.data(), nullptr, &count));
  return v;
}
std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t n) { return neighbours(n, cudaGraphNodeGetDependencies); }
std::vector<cudaGraphNode_t> dependents(cudaGraphNode_t n) { return neighbours(n, cudaGraphNodeGetDependentNodes); }

// A memset of zeros whose bytes all lie in `range`.
bool zeroes_only_inside(cudaGraphNode_t n, ZeroedRange range) {
  cudaGraphNodeType type;
  CUDA_CHECK(cudaGraphNodeGetType(n, &type));
  if (type != cudaGraphNodeTypeMemset) return false;
  cudaMemsetParams p{};
  CUDA_CHECK(cudaGraphMemsetNodeGetParams(n, &p));
  if (p.value != 0) return false;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p.dst);
  const size_t rows = p.height ? p.height : 1;
  const uintptr_t last = first + (rows - 1) * p.pitch + p.width * p.elementSize;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(range.begin);
  return first >= begin && last <= begin + range.bytes;
}

}  // namespace

size_t drop_memsets_of_zeroed_range(cudaGraph_t graph, ZeroedRange range) {
  if (!range.begin || range.bytes == 0) return 0;
  size_t count = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  size_t dropped = 0;
  for (cudaGraphNode_t n : nodes) {
    if (!zeroes_only_inside(n, range)) continue;
    // What came before the memset now comes directly before what came after it.
    for (cudaGraphNode_t after : dependents(n)) {
      const std::vector<cudaGraphNode_t> has = dependencies(after);
      for (cudaGraphNode_t before : dependencies(n))
        if (std::find(has.begin(), has.end(), before) == has.end())
          CUDA_CHECK(cudaGraphAddDependencies(graph, &before, &after, nullptr, 1));
    }
    CUDA_CHECK(cudaGraphDestroyNode(n));
    ++dropped;
  }
  return dropped;
}
