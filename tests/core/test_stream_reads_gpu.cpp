// StreamReads (core/stream_reads.h): a writer stream that calls before_write waits for the reader
// stream's pending read of that buffer, eagerly and inside a stream capture; without it the write
// overtakes the read (so the test can tell). The reader is held back by a host function that sleeps
// before its copy, so that an unordered write would land first.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"
#include "core/stream_reads.h"
#include "support/gpu_test_util.h"

namespace {

constexpr size_t kBytes = 1 << 20;
constexpr int kOriginal = 0x5A, kOverwritten = 0xC3;

void CUDART_CB sleep_100ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

struct Buffers {
  DeviceBuffer read{kBytes, "the buffer read"}, copy{kBytes, "the reader's copy"};
  Buffers() {
    CUDA_CHECK(cudaMemset(read.get(), kOriginal, kBytes));
    CUDA_CHECK(cudaMemset(copy.get(), 0, kBytes));
    CUDA_CHECK(cudaDeviceSynchronize());  // the test's non-blocking streams do not wait for these
  }
  // The reader's slow read of `read` into `copy`.
  void enqueue_read(cudaStream_t reader) const {
    CUDA_CHECK(cudaLaunchHostFunc(reader, sleep_100ms, nullptr));
    CUDA_CHECK(cudaMemcpyAsync(copy.get(), read.get(), kBytes, cudaMemcpyDeviceToDevice, reader));
  }
  void enqueue_write(cudaStream_t writer) const { CUDA_CHECK(cudaMemsetAsync(read.get(), kOverwritten, kBytes, writer)); }
  // Bytes of the copy that hold `value`.
  size_t copied(int value) const {
    std::vector<uint8_t> host(kBytes);
    CUDA_CHECK(cudaMemcpy(host.data(), copy.get(), kBytes, cudaMemcpyDeviceToHost));
    size_t n = 0;
    for (uint8_t b : host) n += b == value;
    return n;
  }
};

// The reader's slow read, then the writer's overwrite with before_write between them; `forgotten`:
// reset() drops the pending read first, as a join that did not happen would.
void read_then_write(const Buffers& b, bool forgotten) {
  Stream reader(false), writer(false);
  StreamReads reads({b.read.get()});
  b.enqueue_read(reader);
  reads.read(b.read.get(), reader);
  if (forgotten) reads.reset();
  reads.before_write(b.read.get(), writer);
  b.enqueue_write(writer);
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(StreamReadsGpu, TheWriterWaitsForThePendingRead) {
  SKIP_WITHOUT_GPU("stream events");
  Buffers b;
  read_then_write(b, false);
  EXPECT_EQ(b.copied(kOriginal), kBytes) << "the reader read the buffer before the writer overwrote it";
}

TEST(StreamReadsGpu, WithoutTheWaitTheWriteOvertakesTheRead) {
  SKIP_WITHOUT_GPU("stream events");
  Buffers b;
  read_then_write(b, true);
  EXPECT_EQ(b.copied(kOverwritten), kBytes) << "the unordered write landed first: the test above can fail";
}

TEST(StreamReadsGpu, TheWaitHoldsInsideAStreamCapture) {
  SKIP_WITHOUT_GPU("stream capture");
  Stream reader(false), writer(false);
  Event fork(false), join(false);
  Buffers b;
  StreamReads reads({b.read.get()});
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(writer, cudaStreamCaptureModeThreadLocal));
  fork.record(writer);
  CUDA_CHECK(cudaStreamWaitEvent(reader, fork, 0));
  b.enqueue_read(reader);
  reads.read(b.read.get(), reader);
  reads.before_write(b.read.get(), writer);
  b.enqueue_write(writer);
  join.record(reader);
  CUDA_CHECK(cudaStreamWaitEvent(writer, join, 0));
  CUDA_CHECK(cudaStreamEndCapture(writer, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, writer));
  CUDA_CHECK(cudaStreamSynchronize(writer));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  EXPECT_EQ(b.copied(kOriginal), kBytes) << "the graph's write waited for the read";
}

TEST(StreamReadsGpu, OnlyTrackedBuffersAreReadAndEachReadWaitedForOnce) {
  SKIP_WITHOUT_GPU("stream events");
  Stream s(false);
  Buffers b;
  StreamReads reads({b.read.get()});
  EXPECT_THROW(reads.read(b.copy.get(), s), Fatal) << "a read of a buffer it does not track";
  EXPECT_NO_THROW(reads.before_write(b.copy.get(), s)) << "a write of one it does not track waits for nothing";
  EXPECT_FALSE(reads.pending(b.copy.get()));
  reads.read(b.read.get(), s);
  EXPECT_TRUE(reads.pending(b.read.get()));
  reads.before_write(b.read.get(), s);
  EXPECT_FALSE(reads.pending(b.read.get())) << "waited for once: the next write needs no wait";
  reads.read(b.read.get(), s);
  reads.reset();
  EXPECT_FALSE(reads.pending(b.read.get())) << "reset drops the pending reads";
  CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace
