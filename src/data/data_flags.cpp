// The rows of the shared data flags (data/data_flags.h).
#include "data/data_flags.h"

#include "data/dataset.h"  // Fashion-MNIST's canvas

// One row per flag: a table, read row by row.
const std::vector<FlagRow<DataOptions>>& data_flag_rows() {
  using Row = FlagRow<DataOptions>;
  static const std::vector<Row> rows = {
      {"--data", "NAME", "data set: auto, cifar10, fashion-mnist, synthetic or folder (auto: CIFAR-10 if `make data` fetched it, else Fashion-MNIST; folder: your images in --data-dir)",
       [](const DataOptions& o) { return o.data; },
       [](DataOptions& o, const std::string& v) {
         if (v != "auto" && v != "cifar10" && v != "fashion-mnist" && v != "synthetic" && v != "folder")
           throw UsageError("--data: '" + v + "' is not one of auto, cifar10, fashion-mnist, synthetic, folder");
         o.data = v;
       }},
      {"--data-dir", "DIR", "where the data set's files are", [](const DataOptions&) { return std::string("data/cifar-10-batches-bin, or $FASHION_MNIST_DIR, data/fashion-mnist, /usr/share/datasets/fashion-mnist"); },
       [](DataOptions& o, const std::string& v) { o.data_dir = v; }},
      {"--synthetic-size", "N", "training images of --data synthetic (the test set is a fifth)", [](const DataOptions& o) { return std::to_string(o.synthetic_size); },
       [](DataOptions& o, const std::string& v) { o.synthetic_size = (int)parse_long("--synthetic-size", v, 1, 10000000); }},
      {"--image-size", "N", "side of the images the model sees: --data folder (resized and centre-cropped) and synthetic a multiple of 8 from 8 to 1024; fashion-mnist 28 to 64 with N - 28 even (the 28x28 images centred on a zero canvas; 28: no padding); cifar10 32", [](const DataOptions& o) { return std::to_string(o.image_size); },
       [](DataOptions& o, const std::string& v) { o.image_size = (int)parse_long("--image-size", v, 8, 1024); }},
      {"--skip-bad-images", "", "--data folder: leave out files that fail the header check or do not decode (each file is decoded once at start; a warning gives their count) instead of stopping", [](const DataOptions&) { return std::string("a bad file is an error"); },
       [](DataOptions& o, const std::string&) { o.skip_bad_images = true; }},
      {"--cache-decoded", "", "--data folder: decode every image once at start into memory (N x N uint8)", [](const DataOptions&) { return std::string("decode every epoch in the loader threads"); },
       [](DataOptions& o, const std::string&) { o.cache_decoded = true; }},
      {"--batch", "N", "images per step (per GPU when bin/train runs on several: --gpus, torchrun, mpirun, srun)", [](const DataOptions& o) { return std::to_string(o.batch); },
       [](DataOptions& o, const std::string& v) { o.batch = (int)parse_long("--batch", v, 2, 8192); }},
  };
  return rows;
}

namespace {

// Folder and synthetic data are served at any side; multiples of 8 keep every stage of the network
// at exactly half the side before it.
void check_multiple_of_8(int n) {
  if (n % 8 != 0) throw UsageError("--image-size " + std::to_string(n) + " is not a multiple of 8");
}

// Fashion-MNIST's images are padded, never cropped or resized (data/dataset.h).
void check_fashion_mnist_size(int n) {
  if (const std::string why = fashion_mnist_side_refusal(n); !why.empty())
    throw UsageError("--image-size " + std::to_string(n) + ": " + why);
}

}  // namespace

void check_data_options(const DataOptions& o) {
  const int n = o.image_size;
  if (o.data == "folder" || o.data == "synthetic")
    check_multiple_of_8(n);
  else if (o.data == "fashion-mnist")
    check_fashion_mnist_size(n);
  else if (n != kDefaultImageSide)  // cifar10, or auto (which may choose it)
    throw UsageError("--image-size " + std::to_string(n) + " applies to --data fashion-mnist, folder and synthetic" +
                     (o.data == "auto" ? " (name the data set: --data auto may choose CIFAR-10)" : "") +
                     ": CIFAR-10 is 32x32 (`make data-folder` writes it as an image folder)");
  if (o.data == "folder" && o.data_dir.empty())
    throw UsageError("--data folder needs --data-dir DIR (DIR/train/<class>/..., DIR/test/<class>/...)");
}
