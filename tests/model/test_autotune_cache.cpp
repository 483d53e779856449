// The conv-algorithm cache file: exact round trips, a corrupt file ignored with a warning (and
// rewritten on save), entries of other GPUs/builds kept but never used, and the notice armed
// around a first start's measuring.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/autotune_cache.h"
#include "core/elapsed.h"
#include "core/errors.h"
#include "core/file_io.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using test_files::TempDir;
using test_files::temporary_files_of;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const std::string kHere = "gpu=NVIDIA H100 80GB HBM3;cudnn=91400;precision=fp16;layout=NHWC;deterministic=0;workspace_mb=1024";
const std::string kOther = "gpu=NVIDIA A100-SXM4-40GB;cudnn=90100;precision=fp32;layout=NCHW;deterministic=1;workspace_mb=256";
const char* kHeaderLine = "resnet-trainer autotune cache v2\n";

ConvAlgos algos(int seed) {
  // Times with at most 6 significant digits, as the file stores them. Odd seeds hold graph-API
  // engine tags, even ones the legacy API's algorithm numbers.
  auto algo = [&](int i) { return seed % 2 ? "eng" + std::to_string(i) + "_k2=" + std::to_string(seed) : std::to_string(i); };
  return {{algo(seed % 8), 1, size_t(seed) * 4096, 0.0412f},
          {algo((seed + 1) % 8), 0, 0, -1.f},
          {algo((seed + 2) % 8), 2, (size_t(5) << 32) + seed, 12.5f}};  // a workspace above 4 GiB
}

AutotuneEntries sample_entries() {
  AutotuneEntries e;
  e[kHere].fused["fused.conv-bn-relu.n256.c64.h32.w32.k64.r3.s1.p1"] = {"eng31_k2=1_k25=0", 1, 0, 0.0541f, 0.0612f};
  e[kHere].fused["fused.conv-stats.n128.c64.h32.w32.k64.r1.s1.p0"] = {"eng97", 0, 4096, 0.125f};
  e[kHere].fused["fused.gemm-bn-relu.n128.c64.h32.w32.k256.r1.s1.p0"] = {"lt3", 0, 0, 0.02f, 0.03f};
  e[kHere].convs["n128.c64.h32.w32.k64.r3.s1.p1"] = algos(1);
  e[kHere].convs["n128.c256.h8.w8.k512.r1.s2.p0"] = algos(2);
  e[kOther].convs["n128.c64.h32.w32.k64.r3.s1.p1"] = algos(3);
  return e;
}

TEST(AutotuneCacheFile, FormatParseRoundTrip) {
  const AutotuneEntries e = sample_entries();
  const std::string text = format_autotune_cache(e);
  EXPECT_EQ(text.rfind(kHeaderLine, 0), 0u) << text;
  EXPECT_EQ(parse_autotune_cache(text, "c.txt"), e);
  EXPECT_EQ(format_autotune_cache(parse_autotune_cache(text, "c.txt")), text);
}

TEST(AutotuneCacheFile, MeasuredTimesKeepSixSignificantDigits) {
  AutotuneEntries e;
  e[kHere].convs["s"] = {{"3", 1, 0, 0.123456789f}, {"1", 0, 0, 1234.5678f}, {"2", 0, 0, 3.3333333e-5f}};
  const ConvAlgos back = parse_autotune_cache(format_autotune_cache(e), "c.txt").at(kHere).convs.at("s");
  EXPECT_NEAR(back.fwd.ms, 0.123456789f, 1e-6f);
  EXPECT_NEAR(back.bwd_data.ms, 1234.5678f, 1e-2f);
  EXPECT_NEAR(back.bwd_filter.ms, 3.3333333e-5f, 1e-10f);
  EXPECT_EQ(back.fwd.algo, "3");
  EXPECT_EQ(back.fwd.math, 1);
}

// A graph-API choice is cudnn-frontend's engine tag: the engine's global index and its knobs, as
// many as cuDNN gives it (negative knob values included).
TEST(AutotuneCacheFile, EngineTagsRoundTrip) {
  AutotuneEntries e;
  e[kHere].convs["s"] = {{"eng67_k2=3_k13=1_k18=0_k25=0_k27=2_k28=1", 0, 0, 0.5f},
                         {"eng130", 0, 0, 0.25f},
                         {"eng62_k2=-1", 0, 1024, 1.f}};
  EXPECT_EQ(parse_autotune_cache(format_autotune_cache(e), "c.txt"), e);
}

TEST(AutotuneCacheFile, ReadsTheDocumentedFusedLine) {
  const std::string text = std::string(kHeaderLine) + "[" + kHere + "]\n" +
                           "fused.conv-bn-relu.n256.c64.h32.w32.k64.r3.s1.p1 plan=eng31_k2=1/1/0/0.0541 unfused=0.0612\n" +
                           "fused.conv-bn.n256.c64.h32.w32.k256.r1.s1.p0 plan=eng0/0/0/0.03\n";
  const AutotuneEntries e = parse_autotune_cache(text, "c.txt");
  const FusedChoice& c = e.at(kHere).fused.at("fused.conv-bn-relu.n256.c64.h32.w32.k64.r3.s1.p1");
  EXPECT_EQ(c, (FusedChoice{"eng31_k2=1", 1, 0, 0.0541f, 0.0612f}));
  EXPECT_EQ(e.at(kHere).fused.at("fused.conv-bn.n256.c64.h32.w32.k256.r1.s1.p0").unfused_ms, -1.f) << "not kept";
  EXPECT_EQ(format_autotune_cache(e), text);
  EXPECT_TRUE(e.at(kHere).convs.empty());
}

TEST(AutotuneCacheFile, ReadsTheDocumentedExample) {
  const std::string text = std::string(kHeaderLine) + "[" + kHere + "]\n" +
                           "n128.c64.h32.w32.k64.r3.s1.p1 fwd=eng62_k2=4_k25=1/0/0/0.0322 bwd_data=eng67_k2=4/0/0/0.0511 bwd_filter=1/1/4096/0.0612\n";
  const AutotuneEntries e = parse_autotune_cache(text, "c.txt");
  const ConvAlgos& a = e.at(kHere).convs.at("n128.c64.h32.w32.k64.r3.s1.p1");
  EXPECT_EQ(a.fwd.algo, "eng62_k2=4_k25=1");
  EXPECT_EQ(a.bwd_filter.algo, "1");
  EXPECT_EQ(a.bwd_filter.workspace, 4096u);
  EXPECT_FLOAT_EQ(a.bwd_data.ms, 0.0511f);
}

TEST(AutotuneCacheFile, MalformedLinesNameFileAndLine) {
  const std::string ctx = "[" + kHere + "]\n";
  struct Case {
    std::string text, what;
  } cases[] = {
      {"resnet-trainer autotune cache v0\n", "not an autotune cache"},
      {std::string(kHeaderLine) + "s fwd=1/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "before any [context]"},
      {std::string(kHeaderLine) + ctx + "s fwd=x/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=1/1/0 bwd_filter=1/1/0/1\n", "bad bwd_data field"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1x\n", "bad bwd_filter field"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=1/1/0/1\n", "expected: shape"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1 extra\n", "expected: shape"},
      {std::string(kHeaderLine) + ctx + "s fwd=eng1 k2/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "expected: shape"},
      {std::string(kHeaderLine) + ctx + "s fwd=eng1/k2/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "s fwd=/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "s fwd=" + std::string(201, 'e') + "/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n",
       "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn s fwd=1/1/0/1\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/99/0/1\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0/1 x\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0/1 unfused=0.5x\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0/1 unfused=nan\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0/inf\n", "expected: fused."},
      {std::string(kHeaderLine) + ctx + "fused.conv-bn.s plan=1/1/0/1 unfused=0.5 x\n", "expected: fused."},
      {std::string(kHeaderLine) + "[unclosed\n", "malformed context"},
      {"", "empty"},
      {"resnet-trainer autotune cache v1\n[" + kHere + "]\ns fwd=1/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n",
       "written by an older version of the trainer (format v1, this one reads v2)"},
      {std::string(kHeaderLine) + ctx + "s fwd=eng1_k2/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "s fwd=eng1_k2=x/1/0/1 bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n", "bad fwd field"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=lt/1/0/1 bwd_filter=1/1/0/1\n", "bad bwd_data field"},
      {std::string(kHeaderLine) + ctx + "s fwd=1/1/0/1 bwd_data=1/1/0/1 bwd_filter=1x/1/0/1\n", "bad bwd_filter field"},
  };
  for (const Case& c : cases) {
    try {
      parse_autotune_cache(c.text, "cache.txt");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const InputError& e) {
      EXPECT_HAS(e.what(), "cache.txt:");
      EXPECT_HAS(e.what(), c.what);
    }
  }
  // The line number points at the bad line (3: header, context, entry).
  try {
    parse_autotune_cache(cases[2].text, "cache.txt");
  } catch (const InputError& e) {
    EXPECT_HAS(e.what(), "cache.txt:3:");
  }
}

TEST(AutotuneCache, SaveLoadRoundTripAndFind) {
  TempDir dir;
  const std::string path = dir / "cache.txt";
  {
    AutotuneCache c(path, kHere);
    EXPECT_TRUE(c.load().empty()) << "a missing file is not worth a warning";
    EXPECT_EQ(c.find("a"), nullptr);
    c.put("a", algos(1));
    c.put("b", algos(2));
    ASSERT_NE(c.find("a"), nullptr);
    EXPECT_EQ(*c.find("a"), algos(1));
    c.save();
  }
  AutotuneCache c(path, kHere);
  EXPECT_TRUE(c.load().empty());
  EXPECT_EQ(c.entries_here(), 2u);
  ASSERT_NE(c.find("a"), nullptr);
  EXPECT_EQ(*c.find("a"), algos(1));
  ASSERT_NE(c.find("b"), nullptr);
  EXPECT_EQ(*c.find("b"), algos(2));
  EXPECT_EQ(c.find("c"), nullptr);
  EXPECT_TRUE(temporary_files_of(path).empty());
}

TEST(AutotuneCache, FusedPlansAreKeptBesideTheConvsAndSaved) {
  TempDir dir;
  const std::string path = dir / "cache.txt";
  const std::string key = "fused.conv-bn-add-relu.n256.c64.h32.w32.k256.r1.s1.p0";
  {
    AutotuneCache c(path, kHere);
    c.load();
    EXPECT_EQ(c.find_fused(key), nullptr);
    c.put("a", algos(1));
    c.put_fused(key, {"eng5", 2, 256, 0.0765f});
    c.save();
  }
  AutotuneCache c(path, kHere);
  EXPECT_TRUE(c.load().empty());
  EXPECT_EQ(c.entries_here(), 2u);
  ASSERT_NE(c.find_fused(key), nullptr);
  EXPECT_EQ(*c.find_fused(key), (FusedChoice{"eng5", 2, 256, 0.0765f}));
  EXPECT_EQ(c.find_fused("fused.conv-bn.other"), nullptr);
  EXPECT_EQ(c.find(key), nullptr) << "a fused key is not a conv shape";
  EXPECT_FALSE(c.changed());
  c.erase_fused("fused.conv-bn.absent");
  EXPECT_FALSE(c.changed()) << "nothing to erase";
  c.erase_fused(key);
  EXPECT_TRUE(c.changed());
  EXPECT_EQ(c.find_fused(key), nullptr);
  EXPECT_EQ(c.entries_here(), 1u);
  AutotuneCache elsewhere(path, kOther);
  elsewhere.load();
  EXPECT_EQ(elsewhere.find_fused(key), nullptr) << "another context's plan must not be used";
}

// What callers save for: a put that changes something, not one that writes what was loaded.
TEST(AutotuneCache, ChangedOnlyWhenAnEntryChanges) {
  TempDir dir;
  const std::string path = dir / "cache.txt";
  {
    AutotuneCache c(path, kHere);
    c.load();
    EXPECT_FALSE(c.changed());
    c.put("a", algos(1));
    c.put_fused("fused.k", {"eng1", 0, 0, 0.5f});
    EXPECT_TRUE(c.changed());
    c.save();
  }
  AutotuneCache c(path, kHere);
  c.load();
  c.put("a", algos(1));
  c.put_fused("fused.k", {"eng1", 0, 0, 0.5f});
  EXPECT_FALSE(c.changed()) << "the same choices as the file's";
  c.put_fused("fused.k", {"eng2", 0, 0, 0.4f});
  EXPECT_TRUE(c.changed());
  AutotuneCache d(path, kHere);
  d.load();
  d.put("b", algos(2));
  EXPECT_TRUE(d.changed()) << "a new shape";
}

TEST(AutotuneCache, CorruptFileIsIgnoredWithAWarningAndRewritten) {
  const std::string ctx = "[" + kHere + "]\n";
  const char binary[] = "\x1f\x8b\x08\x00\xff\xfe garbage \x01\x02";
  for (const std::string& bad : {std::string("not a cache at all\n"),
                                 std::string(kHeaderLine) + ctx + "a fwd=1/1/0/zz bwd_data=1/1/0/1 bwd_filter=1/1/0/1\n",
                                 std::string(binary, sizeof(binary) - 1), std::string()}) {
    TempDir dir;
    const std::string path = dir / "cache.txt";
    write_text(path, bad);
    AutotuneCache c(path, kHere);
    const std::vector<std::string> warnings = c.load();
    ASSERT_EQ(warnings.size(), 1u) << "for file text '" << bad << "'";
    EXPECT_HAS(warnings[0], "ignoring");
    EXPECT_HAS(warnings[0], path);
    EXPECT_EQ(c.find("a"), nullptr);
    EXPECT_EQ(c.entries_here(), 0u);
    c.put("a", algos(4));
    c.save();
    const AutotuneEntries e = parse_autotune_cache(read_text(path), path);  // valid again
    EXPECT_EQ(e.at(kHere).convs.at("a"), algos(4));
    EXPECT_EQ(e.size(), 1u);
  }
}

TEST(AutotuneCache, OtherContextGivesNoEntriesButIsKept) {
  TempDir dir;
  const std::string path = dir / "cache.txt";
  AutotuneEntries theirs;
  theirs[kOther].convs["a"] = algos(5);
  theirs[kOther].convs["b"] = algos(6);
  write_text(path, format_autotune_cache(theirs));

  AutotuneCache c(path, kHere);
  const std::vector<std::string> warnings = c.load();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], "no entries");
  EXPECT_HAS(warnings[0], path);
  EXPECT_EQ(c.find("a"), nullptr) << "another GPU's choice must not be used";
  EXPECT_EQ(c.entries_here(), 0u);
  c.put("a", algos(7));
  c.save();

  const AutotuneEntries e = parse_autotune_cache(read_text(path), path);
  EXPECT_EQ(e.at(kOther), theirs.at(kOther)) << "the other context's entries are kept";
  EXPECT_EQ(e.at(kHere).convs.at("a"), algos(7));
  // And the other binary still finds its own.
  AutotuneCache other(path, kOther);
  EXPECT_TRUE(other.load().empty());
  ASSERT_NE(other.find("b"), nullptr);
  EXPECT_EQ(*other.find("b"), algos(6));
}

TEST(AutotuneCache, HeaderOnlyFileHasNoEntriesHere) {
  TempDir dir;
  write_text(dir / "cache.txt", kHeaderLine);
  AutotuneCache c(dir / "cache.txt", kHere);
  const std::vector<std::string> warnings = c.load();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], "no entries");
}

// The line a long network build prints says whether this GPU and build have nothing measured yet
// (a first start) or only other shapes.
TEST(AutotuneCache, StillMeasuringLineSaysWhyTheSearchRuns) {
  AutotuneCache c("cache.txt", kHere);
  EXPECT_EQ(c.still_measuring_line(),
            "convs: measuring cuDNN's conv algorithms and fused plans (cache.txt has none for this GPU and build "
            "yet); this can take a minute, and they are saved so that later starts skip it");
  c.put("a", algos(1));
  EXPECT_EQ(c.still_measuring_line(),
            "convs: measuring cuDNN's conv algorithms and fused plans (shapes or patterns new to cache.txt: another "
            "batch or image size); this can take a minute, and they are saved so that later starts skip it");
  c.left_unsaved("measured under a CUDA tool (libX.so)");
  EXPECT_EQ(c.still_measuring_line(),
            "convs: measuring cuDNN's conv algorithms and fused plans (shapes or patterns new to cache.txt: another "
            "batch or image size); this can take a minute, and they are not saved: measured under a CUDA tool (libX.so)");
  EXPECT_EQ(c.unsaved_line(), "the conv choices are not saved to cache.txt: measured under a CUDA tool (libX.so)");
}

// The armed notice (what bin/train and bin/predict print when a first start measures for long):
// it starts at the first lookup that misses, so a network found whole in the cache never says it
// is measuring, however long its build takes.
struct NoticeFile {
  test_files::TempDir dir;
  std::string path = dir / "out.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ~NoticeFile() {
    if (f) std::fclose(f);
  }
  std::string text() const {
    const std::vector<uint8_t> bytes = read_file(path);  // a handle of its own: the notice's position stays
    return std::string(bytes.begin(), bytes.end());
  }
};

TEST(AutotuneCache, TheArmedNoticeStartsAtTheFirstMissOnly) {
  using namespace std::chrono_literals;
  NoticeFile out;
  ASSERT_NE(out.f, nullptr);
  AutotuneCache c("cache.txt", kHere);
  c.put("a", algos(1));
  c.arm_late_notice(1ms, out.f);
  EXPECT_NE(c.find("a"), nullptr);
  std::this_thread::sleep_for(200ms);  // hits only: no notice, though the delay is long past
  EXPECT_EQ(out.text(), "");
  EXPECT_EQ(c.find("b"), nullptr);  // a miss: a search would follow
  EXPECT_EQ(c.find_fused("k"), nullptr);  // a second miss starts no second notice
  const auto start = std::chrono::steady_clock::now();
  while (out.text().empty() && seconds_since(start) < 30) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(100ms);  // time for a second line, were there one
  c.end_late_notice();
  EXPECT_EQ(out.text(), c.still_measuring_line() + "\n");
}

TEST(AutotuneCache, AnUnarmedOrEndedNoticePrintsNothing) {
  using namespace std::chrono_literals;
  testing::internal::CaptureStdout();  // where an unarmed cache's notice would go
  {
    AutotuneCache unarmed("cache.txt", kHere);
    EXPECT_EQ(unarmed.find("a"), nullptr);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  NoticeFile out;
  ASSERT_NE(out.f, nullptr);
  {
    AutotuneCache ended("cache.txt", kHere);
    ended.arm_late_notice(1ms, out.f);
    ended.end_late_notice();
    EXPECT_EQ(ended.find_fused("k"), nullptr);
    const auto start = std::chrono::steady_clock::now();
    AutotuneCache quick("cache.txt", kHere);
    quick.arm_late_notice(60s, out.f);
    EXPECT_EQ(quick.find("a"), nullptr);
    quick.end_late_notice();
    EXPECT_LT(seconds_since(start), 5.0) << "ending the notice waited for its delay";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(out.text(), "");
}

TEST(AutotuneCache, EmptyPathNeverTouchesDisk) {
  AutotuneCache c("", kHere);
  EXPECT_TRUE(c.load().empty());
  c.put("a", algos(1));
  EXPECT_NO_THROW(c.save());
  EXPECT_EQ(*c.find("a"), algos(1));
}

}  // namespace

namespace {

TEST(AutotuneCache, ComposesItsContextLineFromWhatAChoiceDependsOn) {
  const AutotuneContext c{"NVIDIA H100 80GB HBM3", 91400, DType::F16, Layout::NHWC, true, ConvApi::Graph, 1024};
  EXPECT_EQ(c.key(), "gpu=NVIDIA H100 80GB HBM3;cudnn=91400;precision=fp16;layout=NHWC;tf32=1;api=graph;workspace_mb=1024");
  AutotuneCache cache("", c);
  EXPECT_EQ(cache.context(), c.key());
}

// A profiler's library, named where one is injected and only there: under one the programs measure
// without saving. nsys sets the variable; ncu and compute-sanitizer only map their libraries.
TEST(InjectedCudaTool, NamesTheVariablesLibraryOrAMappedToolLibrary) {
  const std::string plain =
      "7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcudnn_graph.so.9.14.0\n"
      "7f10-7f20 r-xp 00000000 08:01 13 /usr/local/cuda/lib64/libcudart.so.13\n"
      "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n";
  std::istringstream none(plain);
  EXPECT_EQ(injected_tool_in(nullptr, none), "");
  std::istringstream empty_variable(plain);
  EXPECT_EQ(injected_tool_in("", empty_variable), "") << "an empty variable injects nothing";
  std::istringstream with_nsys(plain);
  EXPECT_EQ(injected_tool_in("/opt/nsys/libToolsInjection64.so", with_nsys), "/opt/nsys/libToolsInjection64.so");
  std::istringstream with_ncu(plain + "7f30-7f40 r-xp 00000000 08:01 14 /opt/ncu/target/libInterceptorInjectionTarget.so\n");
  EXPECT_EQ(injected_tool_in(nullptr, with_ncu), "/opt/ncu/target/libInterceptorInjectionTarget.so");
  std::istringstream with_sanitizer(plain + "7f30-7f40 r-xp 00000000 08:01 15 /usr/local/cuda/compute-sanitizer/libsanitizer-collection.so\n");
  EXPECT_EQ(injected_tool_in(nullptr, with_sanitizer), "/usr/local/cuda/compute-sanitizer/libsanitizer-collection.so");
  std::istringstream folder_only("7f30-7f40 r-xp 00000000 08:01 16 /opt/injection/libcudart.so.13\n");
  EXPECT_EQ(injected_tool_in(nullptr, folder_only), "") << "a folder's name is not a library's";
  EXPECT_NE(measured_under_tool("/opt/x/libToolsInjection64.so").find("(/opt/x/libToolsInjection64.so)"),
            std::string::npos);
}

}  // namespace
