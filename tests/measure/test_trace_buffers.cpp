// CUPTI's buffer hand-over (trace.h, trace_buffers): activity buffers made by hand, kept only inside
// a window, read in order by take() rather than on CUPTI's thread, an unreadable one a Fatal (CPU).
#include <gtest/gtest.h>

#include <cupti.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "measure/trace.h"

namespace {

// ---- CUPTI's buffers: kept on its thread, read by stop() -------------------------------------------
// Activity buffers made by hand, record after record as CUPTI lays them out: reading them needs
// libcupti (cuptiActivityGetNextRecord only walks memory) but no GPU.

class ActivityBuffer {
 public:
  template <class Record>
  ActivityBuffer& add(const Record& r) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(r));
    std::memcpy(bytes_.data() + at, &r, sizeof(r));
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  // A buffer as buffer_requested allocates it; whoever it is handed to frees it.
  uint8_t* release() const {
    const size_t n = (bytes_.size() / ACTIVITY_RECORD_ALIGNMENT + 1) * ACTIVITY_RECORD_ALIGNMENT;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, n));
    std::memcpy(p, bytes_.data(), bytes_.size());
    return p;
  }

 private:
  std::vector<uint8_t> bytes_;
};

CUpti_ActivityKernel10 kernel_record(const char* name, uint64_t start, uint64_t end) {
  CUpti_ActivityKernel10 k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.name = name;
  k.start = start, k.end = end;
  k.streamId = 7;
  k.correlationId = 11;
  k.gridX = 4, k.gridY = 1, k.gridZ = 1;
  k.blockX = 256, k.blockY = 1, k.blockZ = 1;
  return k;
}

CUpti_ActivityMemset4 memset_record(uint64_t bytes) {
  CUpti_ActivityMemset4 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.bytes = bytes;
  m.start = 30, m.end = 40;
  return m;
}

TEST(TraceBuffers, KeptBuffersAreReadInOrderByTake) {
  static const char kMangled[] = "_Z5scalePfi";
  CUpti_ActivityMemcpy6 copy{};
  copy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  copy.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  copy.bytes = 4096;
  copy.start = 20, copy.end = 25;
  CUpti_ActivityAPI launch{};
  launch.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  launch.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
  launch.threadId = 4242;
  launch.start = 5, launch.end = 6;
  launch.correlationId = 11;

  trace_buffers::keep();
  const ActivityBuffer first = ActivityBuffer().add(launch).add(kernel_record(kMangled, 10, 19)).add(copy);
  trace_buffers::hand_over(first.release(), first.size(), 0);
  const ActivityBuffer second = ActivityBuffer().add(memset_record(64)).add(kernel_record(kMangled, 50, 60));
  trace_buffers::hand_over(second.release(), second.size(), 3);
  trace_buffers::hand_over(nullptr, 0, 2);  // CUPTI had no buffer: only a count of dropped records

  const TraceData d = trace_buffers::take();
  ASSERT_EQ(d.gpu.size(), 4u);
  EXPECT_EQ(d.gpu[0].kind, GpuActivityKind::Kernel);
  EXPECT_EQ(d.gpu[0].name, "scale(float*, int)");
  EXPECT_EQ(d.gpu[0].start_ns, 10u);
  EXPECT_EQ(d.gpu[0].stream, 7u);
  EXPECT_EQ(d.gpu[0].grid[0], 4);
  EXPECT_EQ(d.gpu[0].block[0], 256);
  EXPECT_EQ(d.gpu[1].name, "memcpy HtoD");
  EXPECT_EQ(d.gpu[1].host_memory, HostMemory::Pinned);
  EXPECT_EQ(d.gpu[1].bytes, 4096u);
  EXPECT_EQ(d.gpu[2].kind, GpuActivityKind::Memset);
  EXPECT_EQ(d.gpu[2].bytes, 64u);
  EXPECT_EQ(d.gpu[3].name, "scale(float*, int)");
  EXPECT_EQ(d.gpu[3].start_ns, 50u);
  ASSERT_EQ(d.api_calls.size(), 1u);
  EXPECT_EQ(d.api_calls[0].name, "cudaLaunchKernel");
  EXPECT_EQ(d.api_calls[0].thread, 4242u);
  EXPECT_EQ(d.api_calls[0].correlation, 11u);
  EXPECT_EQ(d.dropped_records, 5u);

  // take() stopped the keeping and let go of what it read.
  const TraceData again = trace_buffers::take();
  EXPECT_TRUE(again.gpu.empty());
  EXPECT_EQ(again.dropped_records, 0u);
}

TEST(TraceBuffers, HandOverOnlyQueuesTheReadingIsInTake) {
  // What CUPTI's thread does must stay cheap: the records are read when take() runs, so a change
  // to the buffer's memory after the hand-over is what take() sees.
  trace_buffers::keep();
  const ActivityBuffer b = ActivityBuffer().add(memset_record(1));
  uint8_t* raw = b.release();
  trace_buffers::hand_over(raw, b.size(), 0);
  CUpti_ActivityMemset4 changed = memset_record(2);
  std::memcpy(raw, &changed, sizeof(changed));
  const TraceData d = trace_buffers::take();
  ASSERT_EQ(d.gpu.size(), 1u);
  EXPECT_EQ(d.gpu[0].bytes, 2u) << "the buffer was read when it was handed over, on CUPTI's thread";
}

TEST(TraceBuffers, BuffersOutsideAWindowAreNotKept) {
  // Before keep(), and after take() (CUPTI's exit handler flushes once more): freed, not queued.
  const ActivityBuffer b = ActivityBuffer().add(memset_record(8));
  trace_buffers::hand_over(b.release(), b.size(), 1);
  TraceData d = trace_buffers::take();
  EXPECT_TRUE(d.gpu.empty());
  EXPECT_EQ(d.dropped_records, 0u);
  trace_buffers::keep();
  trace_buffers::take();
  trace_buffers::hand_over(b.release(), b.size(), 1);
  d = trace_buffers::take();
  EXPECT_TRUE(d.gpu.empty());
  EXPECT_EQ(d.dropped_records, 0u);

  // A window started again without take() (after a stop() that failed) starts empty.
  trace_buffers::keep();
  trace_buffers::hand_over(b.release(), b.size(), 1);
  trace_buffers::keep();
  d = trace_buffers::take();
  EXPECT_TRUE(d.gpu.empty());
  EXPECT_EQ(d.dropped_records, 0u);
}

TEST(TraceBuffers, AnUnreadableBufferIsAFatalFromTake) {
  trace_buffers::keep();
  const ActivityBuffer good = ActivityBuffer().add(memset_record(8));
  trace_buffers::hand_over(good.release(), good.size(), 0);
  std::vector<uint8_t> junk(64, 0xff);  // no activity kind CUPTI knows
  auto* raw = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, junk.size()));
  std::memcpy(raw, junk.data(), junk.size());
  trace_buffers::hand_over(raw, junk.size(), 0);
  try {
    trace_buffers::take();
    FAIL() << "expected Fatal";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find("while reading an activity buffer"), std::string::npos) << e.what();
  }
  // The next window starts clean.
  trace_buffers::keep();
  EXPECT_NO_THROW(trace_buffers::take());
}

}  // namespace
