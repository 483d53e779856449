// drop_memsets_of_zeroed_range (core/graph_memsets.h): memsets of zeros wholly inside the range
// leave the graph, their neighbours joined; every other node stays, in its order. memsets_to_kernels:
// chains of memsets become fill kernels that write the same bytes, in the same order.
// hoist_memsets_to_start: memsets of an owned range run once, first.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_graph.h"
#include "core/graph_memsets.h"
#include "core/memory.h"
#include "kernels/fill.h"
#include "support/gpu_test_util.h"

namespace {

constexpr size_t kBytes = 4096;

struct Captured {
  cudaGraph_t graph = nullptr;
  ~Captured() {
    if (graph) cudaGraphDestroy(graph);
  }
};

void capture(cudaStream_t s, Captured& c, const std::function<void()>& enqueue) {
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue();
  CUDA_CHECK(cudaStreamEndCapture(s, &c.graph));
}

size_t node_count(cudaGraph_t g) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  return n;
}

std::vector<unsigned char> bytes_at(const void* p, size_t n) {
  std::vector<unsigned char> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost));
  return v;
}

void launch(cudaGraph_t g, cudaStream_t s) {
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
}

char* at(const DeviceBuffer& b, size_t offset) { return static_cast<char*>(b.get()) + offset; }

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t g) {
  size_t n = node_count(g);
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  return nodes;
}

size_t count_of(cudaGraph_t g, cudaGraphNodeType type) {
  size_t c = 0;
  for (cudaGraphNode_t node : nodes_of(g)) {
    cudaGraphNodeType t;
    CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    c += t == type;
  }
  return c;
}

// The node type of each root (a node with no dependencies) of g.
std::vector<cudaGraphNodeType> root_types(cudaGraph_t g) {
  std::vector<cudaGraphNodeType> types;
  for (cudaGraphNode_t node : nodes_of(g)) {
    size_t deps = 0;
    CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &deps));
    cudaGraphNodeType t;
    CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (deps == 0) types.push_back(t);
  }
  return types;
}

// One memset node, 1D (height 1) or 2D, of elements of 1, 2 or 4 bytes, after the nodes `after`.
cudaGraphNode_t add_memset(cudaGraph_t g, const std::vector<cudaGraphNode_t>& after, void* dst, unsigned element_size,
                           size_t width, size_t height, size_t pitch, unsigned value) {
  cudaMemsetParams p{};
  p.dst = dst;
  p.elementSize = element_size;
  p.width = width;
  p.height = height;
  p.pitch = pitch;
  p.value = value;
  cudaGraphNode_t n = nullptr;
  CUDA_CHECK(cudaGraphAddMemsetNode(&n, g, after.data(), after.size(), &p));
  return n;
}

// A copy node of `bytes` from src to dst, after `after`.
cudaGraphNode_t add_copy(cudaGraph_t g, cudaGraphNode_t after, void* dst, const void* src, size_t bytes) {
  cudaMemcpy3DParms cp{};
  cp.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), bytes, bytes, 1);
  cp.dstPtr = make_cudaPitchedPtr(dst, bytes, bytes, 1);
  cp.extent = make_cudaExtent(bytes, 1, 1);
  cp.kind = cudaMemcpyDeviceToDevice;
  cudaGraphNode_t n = nullptr;
  CUDA_CHECK(cudaGraphAddMemcpyNode(&n, g, &after, 1, &cp));
  return n;
}

// Where two byte strings first differ, for a failure message.
std::string first_difference(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (got[i] != want[i])
      return "byte " + std::to_string(i) + ": " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return got.size() == want.size() ? "none" : "sizes differ";
}

// What a memset writes, on the host: `height` rows of `width` elements, `pitch` bytes apart.
void memset_on_host(std::vector<unsigned char>& bytes, size_t offset, unsigned element_size, size_t width,
                    size_t height, size_t pitch, unsigned value) {
  for (size_t r = 0; r < height; ++r)
    for (size_t i = 0; i < width; ++i)
      for (unsigned b = 0; b < element_size; ++b)
        bytes[offset + r * pitch + i * element_size + b] = static_cast<unsigned char>(value >> (8 * b));
}

}  // namespace

TEST(GraphMemsetsGpu, OnlyZeroMemsetsWhollyInsideTheRangeAreDropped) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer kept(2 * kBytes, "zeroed range and beyond"), other(kBytes, "other"), out(2 * kBytes, "out");
  CUDA_CHECK(cudaMemset(kept.get(), 0, kBytes));          // the range: zero, as its owner keeps it
  CUDA_CHECK(cudaMemset(at(kept, kBytes), 9, kBytes));    // beyond it
  const ZeroedRange range{kept.get(), kBytes};
  Captured g;
  capture(s, g, [&] {
    CUDA_CHECK(cudaMemsetAsync(other.get(), 3, kBytes, s));                     // outside: kept
    CUDA_CHECK(cudaMemsetAsync(kept.get(), 0, kBytes / 2, s));                  // inside, zeros: dropped
    CUDA_CHECK(cudaMemsetAsync(at(kept, kBytes / 2), 0, kBytes / 2, s));        // inside, to the last byte: dropped
    CUDA_CHECK(cudaMemsetAsync(at(kept, kBytes - 8), 0, 16, s));                // crosses the end: kept
    CUDA_CHECK(cudaMemsetAsync(at(kept, 64), 5, 8, s));                         // inside, not zeros: kept
    CUDA_CHECK(cudaMemcpyAsync(out.get(), kept.get(), 2 * kBytes, cudaMemcpyDeviceToDevice, s));
  });
  ASSERT_EQ(node_count(g.graph), 6u);
  EXPECT_EQ(drop_memsets_of_zeroed_range(g.graph, range), 2u);
  EXPECT_EQ(node_count(g.graph), 4u);
  launch(g.graph, s);
  std::vector<unsigned char> want(2 * kBytes, 0);
  std::fill(want.begin() + 64, want.begin() + 72, 5);
  std::fill(want.begin() + kBytes + 8, want.end(), 9);  // the memset across the end zeroed 8 bytes past it
  EXPECT_EQ(bytes_at(out.get(), 2 * kBytes), want) << "the copy still follows the memsets that stayed";
  EXPECT_EQ(bytes_at(other.get(), kBytes), std::vector<unsigned char>(kBytes, 3));
}

TEST(GraphMemsetsGpu, TheNodesAroundADroppedMemsetStayInOrder) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer kept(kBytes, "zeroed range"), a(kBytes, "a"), b(kBytes, "b");
  CUDA_CHECK(cudaMemset(kept.get(), 0, kBytes));
  CUDA_CHECK(cudaMemset(a.get(), 4, kBytes));
  Captured g;
  capture(s, g, [&] {
    CUDA_CHECK(cudaMemsetAsync(a.get(), 6, kBytes, s));
    CUDA_CHECK(cudaMemsetAsync(kept.get(), 0, kBytes, s));  // dropped: the next copy must still follow the first memset
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, s));
  });
  EXPECT_EQ(drop_memsets_of_zeroed_range(g.graph, {kept.get(), kBytes}), 1u);
  size_t n = 3;
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(g.graph, nodes.data(), &n));
  ASSERT_EQ(n, 2u);
  size_t deps = 0;
  CUDA_CHECK(cudaGraphNodeGetDependencies(nodes[1], nullptr, nullptr, &deps));
  EXPECT_EQ(deps, 1u) << "the copy depends on the memset of a";
  launch(g.graph, s);
  EXPECT_EQ(bytes_at(b.get(), kBytes), std::vector<unsigned char>(kBytes, 6));
}

TEST(GraphMemsetsGpu, AnEmptyRangeDropsNothing) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer a(kBytes, "a");
  Captured g;
  capture(s, g, [&] { CUDA_CHECK(cudaMemsetAsync(a.get(), 0, kBytes, s)); });
  EXPECT_EQ(drop_memsets_of_zeroed_range(g.graph, {}), 0u);
  EXPECT_EQ(node_count(g.graph), 1u);
}

TEST(GraphMemsetsGpu, CudaGraphDropsThemAtEachCaptureAndStillUpdatesInPlace) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream s;
  DeviceBuffer kept(kBytes, "zeroed range"), a(kBytes, "a"), out(kBytes, "out");
  CUDA_CHECK(cudaMemset(kept.get(), 0, kBytes));
  int value = 4;
  auto work = [&] {
    CUDA_CHECK(cudaMemsetAsync(kept.get(), 0, kBytes, s));
    CUDA_CHECK(cudaMemsetAsync(a.get(), value, kBytes, s));
    CUDA_CHECK(cudaMemcpyAsync(out.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, s));
  };
  CudaGraph g;
  g.drop_memsets_into({{kept.get(), kBytes}});
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::New);
  EXPECT_EQ(g.memsets_dropped(), 1u);
  EXPECT_EQ(g.memsets_as_kernels().memsets, 1u) << "the memset of a";
  EXPECT_EQ(g.memsets_as_kernels().kernels, 1u);
  EXPECT_EQ(g.nodes(), 2u);
  value = 6;
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::Updated) << "the same topology after dropping";
  g.launch(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(bytes_at(out.get(), kBytes), std::vector<unsigned char>(kBytes, 6));
}

TEST(GraphMemsetsGpu, FillRegionsWritesWhatEachMemsetWould) {
  SKIP_WITHOUT_GPU("a kernel");
  Stream s;
  // Aligned and not, 1D and 2D, every element size, word rows and odd ones, a large region.
  struct Case {
    size_t offset;
    unsigned element_size;
    size_t width, height, pitch;
    unsigned value;
  };
  const std::vector<Case> cases = {{0, 1, 4, 1, 0, 0},         {8, 1, 2048, 1, 0, 0xA5},  {1, 1, 13, 1, 0, 0x7F},
                                   {64, 2, 7, 3, 20, 0xBEEF},   {200, 4, 5, 4, 24, 0xDEADBEEF},
                                   {401, 1, 6, 5, 11, 0x1234},  {4096, 4, 200000, 1, 0, 0x01020304}};
  size_t total = 0;
  for (const Case& c : cases) total = std::max(total, c.offset + (c.height - 1) * c.pitch + c.width * c.element_size);
  DeviceBuffer buf(total, "fill target");
  CUDA_CHECK(cudaMemset(buf.get(), 0xEE, total));
  std::vector<unsigned char> want(total, 0xEE);
  FillRegions f;
  for (const Case& c : cases) {
    f.region[f.count++] = {at(buf, c.offset), c.pitch, c.width, c.height, c.value, c.element_size};
    memset_on_host(want, c.offset, c.element_size, c.width, c.height, c.pitch, c.value);
  }
  fill_regions(f, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(bytes_at(buf.get(), total), want);
}

TEST(GraphMemsetsGpu, AChainOfMemsetsRunsAsKernelsThatWriteTheSameBytes) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  constexpr size_t kChain = 2 * kFillRegions + 3;  // three kernels: 8, 8 and 3 memsets
  DeviceBuffer buf(kChain * 64, "memset targets"), copy(kChain * 64, "copy");
  // Element sizes 1, 2 and 4 in turn, one row or two.
  struct Memset {
    unsigned element_size;
    size_t width, height;
    unsigned value;
  };
  std::vector<Memset> memsets;
  std::vector<unsigned char> want(kChain * 64, 0xEE);
  for (size_t i = 0; i < kChain; ++i) {
    const unsigned es = 1u << (i % 3), mask = es == 4 ? ~0u : (1u << (8 * es)) - 1;
    const Memset m{es, i % 3 == 0 ? 9u : 5u, i % 2 ? 2u : 1u, unsigned(0x10203 * (i + 1)) & mask};
    memsets.push_back(m);
    memset_on_host(want, i * 64, m.element_size, m.width, m.height, 24, m.value);
  }
  // The same graph twice: run as built, and rewritten; each starts from the same bytes.
  for (int rewritten = 0; rewritten < 2; ++rewritten) {
    Captured g;
    CUDA_CHECK(cudaGraphCreate(&g.graph, 0));
    cudaGraphNode_t last = nullptr;
    for (size_t i = 0; i < kChain; ++i)
      last = add_memset(g.graph, last ? std::vector{last} : std::vector<cudaGraphNode_t>{}, at(buf, i * 64),
                        memsets[i].element_size, memsets[i].width, memsets[i].height, 24, memsets[i].value);
    const cudaGraphNode_t after = add_copy(g.graph, last, copy.get(), buf.get(), buf.bytes());
    if (rewritten) {
      const MemsetRewrite r = memsets_to_kernels(g.graph);
      EXPECT_EQ(r.memsets, kChain);
      EXPECT_EQ(r.kernels, 3u);
      EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeMemset), 0u);
      EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeKernel), 3u);
      size_t deps = 0;
      CUDA_CHECK(cudaGraphNodeGetDependencies(after, nullptr, nullptr, &deps));
      EXPECT_EQ(deps, 1u) << "the copy follows the last kernel";
    }
    CUDA_CHECK(cudaMemset(buf.get(), 0xEE, buf.bytes()));
    CUDA_CHECK(cudaMemset(copy.get(), 0, copy.bytes()));
    launch(g.graph, s);
    const std::vector<unsigned char> got = bytes_at(copy.get(), copy.bytes());
    EXPECT_EQ(got, want) << (rewritten ? "rewritten" : "as built") << ", first difference at "
                         << first_difference(got, want);
  }
}

TEST(GraphMemsetsGpu, AMemsetWhoseValueDoesNotFitItsElementsStays) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  DeviceBuffer buf(256, "memset targets");
  Captured g;
  CUDA_CHECK(cudaGraphCreate(&g.graph, 0));
  cudaGraphNode_t n = add_memset(g.graph, {}, buf.get(), 1, 16, 1, 0, 0x70E15);  // 1-byte elements
  n = add_memset(g.graph, {n}, at(buf, 64), 2, 16, 1, 0, 0x1BEEF);                // 2-byte elements
  add_memset(g.graph, {n}, at(buf, 128), 2, 16, 1, 0, 0xBEEF);                    // fits: rewritten
  const MemsetRewrite r = memsets_to_kernels(g.graph);
  EXPECT_EQ(r.memsets, 1u);
  EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeMemset), 2u);
}

TEST(GraphMemsetsGpu, MemsetsBetweenOtherNodesKeepTheirPlace) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer x(kBytes, "x"), first(kBytes, "first copy"), second(kBytes, "second copy");
  Captured g;
  capture(s, g, [&] {
    CUDA_CHECK(cudaMemsetAsync(x.get(), 1, kBytes, s));
    CUDA_CHECK(cudaMemcpyAsync(first.get(), x.get(), kBytes, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaMemsetAsync(x.get(), 2, kBytes / 2, s));  // a chain of two: one kernel
    CUDA_CHECK(cudaMemsetAsync(at(x, kBytes / 2), 3, kBytes / 2, s));
    CUDA_CHECK(cudaMemcpyAsync(second.get(), x.get(), kBytes, cudaMemcpyDeviceToDevice, s));
  });
  const MemsetRewrite r = memsets_to_kernels(g.graph);
  EXPECT_EQ(r.memsets, 3u);
  EXPECT_EQ(r.kernels, 2u);
  EXPECT_EQ(node_count(g.graph), 4u);
  launch(g.graph, s);
  EXPECT_EQ(bytes_at(first.get(), kBytes), std::vector<unsigned char>(kBytes, 1)) << "copied before the second fill";
  std::vector<unsigned char> want(kBytes, 2);
  std::fill(want.begin() + kBytes / 2, want.end(), 3);
  EXPECT_EQ(bytes_at(second.get(), kBytes), want) << "copied after it";
}

TEST(GraphMemsetsGpu, AMemsetWithSeveralDependentsHandsThemAllToItsKernel) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer x(kBytes, "x"), y(kBytes, "y"), a(kBytes, "a"), b(kBytes, "b");
  Captured g;
  CUDA_CHECK(cudaGraphCreate(&g.graph, 0));
  const cudaGraphNode_t mx = add_memset(g.graph, {}, x.get(), 1, kBytes, 1, 0, 7);
  const cudaGraphNode_t my = add_memset(g.graph, {}, y.get(), 1, kBytes, 1, 0, 8);  // a root of its own
  // After both: not a chain link of either.
  const cudaGraphNode_t m2 = add_memset(g.graph, {mx, my}, at(x, 16), 1, 16, 1, 0, 9);
  for (DeviceBuffer* to : {&a, &b}) add_copy(g.graph, m2, to->get(), x.get(), kBytes);
  const MemsetRewrite r = memsets_to_kernels(g.graph);
  EXPECT_EQ(r.memsets, 3u);
  EXPECT_EQ(r.kernels, 3u) << "no chain: each memset has a kernel";
  launch(g.graph, s);
  std::vector<unsigned char> want(kBytes, 7);
  std::fill(want.begin() + 16, want.begin() + 32, 9);
  EXPECT_EQ(bytes_at(a.get(), kBytes), want);
  EXPECT_EQ(bytes_at(b.get(), kBytes), want);
  EXPECT_EQ(bytes_at(y.get(), kBytes), std::vector<unsigned char>(kBytes, 8));
}

// hoist_memsets_to_start: zero memsets wholly inside a range, and no other memset's bytes, leave
// their place for one kernel that runs before everything else.
TEST(GraphMemsetsGpu, MemsetsOfARangeRunOnceAtTheStart) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer owned(kBytes, "owned range"), other(kBytes, "other"), out(kBytes, "out"), first(kBytes, "first copy");
  CUDA_CHECK(cudaMemset(owned.get(), 7, kBytes));  // what the last launch left there
  CUDA_CHECK(cudaMemset(other.get(), 1, kBytes));
  Captured g;
  capture(s, g, [&] {
    CUDA_CHECK(cudaMemcpyAsync(first.get(), other.get(), kBytes, cudaMemcpyDeviceToDevice, s));  // the root
    CUDA_CHECK(cudaMemsetAsync(owned.get(), 0, 1024, s));                  // moved
    CUDA_CHECK(cudaMemsetAsync(at(owned, 1024), 0, 13, s));                // moved (odd length)
    CUDA_CHECK(cudaMemsetAsync(at(owned, 2048), 0, 64, s));                // stays: the next one overlaps it
    CUDA_CHECK(cudaMemsetAsync(at(owned, 2048 + 32), 0, 64, s));           // stays
    CUDA_CHECK(cudaMemsetAsync(at(owned, 3072), 5, 64, s));                // stays: not zeros
    CUDA_CHECK(cudaMemsetAsync(at(other, 64), 0, 64, s));                  // stays: outside the range
    CUDA_CHECK(cudaMemcpyAsync(out.get(), owned.get(), kBytes, cudaMemcpyDeviceToDevice, s));
  });
  ASSERT_EQ(node_count(g.graph), 8u);
  EXPECT_EQ(hoist_memsets_to_start(g.graph, {{owned.get(), kBytes}}), 2u);
  EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeMemset), 4u);
  EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeKernel), 1u);
  // The kernel is the graph's only root.
  EXPECT_EQ(root_types(g.graph), std::vector<cudaGraphNodeType>{cudaGraphNodeTypeKernel});
  launch(g.graph, s);
  std::vector<unsigned char> want(kBytes, 7);
  std::fill(want.begin(), want.begin() + 1024 + 13, 0);
  std::fill(want.begin() + 2048, want.begin() + 2048 + 96, 0);
  std::fill(want.begin() + 3072, want.begin() + 3072 + 64, 5);
  EXPECT_EQ(bytes_at(out.get(), kBytes), want) << first_difference(bytes_at(out.get(), kBytes), want);
  EXPECT_EQ(bytes_at(first.get(), kBytes), std::vector<unsigned char>(kBytes, 1));
}

TEST(GraphMemsetsGpu, MoreSpansThanOneKernelTakesRunAsSeveralKernelsAllFirst) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  constexpr int kMemsets = kZeroSpans + 8;
  constexpr size_t kEach = 16;
  static_assert(kMemsets * kEach <= kBytes);
  DeviceBuffer owned(kBytes, "owned range"), out(kBytes, "out");
  CUDA_CHECK(cudaMemset(owned.get(), 7, kBytes));
  Captured g;
  capture(s, g, [&] {
    for (int i = 0; i < kMemsets; ++i) CUDA_CHECK(cudaMemsetAsync(at(owned, i * kEach), 0, kEach, s));
    CUDA_CHECK(cudaMemcpyAsync(out.get(), owned.get(), kBytes, cudaMemcpyDeviceToDevice, s));
  });
  EXPECT_EQ(hoist_memsets_to_start(g.graph, {{owned.get(), kBytes}}), size_t(kMemsets));
  EXPECT_EQ(count_of(g.graph, cudaGraphNodeTypeMemset), 0u);
  // Two kernels, both ahead of the copy, the only node left besides them.
  EXPECT_EQ(root_types(g.graph), (std::vector<cudaGraphNodeType>{cudaGraphNodeTypeKernel, cudaGraphNodeTypeKernel}));
  EXPECT_EQ(node_count(g.graph), 3u);
  launch(g.graph, s);
  std::vector<unsigned char> want(kBytes, 7);
  std::fill(want.begin(), want.begin() + kMemsets * kEach, 0);
  EXPECT_EQ(bytes_at(out.get(), kBytes), want) << first_difference(bytes_at(out.get(), kBytes), want);
}

TEST(GraphMemsetsGpu, NoRangesMoveNothing) {
  SKIP_WITHOUT_GPU("rewriting a CUDA graph");
  Stream s;
  DeviceBuffer a(kBytes, "a");
  Captured g;
  capture(s, g, [&] { CUDA_CHECK(cudaMemsetAsync(a.get(), 0, kBytes, s)); });
  EXPECT_EQ(hoist_memsets_to_start(g.graph, {}), 0u);
  EXPECT_EQ(node_count(g.graph), 1u);
}

TEST(GraphMemsetsGpu, ZeroSpansZeroesEachSpanAndNothingElse) {
  SKIP_WITHOUT_GPU("a kernel");
  Stream s;
  // Aligned and not, word lengths and odd ones, a span longer than one block covers.
  const std::vector<std::pair<size_t, unsigned>> spans = {{0, 4}, {9, 1}, {17, 13}, {64, 4096}, {8193, 3}, {9000, 300000}};
  const size_t total = 9000 + 300000 + 64;
  DeviceBuffer buf(total, "zero target");
  CUDA_CHECK(cudaMemset(buf.get(), 0xEE, total));
  std::vector<unsigned char> want(total, 0xEE);
  ZeroSpans z;
  for (auto [offset, bytes] : spans) {
    z.dst[z.count] = at(buf, offset);
    z.bytes[z.count++] = bytes;
    std::fill(want.begin() + offset, want.begin() + offset + bytes, 0);
  }
  zero_spans(z, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<unsigned char> got = bytes_at(buf.get(), total);
  EXPECT_EQ(got, want) << first_difference(got, want);
}

TEST(GraphMemsetsGpu, CudaGraphMovesThemAtEachCaptureAndStillUpdatesInPlace) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream s;
  DeviceBuffer owned(kBytes, "owned range"), a(kBytes, "a"), out(kBytes, "out");
  int value = 4;
  auto work = [&] {
    CUDA_CHECK(cudaMemsetAsync(a.get(), value, kBytes, s));
    CUDA_CHECK(cudaMemsetAsync(owned.get(), 0, kBytes, s));
    CUDA_CHECK(cudaMemcpyAsync(out.get(), a.get(), kBytes / 2, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(at(out, kBytes / 2), owned.get(), kBytes / 2, cudaMemcpyDeviceToDevice, s));
  };
  CudaGraph g;
  g.hoist_memsets_from({{owned.get(), kBytes}});
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::New);
  EXPECT_EQ(g.memsets_hoisted(), 1u);
  value = 6;
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::Updated) << "the same topology after moving";
  CUDA_CHECK(cudaMemset(owned.get(), 9, kBytes));
  g.launch(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned char> want(kBytes, 6);
  std::fill(want.begin() + kBytes / 2, want.end(), 0);
  EXPECT_EQ(bytes_at(out.get(), kBytes), want);
}
