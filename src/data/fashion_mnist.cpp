// Fashion-MNIST in idx format (https://github.com/zalandoresearch/fashion-mnist), read from the
// .gz files directly. Debian ships it as the package dataset-fashion-mnist.
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "data/dataset.h"
#include "core/file_io.h"

namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int kMnistSide = kFashionMnistSide;
// The largest idx file read (decompressed): 340,000 images of 28x28, over five times Fashion-MNIST's
// training set. A .gz may be slightly larger than its content (stored blocks add 5 bytes per 64 KiB).
constexpr size_t kMaxIdxBytes = size_t(256) << 20;
constexpr size_t kMaxGzBytes = kMaxIdxBytes + kMaxIdxBytes / 1024 + 1024;

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

bool exists(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0;
}

// Reads `<dir>/<base>.gz` if present, else `<dir>/<base>`; returns the decompressed bytes and sets
// `path` to the file used.
std::vector<uint8_t> read_maybe_gz(const std::string& dir, const std::string& base, std::string& path) {
  path = dir + "/" + base + ".gz";
  if (exists(path)) {
    const std::vector<uint8_t> gz = read_file(path, kMaxGzBytes);
    if (gz.empty()) throw InputError(path + ": empty file");
    return gunzip(gz.data(), gz.size(), path, kMaxIdxBytes);
  }
  path = dir + "/" + base;
  if (exists(path)) return read_file(path, kMaxIdxBytes);
  throw InputError(dir + "/" + base + ".gz: not found (nor " + base +
                   "); install the Debian package dataset-fashion-mnist or pass --data-dir");
}

Dataset load_pair(const std::string& dir, const std::string& images, const std::string& labels, int side) {
  std::string ipath, lpath;
  const std::vector<uint8_t> ib = read_maybe_gz(dir, images, ipath);
  const std::vector<uint8_t> lb = read_maybe_gz(dir, labels, lpath);
  return parse_idx(ib.data(), ib.size(), ipath, lb.data(), lb.size(), lpath, side);
}

// bin/train's options refuse such a side (data/data_flags.h); bin/predict takes the side from a
// checkpoint, which may have been damaged.
void check_canvas_side(int side) {
  if (!fashion_mnist_side_refusal(side).empty())
    throw InputError("Fashion-MNIST is not served at image side " + std::to_string(side) + ": its 28x28 images are "
                     "centred on a canvas of 28 to " + std::to_string(kFashionMnistMaxSide) + " with an even border");
}

}  // namespace

std::string fashion_mnist_side_refusal(int side) {
  if (side < kMnistSide) return "Fashion-MNIST's images are 28x28 and are not cropped: give 28 (no padding) or more";
  if ((side - kMnistSide) % 2 != 0)
    return "Fashion-MNIST's 28x28 images are centred, with as many zero pixels on every edge: give 28 plus an even "
           "number (28, 30, 32, ...)";
  if (side > kFashionMnistMaxSide)
    return "Fashion-MNIST is served at most at " + std::to_string(kFashionMnistMaxSide) + "x" +
           std::to_string(kFashionMnistMaxSide) + " (a wider zero border only costs time and memory)";
  return "";
}

Dataset parse_idx(const uint8_t* images, size_t images_size, const std::string& images_file,
                  const uint8_t* labels, size_t labels_size, const std::string& labels_file, int side) {
  check_canvas_side(side);
  if (images_size < 16) throw InputError(images_file + ": truncated idx header (" + std::to_string(images_size) + " bytes)");
  if (labels_size < 8) throw InputError(labels_file + ": truncated idx header (" + std::to_string(labels_size) + " bytes)");
  const uint32_t imagic = big_endian_u32(images), lmagic = big_endian_u32(labels);
  if (imagic != kIdxImagesMagic)
    throw InputError(images_file + ": wrong magic " + hex(imagic) + ", expected " + hex(kIdxImagesMagic) + " (idx3 unsigned byte images)");
  if (lmagic != kIdxLabelsMagic)
    throw InputError(labels_file + ": wrong magic " + hex(lmagic) + ", expected " + hex(kIdxLabelsMagic) + " (idx1 unsigned byte labels)");
  const uint32_t n = big_endian_u32(images + 4), rows = big_endian_u32(images + 8),
                 cols = big_endian_u32(images + 12), nl = big_endian_u32(labels + 4);
  if (rows != kMnistSide || cols != kMnistSide)
    throw InputError(images_file + ": images are " + std::to_string(rows) + "x" + std::to_string(cols) + ", expected 28x28");
  if (n == 0 || n > 10000000u) throw InputError(images_file + ": implausible image count " + std::to_string(n));
  if (n != nl)
    throw InputError(images_file + " holds " + std::to_string(n) + " images but " + labels_file + " holds " + std::to_string(nl) + " labels");
  const size_t pix = size_t(kMnistSide) * kMnistSide;
  const size_t want_i = 16 + pix * n, want_l = 8 + size_t(n);
  if (images_size != want_i)
    throw InputError(images_file + ": " + (images_size < want_i ? "truncated" : "too large") + ": " +
                     std::to_string(images_size) + " bytes, expected " + std::to_string(want_i));
  if (labels_size != want_l)
    throw InputError(labels_file + ": " + (labels_size < want_l ? "truncated" : "too large") + ": " +
                     std::to_string(labels_size) + " bytes, expected " + std::to_string(want_l));

  Dataset d;
  d.name = "fashion-mnist";
  d.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"};
  d.count = static_cast<int>(n);
  d.channels = 1;
  d.side = side;
  d.labels.assign(labels + 8, labels + 8 + n);
  for (uint32_t i = 0; i < n; ++i)
    if (d.labels[i] >= kArrayClasses)
      throw InputError(labels_file + ": label " + std::to_string(d.labels[i]) + " at index " + std::to_string(i) + ", expected 0..9");
  const int pad = (side - kMnistSide) / 2;
  d.images.assign(d.image_bytes() * n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* src = images + 16 + pix * i;
    uint8_t* dst = d.images.data() + d.image_bytes() * i;
    for (int y = 0; y < kMnistSide; ++y)
      std::memcpy(dst + size_t(y + pad) * side + pad, src + y * kMnistSide, kMnistSide);
  }
  return d;
}

DataSplit load_fashion_mnist(const std::string& dir, int side) {
  check_canvas_side(side);  // before the files are read
  struct stat st{};
  if (dir.empty() || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError("Fashion-MNIST directory '" + dir +
                     "' not found: install the Debian package dataset-fashion-mnist "
                     "(sudo apt-get install dataset-fashion-mnist) or pass --data-dir");
  DataSplit s;
  s.train = load_pair(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", side);
  s.test = load_pair(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", side);
  return s;
}

std::string find_fashion_mnist_dir() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("FASHION_MNIST_DIR")) candidates.push_back(env);
  candidates.push_back("data/fashion-mnist");
  candidates.push_back("/usr/share/datasets/fashion-mnist");
  for (const auto& dir : candidates)
    if (exists(dir + "/train-images-idx3-ubyte.gz") || exists(dir + "/train-images-idx3-ubyte"))
      return dir;
  return "";
}
