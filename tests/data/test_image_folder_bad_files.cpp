// Bad files in an image folder (image_folder.h): truncated, undecodable or a FIFO, each named in one
// InputError or, with --skip-bad-images, left out and counted; met later, by the normalisation
// sample or a batch, named as an ImageDecodeError.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "support/test_files.h"
#include "image_folder_test_util.h"

namespace {

using namespace test_files;         // TempDir, input_error_of
using namespace image_folder_test;  // fs, write, fixture, write_folder, error_of_loading, at_side

TEST(ImageFolder, ABadFileIsNamedOrWithSkipBadLeftOutAndCounted) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  std::vector<uint8_t> truncated = fixture("rgb.png");
  truncated.resize(truncated.size() - 20);
  write(dir / "train/dog/c.png", truncated);
  EXPECT_EQ(error_of_loading(dir.path),
            dir / "train/dog/c.png" + ": truncated: the PNG has no IEND chunk at its end (--skip-bad-images leaves it out)");
  write(dir / "test/cat/d.jpg", {'n', 'o', 'p', 'e'});
  EXPECT_HAS(error_of_loading(dir.path), "(and 1 more bad files; --skip-bad-images leaves them out)");
  ImageOptions skip = at_side(8);
  skip.skip_bad = true;
  const FolderData f = load_image_folder(dir.path, skip);
  EXPECT_EQ(f.report.skipped, 2);
  ASSERT_EQ(f.report.skipped_examples.size(), 2u);
  EXPECT_HAS(f.report.skipped_examples[0], dir / "train/dog/c.png: truncated");
  EXPECT_EQ(f.split.train.count, 4);
  EXPECT_EQ(f.split.test.count, 4);
  // A class whose every file is bad cannot stay.
  fs::remove(dir / "train/cat/a.png");
  write(dir / "train/cat/b.jpg", truncated);
  EXPECT_HAS(error_of_loading(dir.path, skip), dir / "train/cat: no readable images left");
}

// A FIFO named like an image is refused at once, not opened and waited on for a writer (which
// would hang the run): should loading not come back, the test opens the FIFO for writing so that
// it does, and fails.
TEST(ImageFolder, AFifoIsNamedOrSkippedNotWaitedOn) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  const std::string fifo = dir / "train/dog/p.png";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto loading = std::async(std::launch::async, [&] { return error_of_loading(dir.path); });
  if (loading.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    const int writer = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
    loading.wait();
    FAIL() << "loading the folder waited on the FIFO";
  }
  EXPECT_EQ(loading.get(), fifo + ": is a FIFO (named pipe), expected a regular file (--skip-bad-images leaves it out)");
  ImageOptions skip = at_side(8);
  skip.skip_bad = true;
  const FolderData f = load_image_folder(dir.path, skip);
  EXPECT_EQ(f.report.skipped, 1);
  EXPECT_EQ(f.split.train.count, 4);
}

// A PNG whose header and end are fine but whose pixels do not inflate.
std::vector<uint8_t> undecodable_png() {
  std::vector<uint8_t> b = fixture("rgb.png");
  const size_t idat = std::string(b.begin(), b.end()).find("IDAT");
  for (size_t i = idat + 4; i < idat + 12; ++i) b[i] = 0xFF;
  return b;
}

TEST(ImageFolder, AFileThatFailsToDecodeIntoTheCacheIsNamedOrSkipped) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  write(dir / "train/cat/bad.png", undecodable_png());
  ImageOptions cache = at_side(8, true);
  EXPECT_HAS(error_of_loading(dir.path, cache), dir / "train/cat/bad.png: cannot decode the PNG");
  EXPECT_EQ(load_image_folder(dir.path, at_side(8)).split.train.count, 5) << "the header pass cannot see it";
  cache.skip_bad = true;
  const FolderData f = load_image_folder(dir.path, cache);
  EXPECT_EQ(f.split.train.count, 4);
  EXPECT_EQ(f.report.skipped, 1);
  EXPECT_EQ(f.split.train.images.size(), 4u * 3 * 8 * 8);
  for (const std::string& p : f.split.train.paths) EXPECT_EQ(p.find("bad.png"), std::string::npos);
}

// --skip-bad-images leaves out a file that passes the header check but does not decode whether or
// not the images are cached: decoded every epoch, every file is decoded once at start to find it
// (issue 38: it used to stay in, and stop the run when a batch or the normalisation sample met it).
TEST(ImageFolder, SkipBadImagesLeavesOutAFileThatDoesNotDecodeWithoutTheCacheToo) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  write(dir / "test/dog/bad.png", undecodable_png());
  ImageOptions skip = at_side(8);
  skip.skip_bad = true;
  const FolderData f = load_image_folder(dir.path, skip);
  EXPECT_TRUE(f.split.test.decoded_on_demand);
  EXPECT_TRUE(f.split.test.images.empty()) << "nothing kept in memory";
  EXPECT_EQ(f.split.test.count, 4);
  EXPECT_EQ(f.split.test.labels, (std::vector<uint8_t>{0, 0, 1, 1}));
  for (const std::string& p : f.split.test.paths) EXPECT_EQ(p.find("bad.png"), std::string::npos);
  EXPECT_EQ(f.report.skipped, 1);
  ASSERT_EQ(f.report.skipped_examples.size(), 1u);
  EXPECT_HAS(f.report.skipped_examples[0], dir / "test/dog/bad.png: cannot decode the PNG");
  EXPECT_HAS(f.report.skipped_examples[0], "(decoding)");
  EXPECT_EQ(f.report.decoded_images, 9);
  EXPECT_EQ(f.report.cache_bytes, 0u);
}

// Decoded on demand without --skip-bad-images, a file that does not decode is met first by the
// normalisation sample at start, if it is in the sample: the error says so, and what leaves it out.
TEST(ImageFolder, TheNormalisationSampleNamesAFileThatDoesNotDecodeAndTheFlagThatSkipsIt) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  write(dir / "train/dog/bad.png", undecodable_png());
  const FolderData f = load_image_folder(dir.path, at_side(8));
  try {
    compute_normalization(f.split.train, 2);
    ADD_FAILURE() << "the sample decoded every file";
  } catch (const ImageDecodeError& e) {
    EXPECT_HAS(e.what(), dir / "train/dog/bad.png: cannot decode the PNG");
    EXPECT_HAS(e.what(), "(met by the normalisation sample at start; --skip-bad-images leaves out files that do not decode)");
  }
}

// Decoding on demand: the file is named where the batch is assembled (a loader thread, or the main
// thread of the synchronous loader), as an ImageDecodeError.
TEST(ImageFolder, AFileThatFailsToDecodeInABatchIsAnImageDecodeErrorNamingIt) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  const FolderData f = load_image_folder(dir.path, at_side(8));
  write(dir / "test/dog/a.png", undecodable_png());  // changed after the header pass
  const EpochPlan plan = eval_plan(f.split.test, 2);  // batch 0: cat/a, cat/b; batch 1: dog/a, dog/b
  std::vector<uint8_t> images(2 * f.split.test.image_bytes());
  std::vector<int32_t> labels(2);
  assemble_batch_u8(f.split.test, plan, 0, Layout::NCHW, images.data(), labels.data());
  try {
    assemble_batch_u8(f.split.test, plan, 1, Layout::NHWC, images.data(), labels.data());
    ADD_FAILURE() << "assembled a batch holding an undecodable file";
  } catch (const ImageDecodeError& e) {
    EXPECT_HAS(e.what(), dir / "test/dog/a.png: cannot decode");
  }
}

}  // namespace
