// CUPTI glue for the built-in timeline: activity buffers in, plain TraceData records (trace.h) out.
#include "measure/trace.h"

#include <cupti.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/errors.h"

namespace {

[[noreturn]] void throw_cupti_error(CUptiResult r, const char* call, const char* file, int line) {
  const char* text = nullptr;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || !text) text = "unknown CUPTI error";
  std::string msg = "CUPTI error " + std::string(text) + " in " + call + " at " + file + ":" + std::to_string(line);
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    msg += "; another profiler (nsys, ncu, cuda-gdb) is attached: use either it or --trace, not both";
  if (r == CUPTI_ERROR_NOT_INITIALIZED || r == CUPTI_ERROR_NOT_COMPATIBLE || r == CUPTI_ERROR_INVALID_DEVICE)
    msg += "; libcupti could not attach to this GPU: check that libcupti comes from the same CUDA "
           "toolkit as libcudart and that the driver supports it (nvidia-smi)";
  if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES || r == CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES)
    msg += "; this user may not profile the GPU: run without --trace";
  throw Fatal(msg);
}

#define CUPTI_CHECK(call)                                                        \
  do {                                                                           \
    CUptiResult r_ = (call);                                                     \
    if (r_ != CUPTI_SUCCESS) throw_cupti_error(r_, #call, __FILE__, __LINE__);   \
  } while (0)

const CUpti_ActivityKind kRecordedKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
// Per buffer; CUPTI asks for another when one fills, and hands full ones back on its own thread.
constexpr size_t kBufferBytes = 8u << 20;

struct FreeBuffer {
  void operator()(uint8_t* p) const { std::free(p); }
};
// A full activity buffer as CUPTI handed it back, not yet read.
struct RawBuffer {
  std::unique_ptr<uint8_t, FreeBuffer> data;
  size_t valid_size = 0;
};

// Everything the CUPTI callbacks and the phase ranges write, from any thread. The main training
// thread takes `mu` at the end of every phase range, so nothing slow may happen under it: a wait
// there starves the GPU and makes the traced run slower than an untraced one. Hence CUPTI's thread
// only queues its full buffers here, and stop() reads them, on its own thread, once the window is
// over.
struct Collector {
  std::mutex mu;
  TraceData data;                // phases and thread names as they come; GPU and API records from stop()
  bool keep_buffers = false;     // from start() to stop(); a buffer that completes otherwise is freed
  std::vector<RawBuffer> full;   // kept buffers, in the order CUPTI completed them
  uint64_t dropped_records = 0;  // reported with the kept buffers
  std::string error;             // from a callback, which must not throw; stop() reports it
};

// Never destroyed: CUPTI may still hand back buffers from its exit handler.
Collector& collector() {
  static Collector* c = new Collector;
  return *c;
}

std::atomic<bool> g_instance_exists{false};

// Turns activity records into TraceData. Runs only in trace_buffers::take(), so it needs no lock.
struct RecordParser {
  TraceData out;
  std::unordered_map<const char*, std::string> kernel_names;  // CUPTI shares one name pointer per kernel
  std::unordered_map<uint32_t, std::string> api_names;       // by runtime callback id
};

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel"
std::string api_name(RecordParser& c, uint32_t cbid) {
  auto it = c.api_names.find(cbid);
  if (it != c.api_names.end()) return it->second;
  const char* raw = nullptr;
  std::string name = cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &raw) == CUPTI_SUCCESS && raw
                         ? raw
                         : "runtime API " + std::to_string(cbid);
  const size_t v = name.rfind("_v");
  if (v != std::string::npos && v + 2 < name.size() &&
      name.find_first_not_of("0123456789", v + 2) == std::string::npos)
    name.resize(v);
  return c.api_names.emplace(cbid, name).first->second;
}

CopyKind copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return CopyKind::HostToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return CopyKind::DeviceToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return CopyKind::DeviceToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return CopyKind::HostToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return CopyKind::PeerToPeer;
    default: return CopyKind::None;
  }
}

HostMemory host_memory(uint8_t memory_kind) {
  switch (memory_kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return HostMemory::Pageable;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return HostMemory::Pinned;
    default: return HostMemory::Other;
  }
}

const char* memcpy_name(CopyKind k) {
  switch (k) {
    case CopyKind::HostToDevice: return "memcpy HtoD";
    case CopyKind::DeviceToHost: return "memcpy DtoH";
    case CopyKind::DeviceToDevice: return "memcpy DtoD";
    case CopyKind::HostToHost: return "memcpy HtoH";
    case CopyKind::PeerToPeer: return "memcpy PtoP";
    case CopyKind::None: break;
  }
  return "memcpy";
}

// What every GPU record holds alike (kernels, copies, fills): when, where, and its API call.
template <class Record>
GpuActivity gpu_activity(GpuActivityKind kind, const Record& r) {
  GpuActivity a;
  a.kind = kind;
  a.start_ns = r.start;
  a.end_ns = r.end;
  a.device = r.deviceId;
  a.stream = r.streamId;
  a.correlation = r.correlationId;
  return a;
}

// The struct versions are the newest in CUDA 13's cupti_activity.h, which is what CUPTI 13 writes.
void add_record(RecordParser& c, const CUpti_Activity* rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      GpuActivity a = gpu_activity(GpuActivityKind::Kernel, *k);
      auto name = c.kernel_names.find(k->name);
      if (name == c.kernel_names.end()) name = c.kernel_names.emplace(k->name, demangle(k->name)).first;
      a.name = name->second;
      a.grid[0] = k->gridX, a.grid[1] = k->gridY, a.grid[2] = k->gridZ;
      a.block[0] = k->blockX, a.block[1] = k->blockY, a.block[2] = k->blockZ;
      c.out.gpu.push_back(std::move(a));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      GpuActivity a = gpu_activity(GpuActivityKind::Memcpy, *m);
      a.copy = copy_kind(m->copyKind);
      a.name = memcpy_name(a.copy);
      if (a.copy == CopyKind::HostToDevice) a.host_memory = host_memory(m->srcKind);
      if (a.copy == CopyKind::DeviceToHost) a.host_memory = host_memory(m->dstKind);
      a.bytes = m->bytes;
      c.out.gpu.push_back(std::move(a));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      GpuActivity a = gpu_activity(GpuActivityKind::Memset, *m);
      a.name = "memset";
      a.bytes = m->bytes;
      c.out.gpu.push_back(std::move(a));
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
      const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      c.out.api_calls.push_back({api_name(c, api->cbid), api->threadId, api->start, api->end, api->correlationId});
      break;
    }
    default: break;  // kinds we did not enable
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // A null buffer is allowed: CUPTI then drops records and counts them (see buffer_completed).
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

// On CUPTI's thread, while the main thread trains: hand the buffer over and nothing more (Collector).
void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid_size) {
  size_t dropped = 0;  // if even this query fails, the count is just not known
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) != CUPTI_SUCCESS) dropped = 0;
  trace_buffers::hand_over(buffer, valid_size, dropped);
}

// Frees the buffers kept so far (a window nobody will read) and from now on keeps (or frees) the
// ones handed over.
void reset_buffers(bool keep) {
  Collector& c = collector();
  std::vector<RawBuffer> old;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    old.swap(c.full);
    c.dropped_records = 0;
    c.error.clear();
    c.keep_buffers = keep;
  }
}  // freed here, outside the lock

// Leaves CUPTI quiet without throwing, for the destructor.
void disable_all_quietly() {
  for (CUpti_ActivityKind k : kRecordedKinds) cuptiActivityDisable(k);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

}  // namespace

// ---- host side ----------------------------------------------------------------------------------
namespace trace_host {

std::atomic<bool> recording{false};

uint64_t timestamp_ns() {
  uint64_t t = 0;
  // Fails only for a null pointer; a phase without a time would be worse than a throw from a destructor.
  if (cuptiGetTimestamp(&t) != CUPTI_SUCCESS) return 0;
  return t;
}

uint32_t this_thread_id() {
  // The id CUPTI puts in runtime API records under CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM.
  thread_local const uint32_t id = static_cast<uint32_t>(syscall(SYS_gettid));
  return id;
}

void add_range(HostRange range) {
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  c.data.ranges.push_back(std::move(range));
}

void set_thread_name(uint32_t thread, const std::string& name) {
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  c.data.thread_names[thread] = name;
}

}  // namespace trace_host

// ---- CUPTI's buffers, from its thread to stop()'s ---------------------------------------------------
namespace trace_buffers {

void keep() { reset_buffers(true); }

void hand_over(uint8_t* buffer, size_t valid_size, size_t dropped_records) noexcept {
  RawBuffer b{std::unique_ptr<uint8_t, FreeBuffer>(buffer), valid_size};
  Collector& c = collector();
  try {
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.keep_buffers) return;  // after stop(), e.g. from CUPTI's exit handler: b frees it
    c.dropped_records += dropped_records;
    if (b.data && valid_size > 0) c.full.push_back(std::move(b));
  } catch (const std::exception& e) {  // nothing may unwind into CUPTI; b still owns the buffer
    std::lock_guard<std::mutex> lock(c.mu);
    c.error = std::string("keeping a CUPTI activity buffer failed: ") + e.what();
  }
}

TraceData take() {
  Collector& c = collector();
  std::vector<RawBuffer> full;  // freed on the way out, also when a record cannot be read
  RecordParser p;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.keep_buffers = false;
    full.swap(c.full);
    p.out.dropped_records = c.dropped_records;
    c.dropped_records = 0;
    error.swap(c.error);
  }
  if (!error.empty()) throw Fatal(error);
  try {
    for (const RawBuffer& b : full) {
      CUpti_Activity* rec = nullptr;
      for (;;) {
        const CUptiResult r = cuptiActivityGetNextRecord(b.data.get(), b.valid_size, &rec);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of this buffer
        if (r != CUPTI_SUCCESS) {
          const char* text = nullptr;
          cuptiGetResultString(r, &text);
          throw Fatal("CUPTI error " + std::string(text ? text : "?") + " while reading an activity buffer");
        }
        add_record(p, rec);
      }
    }
  } catch (const Fatal&) {
    throw;
  } catch (const std::exception& e) {
    throw Fatal(std::string("reading CUPTI activity records failed: ") + e.what());
  }
  return std::move(p.out);
}

}  // namespace trace_buffers

// ---- CuptiTrace -----------------------------------------------------------------------------------

CuptiTrace::CuptiTrace() {
  if (g_instance_exists.exchange(true)) throw Fatal("internal error: a second CuptiTrace in one process");
  try {
    // gettid, so runtime API rows and NvtxRange phases of one thread land on the same row.
    CUPTI_CHECK(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  } catch (...) {
    g_instance_exists = false;
    throw;
  }
}

CuptiTrace::~CuptiTrace() {
  if (recording_) {  // stop() did not finish: nobody will read these records
    trace_host::recording = false;
    disable_all_quietly();
    reset_buffers(false);
  }
  g_instance_exists = false;
}

void CuptiTrace::start() {
  Collector& c = collector();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    TraceData fresh;
    fresh.thread_names = std::move(c.data.thread_names);
    fresh.main_thread = trace_host::this_thread_id();
    c.data = std::move(fresh);
  }
  trace_buffers::keep();
  for (CUpti_ActivityKind k : kRecordedKinds) CUPTI_CHECK(cuptiActivityEnable(k));
  recording_ = true;
  trace_host::recording = true;
}

void CuptiTrace::stop() {
  if (!recording_) return;
  CUDA_CHECK(cudaDeviceSynchronize());  // every activity of the window has its end time
  trace_host::recording = false;
  for (CUpti_ActivityKind k : kRecordedKinds) CUPTI_CHECK(cuptiActivityDisable(k));
  CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));  // returns after the callbacks ran
  recording_ = false;
  // Every buffer of the window is kept by now. Reading them here, after the window's end, and
  // outside the lock, is what keeps the trace from slowing the steps it records.
  TraceData parsed = trace_buffers::take();
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  c.data.gpu = std::move(parsed.gpu);
  c.data.api_calls = std::move(parsed.api_calls);
  c.data.dropped_records = parsed.dropped_records;
}

TraceSummary CuptiTrace::summary() const {
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  return summarize(c.data);
}

void CuptiTrace::write_chrome_json(const std::string& path) const {
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  write_chrome_trace_file(c.data, path);
}
