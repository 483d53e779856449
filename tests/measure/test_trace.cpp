// The built-in timeline: summary and Chrome JSON on synthetic records (CPU), CUPTI's buffer hand-over
// on hand-made activity buffers (CPU), and one CUPTI recording of a real kernel and memcpy (GPU).
#include <gtest/gtest.h>

#include <cupti.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/handles.h"
#include "measure/profiling.h"
#include "measure/trace.h"

namespace {

// ---- a strict JSON parser, so the output is checked as a viewer would read it ---------------------

struct Json {
  enum Type { Null, Bool, Number, String, Array, Object } type = Null;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* get(const std::string& key) const {
    for (const auto& f : fields)
      if (f.first == key) return &f.second;
    return nullptr;
  }
  const Json& at(const std::string& key) const {
    const Json* v = get(key);
    if (!v) throw std::runtime_error("missing key " + key);
    return *v;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  Json parse_document() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("text after the top-level value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(i_) + ": " + why);
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  void literal(const char* word) {
    for (const char* p = word; *p; ++p, ++i_)
      if (i_ >= s_.size() || s_[i_] != *p) fail(std::string("expected ") + word);
  }

  Json value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Object;
      ++i_;
      if (eat('}')) return v;
      do {
        space();
        std::string key = string();
        expect(':');
        v.fields.emplace_back(std::move(key), value());
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      v.type = Json::Array;
      ++i_;
      if (eat(']')) return v;
      do v.items.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.type = Json::String;
      v.str = string();
    } else if (c == 't' || c == 'f') {
      v.type = Json::Bool;
      v.boolean = c == 't';
      literal(v.boolean ? "true" : "false");
    } else if (c == 'n') {
      literal("null");
    } else {
      v.type = Json::Number;
      v.number = number();
    }
    return v;
  }

  double number() {
    const size_t start = i_;
    const auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == from) fail("expected a digit");
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') ++i_;  // no leading zeros
    else digits();
    if (i_ < s_.size() && s_[i_] == '.') ++i_, digits();
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      digits();
    }
    return std::stod(s_.substr(start, i_ - start));
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      const char h = s_[i_];
      v = v * 16 + (h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : (fail("bad hex digit"), 0));
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Raw bytes >= 0x80 must form valid UTF-8 (RFC 8259 section 8.1).
  void utf8_sequence(std::string& out) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s_[k]); };
    const unsigned char c = byte(i_);
    size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n == 0 || i_ + n > s_.size()) fail("invalid UTF-8");
    for (size_t k = 1; k < n; ++k)
      if (byte(i_ + k) < 0x80 || byte(i_ + k) > 0xBF) fail("invalid UTF-8 continuation");
    out.append(s_, i_, n);
    i_ += n;
  }

  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') return ++i_, out;
      if (c < 0x20) fail("raw control character in a string");
      if (c >= 0x80) {
        utf8_sequence(out);
        continue;
      }
      ++i_;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
            if (s_.compare(i_, 2, "\\u") != 0) fail("lone high surrogate");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape \\") + e);
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
};

Json parse_json(const std::string& text) { return JsonParser(text).parse_document(); }

TEST(TraceJsonParser, RejectsWhatViewersReject) {
  EXPECT_NO_THROW(parse_json(R"({"a":[1,-2.5e3,true,null,"x\u00e9\ud83d\ude00"]})"));
  EXPECT_THROW(parse_json(R"({"a":1,})"), std::runtime_error);
  EXPECT_THROW(parse_json("[\"tab\there\"]"), std::runtime_error);
  EXPECT_THROW(parse_json(R"(["\x"])"), std::runtime_error);
  EXPECT_THROW(parse_json("[\"\xff\"]"), std::runtime_error);
  EXPECT_THROW(parse_json("[01]"), std::runtime_error);
  EXPECT_THROW(parse_json("[1] 2"), std::runtime_error);
}

// ---- synthetic records ----------------------------------------------------------------------------

// Far from zero, so that every output time has to be relative.
constexpr uint64_t kBase = 1'700'000'000'000'000'000ull;
uint64_t us(double t) { return kBase + static_cast<int64_t>(t * 1000); }

constexpr uint32_t kMain = 4242, kLoader = 4243;

GpuActivity kernel(const std::string& name, double start_us, double end_us, uint32_t stream = 7) {
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

GpuActivity copy_h2d(double start_us, double end_us, uint64_t bytes, uint32_t stream) {
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

HostRange range(const std::string& name, uint32_t thread, double start_us, double end_us) {
  return {name, phase_color::kGreen, thread, us(start_us), us(end_us)};
}

TEST(TraceSummary, BusyPercentIsTheUnionOverTwoStreams) {
  TraceData d;
  d.gpu = {kernel("a", 0, 100, 7), kernel("a", 300, 400, 7), kernel("b", 50, 150, 13),
           kernel("b", 350, 380, 13), copy_h2d(600, 700, 4096, 13)};
  // Union: [0,150] + [300,400] + [600,700] = 350 us of 700 us.
  const TraceSummary s = summarize(d);
  EXPECT_NEAR(s.window_ms, 0.7, 1e-12);
  EXPECT_NEAR(s.gpu_busy_pct, 50.0, 1e-9);
}

TEST(TraceSummary, BusyPercentOfDisjointAndNestedIntervals) {
  TraceData disjoint;
  disjoint.gpu = {kernel("a", 0, 100, 7), kernel("b", 200, 300, 13)};
  EXPECT_NEAR(summarize(disjoint).gpu_busy_pct, 200.0 / 3.0, 1e-9);

  TraceData nested;  // one long kernel hides a short one on another stream
  nested.gpu = {kernel("long", 0, 1000, 7), kernel("short", 100, 200, 13), kernel("same", 0, 1000, 14)};
  EXPECT_NEAR(summarize(nested).gpu_busy_pct, 100.0, 1e-9);
  EXPECT_TRUE(summarize(nested).longest_gaps.empty());
}

TEST(TraceSummary, WindowIsFirstGpuStartToLastGpuEnd) {
  TraceData d;
  // The last to start is not the last to end; host records outside the GPU span do not count.
  d.gpu = {kernel("late", 100, 200, 13), kernel("long", 20, 900, 7)};
  d.ranges = {range("step 1", kMain, 0, 2000)};
  d.api_calls = {{"cudaLaunchKernel", kMain, us(5), us(6), 1}};
  const TraceSummary s = summarize(d);
  EXPECT_NEAR(s.window_ms, 0.88, 1e-12);
  EXPECT_NEAR(s.gpu_busy_pct, 100.0, 1e-9);
}

TEST(TraceSummary, EmptyTraceHasNoWindow) {
  const TraceSummary s = summarize(TraceData{});
  EXPECT_EQ(s.window_ms, 0.0);
  EXPECT_EQ(s.gpu_busy_pct, 0.0);
  EXPECT_TRUE(s.longest_gaps.empty());
  EXPECT_TRUE(s.top_kernels.empty());
  EXPECT_NE(s.report().find("no GPU activity"), std::string::npos);
}

TEST(TraceSummary, LongestGapsWithTheirPhase) {
  TraceData d;
  d.main_thread = kMain;
  // Gaps: 10@10, 30@30, 80@70, 240@160, 10@410, 5@425, 5@440 (length@start, us).
  d.gpu = {kernel("k", 0, 10),    kernel("k", 20, 30),   kernel("k", 60, 70),   kernel("k", 150, 160),
           kernel("k", 400, 410), kernel("k", 420, 425), kernel("k", 430, 440), kernel("k", 445, 450)};
  d.ranges = {
      range("step 3", kMain, 0, 405),
      range("forward", kMain, 0, 15),
      range("loss stats", kMain, 25, 60),  // nested in "step 3": the gap at 30 is "loss stats"
      range("optimizer step", kMain, 100, 170),
      range("sgd update", kMain, 150, 165),  // innermost of two open at 160
      range("step 4", kMain, 405, 1000),
      range("get batch", kLoader, 150, 420),  // another thread: never the phase
  };
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.longest_gaps.size(), 5u);
  const struct {
    double start_ms, length_ms;
    const char* phase;
  } want[] = {{0.160, 0.240, "sgd update"},
              {0.070, 0.080, "after loss stats"},
              {0.030, 0.030, "loss stats"},
              {0.010, 0.010, "forward"},
              {0.410, 0.010, "after optimizer step"}};
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(s.longest_gaps[i].start_ms, want[i].start_ms, 1e-12);
    EXPECT_NEAR(s.longest_gaps[i].length_ms, want[i].length_ms, 1e-12);
    EXPECT_EQ(s.longest_gaps[i].phase, want[i].phase);
  }
}

TEST(TraceSummary, GapWithNoRangeSaysSo) {
  TraceData d;
  d.main_thread = kMain;
  d.gpu = {kernel("k", 0, 10), kernel("k", 20, 30)};
  d.ranges = {range("get batch", kLoader, 0, 30), range("step 1", kMain, 0, 30)};
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  EXPECT_EQ(s.longest_gaps[0].phase, "no range");
}

TEST(TraceSummary, TopKernelsByTotalTime) {
  TraceData d;
  d.gpu = {kernel("b", 0, 10),  kernel("b", 10, 20), kernel("b", 20, 30), kernel("a", 30, 45),
           kernel("a", 45, 60), kernel("c", 60, 100), copy_h2d(100, 300, 1 << 20, 13)};
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.top_kernels.size(), 3u);  // the memcpy is not a kernel
  EXPECT_EQ(s.top_kernels[0].name, "c");
  EXPECT_EQ(s.top_kernels[0].count, 1);
  EXPECT_NEAR(s.top_kernels[0].total_ms, 0.040, 1e-12);
  EXPECT_NEAR(s.top_kernels[0].pct, 40.0, 1e-9);
  EXPECT_EQ(s.top_kernels[1].name, "a");  // ties with "b" on time: by name
  EXPECT_EQ(s.top_kernels[1].count, 2);
  EXPECT_NEAR(s.top_kernels[1].pct, 30.0, 1e-9);
  EXPECT_EQ(s.top_kernels[2].name, "b");
  EXPECT_EQ(s.top_kernels[2].count, 3);
  EXPECT_NEAR(s.top_kernels[2].total_ms, 0.030, 1e-12);
}

TEST(TraceSummary, KeepsTheTenLongestKernels) {
  TraceData d;
  for (int i = 0; i < 12; ++i) d.gpu.push_back(kernel("k" + std::to_string(i), i * 100, i * 100 + 1 + i));
  const TraceSummary s = summarize(d);
  ASSERT_EQ(s.top_kernels.size(), 10u);
  EXPECT_EQ(s.top_kernels.front().name, "k11");
  EXPECT_EQ(s.top_kernels.back().name, "k2");
}

TEST(TraceSummary, ReportNamesTheNumbers) {
  TraceData d;
  d.main_thread = kMain;
  d.gpu = {kernel("void conv<float>(float const*)", 0, 100), kernel("relu", 300, 400)};
  d.ranges = {range("loss stats", kMain, 50, 350)};
  d.dropped_records = 3;
  const std::string r = summarize(d).report();
  EXPECT_NE(r.find("GPU busy 50.0%"), std::string::npos) << r;
  EXPECT_NE(r.find("0.40 ms window"), std::string::npos) << r;
  EXPECT_NE(r.find("loss stats"), std::string::npos) << r;
  EXPECT_NE(r.find("void conv<float>(float const*)"), std::string::npos) << r;
  EXPECT_NE(r.find("dropped 3 records"), std::string::npos) << r;
}

TEST(TraceDemangle, ReadableKernelNames) {
  EXPECT_EQ(demangle("_Z6kernelPfi"), "kernel(float*, int)");
  EXPECT_EQ(demangle("_Z4convIfEvPKT_"), "void conv<float>(float const*)");
  EXPECT_EQ(demangle("f"), "f");  // a C-named kernel is not the type "float"
  EXPECT_EQ(demangle("_Z!!"), "_Z!!");
  EXPECT_EQ(demangle(nullptr), "");
}

// ---- Chrome trace JSON ----------------------------------------------------------------------------

TraceData two_thread_trace() {
  TraceData d;
  d.main_thread = kMain;
  d.thread_names = {{kMain, "main"}, {kLoader, "loader 0"}, {999, "idle thread"}};
  d.api_calls = {{"cudaMemcpyAsync", kMain, us(-5), us(-4), 11}, {"cudaLaunchKernel", 777, us(1), us(2), 12}};
  d.ranges = {range("step 3", kMain, -6, 500), range("forward", kMain, -5.5, 200),
              range("get batch", kLoader, 10, 30)};
  d.gpu = {copy_h2d(0, 100, 4096, 13), kernel("void relu<float>(float*, int)", 100, 150, 7)};
  d.gpu.back().correlation = 12;
  return d;
}

std::string chrome_json(const TraceData& d) {
  std::ostringstream out;
  write_chrome_trace(d, out);
  return out.str();
}

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

const Json* find_event(const Json& events, const std::string& name) {
  for (const Json& e : events.items)
    if (e.at("ph").str == "X" && e.at("name").str == name) return &e;
  return nullptr;
}

TEST(TraceChromeJson, ParsesWithRowsForThreadsAndStreams) {
  const Json root = parse_json(chrome_json(two_thread_trace()));
  ASSERT_EQ(root.type, Json::Object);
  const Json& events = root.at("traceEvents");
  ASSERT_EQ(events.type, Json::Array);
  const Rows rows(events);

  int complete = 0;
  for (const Json& e : events.items) {
    const std::string ph = e.at("ph").str;
    ASSERT_TRUE(ph == "X" || ph == "M") << ph;
    if (ph != "X") continue;
    ++complete;
    EXPECT_EQ(e.at("ts").type, Json::Number);
    EXPECT_GE(e.at("ts").number, 0.0);
    EXPECT_GE(e.at("dur").number, 0.0);
  }
  EXPECT_EQ(complete, 7);

  // One process for the CPU with a row per thread, one for the GPU with a row per stream.
  EXPECT_EQ(rows.row(*find_event(events, "forward")), "CPU/main");
  EXPECT_EQ(rows.row(*find_event(events, "step 3")), "CPU/main");
  EXPECT_EQ(rows.row(*find_event(events, "cudaMemcpyAsync")), "CPU/main");
  EXPECT_EQ(rows.row(*find_event(events, "get batch")), "CPU/loader 0");
  EXPECT_EQ(rows.row(*find_event(events, "cudaLaunchKernel")), "CPU/thread 777");
  EXPECT_EQ(rows.row(*find_event(events, "memcpy HtoD")), "GPU 0/stream 13");
  EXPECT_EQ(rows.row(*find_event(events, "void relu<float>(float*, int)")), "GPU 0/stream 7");
  for (const auto& [key, name] : rows.thread) EXPECT_NE(name, "idle thread");  // no events, no row

  // Microseconds from the earliest record (the "step 3" range at -6 us).
  const Json& k = *find_event(events, "void relu<float>(float*, int)");
  EXPECT_NEAR(k.at("ts").number, 106.0, 1e-9);
  EXPECT_NEAR(k.at("dur").number, 50.0, 1e-9);
  EXPECT_EQ(k.at("cat").str, "kernel");
  EXPECT_EQ(k.at("args").at("correlation").number, 12);
  ASSERT_EQ(k.at("args").at("grid").items.size(), 3u);
  EXPECT_EQ(k.at("args").at("grid").items[0].number, 2);
  EXPECT_EQ(k.at("args").at("block").items[0].number, 256);
  EXPECT_EQ(find_event(events, "step 3")->at("ts").number, 0.0);
  EXPECT_NEAR(find_event(events, "forward")->at("ts").number, 0.5, 1e-9);

  const Json& m = *find_event(events, "memcpy HtoD");
  EXPECT_EQ(m.at("args").at("bytes").number, 4096);
  EXPECT_EQ(m.at("args").at("kind").str, "HtoD");
  EXPECT_EQ(m.at("args").at("host memory").str, "pinned");
  EXPECT_EQ(find_event(events, "forward")->at("args").at("color").str, "#43A047");
}

TEST(TraceChromeJson, MainThreadRowComesFirst) {
  const Json events = parse_json(chrome_json(two_thread_trace())).at("traceEvents");
  for (const Json& e : events.items) {
    if (e.at("name").str != "thread_sort_index" || e.at("pid").number != 1) continue;
    if (e.at("tid").number == kMain) EXPECT_EQ(e.at("args").at("sort_index").number, 0);
    else EXPECT_GT(e.at("args").at("sort_index").number, 0);
  }
}

TEST(TraceChromeJson, EscapesAwkwardNames) {
  const std::vector<std::string> names = {
      "quote\" and back\\slash",
      std::string("controls \x01\x1f\n\t\r\b\f end"),
      "void f<int, float>(S<1>, char const*) [clone .cold]",
      "comma,[bracket]{brace}:colon",
      "utf-8 \xc3\xa9 \xe5\x90\x8d \xf0\x9f\x98\x80",
      "",
  };
  TraceData d;
  d.main_thread = kMain;
  d.thread_names = {{kMain, "main \"thread\"\n"}};
  for (size_t i = 0; i < names.size(); ++i) {
    d.gpu.push_back(kernel(names[i], i * 10.0, i * 10.0 + 5));
    d.ranges.push_back(range(names[i], kMain, i * 10.0, i * 10.0 + 5));
  }
  const std::string text = chrome_json(d);
  for (char c : text) EXPECT_FALSE(c != '\n' && static_cast<unsigned char>(c) < 0x20) << int(c);
  const Json events = parse_json(text).at("traceEvents");
  std::multiset<std::string> seen;
  for (const Json& e : events.items)
    if (e.at("ph").str == "X") seen.insert(e.at("name").str);
  for (const std::string& n : names) EXPECT_EQ(seen.count(n), 2u) << n;
  const Rows rows(events);
  EXPECT_EQ(rows.row(*find_event(events, names[0])), "CPU/main \"thread\"\n");
}

TEST(TraceChromeJson, ReplacesBrokenUtf8) {
  TraceData d;
  d.gpu = {kernel("bad\xff\xc0x", 0, 1), kernel("cut \xe2\x82", 1, 2), kernel("surrogate \xed\xa0\x80", 2, 3)};
  const Json events = parse_json(chrome_json(d)).at("traceEvents");
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_NE(find_event(events, "bad" + fffd + fffd + "x"), nullptr);
  EXPECT_NE(find_event(events, "cut " + fffd + fffd), nullptr);
  EXPECT_NE(find_event(events, "surrogate " + fffd + fffd + fffd), nullptr);
}

TEST(TraceChromeJson, EmptyTraceIsStillValid) {
  const Json root = parse_json(chrome_json(TraceData{}));
  EXPECT_EQ(root.at("traceEvents").type, Json::Array);
}

TEST(TraceChromeJson, WritesAFile) {
  const std::string path = ::testing::TempDir() + "trace_test_" + std::to_string(::getpid()) + ".json";
  write_chrome_trace_file(two_thread_trace(), path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  EXPECT_EQ(parse_json(text.str()).at("traceEvents").items.size(), parse_json(chrome_json(two_thread_trace())).at("traceEvents").items.size());
}

TEST(TraceChromeJson, UnwritablePathIsAnInputErrorNamingIt) {
  const std::string path = "/nonexistent-trace-dir/sub/trace.json";
  try {
    write_chrome_trace_file(two_thread_trace(), path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_chrome_trace_file(two_thread_trace(), ::testing::TempDir()), InputError);  // a directory
}

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

// ---- CUPTI on a real GPU --------------------------------------------------------------------------

TEST(TraceGpu, RecordsKernelMemcpyAndPhase) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: the CUPTI trace needs a GPU";
  name_this_thread("main");
  CuptiTrace trace;
  CublasHandle cublas;  // created before the window: its set-up is not what is traced
  const int n = 1 << 20;
  float* raw = nullptr;
  CUDA_CHECK(cudaMalloc(&raw, n * sizeof(float)));
  std::unique_ptr<float, decltype(&cudaFree)> d(raw, &cudaFree);
  std::vector<float> h(n, 1.0f);

  trace.start();
  {
    NvtxRange phase("scale on GPU", phase_color::kCyan);
    CUDA_CHECK(cudaMemcpy(d.get(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    const float alpha = 2.0f;
    CUBLAS_CHECK(cublasSscal(cublas, n, &alpha, d.get(), 1));  // a kernel without nvcc in tests/
    CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  trace.stop();
  EXPECT_EQ(h[0], 2.0f);

  const TraceSummary s = trace.summary();
  EXPECT_GT(s.gpu_busy_pct, 0.0);
  EXPECT_LE(s.gpu_busy_pct, 100.0);
  EXPECT_GT(s.window_ms, 0.0);
  ASSERT_FALSE(s.top_kernels.empty());
  EXPECT_EQ(s.dropped_records, 0u);

  const std::string path = ::testing::TempDir() + "trace_gpu_" + std::to_string(::getpid()) + ".json";
  trace.write_chrome_json(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  const Json events = parse_json(text.str()).at("traceEvents");
  const Rows rows(events);
  int kernels = 0, h2d = 0, d2h = 0, memcpy_calls = 0;
  for (const Json& e : events.items) {
    if (e.at("ph").str != "X") continue;
    const std::string cat = e.at("cat").str, name = e.at("name").str;
    if (cat == "kernel") {
      ++kernels;
      EXPECT_EQ(rows.row(e).substr(0, 13), "GPU 0/stream ");
    }
    if (name == "memcpy HtoD") {
      ++h2d;
      EXPECT_EQ(e.at("args").at("bytes").number, static_cast<double>(n * sizeof(float)));
    }
    if (name == "memcpy DtoH") ++d2h;
    if (name == "cudaMemcpy") {
      ++memcpy_calls;
      EXPECT_EQ(rows.row(e), "CPU/main");
    }
  }
  EXPECT_GE(kernels, 1);
  EXPECT_EQ(h2d, 1);
  EXPECT_EQ(d2h, 1);
  EXPECT_EQ(memcpy_calls, 2);
  const Json* phase = find_event(events, "scale on GPU");
  ASSERT_NE(phase, nullptr);
  EXPECT_EQ(rows.row(*phase), "CPU/main");
}

}  // namespace
