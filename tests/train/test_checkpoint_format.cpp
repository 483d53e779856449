// Checkpoint round trips (checkpoint.h): serialize and parse exactly, through a file, a file built from
// the documented layout, older files without the newer keys, and the weight average of version 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "train/checkpoint.h"
#include "support/test_files.h"
#include "checkpoint_test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;       // TempDir, input_error_of
using namespace checkpoint_test;  // sample, expect_same, parse, build_file, kHeader

TEST(Checkpoint, SerializeParseRoundTripIsExact) {
  const Checkpoint c = sample();
  const std::vector<uint8_t> bytes = serialize_checkpoint(c);
  expect_same(parse(bytes), c);
  EXPECT_EQ(serialize_checkpoint(parse(bytes)), bytes) << "a re-serialized checkpoint must be identical";
}

TEST(Checkpoint, LossScaleRoundTripsExactly) {
  for (float s : {1.f, 65536.f, 0.1f, 1.f / 1024, 16777216.f, std::nextafter(3.f, 0.f), 1e-40f}) {
    Checkpoint c = sample(4, 2);
    c.meta.loss_scale = s;
    const Checkpoint back = parse(serialize_checkpoint(c));
    EXPECT_EQ(std::memcmp(&back.meta.loss_scale, &s, sizeof(float)), 0) << s << " came back as " << back.meta.loss_scale;
  }
}

TEST(Checkpoint, ReadsAFileBuiltFromTheDocumentedLayout) {
  const Checkpoint c = parse(build_file(kHeader, {{1.f, 2.f, 3.f}, {-1.f, -2.f, -3.f}, {0.5f, 0.25f}}));
  EXPECT_EQ(c.meta.precision, "fp32");
  EXPECT_EQ(c.meta.model_signature, 42u);
  EXPECT_EQ(c.meta.step, 100);
  EXPECT_EQ(c.meta.step_in_epoch, 5);
  EXPECT_EQ(c.meta.loss_scale, 1.f);
  EXPECT_EQ(c.master, (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_EQ(c.momentum, (std::vector<float>{-1.f, -2.f, -3.f}));
  EXPECT_EQ(c.running, (std::vector<float>{0.5f, 0.25f}));
}

// Files written before the image side and the classes were recorded: 32x32, classes not known.
TEST(Checkpoint, AFileWithoutImageSideOrClassesIs32WithClassesUnknown) {
  const Checkpoint c = parse(build_file(kHeader, {{1.f, 2.f, 3.f}, {-1.f, -2.f, -3.f}, {0.5f, 0.25f}}));
  EXPECT_EQ(c.meta.image_side, 32);
  EXPECT_TRUE(c.meta.class_names.empty());
  Checkpoint one = sample(4, 2);
  one.meta.class_names = {"only"};
  EXPECT_EQ(parse(serialize_checkpoint(one)).meta.class_names, (std::vector<std::string>{"only"}));
  std::string h = std::string(kHeader) + "classes=a,%4\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "names.ck"); }),
             "names.ck: malformed class names");
  h = std::string(kHeader) + "image_side=0\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "side.ck"); }), "side.ck");
}

// Files written before the learning-rate rule (train/lr_scaling.h): a run that was not scaled, its
// schedule not recorded. The record reads back, and a negative rate is refused.
TEST(Checkpoint, TheLearningRateRuleIsRecordedAndOlderFilesLackIt) {
  const std::vector<std::vector<float>> arrays = {{1, 2, 3}, {1, 2, 3}, {1, 2}};
  Checkpoint c = parse(build_file(kHeader, arrays));
  EXPECT_FALSE(c.meta.lr_recorded);
  EXPECT_FALSE(c.meta.lr_scaled);
  c = parse(build_file(std::string(kHeader) + "lr_scaled=1\nlr=0.08\nmin_lr=0\nwarmup_epochs=2\n", arrays));
  EXPECT_TRUE(c.meta.lr_recorded);
  EXPECT_TRUE(c.meta.lr_scaled);
  EXPECT_EQ(c.meta.lr, 0.08);
  EXPECT_EQ(c.meta.warmup_epochs, 2.0);
  EXPECT_EQ(c.meta.lr_reference_batch, 128) << "written before the reference was recorded: scaled from 128";
  c = parse(build_file(std::string(kHeader) + "lr_scaled=1\nlr_reference_batch=256\nlr=0.16\nmin_lr=0\nwarmup_epochs=2\n", arrays));
  EXPECT_EQ(c.meta.lr_reference_batch, 256);
  const std::string no_reference = std::string(kHeader) + "lr_scaled=1\nlr_reference_batch=0\nlr=0.16\nmin_lr=0\nwarmup_epochs=2\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(no_reference, arrays), "ref.ck"); }), "ref.ck: header holds out-of-range values");
  const std::string partial = std::string(kHeader) + "lr_scaled=1\nlr=0.08\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(partial, arrays), "lr.ck"); }), "lr.ck: header lacks 'min_lr'");
  const std::string negative = std::string(kHeader) + "lr_scaled=0\nlr=-0.1\nmin_lr=0\nwarmup_epochs=1\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(negative, arrays), "lr.ck"); }), "lr.ck: header holds out-of-range values");
  Checkpoint unrecorded = sample(4, 2);
  unrecorded.meta.lr_recorded = false;
  const std::vector<uint8_t> bytes = serialize_checkpoint(unrecorded);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()).find("lr_scaled"), std::string::npos) << "no record, no keys";
}

TEST(Checkpoint, SaveLoadRoundTripThroughAFile) {
  TempDir dir;
  const Checkpoint c = sample(5000, 300);
  save_checkpoint(dir / "ck.bin", c);
  expect_same(load_checkpoint(dir / "ck.bin"), c);
  EXPECT_TRUE(temporary_files_of(dir / "ck.bin").empty()) << "the temporary file must be renamed away";
  // A second save replaces the first.
  const Checkpoint d = sample(5000, 300, 1);
  save_checkpoint(dir / "ck.bin", d);
  expect_same(load_checkpoint(dir / "ck.bin"), d);
}

// The weight average (--ema) is a fourth array, in version 2, where the header names its decay. A
// checkpoint without one is written as version 1, byte for byte as before the average existed, so
// that older builds read it; version 1 files (every one written before) load with no average.
TEST(Checkpoint, TheWeightAverageRoundTripsInVersion2) {
  Checkpoint c = sample(1000, 100);
  c.meta.ema_decay = 0.999;
  c.ema.resize(1000);
  for (size_t i = 0; i < c.ema.size(); ++i) c.ema[i] = std::ldexp(static_cast<float>(i), -9) + 0.5f;
  c.ema[7] = 1e-42f;  // a denormal
  const std::vector<uint8_t> bytes = serialize_checkpoint(c);
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  EXPECT_EQ(version, 2u);
  const Checkpoint back = parse(bytes);
  expect_same(back, c);
  EXPECT_EQ(back.meta.ema_decay, 0.999);
  EXPECT_EQ(std::memcmp(back.ema.data(), c.ema.data(), c.ema.size() * sizeof(float)), 0) << "the average differs";
  EXPECT_EQ(serialize_checkpoint(back), bytes);

  Checkpoint plain = sample(1000, 100);
  const std::vector<uint8_t> v1 = serialize_checkpoint(plain);
  std::memcpy(&version, v1.data() + 8, 4);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(std::string(v1.begin(), v1.end()).find("ema_decay"), std::string::npos);
  EXPECT_TRUE(parse(v1).ema.empty());
}

TEST(Checkpoint, AFileOfTheDocumentedLayoutWithAWeightAverage) {
  const std::string h = std::string(kHeader) + "ema_decay=0.99\n";
  const Checkpoint c = parse(build_file(h, {{1, 2, 3}, {-1, -2, -3}, {0.5f, 0.25f}, {7, 8, 9}}, 2));
  EXPECT_EQ(c.ema, (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(c.meta.ema_decay, 0.99);
  // Version 2 without the key holds three arrays; a version 1 file never holds a fourth.
  EXPECT_TRUE(parse(build_file(kHeader, {{1, 2, 3}, {1, 2, 3}, {1, 2}}, 2)).ema.empty());
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}, {7, 8, 9}}, 1), "v1.ck"); }),
             "v1.ck: 20 unexpected bytes after the checksum");
  // An average of another length than the weights, a missing one, and a decay out of [0, 1).
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}, {7, 8}}, 2), "ema.ck"); }),
             "ema.ck: corrupt: the array sizes disagree with the header (weight average holds 2 values, the header "
             "says params=3)");
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}, 2), "ema.ck"); }), "ema.ck");
  const std::string bad = std::string(kHeader) + "ema_decay=1\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(bad, {{1, 2, 3}, {1, 2, 3}, {1, 2}, {7, 8, 9}}, 2), "ema.ck"); }),
             "ema.ck: header holds out-of-range values");
}

}  // namespace
