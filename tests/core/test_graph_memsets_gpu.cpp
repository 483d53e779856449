// drop_memsets_of_zeroed_range (core/graph_memsets.h): memsets of zeros wholly inside the range
// leave the graph, their neighbours joined; every other node stays, in its order.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "core/cuda_graph.h"
#include "core/graph_memsets.h"
#include "core/memory.h"
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
  g.drop_memsets_into({kept.get(), kBytes});
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::New);
  EXPECT_EQ(g.memsets_dropped(), 1u);
  EXPECT_EQ(g.nodes(), 2u);
  value = 6;
  EXPECT_EQ(g.capture(s, work), CudaGraph::Instantiation::Updated) << "the same topology after dropping";
  g.launch(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(bytes_at(out.get(), kBytes), std::vector<unsigned char>(kBytes, 6));
}
