// The Chrome trace JSON (trace.h) on synthetic records, read back through a strict parser as a
// viewer would: rows for threads and streams, relative times, escaping, broken UTF-8, the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/errors.h"
#include "measure/trace.h"
#include "trace_test_util.h"

namespace {

using namespace trace_test;  // parse_json, Json, Rows, find_event, the synthetic records

TEST(TraceJsonParser, RejectsWhatViewersReject) {
  EXPECT_NO_THROW(parse_json(R"({"a":[1,-2.5e3,true,null,"x\u00e9\ud83d\ude00"]})"));
  EXPECT_THROW(parse_json(R"({"a":1,})"), std::runtime_error);
  EXPECT_THROW(parse_json("[\"tab\there\"]"), std::runtime_error);
  EXPECT_THROW(parse_json(R"(["\x"])"), std::runtime_error);
  EXPECT_THROW(parse_json("[\"\xff\"]"), std::runtime_error);
  EXPECT_THROW(parse_json("[01]"), std::runtime_error);
  EXPECT_THROW(parse_json("[1] 2"), std::runtime_error);
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

}  // namespace
