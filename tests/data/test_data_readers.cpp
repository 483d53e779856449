// The data-set readers on files written here: good ones must load exactly, and every kind of broken
// file must be an InputError that names the file and says what is wrong (the user sees only that one
// line). Also the normalization statistics and the synthetic generator.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/elapsed.h"
#include "data/dataset.h"
#include "core/errors.h"
#include "core/file_io.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;  // TempDir, input_error_of, gzip

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// ---- CIFAR-10 -----------------------------------------------------------------------------------

uint8_t cifar_label(int file, int r) { return static_cast<uint8_t>((r * 7 + file) % kArrayClasses); }
uint8_t cifar_pixel(int file, int r, int p) { return static_cast<uint8_t>(r * 31 + p * 7 + file * 101); }

// One batch file's bytes: 10000 records of label + R, G, B planes, from the two functions above.
std::vector<uint8_t> cifar_batch(int file) {
  std::vector<uint8_t> b(kCifarRecordBytes * kCifarRecordsPerFile);
  for (int r = 0; r < kCifarRecordsPerFile; ++r) {
    uint8_t* rec = b.data() + kCifarRecordBytes * r;
    rec[0] = cifar_label(file, r);
    for (size_t p = 0; p + 1 < kCifarRecordBytes; ++p) rec[1 + p] = cifar_pixel(file, r, static_cast<int>(p));
  }
  return b;
}

const char* const kCifarFiles[6] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                    "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};

void write_cifar_dir(const TempDir& dir) {
  for (int f = 0; f < 6; ++f) write_bytes(dir / kCifarFiles[f], cifar_batch(f));
}

TEST(Cifar10Reader, ParsesOneBatchFileExactly) {
  TempDir dir;
  write_bytes(dir / "data_batch_1.bin", cifar_batch(3));
  const std::vector<uint8_t> bytes = read_file(dir / "data_batch_1.bin");
  Dataset d;
  parse_cifar10_batch(bytes.data(), bytes.size(), dir / "data_batch_1.bin", d);
  ASSERT_EQ(d.count, 10000);
  ASSERT_EQ(d.channels, 3);
  ASSERT_EQ(d.labels.size(), 10000u);
  ASSERT_EQ(d.images.size(), 10000u * 3072u);
  for (int r = 0; r < d.count; ++r) {
    ASSERT_EQ(d.labels[r], cifar_label(3, r)) << "record " << r;
    for (int p = 0; p < 3072; p += 97) ASSERT_EQ(d.image(r)[p], cifar_pixel(3, r, p)) << "record " << r << " byte " << p;
    ASSERT_EQ(d.image(r)[3071], cifar_pixel(3, r, 3071));
  }
}

TEST(Cifar10Reader, LoadsTrainAndTestInFileOrder) {
  TempDir dir;
  write_cifar_dir(dir);
  const DataSplit s = load_cifar10(dir.path);
  EXPECT_EQ(s.train.name, "cifar10");
  ASSERT_EQ(s.train.count, 50000);
  ASSERT_EQ(s.test.count, 10000);
  EXPECT_EQ(s.train.channels, 3);
  EXPECT_EQ(s.test.channels, 3);
  ASSERT_EQ(s.train.images.size(), 50000u * 3072u);
  // Record r of data_batch_(f+1) is training sample f*10000 + r.
  for (int f = 0; f < 5; ++f)
    for (int r : {0, 1, 4999, 9999}) {
      const int i = f * 10000 + r;
      EXPECT_EQ(s.train.labels[i], cifar_label(f, r)) << i;
      EXPECT_EQ(s.train.image(i)[0], cifar_pixel(f, r, 0)) << i;
      EXPECT_EQ(s.train.image(i)[2000], cifar_pixel(f, r, 2000)) << i;
    }
  EXPECT_EQ(s.test.labels[1234], cifar_label(5, 1234));
  EXPECT_EQ(s.test.image(1234)[3071], cifar_pixel(5, 1234, 3071));
}

TEST(Cifar10Reader, EmptyFileNamesFile) {
  TempDir dir;
  write_cifar_dir(dir);
  write_bytes(dir / "data_batch_1.bin", {});
  const std::string m = input_error_of([&] { load_cifar10(dir.path); });
  EXPECT_HAS(m, dir / "data_batch_1.bin");
  EXPECT_HAS(m, "empty");
}

TEST(Cifar10Reader, TruncatedFileNamesFileAndSize) {
  TempDir dir;
  write_cifar_dir(dir);
  std::vector<uint8_t> b = cifar_batch(2);
  b.resize(b.size() - 1000);
  write_bytes(dir / "data_batch_3.bin", b);
  const std::string m = input_error_of([&] { load_cifar10(dir.path); });
  EXPECT_HAS(m, dir / "data_batch_3.bin");
  EXPECT_HAS(m, "truncated");
  EXPECT_HAS(m, std::to_string(b.size()));
  EXPECT_HAS(m, "30730000");
}

TEST(Cifar10Reader, TooLargeFileNamesFile) {
  std::vector<uint8_t> b = cifar_batch(0);
  b.push_back(0);
  Dataset d;
  const std::string m = input_error_of([&] { parse_cifar10_batch(b.data(), b.size(), "big.bin", d); });
  EXPECT_HAS(m, "big.bin");
  EXPECT_HAS(m, "too large");
}

TEST(Cifar10Reader, LabelOutOfRangeNamesRecordAndLabel) {
  for (uint8_t bad : {uint8_t(10), uint8_t(255)}) {
    std::vector<uint8_t> b = cifar_batch(0);
    b[kCifarRecordBytes * 4321] = bad;
    Dataset d;
    const std::string m = input_error_of([&] { parse_cifar10_batch(b.data(), b.size(), "labels.bin", d); });
    EXPECT_HAS(m, "labels.bin");
    EXPECT_HAS(m, "record 4321");
    EXPECT_HAS(m, "label " + std::to_string(bad));
  }
}

TEST(Cifar10Reader, MissingFileNamesIt) {
  TempDir dir;
  write_cifar_dir(dir);
  fs::remove(dir / "test_batch.bin");
  const std::string m = input_error_of([&] { load_cifar10(dir.path); });
  EXPECT_HAS(m, dir / "test_batch.bin");
}

TEST(Cifar10Reader, DirectoryInsteadOfFileNamesIt) {
  TempDir dir;
  write_cifar_dir(dir);
  fs::remove(dir / "data_batch_2.bin");
  fs::create_directory(dir / "data_batch_2.bin");
  const std::string m = input_error_of([&] { load_cifar10(dir.path); });
  EXPECT_HAS(m, dir / "data_batch_2.bin");
  EXPECT_HAS(m, "directory");
}

// Six batch files of the right size, sparse (all zeros: label 0, black images), written instantly.
void write_sparse_cifar_dir(const TempDir& dir) {
  for (const char* f : kCifarFiles) {
    write_bytes(dir / f, {});
    ASSERT_EQ(truncate((dir / f).c_str(), off_t(kCifarRecordBytes) * kCifarRecordsPerFile), 0);
  }
}

TEST(Cifar10Reader, AHugeFileIsTooLargeAtOnceNotReadFirst) {
  TempDir dir;
  write_sparse_cifar_dir(dir);
  ASSERT_EQ(truncate((dir / "data_batch_1.bin").c_str(), off_t(40) << 30), 0);  // 40 GiB, sparse
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = input_error_of([&] { load_cifar10(dir.path); });
  EXPECT_HAS(m, dir / "data_batch_1.bin");
  EXPECT_HAS(m, "too large: 42949672960 bytes, expected 30730000");
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Cifar10Reader, AFifoIsNamedNotWaitedOn) {
  TempDir dir;
  write_sparse_cifar_dir(dir);
  fs::remove(dir / "data_batch_4.bin");
  ASSERT_EQ(mkfifo((dir / "data_batch_4.bin").c_str(), 0600), 0);
  EXPECT_EXIT(exit_with_input_error([&] { load_cifar10(dir.path); }, false),
      ::testing::ExitedWithCode(0), "data_batch_4.bin: is a FIFO");
}

TEST(Cifar10Reader, MissingDirectoryNamesIt) {
  TempDir dir;
  const std::string missing = dir / "no-such-dir";
  const std::string m = input_error_of([&] { load_cifar10(missing); });
  EXPECT_HAS(m, missing);
  EXPECT_HAS(m, "not found");
}

// ---- Fashion-MNIST ------------------------------------------------------------------------------

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

uint8_t mnist_pixel(int i, int y, int x) { return static_cast<uint8_t>(1 + (i * 13 + y * 28 + x) % 255); }

std::vector<uint8_t> idx_images(int n, int rows = 28, int cols = 28, uint32_t magic = 0x803) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < rows; ++y)
      for (int x = 0; x < cols; ++x) b.push_back(mnist_pixel(i, y, x));
  return b;
}

std::vector<uint8_t> idx_labels(int n, uint32_t magic = 0x801) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 3) % kArrayClasses));
  return b;
}

constexpr int kTrainN = 50, kTestN = 20;

// The four files of a small Fashion-MNIST set; `gz` picks .gz or plain files.
void write_mnist_dir(const TempDir& dir, bool gz) {
  auto put = [&](const std::string& base, const std::vector<uint8_t>& bytes) {
    if (gz) write_bytes(dir / (base + ".gz"), gzip(bytes));
    else write_bytes(dir / base, bytes);
  };
  put("train-images-idx3-ubyte", idx_images(kTrainN));
  put("train-labels-idx1-ubyte", idx_labels(kTrainN));
  put("t10k-images-idx3-ubyte", idx_images(kTestN));
  put("t10k-labels-idx1-ubyte", idx_labels(kTestN));
}

// Every 28x28 image sits at offset (p, p) of a zero canvas of `side` = 28 + 2p (32 by default: p = 2),
// one channel.
void expect_mnist_set(const Dataset& d, int n, int side = 32) {
  const int p = (side - 28) / 2;
  EXPECT_EQ(d.name, "fashion-mnist");
  ASSERT_EQ(d.count, n);
  ASSERT_EQ(d.channels, 1);
  ASSERT_EQ(d.side, side);
  ASSERT_EQ(d.images.size(), size_t(n) * side * side);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(d.labels[i], (i * 3) % kArrayClasses);
    for (int y = 0; y < side; ++y)
      for (int x = 0; x < side; ++x) {
        const bool inside = y >= p && y < p + 28 && x >= p && x < p + 28;
        const uint8_t want = inside ? mnist_pixel(i, y - p, x - p) : 0;
        ASSERT_EQ(d.image(i)[y * side + x], want) << "image " << i << " at (" << x << ", " << y << ")";
      }
  }
}

TEST(FashionMnistReader, LoadsGzippedFilesOntoPaddedCanvas) {
  TempDir dir;
  write_mnist_dir(dir, true);
  const DataSplit s = load_fashion_mnist(dir.path);
  expect_mnist_set(s.train, kTrainN);
  expect_mnist_set(s.test, kTestN);
}

TEST(FashionMnistReader, LoadsPlainFiles) {
  TempDir dir;
  write_mnist_dir(dir, false);
  const DataSplit s = load_fashion_mnist(dir.path);
  expect_mnist_set(s.train, kTrainN);
  expect_mnist_set(s.test, kTestN);
}

// --image-size N: the same images on an N x N canvas; 28 is the images as the files hold them.
TEST(FashionMnistReader, ServesTheImagesCentredAtTheSideAskedFor) {
  TempDir dir;
  write_mnist_dir(dir, true);
  for (const int side : {28, 30, 64}) {
    SCOPED_TRACE("side " + std::to_string(side));
    const DataSplit s = load_fashion_mnist(dir.path, side);
    expect_mnist_set(s.train, kTrainN, side);
    expect_mnist_set(s.test, kTestN, side);
  }
}

// bin/train's options refuse such sides first; bin/predict's come from a checkpoint.
TEST(FashionMnistReader, RefusesASideItCannotCentreTheImagesOn) {
  TempDir dir;
  write_mnist_dir(dir, true);
  for (const int side : {26, 27, 29, 66})
    EXPECT_HAS(input_error_of([&] { load_fashion_mnist(dir.path, side); }),
               "Fashion-MNIST is not served at image side " + std::to_string(side));
  const std::vector<uint8_t> images = idx_images(2), labels = idx_labels(2);
  EXPECT_HAS(input_error_of([&] { parse_idx(images.data(), images.size(), "img", labels.data(), labels.size(), "lab", 31); }),
             "centred on a canvas of 28 to 64 with an even border");
}

// The statistics are those of the images as the model sees them (src/data/normalization.cpp), the
// zero border included, as bench/pytorch_train.py computes them: at 32 the same pixel sums as at 28,
// over (32/28)^2 times as many pixels.
TEST(FashionMnistReader, NormalisationCountsTheBorderAsTheModelSeesIt) {
  TempDir dir;
  write_mnist_dir(dir, true);
  const Normalization at28 = compute_normalization(load_fashion_mnist(dir.path, 28).train);
  const Normalization at32 = compute_normalization(load_fashion_mnist(dir.path, 32).train);
  const double area = 28.0 * 28.0 / (32.0 * 32.0);
  EXPECT_NEAR(at32.mean[0], at28.mean[0] * area, 1e-6);
  const double sq28 = double(at28.stdev[0]) * at28.stdev[0] + double(at28.mean[0]) * at28.mean[0];  // E[x^2]
  const double sq32 = double(at32.stdev[0]) * at32.stdev[0] + double(at32.mean[0]) * at32.mean[0];
  EXPECT_NEAR(sq32, sq28 * area, 1e-6);
  EXPECT_GT(at28.mean[0], at32.mean[0]) << "no zero border to pull the mean down";
}

TEST(FashionMnistReader, WrongMagicNamesFile) {
  TempDir dir;
  write_mnist_dir(dir, true);
  write_bytes(dir / "train-images-idx3-ubyte.gz", gzip(idx_images(kTrainN, 28, 28, 0x801)));
  std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-images-idx3-ubyte.gz");
  EXPECT_HAS(m, "magic");

  write_mnist_dir(dir, true);
  write_bytes(dir / "t10k-labels-idx1-ubyte.gz", gzip(idx_labels(kTestN, 0x12345678)));
  m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "t10k-labels-idx1-ubyte.gz");
  EXPECT_HAS(m, "magic");
  EXPECT_HAS(m, "0x12345678");
}

TEST(FashionMnistReader, WrongImageSizeNamesFileAndDims) {
  TempDir dir;
  write_mnist_dir(dir, true);
  write_bytes(dir / "train-images-idx3-ubyte.gz", gzip(idx_images(kTrainN, 27, 28)));
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-images-idx3-ubyte.gz");
  EXPECT_HAS(m, "27x28");
}

TEST(FashionMnistReader, ImageAndLabelCountMismatchNamesBothFiles) {
  TempDir dir;
  write_mnist_dir(dir, true);
  write_bytes(dir / "train-labels-idx1-ubyte.gz", gzip(idx_labels(kTrainN - 1)));
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-images-idx3-ubyte.gz");
  EXPECT_HAS(m, dir / "train-labels-idx1-ubyte.gz");
  EXPECT_HAS(m, std::to_string(kTrainN) + " images");
  EXPECT_HAS(m, std::to_string(kTrainN - 1) + " labels");
}

TEST(FashionMnistReader, TruncatedImagesFileNamesIt) {
  TempDir dir;
  write_mnist_dir(dir, false);
  std::vector<uint8_t> b = idx_images(kTestN);
  b.resize(b.size() - 28);
  write_bytes(dir / "t10k-images-idx3-ubyte", b);
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "t10k-images-idx3-ubyte");
  EXPECT_HAS(m, "truncated");
}

TEST(FashionMnistReader, TruncatedHeaderNamesFile) {
  const std::vector<uint8_t> images = idx_images(2), labels = idx_labels(2);
  std::string m = input_error_of([&] { parse_idx(images.data(), 15, "img", labels.data(), labels.size(), "lab"); });
  EXPECT_HAS(m, "img");
  EXPECT_HAS(m, "truncated");
  m = input_error_of([&] { parse_idx(images.data(), images.size(), "img", labels.data(), 7, "lab"); });
  EXPECT_HAS(m, "lab");
  EXPECT_HAS(m, "truncated");
}

TEST(FashionMnistReader, TruncatedGzipNamesFile) {
  TempDir dir;
  write_mnist_dir(dir, true);
  std::vector<uint8_t> gz = gzip(idx_images(kTrainN));
  gz.resize(gz.size() / 2);
  write_bytes(dir / "train-images-idx3-ubyte.gz", gz);
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-images-idx3-ubyte.gz");
  EXPECT_HAS(m, "truncated");
}

TEST(FashionMnistReader, CorruptGzipNamesFile) {
  TempDir dir;
  write_mnist_dir(dir, true);
  std::vector<uint8_t> gz = gzip(idx_images(kTrainN));
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] ^= 0xA5;  // inside the deflate data
  write_bytes(dir / "train-images-idx3-ubyte.gz", gz);
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-images-idx3-ubyte.gz");
  EXPECT_HAS(m, "corrupt");
}

TEST(FashionMnistReader, LabelOutOfRangeNamesFileAndIndex) {
  TempDir dir;
  write_mnist_dir(dir, true);
  std::vector<uint8_t> labels = idx_labels(kTrainN);
  labels[8 + 17] = 10;
  write_bytes(dir / "train-labels-idx1-ubyte.gz", gzip(labels));
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-labels-idx1-ubyte.gz");
  EXPECT_HAS(m, "label 10");
  EXPECT_HAS(m, "index 17");
}

TEST(FashionMnistReader, PlainBytesUnderGzNameAreNotGzip) {
  TempDir dir;
  write_mnist_dir(dir, true);
  write_bytes(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(kTestN));
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "t10k-labels-idx1-ubyte.gz");
  EXPECT_HAS(m, "not a gzip");
}

TEST(FashionMnistReader, EmptyGzNamesFile) {
  TempDir dir;
  write_mnist_dir(dir, true);
  write_bytes(dir / "train-labels-idx1-ubyte.gz", {});
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "train-labels-idx1-ubyte.gz");
  EXPECT_HAS(m, "empty");
}

TEST(FashionMnistReader, MissingFileNamesIt) {
  TempDir dir;
  write_mnist_dir(dir, true);
  fs::remove(dir / "t10k-images-idx3-ubyte.gz");
  const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
  EXPECT_HAS(m, dir / "t10k-images-idx3-ubyte.gz");
  EXPECT_HAS(m, "not found");
}

TEST(FashionMnistReader, AHugeFileIsTooLargeAtOnce) {
  for (const bool gz : {false, true}) {
    TempDir dir;
    write_mnist_dir(dir, gz);
    const std::string path = dir / (gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte");
    ASSERT_EQ(truncate(path.c_str(), off_t(12) << 30), 0);  // 12 GiB, sparse
    const auto t0 = std::chrono::steady_clock::now();
    const std::string m = input_error_of([&] { load_fashion_mnist(dir.path); });
    EXPECT_HAS(m, path + ": too large: 12884901888 bytes");
    EXPECT_LT(seconds_since(t0), 5.0);
  }
}

TEST(FashionMnistReader, MissingDirectoryNamesIt) {
  TempDir dir;
  const std::string missing = dir / "nowhere";
  const std::string m = input_error_of([&] { load_fashion_mnist(missing); });
  EXPECT_HAS(m, missing);
  EXPECT_HAS(m, "not found");
}

TEST(FashionMnistReader, RealDataSetHasBalancedClasses) {
  // Where bin/train looks: $FASHION_MNIST_DIR, data/fashion-mnist, /usr/share/datasets/fashion-mnist.
  const std::string dir = find_fashion_mnist_dir();
  if (dir.empty())
    GTEST_SKIP() << "Fashion-MNIST not installed: no train-images-idx3-ubyte.gz in $FASHION_MNIST_DIR, "
                 << "data/fashion-mnist or /usr/share/datasets/fashion-mnist (sudo apt-get install dataset-fashion-mnist)";
  const DataSplit s = load_fashion_mnist(dir);
  ASSERT_EQ(s.train.count, 60000);
  ASSERT_EQ(s.test.count, 10000);
  std::array<int, kArrayClasses> train_hist{}, test_hist{};
  for (uint8_t l : s.train.labels) train_hist[l]++;
  for (uint8_t l : s.test.labels) test_hist[l]++;
  for (int c = 0; c < kArrayClasses; ++c) {
    EXPECT_EQ(train_hist[c], 6000) << "class " << c;
    EXPECT_EQ(test_hist[c], 1000) << "class " << c;
  }
  // The 2-pixel border of the canvas is padding, never image; at 28 there is none.
  for (int i = 0; i < s.train.count; i += 997)
    for (int x = 0; x < 32; ++x) ASSERT_EQ(s.train.image(i)[x], 0) << "image " << i;
  const DataSplit unpadded = load_fashion_mnist(dir, 28);
  ASSERT_EQ(unpadded.test.count, 10000);
  for (int i = 0; i < 10000; i += 997)
    for (int y = 0; y < 28; ++y)
      ASSERT_EQ(std::memcmp(unpadded.test.image(i) + y * 28, s.test.image(i) + (y + 2) * 32 + 2, 28), 0) << "image " << i;
}

// ---- normalization and synthetic data -------------------------------------------------------------

TEST(Normalization, ExactMeanAndStdOfKnownColourImages) {
  // Two images; channel c is constant a[c] in the first and b[c] in the second, so over both the
  // mean is (a+b)/2 and the (population) std |a-b|/2, in units of 1/255.
  const int a[3] = {0, 51, 200}, b[3] = {255, 153, 200};
  Dataset d;
  d.count = 2;
  d.channels = 3;
  d.images.resize(2 * 3 * 1024);
  d.labels = {0, 1};
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 1024; ++p) {
      d.images[c * 1024 + p] = static_cast<uint8_t>(a[c]);
      d.images[3072 + c * 1024 + p] = static_cast<uint8_t>(b[c]);
    }
  const Normalization n = compute_normalization(d);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(n.mean[c], (a[c] + b[c]) / 2.0 / 255.0, 1e-6) << c;
    if (a[c] != b[c]) EXPECT_NEAR(n.stdev[c], std::abs(a[c] - b[c]) / 2.0 / 255.0, 1e-6) << c;
    else EXPECT_GT(n.stdev[c], 0.f) << "a constant channel must not give a zero std (division)";
  }
}

TEST(Normalization, GreyRepeatsItsChannel) {
  // One grey image: a quarter of the pixels 255, the rest 0: mean 1/4, std sqrt(1/4 - 1/16).
  Dataset d;
  d.count = 1;
  d.channels = 1;
  d.images.assign(1024, 0);
  d.labels = {0};
  for (int p = 0; p < 1024; p += 4) d.images[p] = 255;
  const Normalization n = compute_normalization(d);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(n.mean[c], 0.25, 1e-6);
    EXPECT_NEAR(n.stdev[c], std::sqrt(0.25 - 0.0625), 1e-6);
  }
}

TEST(SyntheticData, DeterministicForASeedAndDifferentForAnother) {
  const DataSplit a = make_synthetic(300, 60, 7), b = make_synthetic(300, 60, 7), c = make_synthetic(300, 60, 8);
  EXPECT_EQ(a.train.count, 300);
  EXPECT_EQ(a.test.count, 60);
  EXPECT_EQ(a.train.channels, 3);
  ASSERT_EQ(a.train.images.size(), 300u * 3072u);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.images, b.test.images);
  EXPECT_NE(a.train.images, c.train.images);
  EXPECT_NE(a.train.labels, c.train.labels);
  // The test split is drawn independently, not a copy of the training split's start.
  EXPECT_NE(std::vector<uint8_t>(a.train.images.begin(), a.train.images.begin() + a.test.images.size()),
            a.test.images);
  std::array<int, kArrayClasses> hist{};
  for (uint8_t l : a.train.labels) {
    ASSERT_LT(l, kArrayClasses);
    hist[l]++;
  }
  for (int k = 0; k < kArrayClasses; ++k) EXPECT_GT(hist[k], 10) << "class " << k << " (labels should be uniform)";
}

}  // namespace
