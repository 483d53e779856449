// CIFAR-10, binary version (https://www.cs.toronto.edu/~kriz/cifar.html).
#include <sys/stat.h>

#include "core/errors.h"
#include "data/dataset.h"
#include "core/file_io.h"

void check_cifar10_size(size_t size, const std::string& file, int records) {
  const size_t expected = kCifarRecordBytes * records;
  if (size == 0) throw InputError(file + ": empty file, expected " + std::to_string(expected) + " bytes");
  if (size != expected) {
    std::string what = size < expected ? "truncated" : "too large";
    throw InputError(file + ": " + what + ": " + std::to_string(size) + " bytes, expected " +
                     std::to_string(expected) + " (" + std::to_string(records) + " records of 3073 bytes)");
  }
}

void parse_cifar10_batch(const uint8_t* bytes, size_t size, const std::string& file, Dataset& out, int records) {
  check_cifar10_size(size, file, records);
  out.channels = 3;
  const size_t pixels = kCifarRecordBytes - 1;
  out.images.reserve(out.images.size() + pixels * records);
  for (int r = 0; r < records; ++r) {
    const uint8_t* rec = bytes + kCifarRecordBytes * r;
    if (rec[0] >= kArrayClasses)
      throw InputError(file + ": record " + std::to_string(r) + " has label " +
                       std::to_string(rec[0]) + ", expected 0..9");
    out.labels.push_back(rec[0]);
    out.images.insert(out.images.end(), rec + 1, rec + kCifarRecordBytes);
  }
  out.count += records;
}

namespace {
Dataset read_batches(const std::string& dir, const std::vector<std::string>& files) {
  Dataset d;
  d.name = "cifar10";
  d.class_names = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  for (const auto& f : files) {
    const std::string path = dir + "/" + f;
    check_cifar10_size(regular_file_size(path), path);  // a wrong size is named before anything is read
    const std::vector<uint8_t> bytes = read_file(path, kCifarRecordBytes * kCifarRecordsPerFile);
    parse_cifar10_batch(bytes.data(), bytes.size(), path, d);
  }
  return d;
}
}  // namespace

DataSplit load_cifar10(const std::string& dir) {
  struct stat st{};
  if (dir.empty() || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError("CIFAR-10 directory '" + dir +
                     "' not found: run `make data` (needs internet), or use --data fashion-mnist");
  DataSplit s;
  s.train = read_batches(dir, {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                               "data_batch_4.bin", "data_batch_5.bin"});
  s.test = read_batches(dir, {"test_batch.bin"});
  return s;
}

std::string find_cifar10_dir() {
  struct stat st{};
  const std::string dir = "data/cifar-10-batches-bin";
  return stat((dir + "/data_batch_1.bin").c_str(), &st) == 0 ? dir : "";
}
