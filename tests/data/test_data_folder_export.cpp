// `make data-folder` (data/make_folder.py): its PNG export of Fashion-MNIST and CIFAR-10 read back as
// an image folder against the idx and CIFAR readers' own pixels, labels and class names.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_folder.h"
#include "support/test_files.h"
#include "image_folder_test_util.h"

namespace {

using namespace test_files;         // TempDir, gzip, repo_path
using namespace image_folder_test;  // fs, write, at_side

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
