// Memsets of a zeroed range dropped from a captured graph (graph_memsets.h).
#include "core/graph_memsets.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/check.h"
#include "kernels/fill.h"

namespace {

// The nodes just before n (cudaGraphNodeGetDependencies) or just after it (cudaGraphNodeGetDependentNodes).
// Asked with the edges' data: the libraries' kernels launched with programmatic dependencies leave
// edges whose data a query without it refuses to drop (cudaErrorLossyQuery).
using NeighbourQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);
std::vector<cudaGraphNode_t> neighbours(cudaGraphNode_t n, NeighbourQuery query) {
  size_t count = 0;
  CUDA_CHECK(query(n, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> v(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count) CUDA_CHECK(query(n, v.data(), edges.data(), &count));
  return v;
}
size_t dependency_count(cudaGraphNode_t n) {
  size_t count = 0;
  CUDA_CHECK(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count));
  return count;
}
std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t n) { return neighbours(n, cudaGraphNodeGetDependencies); }
std::vector<cudaGraphNode_t> dependents(cudaGraphNode_t n) { return neighbours(n, cudaGraphNodeGetDependentNodes); }

// What memset node n writes (a 1D memset as one row), or nothing when n is no memset.
std::optional<FillRegion> memset_region(cudaGraphNode_t n) {
  cudaGraphNodeType type;
  CUDA_CHECK(cudaGraphNodeGetType(n, &type));
  if (type != cudaGraphNodeTypeMemset) return std::nullopt;
  cudaMemsetParams p{};
  CUDA_CHECK(cudaGraphMemsetNodeGetParams(n, &p));
  return FillRegion{p.dst, p.pitch, p.width, p.height ? p.height : 1, p.value, p.elementSize};
}

std::vector<cudaGraphNode_t> all_nodes(cudaGraph_t graph) {
  size_t count = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  return nodes;
}

// The bytes a memset writes, [first, last).
struct ByteSpan {
  uintptr_t first, last;
  bool overlaps(const ByteSpan& o) const { return first < o.last && o.first < last; }
};
ByteSpan span_of(const FillRegion& r) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(r.dst);
  return {first, first + (r.height - 1) * r.pitch + r.width * r.element_size};
}

// A memset of zeros whose bytes all lie in `range`.
bool zeroes_only_inside(const FillRegion& r, ZeroedRange range) {
  const ByteSpan span = span_of(r);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(range.begin);
  return r.value == 0 && span.first >= begin && span.last <= begin + range.bytes;
}

// Takes memset node n out of the graph: what came before it now comes directly before what came after it.
void unlink_and_destroy(cudaGraph_t graph, cudaGraphNode_t n) {
  for (cudaGraphNode_t after : dependents(n)) {
    const std::vector<cudaGraphNode_t> has = dependencies(after);
    for (cudaGraphNode_t before : dependencies(n))
      if (std::find(has.begin(), has.end(), before) == has.end())
        CUDA_CHECK(cudaGraphAddDependencies(graph, &before, &after, nullptr, 1));
  }
  CUDA_CHECK(cudaGraphDestroyNode(n));
}

}  // namespace

size_t drop_memsets_of_zeroed_range(cudaGraph_t graph, ZeroedRange range) {
  if (!range.begin || range.bytes == 0) return 0;
  size_t dropped = 0;
  for (cudaGraphNode_t n : all_nodes(graph)) {
    const std::optional<FillRegion> r = memset_region(n);
    if (!r || !zeroes_only_inside(*r, range)) continue;
    unlink_and_destroy(graph, n);
    ++dropped;
  }
  return dropped;
}

size_t hoist_memsets_to_start(cudaGraph_t graph, const std::vector<ZeroedRange>& ranges) {
  // Every memset, with its bytes, to find those that another memset writes too.
  struct Memset {
    cudaGraphNode_t node;
    FillRegion region;
    ByteSpan span;
  };
  std::vector<Memset> memsets;
  for (cudaGraphNode_t n : all_nodes(graph))
    if (const std::optional<FillRegion> r = memset_region(n)) memsets.push_back({n, *r, span_of(*r)});
  std::vector<ZeroSpans> starts(1);
  size_t hoisted = 0;
  for (const auto& [n, r, span] : memsets) {
    const bool in_range =
        std::any_of(ranges.begin(), ranges.end(), [&](ZeroedRange kept) { return zeroes_only_inside(r, kept); });
    const bool only_one = std::none_of(memsets.begin(), memsets.end(),
                                       [&](const Memset& m) { return m.node != n && m.span.overlaps(span); });
    // One row, or rows that leave no gap: a span of bytes.
    const bool contiguous = r.height == 1 || r.pitch == r.width * r.element_size;
    if (!in_range || !only_one || !contiguous || span.last - span.first > 0xFFFFFFFFu) continue;
    if (starts.back().count == kZeroSpans) starts.emplace_back();
    ZeroSpans& z = starts.back();
    z.dst[z.count] = r.dst;
    z.bytes[z.count++] = static_cast<unsigned>(span.last - span.first);
    unlink_and_destroy(graph, n);
    ++hoisted;
  }
  if (hoisted == 0) return 0;
  std::vector<cudaGraphNode_t> roots;
  for (cudaGraphNode_t n : all_nodes(graph))
    if (dependency_count(n) == 0) roots.push_back(n);
  for (const ZeroSpans& z : starts) {
    void* args[1];
    const cudaKernelNodeParams params = zero_spans_node(z, args);
    cudaGraphNode_t kernel = nullptr;
    CUDA_CHECK(cudaGraphAddKernelNode(&kernel, graph, nullptr, 0, &params));
    for (cudaGraphNode_t root : roots) CUDA_CHECK(cudaGraphAddDependencies(graph, &kernel, &root, nullptr, 1));
  }
  return hoisted;
}

namespace {

// A memset a fill kernel does exactly: its value fits its element size. (With more bits, the
// driver's memset nodes were seen to write bytes that are neither the value nor its low byte; a
// captured cudaMemsetAsync always fits.)
bool rewritable(cudaGraphNode_t n) {
  const std::optional<FillRegion> r = memset_region(n);
  return r && (r->element_size >= 4 || r->value >> (8 * r->element_size) == 0);
}

// The memset just before m in a chain: m's only dependency, when that is a memset with m its only dependent.
cudaGraphNode_t chained_before(cudaGraphNode_t m) {
  const std::vector<cudaGraphNode_t> before = dependencies(m);
  if (before.size() != 1 || !rewritable(before[0]) || dependents(before[0]).size() != 1) return nullptr;
  return before[0];
}
// And just after it.
cudaGraphNode_t chained_after(cudaGraphNode_t m) {
  const std::vector<cudaGraphNode_t> after = dependents(m);
  if (after.size() != 1 || !rewritable(after[0]) || dependencies(after[0]).size() != 1) return nullptr;
  return after[0];
}

}  // namespace

MemsetRewrite memsets_to_kernels(cudaGraph_t graph) {
  MemsetRewrite done;
  std::vector<cudaGraphNode_t> removed;  // never looked at again (the handles die with the nodes)
  auto gone = [&](cudaGraphNode_t n) { return std::find(removed.begin(), removed.end(), n) != removed.end(); };
  for (cudaGraphNode_t n : all_nodes(graph)) {
    if (gone(n) || !rewritable(n)) continue;
    // n's chain, from its first memset, at most kFillRegions at a time: the memsets after those
    // follow the new kernel, so the walk back from n then stops at it.
    while (!gone(n)) {
      cudaGraphNode_t first = n;
      while (cudaGraphNode_t b = chained_before(first)) first = b;
      std::vector<cudaGraphNode_t> chain{first};
      while (chain.size() < size_t(kFillRegions))
        if (cudaGraphNode_t a = chained_after(chain.back())) chain.push_back(a);
        else break;
      FillRegions f;
      for (cudaGraphNode_t m : chain) f.region[f.count++] = *memset_region(m);
      void* args[1];
      const cudaKernelNodeParams params = fill_regions_node(f, args);
      const std::vector<cudaGraphNode_t> before = dependencies(chain.front()), after = dependents(chain.back());
      cudaGraphNode_t kernel = nullptr;
      CUDA_CHECK(cudaGraphAddKernelNode(&kernel, graph, before.data(), before.size(), &params));
      for (cudaGraphNode_t a : after) CUDA_CHECK(cudaGraphAddDependencies(graph, &kernel, &a, nullptr, 1));
      for (cudaGraphNode_t m : chain) {
        CUDA_CHECK(cudaGraphDestroyNode(m));
        removed.push_back(m);
      }
      done.memsets += chain.size();
      ++done.kernels;
    }
  }
  return done;
}
