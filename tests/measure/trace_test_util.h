// What the trace tests share: synthetic GPU and host records far from time zero, and the rows of a
// Chrome trace (which process and thread an event is drawn on) read back through the strict parser.
// Header-only (inline), so each test file includes it and nothing changes in the Makefile.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "measure/profiling.h"
#include "measure/trace.h"
#include "strict_json.h"

namespace trace_test {

// ---- synthetic records ----------------------------------------------------------------------------

// Far from zero, so that every output time has to be relative.
constexpr uint64_t kBase = 1'700'000'000'000'000'000ull;
inline uint64_t us(double t) { return kBase + static_cast<int64_t>(t * 1000); }

constexpr uint32_t kMain = 4242, kLoader = 4243;

inline GpuActivity kernel(const std::string& name, double start_us, double end_us, uint32_t stream = 7) {
  GpuActivity a;
  a.kind = GpuActivityKind::Kernel;
  a.name = name;
  a.start_ns = us(start_us);
  a.end_ns = us(end_us);
  a.stream = stream;
  a.grid[0] = 2, a.grid[1] = 1, a.grid[2] = 1;
  a.block[0] = 256, a.block[1] = 1, a.block[2] = 1;
  return a;
}

inline GpuActivity copy_h2d(double start_us, double end_us, uint64_t bytes, uint32_t stream) {
  GpuActivity a;
  a.kind = GpuActivityKind::Memcpy;
  a.name = "memcpy HtoD";
  a.copy = CopyKind::HostToDevice;
  a.host_memory = HostMemory::Pinned;
  a.bytes = bytes;
  a.start_ns = us(start_us);
  a.end_ns = us(end_us);
  a.stream = stream;
  return a;
}

inline HostRange range(const std::string& name, uint32_t thread, double start_us, double end_us) {
  return {name, phase_color::kGreen, thread, us(start_us), us(end_us)};
}

// ---- reading a Chrome trace back ------------------------------------------------------------------

// The event matching ph, pid-name, tid-name and name, via the metadata rows.
struct Rows {
  std::map<int, std::string> process;
  std::map<std::pair<int, long>, std::string> thread;
  explicit Rows(const Json& events) {
    for (const Json& e : events.items) {
      if (e.at("ph").str != "M") continue;
      const int pid = static_cast<int>(e.at("pid").number);
      if (e.at("name").str == "process_name") process[pid] = e.at("args").at("name").str;
      if (e.at("name").str == "thread_name")
        thread[{pid, static_cast<long>(e.at("tid").number)}] = e.at("args").at("name").str;
    }
  }
  std::string row(const Json& e) const {
    const int pid = static_cast<int>(e.at("pid").number);
    const auto p = process.find(pid);
    const auto t = thread.find({pid, static_cast<long>(e.at("tid").number)});
    return (p == process.end() ? "?" : p->second) + "/" + (t == thread.end() ? "?" : t->second);
  }
};

inline const Json* find_event(const Json& events, const std::string& name) {
  for (const Json& e : events.items)
    if (e.at("ph").str == "X" && e.at("name").str == name) return &e;
  return nullptr;
}

}  // namespace trace_test
