// Data sets held in host memory as 32x32 uint8 images (CHW) with labels 0..9.
//
// Readers validate everything before the GPU is touched: a missing, unreadable, truncated or
// wrong-sized file, a bad magic number or a label out of range throws an InputError that names the
// file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

constexpr int kImageSide = 32;    // every data set is served at 32x32
constexpr int kModelChannels = 3; // the model's stem takes 3 channels; grey is replicated
constexpr int kClasses = 10;

struct Dataset {
  std::string name;                // "cifar10", "fashion-mnist", "synthetic"
  int count = 0;
  int channels = 0;                // stored channels: 3 (colour) or 1 (grey)
  std::vector<uint8_t> images;     // count x channels x 32 x 32
  std::vector<uint8_t> labels;     // count, each < kClasses
  std::vector<std::string> class_names;  // label -> name ("airplane", "T-shirt/top", ...)
  std::vector<std::string> paths;  // per image, where it came from (image folders); empty for array files

  size_t image_bytes() const { return static_cast<size_t>(channels) * kImageSide * kImageSide; }
  const uint8_t* image(int i) const { return images.data() + image_bytes() * i; }
};

struct DataSplit {
  Dataset train, test;
};

// Per model-input channel mean and standard deviation of the training images in [0, 1]; grey data
// sets repeat their one channel's values.
struct Normalization {
  float mean[kModelChannels];
  float stdev[kModelChannels];
};
Normalization compute_normalization(const Dataset& train);

// CIFAR-10 binary version: data_batch_1..5.bin and test_batch.bin, 10000 records of
// 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32).
DataSplit load_cifar10(const std::string& dir);
constexpr size_t kCifarRecordBytes = 1 + 3 * 32 * 32;
constexpr int kCifarRecordsPerFile = 10000;
// An InputError naming `file` unless `size` is exactly `records` records ("truncated", "too large").
void check_cifar10_size(size_t size, const std::string& file, int records = kCifarRecordsPerFile);
// Appends the records of one CIFAR-10 batch file held in memory; `file` names it in errors. The
// file must hold exactly `records` records (10000 in the real files; the fuzzer asks for fewer).
void parse_cifar10_batch(const uint8_t* bytes, size_t size, const std::string& file, Dataset& out,
                         int records = kCifarRecordsPerFile);

// Fashion-MNIST idx files, gzip-compressed (the .gz files are read directly) or plain.
// 28x28 grey images are placed at the centre of a 32x32 zero canvas (2 pixels of padding).
DataSplit load_fashion_mnist(const std::string& dir);
// Parses one idx image file and its label file held in memory (already decompressed).
Dataset parse_idx(const uint8_t* images, size_t images_size, const std::string& images_file,
                  const uint8_t* labels, size_t labels_size, const std::string& labels_file);

// Random uint8 images and labels for throughput runs (never for accuracy claims).
DataSplit make_synthetic(int train_count, int test_count, uint64_t seed);

// Where a data set lives when --data-dir is not given ("" when nowhere).
std::string find_cifar10_dir();
std::string find_fashion_mnist_dir();
