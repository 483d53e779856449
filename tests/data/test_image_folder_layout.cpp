// The image folder's layout (image_folder.h): classes from the sorted subdirectories, labels and
// files in order, image extensions, nesting, val/ as the test split, and every malformed layout an
// InputError naming the place.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/image_folder.h"
#include "support/test_files.h"
#include "image_folder_test_util.h"

namespace {

using namespace test_files;         // TempDir, input_error_of
using namespace image_folder_test;  // fs, write, fixture, write_folder, error_of_loading, at_side

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

}  // namespace
