// NVTX phase ranges (profiling.h), mirrored into the built-in trace while it records (trace.h).
#include "measure/profiling.h"

#include <nvtx3/nvToolsExt.h>

#include "measure/trace.h"

NvtxRange::NvtxRange(const char* name, uint32_t argb) : argb_(argb) {
  nvtxEventAttributes_t attr = {};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = argb;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = name;
  nvtxRangePushEx(&attr);
  // Without a trace recording, this load is all the range costs beyond NVTX (name_ stays empty).
  recording_ = trace_host::recording.load(std::memory_order_relaxed);
  if (recording_) {
    name_ = name;
    start_ns_ = trace_host::timestamp_ns();  // after the push, so nested API calls fall inside
  }
}

NvtxRange::~NvtxRange() {
  if (recording_) {
    try {
      trace_host::add_range({std::move(name_), argb_, trace_host::this_thread_id(), start_ns_,
                             trace_host::timestamp_ns()});
    } catch (...) {
      // Out of memory while recording a phase: the trace misses one range; unwinding must go on.
    }
  }
  nvtxRangePop();
}

void name_this_thread(const char* name) {
  const uint32_t tid = trace_host::this_thread_id();
  nvtxNameOsThreadA(tid, name);
  trace_host::set_thread_name(tid, name);
}
