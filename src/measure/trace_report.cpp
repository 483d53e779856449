// What a recorded trace says: GPU busy %, idle gaps with their CPU phase, top kernels, and the
// Chrome trace JSON. Pure functions of TraceData (trace.h), so tests feed them synthetic records.
#include "measure/trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <utility>

#include "core/errors.h"

namespace {

constexpr size_t kTopGaps = 5;
constexpr size_t kTopKernels = 10;

double ns_to_ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// "step 12" ranges enclose every phase; a gap is better explained by the phase inside them.
bool is_step_range(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step ") != 0) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string phase_at(const TraceData& data, uint64_t t) {
  const HostRange* open = nullptr;  // innermost: the latest start among those open at t
  const HostRange* before = nullptr;  // else the last one that ended by t
  for (const HostRange& r : data.ranges) {
    if (r.thread != data.main_thread || is_step_range(r.name)) continue;
    if (r.start_ns <= t && t < r.end_ns) {
      if (!open || r.start_ns > open->start_ns ||
          (r.start_ns == open->start_ns && r.end_ns < open->end_ns))
        open = &r;
    } else if (r.end_ns <= t && (!before || r.end_ns > before->end_ns)) {
      before = &r;
    }
  }
  if (open) return open->name;
  if (before) return "after " + before->name;
  return "no range";
}

struct Interval {
  uint64_t start, end;
};

std::string shorten(const std::string& s, size_t max_len) {
  return s.size() <= max_len ? s : s.substr(0, max_len - 3) + "...";
}

}  // namespace

std::string demangle(const char* name) {
  if (!name) return "";
  // Only Itanium-mangled names: __cxa_demangle would read a plain "f" or "i" as a type.
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || !readable) return name;
  std::string out(readable);
  std::free(readable);
  return out;
}

TraceSummary summarize(const TraceData& data) {
  TraceSummary s;
  s.dropped_records = data.dropped_records;
  std::vector<Interval> busy;
  busy.reserve(data.gpu.size());
  for (const GpuActivity& a : data.gpu) busy.push_back({a.start_ns, std::max(a.start_ns, a.end_ns)});
  if (busy.empty()) return s;

  std::sort(busy.begin(), busy.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  const uint64_t first = busy.front().start;
  uint64_t busy_ns = 0;
  std::vector<Interval> gaps;
  Interval cur = busy.front();
  for (size_t i = 1; i < busy.size(); ++i) {
    if (busy[i].start <= cur.end) {
      cur.end = std::max(cur.end, busy[i].end);
      continue;
    }
    busy_ns += cur.end - cur.start;
    gaps.push_back({cur.end, busy[i].start});
    cur = busy[i];
  }
  busy_ns += cur.end - cur.start;
  const uint64_t window_ns = cur.end - first;
  s.window_ms = ns_to_ms(window_ns);
  s.gpu_busy_pct = window_ns ? 100.0 * static_cast<double>(busy_ns) / static_cast<double>(window_ns) : 0.0;

  auto longer = [](const Interval& a, const Interval& b) {
    return a.end - a.start != b.end - b.start ? a.end - a.start > b.end - b.start : a.start < b.start;
  };
  const size_t n_gaps = std::min(kTopGaps, gaps.size());
  std::partial_sort(gaps.begin(), gaps.begin() + n_gaps, gaps.end(), longer);
  for (size_t i = 0; i < n_gaps; ++i)
    s.longest_gaps.push_back(
        {ns_to_ms(gaps[i].start - first), ns_to_ms(gaps[i].end - gaps[i].start), phase_at(data, gaps[i].start)});

  std::map<std::string, std::pair<int, uint64_t>> per_kernel;  // name -> count, total ns
  uint64_t kernel_ns = 0;
  for (const GpuActivity& a : data.gpu) {
    if (a.kind != GpuActivityKind::Kernel) continue;
    const uint64_t ns = a.end_ns > a.start_ns ? a.end_ns - a.start_ns : 0;
    auto& k = per_kernel[a.name];
    k.first += 1;
    k.second += ns;
    kernel_ns += ns;
  }
  for (const auto& [name, k] : per_kernel)
    s.top_kernels.push_back({name, k.first, ns_to_ms(k.second),
                             kernel_ns ? 100.0 * static_cast<double>(k.second) / static_cast<double>(kernel_ns) : 0.0});
  std::sort(s.top_kernels.begin(), s.top_kernels.end(), [](const auto& a, const auto& b) {
    return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
  });
  if (s.top_kernels.size() > kTopKernels) s.top_kernels.resize(kTopKernels);
  return s;
}

std::string TraceSummary::report() const {
  char line[512];
  std::string out;
  if (window_ms <= 0) {
    out = "trace: no GPU activity recorded in the window\n";
  } else {
    std::snprintf(line, sizeof(line), "trace: GPU busy %.1f%% of a %.2f ms window\n", gpu_busy_pct, window_ms);
    out += line;
  }
  if (!longest_gaps.empty()) out += "  longest GPU idle gaps:\n";
  for (const Gap& g : longest_gaps) {
    std::snprintf(line, sizeof(line), "    %9.3f ms at %10.3f ms  (%s)\n", g.length_ms, g.start_ms,
                  shorten(g.phase, 60).c_str());
    out += line;
  }
  if (!top_kernels.empty()) out += "  top kernels by GPU time:\n";
  for (const KernelStat& k : top_kernels) {
    std::snprintf(line, sizeof(line), "    %5.1f%% %10.3f ms %7dx  %s\n", k.pct, k.total_ms, k.count,
                  shorten(k.name, 100).c_str());
    out += line;
  }
  if (dropped_records) {
    std::snprintf(line, sizeof(line),
                  "  warning: CUPTI dropped %llu records (its buffers were full): busy %% and gaps are "
                  "incomplete; trace a shorter window\n",
                  static_cast<unsigned long long>(dropped_records));
    out += line;
  }
  return out;
}

// ---- Chrome trace JSON ----------------------------------------------------------------------------
namespace {

constexpr int kCpuPid = 1;
int gpu_pid(uint32_t device) { return 2 + static_cast<int>(device); }

// Length of the valid UTF-8 sequence at s[i], or 0: a viewer's JSON parser rejects broken UTF-8.
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

void write_string(std::ostream& out, const std::string& s) {
  out << '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = utf8_length(s, i);
      if (n) out.write(s.data() + i, static_cast<std::streamsize>(n));
      else out << "\\ufffd";
      i += n ? n : 1;
      continue;
    }
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\b': out << "\\b"; break;
      case '\f': out << "\\f"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04x", c);
          out << esc;
        } else {
          out << static_cast<char>(c);
        }
    }
    ++i;
  }
  out << '"';
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

const char* copy_name(CopyKind k) {
  switch (k) {
    case CopyKind::HostToDevice: return "HtoD";
    case CopyKind::DeviceToHost: return "DtoH";
    case CopyKind::DeviceToDevice: return "DtoD";
    case CopyKind::HostToHost: return "HtoH";
    case CopyKind::PeerToPeer: return "PtoP";
    case CopyKind::None: break;
  }
  return "other";
}

const char* host_memory_name(HostMemory m) {
  switch (m) {
    case HostMemory::Pageable: return "pageable";
    case HostMemory::Pinned: return "pinned";
    case HostMemory::Other: return "other";
    case HostMemory::None: break;
  }
  return "";
}

// Writes events one per line, with the commas between them.
class EventWriter {
 public:
  EventWriter(std::ostream& out, uint64_t t0) : out_(out), t0_(t0) {}

  void metadata(int pid, const char* what, const std::string& name) {
    begin();
    out_ << "{\"ph\":\"M\",\"pid\":" << pid << ",\"name\":\"" << what << "\",\"args\":{\"name\":";
    write_string(out_, name);
    out_ << "}}";
  }
  void metadata(int pid, uint32_t tid, const char* what, const std::string& name) {
    begin();
    out_ << "{\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << tid << ",\"name\":\"" << what
         << "\",\"args\":{\"name\":";
    write_string(out_, name);
    out_ << "}}";
  }
  void sort_index(int pid, const char* what, int index) {
    begin();
    out_ << "{\"ph\":\"M\",\"pid\":" << pid << ",\"name\":\"" << what << "\",\"args\":{\"sort_index\":" << index << "}}";
  }
  void thread_sort_index(int pid, uint32_t tid, int index) {
    begin();
    out_ << "{\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << tid
         << ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" << index << "}}";
  }
  // A complete ("X") event; args is the inside of the args object, already JSON.
  void complete(int pid, uint32_t tid, const std::string& name, const char* cat, uint64_t start_ns,
                uint64_t end_ns, const std::string& args) {
    begin();
    out_ << "{\"ph\":\"X\",\"pid\":" << pid << ",\"tid\":" << tid << ",\"name\":";
    write_string(out_, name);
    const uint64_t dur_ns = end_ns > start_ns ? end_ns - start_ns : 0;
    out_ << ",\"cat\":\"" << cat << "\",\"ts\":" << fixed(static_cast<double>(start_ns - t0_) / 1e3, 3)
         << ",\"dur\":" << fixed(static_cast<double>(dur_ns) / 1e3, 3) << ",\"args\":{" << args << "}}";
  }

 private:
  void begin() {
    out_ << (first_ ? "\n" : ",\n");
    first_ = false;
  }
  std::ostream& out_;
  uint64_t t0_;
  bool first_ = true;
};

std::string triple(const int v[3]) {
  return "[" + std::to_string(v[0]) + "," + std::to_string(v[1]) + "," + std::to_string(v[2]) + "]";
}

std::string gpu_args(const GpuActivity& a) {
  std::string args = "\"correlation\":" + std::to_string(a.correlation);
  if (a.kind == GpuActivityKind::Kernel)
    return args + ",\"grid\":" + triple(a.grid) + ",\"block\":" + triple(a.block);
  args += ",\"bytes\":" + std::to_string(a.bytes);
  if (a.kind == GpuActivityKind::Memcpy) {
    args += std::string(",\"kind\":\"") + copy_name(a.copy) + "\"";
    if (a.host_memory != HostMemory::None) args += std::string(",\"host memory\":\"") + host_memory_name(a.host_memory) + "\"";
    if (a.end_ns > a.start_ns)  // bytes per ns is GB/s
      args += ",\"GB/s\":" + fixed(static_cast<double>(a.bytes) / static_cast<double>(a.end_ns - a.start_ns), 2);
  }
  return args;
}

const char* gpu_category(GpuActivityKind k) {
  switch (k) {
    case GpuActivityKind::Kernel: return "kernel";
    case GpuActivityKind::Memcpy: return "memcpy";
    case GpuActivityKind::Memset: return "memset";
  }
  return "gpu";
}

}  // namespace

void write_chrome_trace(const TraceData& data, std::ostream& out) {
  uint64_t t0 = UINT64_MAX;
  for (const auto& a : data.gpu) t0 = std::min(t0, a.start_ns);
  for (const auto& r : data.ranges) t0 = std::min(t0, r.start_ns);
  for (const auto& c : data.api_calls) t0 = std::min(t0, c.start_ns);
  if (t0 == UINT64_MAX) t0 = 0;

  // Rows: CPU threads (main first, then by name) and GPU streams (by id).
  std::set<uint32_t> thread_set;
  for (const auto& r : data.ranges) thread_set.insert(r.thread);
  for (const auto& c : data.api_calls) thread_set.insert(c.thread);
  const auto thread_name = [&](uint32_t tid) {
    const auto it = data.thread_names.find(tid);
    return it != data.thread_names.end() ? it->second : "thread " + std::to_string(tid);
  };
  std::vector<uint32_t> threads(thread_set.begin(), thread_set.end());
  std::stable_sort(threads.begin(), threads.end(), [&](uint32_t a, uint32_t b) {
    if ((a == data.main_thread) != (b == data.main_thread)) return a == data.main_thread;
    return thread_name(a) < thread_name(b);
  });
  std::set<std::pair<uint32_t, uint32_t>> streams;  // device, stream
  for (const auto& a : data.gpu) streams.insert({a.device, a.stream});

  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  EventWriter w(out, t0);
  w.metadata(kCpuPid, "process_name", "CPU");
  w.sort_index(kCpuPid, "process_sort_index", 0);
  for (size_t i = 0; i < threads.size(); ++i) {
    w.metadata(kCpuPid, threads[i], "thread_name", thread_name(threads[i]));
    w.thread_sort_index(kCpuPid, threads[i], static_cast<int>(i));
  }
  std::set<uint32_t> devices_named;
  for (const auto& [device, stream] : streams) {
    if (devices_named.insert(device).second) {
      w.metadata(gpu_pid(device), "process_name", "GPU " + std::to_string(device));
      w.sort_index(gpu_pid(device), "process_sort_index", gpu_pid(device));
    }
    w.metadata(gpu_pid(device), stream, "thread_name", "stream " + std::to_string(stream));
    w.thread_sort_index(gpu_pid(device), stream, static_cast<int>(stream));
  }

  char color[32];
  for (const auto& r : data.ranges) {
    std::snprintf(color, sizeof(color), "\"color\":\"#%06X\"", r.argb & 0xFFFFFFu);
    w.complete(kCpuPid, r.thread, r.name, "nvtx", r.start_ns, r.end_ns, color);
  }
  for (const auto& c : data.api_calls)
    w.complete(kCpuPid, c.thread, c.name, "cuda_api", c.start_ns, c.end_ns,
               "\"correlation\":" + std::to_string(c.correlation));
  for (const auto& a : data.gpu)
    w.complete(gpu_pid(a.device), a.stream, a.name, gpu_category(a.kind), a.start_ns, a.end_ns, gpu_args(a));
  out << "\n]}\n";
}

void write_chrome_trace_file(const TraceData& data, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError("cannot write trace file '" + path + "': " + std::strerror(errno));
  write_chrome_trace(data, out);
  out.flush();
  if (!out) throw InputError("writing trace file '" + path + "' failed (disk full?): " + std::strerror(errno));
}
