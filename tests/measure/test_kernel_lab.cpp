// bin/kernel_lab's bookkeeping (measure/kernel_lab.h): the network's shapes it measures at, its
// command line, how rows are judged and shown (CPU), and timing with the L2 cache flushed (GPU).
// The lab's versions themselves run on the GPU only: tests/python/test_kernel_lab.py runs a small
// lab there and requires every version to pass its check.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/handles.h"
#include "measure/kernel_lab.h"

namespace {

LabOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "kernel_lab");
  return parse_lab_options(static_cast<int>(args.size()), args.data());
}

std::vector<std::string> texts(const std::vector<ChwShape>& v) {
  std::vector<std::string> t;
  for (const ChwShape& s : v) t.push_back(s.text());
  return t;
}

const LabConv* find_conv(const std::vector<LabConv>& convs, const std::string& layers) {
  for (const LabConv& c : convs)
    if (c.layers == layers) return &c;
  return nullptr;
}

// ---- the network's shapes ------------------------------------------------------------------------

TEST(KernelLabShapes, DistinctConvsOfTheBlocksWithTheirLayers) {
  const std::vector<LabConv> convs = network_convs(128);
  // conv1: the first block of a stage and the rest; conv2: the strided first 3x3 of stages 2-4 and
  // the rest; conv3 and the projection once per stage. The 1x1 64 -> 256 of stage 1 is conv3 and
  // the projection: two roles, two entries.
  ASSERT_EQ(convs.size(), 23u);
  int by_role[4] = {};
  for (const LabConv& c : convs) ++by_role[int(c.role)];
  EXPECT_EQ(by_role[int(ConvRole::Reduce)], 8);
  EXPECT_EQ(by_role[int(ConvRole::Spatial)], 7);
  EXPECT_EQ(by_role[int(ConvRole::Expand)], 4);
  EXPECT_EQ(by_role[int(ConvRole::Shortcut)], 4);

  const LabConv* c = find_conv(convs, "layer2.0.conv2");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->g.key(), "n128.c128.h32.w32.k128.r3.s2.p1");
  EXPECT_EQ(c->text(), "3x3/2 128x128x32x32 -> 128x128x16x16 (layer2.0.conv2)");
  c = find_conv(convs, "layer3.1-5.conv1");
  ASSERT_NE(c, nullptr) << "blocks 1 to 5 of stage 3 share their conv1";
  EXPECT_EQ(c->g.key(), "n128.c1024.h8.w8.k256.r1.s1.p0");
  c = find_conv(convs, "layer1.0-2.conv2");
  ASSERT_NE(c, nullptr) << "stage 1 has no stride: all its 3x3 convs are one shape";
  c = find_conv(convs, "layer4.0.downsample.0");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->g.key(), "n128.c1024.h8.w8.k2048.r1.s2.p0");
  EXPECT_EQ(c->role, ConvRole::Shortcut);
  EXPECT_EQ(network_convs(4)[0].g.n, 4) << "the batch given";
}

TEST(KernelLabShapes, BatchNormJoinAndDefaultShapes) {
  EXPECT_EQ(texts(network_bn_shapes()),
            (std::vector<std::string>{"64x32x32", "256x32x32", "128x32x32", "128x16x16", "512x16x16", "256x16x16",
                                      "256x8x8", "1024x8x8", "512x8x8", "512x4x4", "2048x4x4"}));
  EXPECT_EQ(texts(network_join_shapes()), (std::vector<std::string>{"256x32x32", "512x16x16", "1024x8x8", "2048x4x4"}));
  EXPECT_EQ(texts(default_lab_shapes()),
            (std::vector<std::string>{"64x32x32", "256x32x32", "128x16x16", "512x16x16", "256x8x8", "1024x8x8",
                                      "512x4x4", "2048x4x4"}));
}

// ---- the command line ------------------------------------------------------------------------------

TEST(KernelLabOptions, Defaults) {
  const LabOptions o = parse({});
  EXPECT_EQ(o.batch, 128);
  EXPECT_EQ(o.check_batch, 2);
  EXPECT_EQ(o.runs, 20);
  EXPECT_EQ(o.shapes, default_lab_shapes());
  EXPECT_EQ(o.formats.size(), 3u);
  EXPECT_FALSE(o.autotune);
  EXPECT_TRUE(o.check);
  EXPECT_EQ(o.flush_mb, 256);
  EXPECT_FALSE(o.as_graph);
  EXPECT_TRUE(parse({"--as-graph"}).as_graph);
  for (const std::string& op : lab_operations()) EXPECT_TRUE(operation_selected(o, op)) << op;
  for (const LabConv& c : network_convs(128)) EXPECT_TRUE(conv_selected(o, c)) << c.text();
}

TEST(KernelLabOptions, ShapesAreTheNetworksWithOrWithoutTheBatch) {
  LabOptions o = parse({"--shapes", "2048x4x4,128x64x32x32"});
  EXPECT_EQ(texts(o.shapes), (std::vector<std::string>{"2048x4x4", "64x32x32"}));
  o = parse({"--shapes=64x64x32x32", "--batch", "64"});  // the batch may come after
  EXPECT_EQ(texts(o.shapes), std::vector<std::string>{"64x32x32"});
  EXPECT_THROW(parse({"--shapes", "64x64x32x32"}), UsageError) << "batch 64 in the shape, 128 in --batch";
  EXPECT_THROW(parse({"--shapes", "65x32x32"}), UsageError) << "not a tensor of the network";
  EXPECT_THROW(parse({"--shapes", "64x32"}), UsageError);
  EXPECT_THROW(parse({"--shapes", "64xAx32"}), UsageError);
}

TEST(KernelLabOptions, OnlyTakesOperationsAndPrefixes) {
  LabOptions o = parse({"--only", "join-projection,bn-stats"});
  EXPECT_TRUE(operation_selected(o, "join-projection-forward"));
  EXPECT_TRUE(operation_selected(o, "join-projection-backward"));
  EXPECT_FALSE(operation_selected(o, "join-identity-forward"));
  EXPECT_TRUE(operation_selected(o, "bn-stats"));
  EXPECT_FALSE(operation_selected(o, "bn-apply"));
  o = parse({"--only", "conv"});
  EXPECT_TRUE(operation_selected(o, "conv-wgrad"));
  EXPECT_FALSE(operation_selected(o, "bn-backward"));
  EXPECT_THROW(parse({"--only", "bn-stat"}), UsageError) << "neither an operation nor a whole prefix";
  EXPECT_THROW(parse({"--only", "gemm"}), UsageError);
}

TEST(KernelLabOptions, ConvsAreThoseThatReadOrWriteAChosenShape) {
  const LabOptions o = parse({"--shapes", "2048x4x4"});
  std::vector<std::string> chosen;
  for (const LabConv& c : network_convs(128))
    if (conv_selected(o, c)) chosen.push_back(c.layers);
  EXPECT_EQ(chosen, (std::vector<std::string>{"layer4.0-2.conv3", "layer4.0.downsample.0", "layer4.1-2.conv1"}));
}

TEST(KernelLabOptions, FormatsAndBadValues) {
  EXPECT_EQ(parse({"--formats", "all"}).formats.size(), 4u);
  const LabOptions o = parse({"--formats", "fp32-nhwc"});
  ASSERT_EQ(o.formats.size(), 1u);
  EXPECT_EQ(o.formats[0].text(), "fp32 NHWC");
  EXPECT_THROW(parse({"--formats", "bf16-nhwc"}), UsageError);
  EXPECT_THROW(parse({"--batch", "127"}), UsageError) << "not a multiple of --check-batch 2";
  EXPECT_NO_THROW(parse({"--batch", "127", "--check-batch", "1"}));
  EXPECT_THROW(parse({"--runs", "0"}), UsageError);
  EXPECT_THROW(parse({"--json"}), UsageError) << "a missing value";
  EXPECT_THROW(parse({"--speed"}), UsageError);
  EXPECT_TRUE(parse({"--autotune", "--no-check"}).autotune);
  EXPECT_FALSE(parse({"--no-check"}).check);
}

TEST(KernelLabOptions, HelpListsEveryFlagAndOperation) {
  const std::string help = lab_usage_text();
  for (const char* flag : {"--batch", "--check-batch", "--runs", "--shapes", "--only", "--formats", "--autotune",
                           "--no-check", "--flush-mb", "--as-graph", "--workspace-mb", "--json", "--help"})
    EXPECT_NE(help.find(std::string("  ") + flag + " "), std::string::npos) << flag;
  for (const std::string& op : lab_operations()) EXPECT_NE(help.find(op), std::string::npos) << op;
}

// ---- rows ------------------------------------------------------------------------------------------

TEST(KernelLabRows, MedianAndBandwidth) {
  EXPECT_FLOAT_EQ(median_of({3, 1, 2}), 2);
  EXPECT_FLOAT_EQ(median_of({4, 1, 3, 2}), 2.5f);
  EXPECT_FLOAT_EQ(median_of({}), -1);
  EXPECT_DOUBLE_EQ(gb_per_s(size_t(3) << 30, 1.0), 3.0 * (1 << 30) / 1e6);  // bytes per ms / 1e6
  EXPECT_DOUBLE_EQ(gb_per_s(1000, 0), 0);
}

TEST(KernelLabRows, TheWorstOutputRelativeToItsBound) {
  EXPECT_EQ(check_text({}), "-");
  EXPECT_TRUE(checks_passed({}));
  const std::vector<LabCheck> ok = {{"y", 2e-3, 1e-2}, {"mean", 5e-5, 1e-4}};
  EXPECT_TRUE(checks_passed(ok));
  EXPECT_EQ(check_text(ok), "ok 5.0e-05") << "mean is at half its bound, y at a fifth";
  const std::vector<LabCheck> bad = {{"y", 2e-3, 1e-2}, {"dx", 3e-2, 1e-2}};
  EXPECT_FALSE(checks_passed(bad));
  EXPECT_EQ(check_text(bad), "FAIL dx 3.0e-02 > 1e-02");
  const std::vector<LabCheck> nan = {{"y", std::numeric_limits<double>::quiet_NaN(), 1e-2}, {"dx", 0.5, 1e-2}};
  EXPECT_FALSE(checks_passed(nan));
  EXPECT_EQ(check_text(nan), "FAIL y nan > 1e-02") << "an unwritten output is the first failure";
}

LabRow row(const std::string& version) {
  LabRow r;
  r.op = "bn-apply";
  r.version = version;
  r.shape = "128x64x32x32";
  r.format = "fp16 NHWC";
  return r;
}

TEST(KernelLabRows, TableLines) {
  LabRow ok = row("bn_apply");
  ok.ms = {0.2f, 0.1f, 0.3f};
  ok.bytes = 200000000;
  ok.checks = {{"y", 1e-3, 1e-2}};
  const std::string line = lab_table_line(ok);
  EXPECT_EQ(line.rfind("| bn_apply ", 0), 0u) << line;
  EXPECT_NE(line.find("| 128x64x32x32 "), std::string::npos);
  EXPECT_NE(line.find("| 0.2000 "), std::string::npos) << "the median";
  EXPECT_NE(line.find("| 1000 "), std::string::npos) << "2e8 bytes in 0.2 ms";
  EXPECT_NE(line.find("| ok 1.0e-03 |"), std::string::npos);
  EXPECT_FALSE(row_failed(ok));
  EXPECT_EQ(lab_table_header().find("| version "), 0u);
  EXPECT_EQ(line.find("| 128x64x32x32"), lab_table_header().find("| shape")) << "columns line up";

  LabRow refused = row("ConvStats");
  refused.refused = "cuDNN has no engine for it on this GPU";
  refused.note = "fp16 scale/bias";
  EXPECT_NE(lab_table_line(refused).find("| ConvStats [fp16 scale/bias] "), std::string::npos);
  EXPECT_NE(lab_table_line(refused).find("refused: cuDNN has no engine for it on this GPU"), std::string::npos);
  EXPECT_FALSE(row_failed(refused)) << "a refusal is cuDNN's answer, not a failure";

  LabRow err = row("bn_apply");
  err.error = "CUDA error";
  EXPECT_NE(lab_table_line(err).find("error: CUDA error"), std::string::npos);
  EXPECT_TRUE(row_failed(err));
  LabRow wrong = ok;
  wrong.checks = {{"y", 0.5, 1e-2}};
  EXPECT_TRUE(row_failed(wrong));
  LabRow compute = ok;
  compute.bytes = 0;
  EXPECT_NE(lab_table_line(compute).find("| -      |"), std::string::npos) << "no GB/s without bytes";
}

TEST(KernelLabRows, JsonLinesAndSummary) {
  LabRow ok = row("bn_apply");
  ok.ms = {0.25f, 0.5f};
  ok.bytes = 1000000;
  ok.checks = {{"y", 1e-3, 1e-2}};
  const std::string j = lab_json_row(ok);
  for (const char* part : {"\"event\":\"row\"", "\"op\":\"bn-apply\"", "\"status\":\"ok\"", "\"ms_median\":0.375",
                           "\"ms_min\":0.25", "\"ms_max\":0.5", "\"runs\":2", "\"bytes\":1000000",
                           "\"gb_per_s\":2.66667", "\"error_y\":0.001", "\"check\":\"ok 1.0e-03\""})
    EXPECT_NE(j.find(part), std::string::npos) << part << " in " << j;
  LabRow refused = row("ConvStats");
  refused.refused = "no \"engine\"";
  const std::string r = lab_json_row(refused);
  EXPECT_NE(r.find("\"status\":\"refused\",\"why\":\"no \\\"engine\\\"\""), std::string::npos) << r;
  EXPECT_EQ(r.find("ms_median"), std::string::npos);
  LabRow wrong = ok;
  wrong.checks = {{"y", 0.5, 1e-2}};
  EXPECT_NE(lab_json_row(wrong).find("\"status\":\"check failed\""), std::string::npos);

  const std::vector<LabRow> rows = {ok, refused, wrong};
  EXPECT_EQ(lab_summary(rows, 12.34, 5.0),
            "kernel lab: 3 versions measured: 1 ok, 1 refused, 1 failed; 12.3 s, of which 5.0 s building cuDNN "
            "plans\n");
  EXPECT_EQ(lab_json_end(rows, 12.5, 5.0),
            "{\"event\":\"end\",\"rows\":3,\"ok\":1,\"refused\":1,\"failed\":1,\"seconds\":12.5,\"plan_seconds\":5}");
}

// ---- timing (GPU) ---------------------------------------------------------------------------------

TEST(KernelLabTiming, EveryRunTimedAfterTheFlush) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: timing runs on the GPU";
  Stream stream;
  const DeviceBuffer flush(size_t(64) << 20, "flush"), work(size_t(16) << 20, "work");
  int calls = 0;
  const std::vector<float> ms = time_with_cold_l2(stream, flush, 5, [&] {
    ++calls;
    CUDA_CHECK(cudaMemsetAsync(work.get(), 1, work.bytes(), stream));
  });
  EXPECT_EQ(calls, 5);
  ASSERT_EQ(ms.size(), 5u);
  for (float t : ms) {
    EXPECT_GT(t, 0.0f);
    EXPECT_LT(t, 1000.0f);
  }
}

}  // namespace
