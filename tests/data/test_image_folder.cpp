// The image-folder data set (image_folder.h) on folders written here: class discovery and labels,
// every way a folder can be wrong (each an InputError naming the place), bad files named or
// skipped, decoding on demand and into the cache giving the same pixels, the cache's memory check,
// the normalisation sample, and `make data-folder`'s PNG export read back against the idx and CIFAR
// readers' own pixels.
#include <gtest/gtest.h>

#include <stb_image_write.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/host_memory.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<uint8_t> fixture(const std::string& name) { return read_file(repo_path("tests/fixtures/images/" + name)); }

// A w x h PNG of `channels` whose pixels are `value` plus a gradient.
void write_png(const std::string& path, int w, int h, int channels, int value) {
  fs::create_directories(fs::path(path).parent_path());
  std::vector<uint8_t> px(size_t(w) * h * channels);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(value + i * 7);
  ASSERT_TRUE(stbi_write_png(path.c_str(), w, h, channels, px.data(), w * channels)) << path;
}

// train/ and test/ with the same classes, two colour images each in several formats and sizes.
void write_folder(const std::string& root, const std::vector<std::string>& classes) {
  for (const char* split : {"train", "test"})
    for (size_t k = 0; k < classes.size(); ++k) {
      const std::string dir = root + "/" + split + "/" + classes[k];
      write_png(dir + "/a.png", 20 + int(k), 12, 3, 10 * int(k));
      write(dir + "/b.jpg", fixture("rgb.jpg"));
    }
}

std::string error_of_loading(const std::string& root, const ImageOptions& o = {}) {
  return input_error_of([&] { load_image_folder(root, o); });
}

ImageOptions at_side(int side, bool cache = false) {
  ImageOptions o;
  o.side = side;
  o.cache_decoded = cache;
  o.threads = 2;
  return o;
}

// ---- discovery -----------------------------------------------------------------------------------
TEST(ImageFolder, ClassesAreTheSortedSubdirectoriesWithoutHiddenOnes) {
  TempDir dir;
  for (const char* d : {"train/zebra", "train/Apple", "train/apple", "train/.cache", "train/10", "train/9"})
    fs::create_directories(dir / d);
  write(dir / "train/readme.txt", {'x'});
  EXPECT_EQ(find_classes(dir / "train"), (std::vector<std::string>{"10", "9", "Apple", "apple", "zebra"}));
}

TEST(ImageFolder, LabelsFollowTheClassesAndFilesAreSortedSubdirectoriesIncluded) {
  TempDir dir;
  const std::string t = dir / "train";
  for (const char* f : {"a/2.png", "a/1.PNG", "a/sub/0.Jpeg", "a/.hidden.png", "a/.skip/3.png", "b/z.GIF", "b/y.pgm"})
    write(t + "/" + f, {0});
  write(t + "/a/notes.txt", {0});
  write(t + "/b/image.webp", {0});
  const FolderListing l = list_images(t, {"a", "b"});
  EXPECT_EQ(l.paths, (std::vector<std::string>{t + "/a/1.PNG", t + "/a/2.png", t + "/a/sub/0.Jpeg", t + "/b/y.pgm",
                                                t + "/b/z.GIF"}));
  EXPECT_EQ(l.labels, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(l.ignored, 2);
}

TEST(ImageFolder, ImageExtensionsInAnyCase) {
  for (const char* yes : {"a.png", "a.PNG", "b.jpg", "b.JPEG", "c.jpeg", "d.bmp", "e.Tga", "f.gif", "g.ppm", "h.PGM", "x.y.png"})
    EXPECT_TRUE(has_image_extension(yes)) << yes;
  for (const char* no : {"a", "png", "a.webp", "a.png.txt", "a.tif", "a.pbm", "a."}) EXPECT_FALSE(has_image_extension(no)) << no;
}

TEST(ImageFolder, EveryMalformedLayoutIsNamed) {
  TempDir dir;
  EXPECT_HAS(error_of_loading(dir / "nowhere"), "image folder '" + dir / "nowhere" + "' not found");
  fs::create_directories(dir / "a/test/x");
  EXPECT_HAS(error_of_loading(dir / "a"), dir / "a" + ": no train/ directory");
  fs::create_directories(dir / "b/train/x");
  EXPECT_HAS(error_of_loading(dir / "b"), dir / "b" + ": no test/ (or val/) directory");
  fs::create_directories(dir / "c/train");
  fs::create_directories(dir / "c/test");
  EXPECT_HAS(error_of_loading(dir / "c"), dir / "c/train: no class directories");
  write_folder(dir / "d", {"cat", "dog"});
  fs::create_directories(dir / "d/val/cat");
  EXPECT_HAS(error_of_loading(dir / "d"), "has both test/ and val/");
  write_folder(dir / "e", {"cat", "dog"});
  fs::create_directories(dir / "e/train/emu");
  EXPECT_HAS(error_of_loading(dir / "e"), dir / "e/test: its classes differ from those of " + dir / "e/train (missing emu)");
  fs::create_directories(dir / "e/test/emu");
  fs::create_directories(dir / "e/test/fox");
  write(dir / "e/train/emu/1.png", fixture("rgb.png"));
  EXPECT_HAS(error_of_loading(dir / "e"), "(extra fox)");
  write_folder(dir / "f", {"cat", "dog"});
  fs::create_directories(dir / "f/train/emu");
  fs::create_directories(dir / "f/test/emu");
  write(dir / "f/train/emu/notes.txt", {1});
  EXPECT_HAS(error_of_loading(dir / "f"), dir / "f/train/emu: no images in this class");
}

TEST(ImageFolder, ValIsTheTestSplitWhenThereIsNoTest) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog"});
  fs::rename(dir / "test", dir / "val");
  const FolderData f = load_image_folder(dir.path, at_side(16));
  EXPECT_EQ(f.report.test_split, "val");
  EXPECT_EQ(f.split.test.count, 4);
  EXPECT_EQ(f.split.test.paths[0], dir / "val/cat/a.png");
}

// ---- loading ---------------------------------------------------------------------------------------
TEST(ImageFolder, DecodedOnDemandAndCachedGiveTheSamePixels) {
  TempDir dir;
  write_folder(dir.path, {"cat", "dog", "emu"});
  const FolderData lazy = load_image_folder(dir.path, at_side(16));
  const FolderData cached = load_image_folder(dir.path, at_side(16, true));
  for (const FolderData* f : {&lazy, &cached}) {
    const Dataset& d = f->split.train;
    EXPECT_EQ(d.name, "folder");
    EXPECT_EQ(d.count, 6);
    EXPECT_EQ(d.side, 16);
    EXPECT_EQ(d.channels, 3);
    EXPECT_EQ(d.class_names, (std::vector<std::string>{"cat", "dog", "emu"}));
    EXPECT_EQ(d.labels, (std::vector<uint8_t>{0, 0, 1, 1, 2, 2}));
    EXPECT_EQ(d.paths[3], dir / "train/dog/b.jpg");
  }
  EXPECT_TRUE(lazy.split.train.decoded_on_demand);
  EXPECT_TRUE(lazy.split.train.images.empty());
  EXPECT_FALSE(cached.split.train.decoded_on_demand);
  EXPECT_EQ(cached.report.cache_bytes, 12u * 3 * 16 * 16);
  EXPECT_EQ(cached.report.decoded_images, 12);
  for (const DataSplit* s : {&lazy.split, &cached.split})
    for (const Dataset* d : {&s->train, &s->test})
      for (int i = 0; i < d->count; ++i) {
        std::vector<uint8_t> direct(d->image_bytes()), scratch(d->image_bytes());
        load_image_file(d->paths[i], 3, 16, direct.data());
        const uint8_t* px = image_pixels(*d, i, scratch.data());
        ASSERT_EQ(std::vector<uint8_t>(px, px + d->image_bytes()), direct) << d->paths[i];
      }
}

TEST(ImageFolder, AFolderOfGreyFilesKeepsOneChannel) {
  TempDir dir;
  for (const char* split : {"train", "test"})
    for (const char* cls : {"a", "b"}) {
      write(dir / (std::string(split) + "/" + cls + "/g.pgm"), fixture("grey.pgm"));
      write(dir / (std::string(split) + "/" + cls + "/ga.png"), fixture("grey_alpha.png"));
    }
  const FolderData f = load_image_folder(dir.path, at_side(8, true));
  EXPECT_EQ(f.split.train.channels, 1);
  EXPECT_EQ(f.split.train.images.size(), 4u * 8 * 8);
  write(dir / "test/b/c.png", fixture("rgb.png"));  // one colour file makes the folder colour
  EXPECT_EQ(load_image_folder(dir.path, at_side(8)).split.train.channels, 3);
}

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

// Directories nested 16 deep under a class are read; deeper is refused with one line (a symlink
// loop would otherwise never end), as the docs say.
TEST(ImageFolder, ClassDirectoriesNestedSixteenDeepAreReadAndDeeperRefused) {
  TempDir dir;
  std::string deep = dir / "train/a";
  for (int d = 0; d < 16; ++d) deep += "/d";
  write(deep + "/x.png", fixture("rgb.png"));
  EXPECT_EQ(list_images(dir / "train", {"a"}).paths, (std::vector<std::string>{deep + "/x.png"}));
  write(deep + "/e/y.png", fixture("rgb.png"));
  EXPECT_EQ(input_error_of([&] { list_images(dir / "train", {"a"}); }),
            deep + "/e: directories nested more than 16 deep (a symlink loop?)");
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

TEST(ImageFolder, TheCacheMustFitInThreeQuartersOfMemAvailable) {
  TempDir dir;
  std::ofstream(dir / "meminfo") << "MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    4 kB\n";
  EXPECT_EQ(read_mem_available(dir / "meminfo"), std::optional<size_t>(4096));
  EXPECT_EQ(read_mem_available(dir / "missing"), std::nullopt);
  EXPECT_NO_THROW(check_cache_fits(3072, 4096, 1, 32));
  EXPECT_HAS(input_error_of([] { check_cache_fits(3073, 4096, 1, 32); }), "--cache-decoded: 1 images at 32x32 need");
  EXPECT_NO_THROW(check_cache_fits(uint64_t(1) << 40, 0, 1, 32)) << "unknown memory: no check";
  write_folder(dir / "set", {"cat", "dog"});
  std::ofstream(dir / "meminfo-1k") << "MemAvailable:    1 kB\n";
  ImageOptions o = at_side(8, true);  // 8 images of 8x8x3: 1536 bytes, more than 3/4 of 1 KiB
  o.meminfo = dir / "meminfo-1k";
  EXPECT_HAS(error_of_loading(dir / "set", o), "--cache-decoded: 8 images at 8x8 need");
  o.cache_decoded = false;
  EXPECT_NO_THROW(load_image_folder(dir / "set", o)) << "decoding every epoch needs no cache";
}

// Decoded on demand, the statistics come from images j * count / sample: here every even image is
// one grey level and every odd one another, so the sample sees only the first.
TEST(ImageFolder, NormalisationOfImagesDecodedOnDemandUsesAnEvenSample) {
  TempDir dir;
  write_png(dir / "dark.png", 8, 8, 1, 0);
  write_png(dir / "light.png", 8, 8, 1, 100);
  Dataset d;
  d.count = 2 * kNormalizationSample;
  d.channels = 1;
  d.side = 8;
  d.decoded_on_demand = true;
  for (int i = 0; i < d.count; ++i) d.paths.push_back(dir / (i % 2 ? "light.png" : "dark.png"));
  const Normalization n = compute_normalization(d, 2);
  EXPECT_EQ(n.images, kNormalizationSample);
  std::vector<uint8_t> dark(64);
  load_image_file(dir / "dark.png", 1, 8, dark.data());
  double mean = 0;
  for (uint8_t v : dark) mean += v / 255.0 / 64;
  EXPECT_NEAR(n.mean[0], mean, 1e-6);
  EXPECT_EQ(n.mean[2], n.mean[0]);
  d.count = 100;  // at most the sample size: all of them
  EXPECT_EQ(compute_normalization(d, 2).images, 100);
}

// Images of one colour: the channels that are one value in every pixel have a standard deviation of
// 0, taken as 1 (dividing by ~0 would blow any other value up at test time), and one warning line
// names them (issue 38: the variance was clamped at 1e-12, silently).
TEST(ImageFolder, NormalisationWarnsOfChannelsOfOneValueAndTakesTheirStdAsOne) {
  TempDir dir;
  auto solid = [&](const std::string& name, uint8_t r, uint8_t g, uint8_t b) {
    std::vector<uint8_t> px;
    for (int i = 0; i < 8 * 8; ++i) px.insert(px.end(), {r, g, b});
    ASSERT_TRUE(stbi_write_png((dir / name).c_str(), 8, 8, 3, px.data(), 8 * 3));
  };
  solid("a.png", 10, 0, 200);
  solid("b.png", 30, 0, 200);
  Dataset d;
  d.count = 2;
  d.channels = 3;
  d.side = 8;
  d.decoded_on_demand = true;
  d.paths = {dir / "a.png", dir / "b.png"};
  const Normalization n = compute_normalization(d, 2);
  EXPECT_NEAR(n.stdev[0], 10 / 255.0, 1e-6) << "red varies between the images";
  EXPECT_EQ(n.stdev[1], 1.f);
  EXPECT_EQ(n.stdev[2], 1.f);
  EXPECT_NEAR(n.mean[2], 200 / 255.0, 1e-6);
  EXPECT_EQ(n.warning, "normalisation: every pixel of the 2 training images has the same value in channel green (0/255), "
                       "blue (200/255): a standard deviation of 0, taken as 1 (are the images blank or of one colour?)");
  solid("b.png", 30, 1, 200);
  EXPECT_HAS(compute_normalization(d, 2).warning, "channel blue (200/255):");
  solid("b.png", 30, 1, 201);
  EXPECT_EQ(compute_normalization(d, 2).warning, "") << "no channel of one value, no warning";
}

// ---- make data-folder ------------------------------------------------------------------------------
bool python_available() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

// Runs data/make_folder.py with `args`; returns its exit status.
int make_folder(const std::string& args, const std::string& log) {
  return std::system(("python3 " + repo_path("data/make_folder.py") + " " + args + " >" + log + " 2>&1").c_str());
}

// Every image of the folder read back (cached, at 32x32) equals the array reader's image at the
// index its file name gives, with the same label and class name.
void expect_same_pixels(const Dataset& folder, const Dataset& arrays) {
  ASSERT_EQ(folder.count, arrays.count);
  ASSERT_EQ(folder.channels, arrays.channels);
  ASSERT_EQ(folder.classes(), arrays.classes());
  for (int k = 0; k < folder.classes(); ++k) {
    std::string name = arrays.class_names[k];
    for (char& ch : name)
      if (ch == '/' || ch == ' ') ch = '_';
    EXPECT_EQ(folder.class_names[k], std::to_string(k) + "_" + name);
  }
  for (int i = 0; i < folder.count; ++i) {
    const std::string file = fs::path(folder.paths[i]).stem().string();
    const int index = std::stoi(file);
    ASSERT_EQ(folder.labels[i], arrays.labels[index]) << folder.paths[i];
    ASSERT_EQ(std::memcmp(folder.image(i), arrays.image(index), arrays.image_bytes()), 0) << folder.paths[i];
  }
}

std::vector<uint8_t> be32(std::vector<uint32_t> words) {
  std::vector<uint8_t> b;
  for (uint32_t w : words)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(w >> s));
  return b;
}

TEST(DataFolderExport, FashionMnistPngsHoldTheIdxReadersPixels) {
  if (!python_available()) GTEST_SKIP() << "python3 is not installed: data/make_folder.py cannot run";
  TempDir dir;
  const int counts[2] = {37, 13};
  const char* bases[2][2] = {{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
                             {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}};
  for (int s = 0; s < 2; ++s) {
    std::vector<uint8_t> images = be32({0x803, uint32_t(counts[s]), 28, 28}), labels = be32({0x801, uint32_t(counts[s])});
    for (int i = 0; i < counts[s] * 28 * 28; ++i) images.push_back(static_cast<uint8_t>(i * 13 + s * 5 + i / 777));
    for (int i = 0; i < counts[s]; ++i) labels.push_back(static_cast<uint8_t>((i * 7 + s) % 10));
    write(dir / (std::string(bases[s][0]) + ".gz"), gzip(images));
    write(dir / bases[s][1], labels);  // one of them plain: the script takes both
  }
  ASSERT_EQ(make_folder("--fashion-mnist-dir " + dir.path + " --cifar-dir " + dir / "none --out " + dir / "out", dir / "log"), 0)
      << std::ifstream(dir / "log").rdbuf();
  const DataSplit arrays = load_fashion_mnist(dir.path);
  const FolderData folder = load_image_folder(dir / "out/fashion-mnist-png", at_side(32, true));
  expect_same_pixels(folder.split.train, arrays.train);
  expect_same_pixels(folder.split.test, arrays.test);
  EXPECT_FALSE(fs::exists(dir / "out/cifar-10-png")) << "no CIFAR-10 batches, no folder";
}

TEST(DataFolderExport, TheRealFashionMnistReadsBackTheSame) {
  const std::string fmnist = find_fashion_mnist_dir();
  if (fmnist.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
  if (!python_available()) GTEST_SKIP() << "python3 is not installed: data/make_folder.py cannot run";
  TempDir dir;
  ASSERT_EQ(make_folder("--fashion-mnist-dir " + fmnist + " --cifar-dir " + dir / "none --limit 300 --out " + dir.path, dir / "log"), 0)
      << std::ifstream(dir / "log").rdbuf();
  DataSplit arrays = load_fashion_mnist(fmnist);
  for (Dataset* d : {&arrays.train, &arrays.test}) {  // the first 300 of each, as --limit wrote
    d->count = 300;
    d->labels.resize(300);
    d->images.resize(d->image_bytes() * 300);
  }
  const FolderData folder = load_image_folder(dir / "fashion-mnist-png", at_side(32, true));
  expect_same_pixels(folder.split.train, arrays.train);
  expect_same_pixels(folder.split.test, arrays.test);
}

TEST(DataFolderExport, Cifar10PngsHoldTheBinaryReadersPixels) {
  if (!python_available()) GTEST_SKIP() << "python3 is not installed: data/make_folder.py cannot run";
  TempDir dir;
  const int records = 10;  // every class in every file: an image folder has no empty class
  DataSplit arrays;
  arrays.train.class_names = arrays.test.class_names = {"airplane", "automobile", "bird", "cat", "deer",
                                                        "dog", "frog", "horse", "ship", "truck"};
  for (const char* f : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                        "data_batch_5.bin", "test_batch.bin"}) {
    std::vector<uint8_t> b(kCifarRecordBytes * records);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 31 + f[11] * 3);
    for (int r = 0; r < records; ++r) b[kCifarRecordBytes * r] = static_cast<uint8_t>((r + f[11]) % 10);
    write(dir / (std::string("cifar/") + f), b);
    parse_cifar10_batch(b.data(), b.size(), f, std::string(f) == "test_batch.bin" ? arrays.test : arrays.train, records);
  }
  // The script writes Fashion-MNIST too: one black image a split.
  std::vector<uint8_t> one_image = be32({0x803, 1, 28, 28}), one_label = be32({0x801, 1});
  one_image.resize(one_image.size() + 28 * 28);
  one_label.push_back(0);
  for (const std::string s : {"train", "t10k"}) {
    write(dir / ("fmnist/" + s + "-images-idx3-ubyte"), one_image);
    write(dir / ("fmnist/" + s + "-labels-idx1-ubyte"), one_label);
  }
  ASSERT_EQ(make_folder("--fashion-mnist-dir " + dir / "fmnist --cifar-dir " + dir / "cifar --out " + dir / "out", dir / "log"), 0)
      << std::ifstream(dir / "log").rdbuf();
  const FolderData folder = load_image_folder(dir / "out/cifar-10-png", at_side(32, true));
  expect_same_pixels(folder.split.train, arrays.train);
  expect_same_pixels(folder.split.test, arrays.test);
}

}  // namespace
