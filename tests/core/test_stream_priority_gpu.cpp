// Stream priorities (core/handles.h, StreamPriority): the compute stream goes first, and a kernel
// captured into a CUDA graph keeps the priority of the stream it was captured from, which the
// step's graph runs by (core/cuda_graph.cpp instantiates it with the node priorities).
#include <gtest/gtest.h>

#include <vector>

#include "core/cuda_graph.h"
#include "core/handles.h"
#include "core/memory.h"
#include "kernels/fill.h"
#include "support/gpu_test_util.h"

namespace {

int priority_of(cudaStream_t s) {
  int p = 0;
  CUDA_CHECK(cudaStreamGetPriority(s, &p));
  return p;
}

struct Range {
  int least = 0, greatest = 0;
  Range() { CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest)); }
};

// One fill kernel on `s` that sets the first byte of `at`.
void fill_one(void* at, cudaStream_t s) {
  FillRegions f;
  f.region[f.count++] = {at, 1, 1, 1, 7u, 1};
  fill_regions(f, s);
}

// A fill kernel on `chain` and one on `lane`, forked from and joined back to `chain`.
void fork_and_fill(cudaStream_t chain, cudaStream_t lane, Event& forked, Event& done, char* at) {
  forked.record(chain);
  CUDA_CHECK(cudaStreamWaitEvent(lane, forked, 0));
  fill_one(at, chain);
  fill_one(at + 1, lane);
  done.record(lane);
  CUDA_CHECK(cudaStreamWaitEvent(chain, done, 0));
}

}  // namespace

TEST(StreamPriorityGpu, FirstIsTheDevicesGreatestAndNormalItsLeast) {
  SKIP_WITHOUT_GPU("stream priorities");
  const Range r;
  ASSERT_NE(r.least, r.greatest) << "the device offers one stream priority only";
  const Stream first(false, StreamPriority::First), normal(false), blocking_first(true, StreamPriority::First);
  EXPECT_EQ(priority_of(first), r.greatest);
  EXPECT_EQ(priority_of(blocking_first), r.greatest);
  EXPECT_EQ(priority_of(normal), r.least);
}

TEST(StreamPriorityGpu, TheComputeStreamGoesFirst) {
  SKIP_WITHOUT_GPU("stream priorities");
  GpuContext ctx;
  EXPECT_EQ(priority_of(ctx.stream), Range().greatest);
}

TEST(StreamPriorityGpu, ACapturedKernelKeepsItsStreamsPriority) {
  SKIP_WITHOUT_GPU("capturing a CUDA graph");
  const Range r;
  const Stream chain(true, StreamPriority::First), lane(false);
  Event forked(false), done(false);
  DeviceBuffer bytes(2, "two bytes");
  char* at = static_cast<char*>(bytes.get());
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(chain, cudaStreamCaptureModeThreadLocal));
  fork_and_fill(chain, lane, forked, done, at);
  CUDA_CHECK(cudaStreamEndCapture(chain, &graph));
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<int> priorities;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaLaunchAttributeValue v{};
    CUDA_CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePriority, &v));
    priorities.push_back(v.priority);
  }
  CUDA_CHECK(cudaGraphDestroy(graph));
  ASSERT_EQ(priorities.size(), 2u);
  EXPECT_NE(priorities[0], priorities[1]);
  for (int p : priorities) EXPECT_TRUE(p == r.greatest || p == r.least) << p;
}

TEST(StreamPriorityGpu, AGraphOfTwoPrioritiesInstantiatesAndRuns) {
  SKIP_WITHOUT_GPU("running a CUDA graph");
  const Stream chain(true, StreamPriority::First), lane(false);
  Event forked(false), done(false);
  DeviceBuffer bytes(2, "two bytes");
  char* at = static_cast<char*>(bytes.get());
  CUDA_CHECK(cudaMemset(at, 0, 2));
  CudaGraph graph;
  EXPECT_EQ(graph.capture(chain, [&] { fork_and_fill(chain, lane, forked, done, at); }), CudaGraph::Instantiation::New);
  graph.launch(chain);
  CUDA_CHECK(cudaStreamSynchronize(chain));
  char got[2] = {0, 0};
  CUDA_CHECK(cudaMemcpy(got, at, 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got[0], 7);
  EXPECT_EQ(got[1], 7);
}
