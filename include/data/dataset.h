// Data sets as side x side uint8 images (CHW) with labels 0..K-1: held in host memory (CIFAR-10 at
// 32x32, Fashion-MNIST at 32x32 or --image-size, synthetic data at --image-size, each with 10
// classes; an image folder with --cache-decoded),
// or decoded from their files whenever a batch needs them (an image folder, image_folder.h).
//
// Readers validate everything before the GPU is touched: a missing, unreadable, truncated or
// wrong-sized file, a bad magic number or a label out of range throws an InputError that names the
// file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

constexpr int kDefaultImageSide = 32;  // CIFAR-10's side, and every data set's unless --image-size says
// Fashion-MNIST's images are 28x28. Served at side N they sit at the centre of an N x N zero canvas,
// (N - 28) / 2 pixels from each edge: N - 28 must be even, and N at most 64 (the canvas is held for
// every image, and a wider border is only padding for the convolutions to work on).
constexpr int kFashionMnistSide = 28;
constexpr int kFashionMnistMaxSide = 64;
constexpr int kModelChannels = 3;      // the model's stem takes 3 channels; grey is replicated
constexpr int kArrayClasses = 10;      // classes of CIFAR-10, Fashion-MNIST and synthetic data

struct Dataset {
  std::string name;                // "cifar10", "fashion-mnist", "synthetic", "folder"
  int count = 0;
  int channels = 0;                // stored channels: 3 (colour) or 1 (grey)
  int side = kDefaultImageSide;    // images are side x side
  std::vector<uint8_t> images;     // count x channels x side x side; empty when decoded_on_demand
  std::vector<uint8_t> labels;     // count, each < classes()
  std::vector<std::string> class_names;  // label -> name ("airplane", "T-shirt/top", ...)
  std::vector<std::string> paths;  // per image, where it came from (image folders); empty for array files
  bool decoded_on_demand = false;  // images are decoded from paths[i] when a batch needs them

  int classes() const { return static_cast<int>(class_names.size()); }
  size_t image_bytes() const { return static_cast<size_t>(channels) * side * side; }
  const uint8_t* image(int i) const { return images.data() + image_bytes() * i; }
};

// Image i's pixels (channels x side x side): from memory, or decoded into `scratch` (image_bytes()
// of room) for a data set decoded on demand; ImageDecodeError (image_decode.h) naming the file when
// it does not decode. Safe to call from several threads with their own scratch.
const uint8_t* image_pixels(const Dataset& d, int i, uint8_t* scratch);

struct DataSplit {
  Dataset train, test;
};

// Per model-input channel mean and standard deviation of the training images in [0, 1]; grey data
// sets repeat their one channel's values. A channel of one value in every pixel has a standard
// deviation of 0: it is taken as 1, and `warning` says so in one line.
struct Normalization {
  float mean[kModelChannels];
  float stdev[kModelChannels];
  int images = 0;       // training images the statistics came from
  std::string warning{};  // "" unless a channel is one value everywhere
};
// From every training image held in memory; from kNormalizationSample images spread evenly over the
// set (index j * count / sample) when the images are decoded on demand, decoded on `threads` threads
// (an image that does not decode is an ImageDecodeError saying the sample met it).
constexpr int kNormalizationSample = 10000;
Normalization compute_normalization(const Dataset& train, int threads = 1);

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
// The 28x28 grey images are placed at the centre of a side x side zero canvas (at 32, 2 pixels of
// padding on each edge; at 28, none); an InputError for a side the canvas rule above refuses.
DataSplit load_fashion_mnist(const std::string& dir, int side = kDefaultImageSide);
// Why Fashion-MNIST cannot be served at `side` (the canvas rule above), "" where it can: the one rule
// behind --image-size's check and the reader's.
std::string fashion_mnist_side_refusal(int side);
// Parses one idx image file and its label file held in memory (already decompressed).
Dataset parse_idx(const uint8_t* images, size_t images_size, const std::string& images_file,
                  const uint8_t* labels, size_t labels_size, const std::string& labels_file,
                  int side = kDefaultImageSide);

// Random uint8 images (side x side) and labels for throughput runs (never for accuracy claims).
DataSplit make_synthetic(int train_count, int test_count, uint64_t seed, int side = kDefaultImageSide);

// Where a data set lives when --data-dir is not given ("" when nowhere).
std::string find_cifar10_dir();
std::string find_fashion_mnist_dir();
