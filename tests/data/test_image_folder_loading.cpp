// Loading an image folder (image_folder.h): decoding on demand and into the cache giving the same
// pixels, grey folders, the cache's memory check, and the normalisation sample and its warning.
#include <gtest/gtest.h>

#include <stb_image_write.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/host_memory.h"
#include "data/dataset.h"
#include "data/image_decode.h"
#include "data/image_folder.h"
#include "support/test_files.h"
#include "image_folder_test_util.h"

namespace {

using namespace test_files;         // TempDir, input_error_of
using namespace image_folder_test;  // write, fixture, write_png, write_folder, error_of_loading, at_side

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

}  // namespace
