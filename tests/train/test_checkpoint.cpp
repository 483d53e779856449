// Checkpoints: exact round trips, every kind of damaged file rejected with an InputError (never a
// crash), the fit checks a resume makes, and atomic saves, down to a process killed mid-save.
#include <gtest/gtest.h>

#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/elapsed.h"
#include "train/checkpoint.h"
#include "core/errors.h"
#include "core/file_io.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;  // TempDir, input_error_of

// A checkpoint whose every field and array element differs from the defaults and from each other.
Checkpoint sample(size_t params = 1000, size_t running = 100, int version = 0) {
  Checkpoint c;
  CheckpointMeta& m = c.meta;
  m.precision = "fp16";
  m.layout = "NHWC";
  m.model = "resnet50-cifar";
  m.model_signature = 0xFEDCBA9876543210ull;
  m.params = params;
  m.running = running;
  m.image_side = 224;
  m.class_names = {"T-shirt/top", "a,b", "100%", "new\nline", "x=y", "tab\there"};  // what a header line must survive
  m.data = "fashion-mnist";
  m.batch = 256;
  m.epochs = 17;
  m.seed = 0xFFFFFFFFFFFFFFFFull;
  m.epoch = 9;
  m.step_in_epoch = 41 + version;
  m.step = 9 * 13717421001ll + m.step_in_epoch;  // 13,717,421,001 steps per epoch: a consistent position
  m.loss_scale = std::nextafter(12345.678f, 1e9f);  // no short decimal form: must survive exactly
  m.good_steps = 777;
  m.skipped_steps = 3;
  m.lr_recorded = true;
  m.lr_scaled = true;
  m.lr = 0.1 * 3;  // 0.30000000000000004: must survive exactly
  m.min_lr = 1e-300;
  m.warmup_epochs = 2.0 / 3;
  c.master.resize(params);
  c.momentum.resize(params);
  c.running.resize(running);
  for (size_t i = 0; i < params; ++i) {
    c.master[i] = std::ldexp(static_cast<float>(i) + 0.1f * version, -7) - 3.f;
    c.momentum[i] = -1.f / (1.f + i + version);
  }
  for (size_t i = 0; i < running; ++i) c.running[i] = std::sqrt(static_cast<float>(i + version));
  if (params > 2) c.master[1] = -0.f, c.master[2] = 1e-42f;  // signed zero and a denormal
  return c;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.meta.precision, b.meta.precision);
  EXPECT_EQ(a.meta.layout, b.meta.layout);
  EXPECT_EQ(a.meta.model, b.meta.model);
  EXPECT_EQ(a.meta.model_signature, b.meta.model_signature);
  EXPECT_EQ(a.meta.params, b.meta.params);
  EXPECT_EQ(a.meta.running, b.meta.running);
  EXPECT_EQ(a.meta.image_side, b.meta.image_side);
  EXPECT_EQ(a.meta.class_names, b.meta.class_names);
  EXPECT_EQ(a.meta.data, b.meta.data);
  EXPECT_EQ(a.meta.batch, b.meta.batch);
  EXPECT_EQ(a.meta.epochs, b.meta.epochs);
  EXPECT_EQ(a.meta.seed, b.meta.seed);
  EXPECT_EQ(a.meta.step, b.meta.step);
  EXPECT_EQ(a.meta.epoch, b.meta.epoch);
  EXPECT_EQ(a.meta.step_in_epoch, b.meta.step_in_epoch);
  EXPECT_EQ(std::memcmp(&a.meta.loss_scale, &b.meta.loss_scale, sizeof(float)), 0)
      << a.meta.loss_scale << " vs " << b.meta.loss_scale;
  EXPECT_EQ(a.meta.good_steps, b.meta.good_steps);
  EXPECT_EQ(a.meta.skipped_steps, b.meta.skipped_steps);
  EXPECT_EQ(a.meta.lr_recorded, b.meta.lr_recorded);
  EXPECT_EQ(a.meta.lr_scaled, b.meta.lr_scaled);
  EXPECT_EQ(a.meta.lr, b.meta.lr);
  EXPECT_EQ(a.meta.min_lr, b.meta.min_lr);
  EXPECT_EQ(a.meta.warmup_epochs, b.meta.warmup_epochs);
  auto bits_equal = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(bits_equal(a.master, b.master)) << "master weights differ";
  EXPECT_TRUE(bits_equal(a.momentum, b.momentum)) << "momentum differs";
  EXPECT_TRUE(bits_equal(a.running, b.running)) << "running statistics differ";
}

Checkpoint parse(const std::vector<uint8_t>& b, const std::string& file = "ck.bin") {
  return parse_checkpoint(b.data(), b.size(), file);
}

// The layout documented in checkpoint.h, written independently: magic, version, header length,
// header, three length-prefixed float arrays, CRC-32 of everything before it.
std::vector<uint8_t> build_file(const std::string& header, const std::vector<std::vector<float>>& arrays,
                                uint32_t version = 1) {
  std::vector<uint8_t> out = {'R', 'N', '5', '0', 'C', 'K', 'P', 'T'};
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  const uint32_t hlen = static_cast<uint32_t>(header.size());
  put(&version, 4);
  put(&hlen, 4);
  put(header.data(), header.size());
  for (const auto& a : arrays) {
    const uint64_t n = a.size();
    put(&n, 8);
    put(a.data(), a.size() * sizeof(float));
  }
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, out.data(), static_cast<uInt>(out.size())));
  put(&crc, 4);
  return out;
}

const char* kHeader =
    "precision=fp32\nlayout=NCHW\nmodel=resnet50-cifar\nmodel_signature=42\nparams=3\nrunning=2\n"
    "data=cifar10\nbatch=128\nepochs=15\nseed=7\nstep=100\nepoch=1\nstep_in_epoch=5\n"
    "loss_scale=0x1p+0\ngood_steps=0\nskipped_steps=0\n";

std::string without_line(std::string h, const std::string& key) {
  const size_t p = h.find(key + "=");
  h.erase(p, h.find('\n', p) + 1 - p);
  return h;
}

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
  EXPECT_FALSE(fs::exists(dir / "ck.bin.tmp")) << "the temporary file must be renamed away";
  // A second save replaces the first.
  const Checkpoint d = sample(5000, 300, 1);
  save_checkpoint(dir / "ck.bin", d);
  expect_same(load_checkpoint(dir / "ck.bin"), d);
}

TEST(Checkpoint, EmptyAndWrongMagicAreNamed) {
  std::string m = input_error_of([] { parse({}, "empty.ck"); });
  EXPECT_HAS(m, "empty.ck");
  EXPECT_HAS(m, "empty");
  std::vector<uint8_t> b = serialize_checkpoint(sample(4, 2));
  b[3] = 'X';
  m = input_error_of([&] { parse(b, "magic.ck"); });
  EXPECT_HAS(m, "magic.ck");
  EXPECT_HAS(m, "magic");
  m = input_error_of([] { parse({'R', 'N', '5'}, "short.ck"); });
  EXPECT_HAS(m, "short.ck");
}

TEST(Checkpoint, WrongVersionIsNamed) {
  const std::string m = input_error_of([] { parse(build_file(kHeader, {{1, 2, 3}, {1, 2, 3}, {1, 2}}, 3), "v3.ck"); });
  EXPECT_HAS(m, "v3.ck");
  EXPECT_HAS(m, "version 3, this build reads versions 1 and 2");
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

TEST(Checkpoint, EveryTruncationOfAFileWithAWeightAverageIsAnInputError) {
  Checkpoint c = sample(40, 8);
  c.meta.ema_decay = 0.9;
  c.ema.assign(40, 0.25f);
  const std::vector<uint8_t> bytes = serialize_checkpoint(c);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    const std::string m = input_error_of([&] { parse(prefix, "cut.ck"); });
    ASSERT_NE(m.find("cut.ck"), std::string::npos) << "prefix of " << n << " bytes: " << m;
  }
}

TEST(Checkpoint, EveryTruncationIsAnInputError) {
  // Every prefix of a small checkpoint (header, lengths, arrays, checksum) ...
  const std::vector<uint8_t> small = serialize_checkpoint(sample(40, 8));
  for (size_t n = 0; n < small.size(); ++n) {
    const std::vector<uint8_t> prefix(small.begin(), small.begin() + n);
    const std::string m = input_error_of([&] { parse(prefix, "cut.ck"); });
    ASSERT_NE(m.find("cut.ck"), std::string::npos) << "prefix of " << n << " bytes: " << m;
  }
  // ... and a coarse sweep over a larger one.
  const std::vector<uint8_t> big = serialize_checkpoint(sample(200000, 5000));
  for (size_t n = 0; n < big.size(); n += big.size() / 97 + 1) {
    const std::string m = input_error_of([&] { parse_checkpoint(big.data(), n, "cut.ck"); });
    ASSERT_NE(m.find("cut.ck"), std::string::npos) << "prefix of " << n << " bytes: " << m;
  }
  const std::string m = input_error_of([&] { parse_checkpoint(big.data(), big.size() - 1, "cut.ck"); });
  EXPECT_HAS(m, "truncated");
}

TEST(Checkpoint, FlippedByteIsAChecksumMismatch) {
  const Checkpoint c = sample(1000, 100);
  const std::vector<uint8_t> good = serialize_checkpoint(c);
  // In the weights, the momentum, and the running statistics (the last array, just before the CRC).
  for (size_t at : {good.size() / 2, good.size() - 4 * 20, good.size() - 5}) {
    std::vector<uint8_t> b = good;
    b[at] ^= 0x10;
    const std::string m = input_error_of([&] { parse(b, "flip.ck"); });
    EXPECT_HAS(m, "flip.ck");
    EXPECT_HAS(m, "checksum");
  }
  // A header value changed to another well-formed one is caught by the checksum too.
  std::vector<uint8_t> b = good;
  const std::string text(b.begin(), b.end());
  const size_t p = text.find("step=123456789050");
  ASSERT_NE(p, std::string::npos);
  b[p + 5] = '2';
  EXPECT_HAS(input_error_of([&] { parse(b, "flip.ck"); }), "checksum");
}

TEST(Checkpoint, HeaderMissingAKeyIsNamed) {
  for (const char* key : {"precision", "seed", "loss_scale", "skipped_steps"}) {
    const std::string m = input_error_of([&] {
      parse(build_file(without_line(kHeader, key), {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "nokey.ck");
    });
    EXPECT_HAS(m, "nokey.ck");
    EXPECT_HAS(m, std::string("'") + key + "'");
  }
}

TEST(Checkpoint, MalformedHeaderValuesAreRejected) {
  std::string h = kHeader;
  h.replace(h.find("batch=128"), 9, "batch=12x");
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "val.ck"); }), "batch");
  h = kHeader;
  h.replace(h.find("step=100"), 8, "step=-10");
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "val.ck"); }), "val.ck");
  h = std::string(kHeader) + "no equals sign\n";
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "val.ck"); }), "no equals sign");
  // Arrays that disagree with the header's params/running counts.
  EXPECT_HAS(input_error_of([&] { parse(build_file(kHeader, {{1, 2}, {1, 2}, {1, 2}}), "val.ck"); }), "array sizes");
}

TEST(Checkpoint, AnArrayLengthThatDisagreesWithTheHeaderIsCorruptionNotTruncation) {
  std::vector<uint8_t> b = build_file(kHeader, {{1, 2, 3}, {1, 2, 3}, {1, 2}});
  const size_t first_len = 8 + 4 + 4 + std::strlen(kHeader);
  const uint64_t huge = 0x4000000000000000ull;  // would overflow a naive size computation
  std::memcpy(b.data() + first_len, &huge, 8);
  const std::string m = input_error_of([&] { parse(b, "len.ck"); });
  EXPECT_HAS(m, "len.ck: corrupt");
  EXPECT_HAS(m, "master weights holds 4611686018427387904 values, the header says params=3");
  EXPECT_EQ(m.find("truncated"), std::string::npos) << m;
}

TEST(Checkpoint, AHeaderClaimingMoreThanAnyCheckpointHoldsIsACorruptHeader) {
  std::string h = kHeader;
  h.replace(h.find("params=3"), 8, "params=13759268650546400843");
  const std::string m = input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "hdr.ck"); });
  EXPECT_HAS(m, "hdr.ck: corrupt header: params=13759268650546400843");
  EXPECT_EQ(m.find("truncated"), std::string::npos) << m;
}

TEST(Checkpoint, AFileShorterThanItsSaneHeaderSaysIsTruncated) {
  const std::vector<uint8_t> whole = serialize_checkpoint(sample(5000, 300));
  for (size_t cut : {size_t(100), size_t(1000), size_t(20000), size_t(40000)}) {
    const std::string m = input_error_of([&] { parse_checkpoint(whole.data(), whole.size() - cut, "cut.ck"); });
    EXPECT_HAS(m, "cut.ck: truncated");
    EXPECT_EQ(m.find("corrupt"), std::string::npos) << m;
  }
}

TEST(Checkpoint, StepEpochAndStepInEpochMustDescribeOnePosition) {
  // kHeader: step 100 = epoch 1 x 95 steps + step 5. Each change below fits no steps per epoch.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"epoch=1", "epoch=3"},                   // 95 steps are not 3 whole epochs
      {"step_in_epoch=5", "step_in_epoch=50"},  // step 50 of an epoch of 50 steps
      {"epoch=1", "epoch=0"},                   // in epoch 0, step must equal step_in_epoch
      {"epochs=15", "epochs=0"},                // a run of no epochs
  };
  for (const auto& [from, to] : bad) {
    std::string h = kHeader;
    h.replace(h.find(from), from.size(), to);
    const std::string m = input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "pos.ck"); });
    EXPECT_HAS(m, "pos.ck");
    EXPECT_TRUE(m.find("inconsistent header") != std::string::npos || m.find("out-of-range") != std::string::npos) << m;
  }
  std::string h = kHeader;
  h.replace(h.find("epoch=1\n"), 8, "epoch=2\n");  // 95 steps over 2 epochs
  EXPECT_HAS(input_error_of([&] { parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}}), "pos.ck"); }),
             "inconsistent header: step 100 is not epoch 2");
  EXPECT_NO_THROW(parse(build_file(kHeader, {{1, 2, 3}, {1, 2, 3}, {1, 2}})));
  h = kHeader;
  h.replace(h.find("epochs=15"), 9, "epochs=1");  // a run resumed with a smaller --epochs saves where it is
  EXPECT_NO_THROW(parse(build_file(h, {{1, 2, 3}, {1, 2, 3}, {1, 2}})));
}

TEST(CheckpointPosition, MustFitThisRunsStepsPerEpoch) {
  CheckpointMeta m;
  m.step = 100;
  m.epoch = 1;
  m.step_in_epoch = 5;
  EXPECT_NO_THROW(check_checkpoint_position(m, 95, "ck.bin"));
  const std::string e = input_error_of([&] { check_checkpoint_position(m, 78, "ck.bin"); });
  EXPECT_HAS(e, "ck.bin: saved at step 100 (epoch 2, step 5 of it)");
  EXPECT_HAS(e, "78 steps per epoch");
  EXPECT_HAS(e, "--synthetic-size");
  m.step_in_epoch = 0;
  m.step = 0;
  m.epoch = 0;
  EXPECT_NO_THROW(check_checkpoint_position(m, 1, "ck.bin"));
  m.step_in_epoch = 3;  // step 3 of epoch 0 cannot be in a run of 3 steps per epoch
  m.step = 3;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_position(m, 3, "ck.bin"); }), "3 steps per epoch");
}

TEST(CheckpointLoad, AFifoIsNamedNotWaitedOn) {
  TempDir dir;
  const std::string fifo = dir / "resume.ckpt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EXIT(exit_with_input_error([&] { load_checkpoint(fifo); }, false),
      ::testing::ExitedWithCode(0), "resume.ckpt: is a FIFO");
}

TEST(CheckpointLoad, AFileLargerThanAnyCheckpointIsRefusedAtOnce) {
  TempDir dir;
  const std::string path = dir / "huge.ckpt";
  save_checkpoint(path, sample(10, 4));
  ASSERT_EQ(truncate(path.c_str(), off_t(40) << 30), 0);  // 40 GiB, sparse
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = input_error_of([&] { load_checkpoint(path); });
  EXPECT_HAS(m, path + ": too large: 42949672960 bytes");
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Checkpoint, TrailingGarbageIsRejected) {
  std::vector<uint8_t> b = serialize_checkpoint(sample(10, 4));
  b.push_back(0);
  b.push_back(1);
  const std::string m = input_error_of([&] { parse(b, "tail.ck"); });
  EXPECT_HAS(m, "tail.ck");
  EXPECT_HAS(m, "2 unexpected bytes");
}

// ---- does a checkpoint fit this run? --------------------------------------------------------------

TEST(CheckpointFits, SameBuildAndRunFits) {
  const CheckpointMeta m = sample(4, 2).meta;
  EXPECT_NO_THROW(check_checkpoint_fits(m, m, "ck.bin"));
  CheckpointMeta later = m;
  later.step += 1000;
  later.loss_scale = 2.f;
  EXPECT_NO_THROW(check_checkpoint_fits(m, later, "ck.bin")) << "only build, model, batch and data must agree";
}

TEST(CheckpointFits, AnotherModelIsRejected) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.model_signature ^= 1;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }), "another model");
  f = here;
  f.params += 1;
  const std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin");
  EXPECT_HAS(m, "another model");
  EXPECT_HAS(m, "5 parameters in the checkpoint, 4 here");
}

TEST(CheckpointFits, AnotherSignatureAloneIsShownAsSuch) {
  // Both sides used to read "resnet50-cifar, 4 parameters": the message names the tensors and signatures.
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.model_signature = here.model_signature + 1;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }),
             "ck.bin: checkpoint of another model than this trainer builds: the same resnet50-cifar with 4 parameters, "
             "but other tensor names or shapes (model signature " + std::to_string(f.model_signature) +
                 " in the checkpoint, " + std::to_string(here.model_signature) + " here)");
  EXPECT_EQ(model_difference(here, here), "");
  f = here;
  f.model = "resnet18";
  f.running += 2;
  EXPECT_EQ(model_difference(f, here), "model resnet18 in the checkpoint, resnet50-cifar here; 4 BN running values in "
                                       "the checkpoint, 2 here");
}

TEST(CheckpointFits, PrecisionOrLayoutMismatchExplainsBothBuilds) {
  CheckpointMeta here = sample(4, 2).meta, f = here;
  here.precision = "fp32";
  here.layout = "NCHW";
  f.precision = "fp16";
  f.layout = "NHWC";
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin");
  EXPECT_HAS(m, "fp16/NHWC");
  EXPECT_HAS(m, "fp32/NCHW");
  f.precision = "fp32";  // layout alone
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "fp32/NHWC");
  EXPECT_HAS(m, "fp32/NCHW");
}

TEST(CheckpointFits, BatchAndDataMismatchAreNamed) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.batch = 64;
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "--batch 64");
  f = here;
  f.data = "cifar10";
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "cifar10");
  EXPECT_HAS(m, "--data");
}

TEST(CheckpointFits, OtherClassesOrImageSizeAreNamed) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.class_names = {"cat", "dog"};
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin: trained on 2 classes (cat,dog) but the data set has 6");
  f.params += 1;  // another class count is another model too: the classes are what the user must see
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }), "trained on 2 classes");
  f = here;
  f.image_side = 32;
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin: trained at --image-size 32; resume with --image-size 32");
  f = here;
  f.class_names.clear();  // an older file: its classes are not known, nothing to compare
  EXPECT_NO_THROW(check_checkpoint_fits(f, here, "ck.bin"));
}

TEST(ModelSignature, ChangesWithANameOrAShape) {
  using Tensors = std::vector<std::pair<std::string, std::vector<int>>>;
  const Tensors base = {{"conv1.w", {64, 3, 3, 3}}, {"bn1.gamma", {64}}, {"fc.w", {10, 2048}}};
  const uint64_t s = model_signature(base);
  EXPECT_EQ(model_signature(base), s);
  Tensors t = base;
  t[1].first = "bn1.beta";
  EXPECT_NE(model_signature(t), s);
  t = base;
  t[0].second[0] = 32;
  EXPECT_NE(model_signature(t), s);
  t = base;
  t[2].second = {2048, 10};
  EXPECT_NE(model_signature(t), s);
  t = base;
  t.pop_back();
  EXPECT_NE(model_signature(t), s);
  t = base;
  std::swap(t[0], t[1]);
  EXPECT_NE(model_signature(t), s);
}

// ---- atomic saves -----------------------------------------------------------------------------------

TEST(CheckpointSave, FailedSaveLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir / "ck.bin";
  const Checkpoint old = sample(2000, 50);
  save_checkpoint(path, old);
  // The temporary file cannot be created: a directory stands in its place.
  fs::create_directory(path + ".tmp");
  try {
    save_checkpoint(path, sample(2000, 50, 1));
    ADD_FAILURE() << "saving through a blocked .tmp should fail";
  } catch (const Fatal& e) {
    EXPECT_HAS(e.what(), path + ".tmp");
  }
  expect_same(load_checkpoint(path), old);
  fs::remove(path + ".tmp");
  // The target is a directory: the rename fails, and no temporary file is left behind.
  const std::string as_dir = dir / "dir.bin";
  fs::create_directory(as_dir);
  EXPECT_THROW(save_checkpoint(as_dir, old), Fatal);
  EXPECT_FALSE(fs::exists(as_dir + ".tmp"));
  // A missing directory names the path.
  try {
    save_checkpoint(dir / "missing/ck.bin", old);
    ADD_FAILURE() << "saving into a missing directory should fail";
  } catch (const Fatal& e) {
    EXPECT_HAS(e.what(), dir / "missing/ck.bin");
  }
  expect_same(load_checkpoint(path), old);
}

// Weights of "version" v: every element is a function of (v, i), so a file mixing two saves, or a
// partial one, can be recognised even if its checksum happened to pass.
Checkpoint versioned(int v, size_t n) {
  Checkpoint c = sample(4, 2);
  c.meta.step = v;  // in epoch 0
  c.meta.epoch = 0;
  c.meta.step_in_epoch = v;
  c.meta.skipped_steps = 0;
  c.meta.params = n;
  c.meta.running = 1024;
  c.master.assign(n, 0.f);
  c.momentum.assign(n, 0.f);
  c.running.assign(1024, static_cast<float>(v));
  for (size_t i = 0; i < n; ++i) {
    c.master[i] = static_cast<float>(v) + static_cast<float>(i % 1000) * 1e-3f;
    c.momentum[i] = -static_cast<float>(v);
  }
  return c;
}

// Polls `done` every 0.2 ms for up to `seconds`; true once it holds.
bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    usleep(200);
  }
  return true;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

TEST(CheckpointSave, KilledMidSaveLeavesALoadableCheckpoint) {
  TempDir dir;
  const std::string path = dir / "ck.bin", tmp = path + ".tmp";
  const size_t n = 2'500'000;  // 2 arrays x 10 MB: a save takes long enough to be interrupted
  save_checkpoint(path, versioned(0, n));
  std::mt19937 rng(1234);
  int mid_save_kills = 0, last = 0;
  for (int round = 0; round < 20; ++round) {
    fs::remove(tmp);  // the previous round's half-written file
    int done[2];
    ASSERT_EQ(pipe(done), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {
      // Keep saving ever newer versions until killed, telling the parent after each save. No gtest,
      // no exit handlers in here.
      close(done[0]);
      fcntl(done[1], F_SETFL, O_NONBLOCK);
      try {
        for (int v = last + 1;; ++v) {
          save_checkpoint(path, versioned(v, n));
          const char b = 1;
          if (write(done[1], &b, 1) < 0) {}  // a full pipe is fine: the parent reads only the first
        }
      } catch (...) {
      }
      _exit(3);
    }
    close(done[1]);
    // Time the writing phase of the child's first save (from its temporary file's appearance to the
    // save's end), then kill the second save at a random moment from its temporary file's appearance
    // to twice that time later: inside write, fsync, rename or the directory's fsync, or just after,
    // whatever the disk's speed.
    const bool first_started = wait_until([&] { return fs::exists(tmp) || readable(done[0]); }, 30);
    const auto t_tmp = std::chrono::steady_clock::now();
    const bool first_done = first_started && wait_until([&] { return readable(done[0]); }, 30);
    const double write_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t_tmp).count();
    const bool second_started = first_done && wait_until([&] { return fs::exists(tmp); }, 30);
    if (second_started) usleep(std::uniform_int_distribution<int>(0, static_cast<int>(2 * write_us) + 1000)(rng));
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    close(done[0]);
    ASSERT_TRUE(second_started) << "the saver did not get through one save and into the next in time";
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver stopped by itself (status " << status << ")";
    mid_save_kills += fs::exists(tmp);
    Checkpoint c;
    try {
      c = load_checkpoint(path);
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": after the kill the checkpoint does not load: " << e.what();
    }
    const int v = static_cast<int>(c.meta.step);
    ASSERT_GT(v, last) << "round " << round << ": the save completed before the kill is gone";
    ASSERT_EQ(c.master.size(), n);
    for (size_t i = 0; i < n; i += 4999)
      ASSERT_EQ(c.master[i], static_cast<float>(v) + static_cast<float>(i % 1000) * 1e-3f) << "round " << round;
    ASSERT_EQ(c.momentum[n - 1], -static_cast<float>(v));
    last = v;
  }
  EXPECT_GT(mid_save_kills, 0) << "no kill landed while a temporary file was being written";
}

}  // namespace
