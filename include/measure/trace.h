// Built-in timeline (`--trace FILE.json`): GPU work and CPU phases recorded through CUPTI over the
// profile window, summarised on the console and written as Chrome trace JSON (Perfetto,
// chrome://tracing).
//
// Two halves: CuptiTrace (trace.cpp) turns CUPTI activity records and NvtxRange phases into the
// plain records of TraceData; summarize() and write_chrome_trace() (trace_report.cpp) are pure CPU
// functions of those records, so they are tested without a GPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

// ---- records (all times in ns on CUPTI's clock) --------------------------------------------------

enum class GpuActivityKind { Kernel, Memcpy, Memset };
enum class CopyKind { None, HostToDevice, DeviceToHost, DeviceToDevice, HostToHost, PeerToPeer };
// Where the host side of a copy lives: pageable copies are the ones the pinned loader removes.
enum class HostMemory { None, Pageable, Pinned, Other };

struct GpuActivity {
  GpuActivityKind kind = GpuActivityKind::Kernel;
  std::string name;  // demangled kernel name, "memcpy HtoD", "memset", ...
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0;
  uint32_t correlation = 0;  // matches the ApiCall that launched it
  uint64_t bytes = 0;        // memcpy / memset
  CopyKind copy = CopyKind::None;
  HostMemory host_memory = HostMemory::None;
  int grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};  // kernels
};

// One NvtxRange, e.g. "forward" inside "step 3".
struct HostRange {
  std::string name;
  uint32_t argb = 0;
  uint32_t thread = 0;  // OS thread id (gettid), as in ApiCall
  uint64_t start_ns = 0, end_ns = 0;
};

// One CUDA runtime API call (cudaLaunchKernel, cudaMemcpyAsync, ...).
struct ApiCall {
  std::string name;
  uint32_t thread = 0;
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t correlation = 0;
};

struct TraceData {
  std::vector<GpuActivity> gpu;
  std::vector<HostRange> ranges;
  std::vector<ApiCall> api_calls;
  std::map<uint32_t, std::string> thread_names;  // from name_this_thread()
  uint32_t main_thread = 0;                      // the thread that called CuptiTrace::start()
  uint64_t dropped_records = 0;                  // CUPTI ran out of buffer space
};

// ---- what the trace says --------------------------------------------------------------------------

struct TraceSummary {
  double window_ms = 0;     // last GPU activity end - first GPU activity start
  double gpu_busy_pct = 0;  // union of GPU activity intervals (kernels, memcpy, memset) / window
  // A stretch with no GPU activity at all. start_ms is from the window start; phase is the
  // innermost host range other than "step N" open on the main thread when the gap starts (e.g.
  // "loss stats"), else "after <last such range>", else "no range".
  struct Gap {
    double start_ms, length_ms;
    std::string phase;
  };
  std::vector<Gap> longest_gaps;  // top 5, longest first
  // pct: share of the total kernel time, as in nsys's cuda_gpu_kern_sum.
  struct KernelStat {
    std::string name;
    int count;
    double total_ms;
    double pct;
  };
  std::vector<KernelStat> top_kernels;  // top 10 by total time, demangled names
  uint64_t dropped_records = 0;
  std::string report() const;  // a few human-readable lines for the console
};

TraceSummary summarize(const TraceData& data);
// Chrome trace JSON: process "CPU" with a row per thread (NVTX ranges and runtime API calls), and
// process "GPU <n>" with a row per stream (kernels, memcpys, memsets); times in microseconds from
// the earliest record.
void write_chrome_trace(const TraceData& data, std::ostream& out);
// Throws InputError naming the file when it cannot be written.
void write_chrome_trace_file(const TraceData& data, const std::string& path);
// "_Z6kernelPfi" -> "kernel(float*, int)"; names that are not mangled come back unchanged.
std::string demangle(const char* name);

// ---- recording ------------------------------------------------------------------------------------

// One per process, since CUPTI's activity callbacks are process-wide. Call start() and stop() from
// the main training thread, between steps (a phase range open at start() is not recorded).
class CuptiTrace {
 public:
  CuptiTrace();  // registers CUPTI activity buffer callbacks; throws Fatal with CUPTI's message
  ~CuptiTrace();
  CuptiTrace(const CuptiTrace&) = delete;
  CuptiTrace& operator=(const CuptiTrace&) = delete;

  // Window start: drops earlier records, enables kernel, memcpy, memset and runtime API activity and
  // the recording of NvtxRange phases.
  void start();
  // Window end: synchronizes the device, disables the activity kinds, flushes CUPTI's buffers into
  // the records; throws Fatal if CUPTI reported an error while recording.
  void stop();
  TraceSummary summary() const;
  void write_chrome_json(const std::string& path) const;  // InputError naming the file on failure

 private:
  bool recording_ = false;
};

// ---- the host side, fed by NvtxRange and name_this_thread (profiling.cpp) -------------------------
namespace trace_host {
// True between CuptiTrace::start() and stop(); the only cost of a phase range while not tracing.
extern std::atomic<bool> recording;
uint64_t timestamp_ns();  // CUPTI's clock, so phases line up with the GPU records
uint32_t this_thread_id();
void add_range(HostRange range);
void set_thread_name(uint32_t thread, const std::string& name);
}  // namespace trace_host

// ---- CUPTI's activity buffers, from CUPTI's thread to stop()'s (trace.cpp; public for the CPU tests)
// CUPTI hands back each full buffer on its own thread while the main thread is training; reading
// one (tens of thousands of records) there, under the lock that every phase range takes, would
// stall the training loop. So a buffer is only queued when it completes, and read in stop().
namespace trace_buffers {
// From now on keep the buffers handed over (CuptiTrace::start()); frees any kept before.
void keep();
// CUPTI's buffer-completed callback: takes ownership of buffer (from std::aligned_alloc) and, while
// keeping, queues it with its valid size and the records CUPTI dropped; otherwise (after stop(),
// or from CUPTI's exit handler) frees it. Never throws: a failure is reported by take().
void hand_over(uint8_t* buffer, size_t valid_size, size_t dropped_records) noexcept;
// Stops keeping, reads every kept buffer in order into the gpu and api_calls records of the result
// (and its dropped_records), and frees them. Throws Fatal for a record CUPTI cannot read or an
// error of hand_over().
TraceData take();
}  // namespace trace_buffers
