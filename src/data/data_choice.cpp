// Choosing and loading the data set of a run.
#include "data/data_choice.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/errors.h"
#include "core/format.h"
#include "core/memory.h"
#include "data/image_folder.h"

namespace {

std::string resolve_auto(const std::string& dir) {
  if (!dir.empty()) return access((dir + "/data_batch_1.bin").c_str(), F_OK) == 0 ? "cifar10" : "fashion-mnist";
  if (!find_cifar10_dir().empty()) return "cifar10";
  if (!find_fashion_mnist_dir().empty()) return "fashion-mnist";
  throw InputError("no data set found: run `make data` (fetches CIFAR-10, needs internet), install the "
                   "Debian package dataset-fashion-mnist, or use --data synthetic");
}

// An image folder, and what the start-up lines say about it.
void load_folder(const std::string& dir, const ImageOptions& images, ChosenData& d) {
  if (dir.empty()) throw InputError("--data folder needs --data-dir DIR");
  d.dir = dir;
  FolderData f = load_image_folder(dir, images);
  d.split = std::move(f.split);
  const FolderReport& r = f.report;
  std::string names;
  for (const std::string& n : d.split.train.class_names) names += (names.empty() ? "" : ", ") + n;
  d.notes.push_back("classes: " + names);
  if (r.test_split == "val") d.notes.push_back("test split: " + dir + "/val");
  if (r.ignored > 0) d.notes.push_back("ignored " + with_commas(r.ignored) + " files without an image extension");
  if (images.cache_decoded) {
    char rate[160];
    const double per_s = r.decode_seconds > 0 ? r.decoded_images / r.decode_seconds : 0;
    std::snprintf(rate, sizeof(rate), " in %.2f s with %d thread%s: %s images/s (%s per thread)", r.decode_seconds,
                  r.decode_threads, r.decode_threads == 1 ? "" : "s", with_commas(std::llround(per_s)).c_str(),
                  with_commas(std::llround(per_s / std::max(1, r.decode_threads))).c_str());
    d.notes.push_back("cache: decoded " + with_commas(r.decoded_images) + " images into " + format_bytes(r.cache_bytes) + rate);
  }
  if (r.skipped > 0) {
    std::string examples;
    for (const std::string& e : r.skipped_examples) examples += (examples.empty() ? "" : "; ") + e;
    d.warnings.push_back("--skip-bad-images: left out " + with_commas(r.skipped) + " bad image file" +
                         (r.skipped == 1 ? "" : "s") + " (" + examples + (r.skipped > int(r.skipped_examples.size()) ? "; ..." : "") + ")");
  }
}

}  // namespace

ChosenData load_data_set(const std::string& which_flag, const std::string& dir, int synthetic_size, int batch,
                         uint64_t seed, const ImageOptions& images) {
  const std::string which = which_flag == "auto" ? resolve_auto(dir) : which_flag;
  ChosenData d;
  if (which == "cifar10") {
    d.dir = dir.empty() ? find_cifar10_dir() : dir;
    if (d.dir.empty()) d.dir = "data/cifar-10-batches-bin";
    d.split = load_cifar10(d.dir);
  } else if (which == "fashion-mnist") {
    d.dir = dir.empty() ? find_fashion_mnist_dir() : dir;
    d.split = load_fashion_mnist(d.dir);
  } else if (which == "folder") {
    load_folder(dir, images, d);
  } else {
    d.dir = "(generated)";
    d.split = make_synthetic(synthetic_size, std::max(synthetic_size / 5, batch), seed, images.side);
  }
  if (d.split.train.count < batch)
    throw InputError("--batch " + std::to_string(batch) + " is larger than the training set (" +
                     std::to_string(d.split.train.count) + " images)");
  return d;
}
