// Damaged checkpoints (checkpoint.h): every kind of damage (empty, wrong magic or version, truncated,
// flipped bytes, bad header values, lengths, trailing bytes, a FIFO, a huge file) an InputError naming
// the file, never a crash, with corruption told from truncation.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/elapsed.h"
#include "train/checkpoint.h"
#include "core/errors.h"
#include "support/test_files.h"
#include "checkpoint_test_util.h"

namespace {

using namespace test_files;       // TempDir, input_error_of
using namespace checkpoint_test;  // sample, parse, build_file, kHeader

std::string without_line(std::string h, const std::string& key) {
  const size_t p = h.find(key + "=");
  h.erase(p, h.find('\n', p) + 1 - p);
  return h;
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

}  // namespace
