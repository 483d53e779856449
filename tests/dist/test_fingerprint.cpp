// Fingerprints: what is encoded comes back, and what differs between two ranks is said, naming the
// fields and both values (dist/fingerprint.h).
#include <gtest/gtest.h>

#include "core/errors.h"
#include "dist/fingerprint.h"

namespace {

Fingerprint sample() {
  Fingerprint f;
  f.add("build", "train: optimizations [fp16]").add("--lr", "0.02").add("--batch", "128").add("data", "fashion-mnist");
  return f;
}

}  // namespace

TEST(Fingerprint, RoundTrip) {
  Fingerprint f = sample();
  f.add("multi", "line one\nline two");
  const Fingerprint g = Fingerprint::decode(f.encode());
  EXPECT_EQ(g.fields(), f.fields());
  EXPECT_EQ(g.fields().back().second, "line one line two");
}

TEST(Fingerprint, BadKeysAndTextAreRefused) {
  Fingerprint f;
  EXPECT_THROW(f.add("a=b", "x"), Fatal);
  EXPECT_THROW(f.add("", "x"), Fatal);
  f.add("k", "v");
  EXPECT_THROW(f.add("k", "w"), Fatal);
  EXPECT_THROW(Fingerprint::decode("no equals sign\n"), Fatal);
  EXPECT_THROW(Fingerprint::decode("=value\n"), Fatal);
}

TEST(Fingerprint, EqualOnesHaveNoDifferences) {
  EXPECT_EQ(fingerprint_differences(sample(), "rank 0", sample(), "rank 1"), "");
}

TEST(Fingerprint, MismatchedFlagsAreNamedWithBothValues) {
  Fingerprint other;
  other.add("build", "train: optimizations [fp16]").add("--lr", "0.1").add("--batch", "128").add("data", "fashion-mnist");
  const std::string d = fingerprint_differences(sample(), "rank 0", other, "rank 3");
  EXPECT_EQ(d, "--lr is '0.02' on rank 0 but '0.1' on rank 3");
}

TEST(Fingerprint, MismatchedBuildsAndMissingFieldsAreNamed) {
  Fingerprint other;
  other.add("build", "train-ddp-naive: optimizations [fp16]").add("--lr", "0.02").add("data", "fashion-mnist");
  other.add("--new-flag", "on");
  const std::string d = fingerprint_differences(sample(), "rank 0", other, "rank 1");
  EXPECT_NE(d.find("build is 'train: optimizations [fp16]' on rank 0 but 'train-ddp-naive: optimizations [fp16]' on rank 1"),
            std::string::npos) << d;
  EXPECT_NE(d.find("--batch is '128' on rank 0 but absent on rank 1"), std::string::npos) << d;
  EXPECT_NE(d.find("--new-flag is absent on rank 0 but 'on' on rank 1"), std::string::npos) << d;
}

TEST(Fingerprint, LongListsAreCut) {
  Fingerprint a, b;
  for (int i = 0; i < 10; ++i) {
    a.add("k" + std::to_string(i), "a");
    b.add("k" + std::to_string(i), "b");
  }
  const std::string d = fingerprint_differences(a, "rank 0", b, "rank 1", 3);
  EXPECT_NE(d.find("k2 is"), std::string::npos);
  EXPECT_EQ(d.find("k3 is"), std::string::npos);
  EXPECT_NE(d.find("and 7 more"), std::string::npos) << d;
}
