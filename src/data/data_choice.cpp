// Choosing and loading the data set of a run.
#include "data/data_choice.h"

#include <unistd.h>

#include <algorithm>

#include "core/errors.h"

namespace {

std::string resolve_auto(const std::string& dir) {
  if (!dir.empty()) return access((dir + "/data_batch_1.bin").c_str(), F_OK) == 0 ? "cifar10" : "fashion-mnist";
  if (!find_cifar10_dir().empty()) return "cifar10";
  if (!find_fashion_mnist_dir().empty()) return "fashion-mnist";
  throw InputError("no data set found: run `make data` (fetches CIFAR-10, needs internet), install the "
                   "Debian package dataset-fashion-mnist, or use --data synthetic");
}

}  // namespace

ChosenData load_data_set(const std::string& which_flag, const std::string& dir, int synthetic_size, int batch,
                         uint64_t seed) {
  const std::string which = which_flag == "auto" ? resolve_auto(dir) : which_flag;
  ChosenData d;
  if (which == "cifar10") {
    d.dir = dir.empty() ? find_cifar10_dir() : dir;
    if (d.dir.empty()) d.dir = "data/cifar-10-batches-bin";
    d.split = load_cifar10(d.dir);
  } else if (which == "fashion-mnist") {
    d.dir = dir.empty() ? find_fashion_mnist_dir() : dir;
    d.split = load_fashion_mnist(d.dir);
  } else {
    d.dir = "(generated)";
    d.split = make_synthetic(synthetic_size, std::max(synthetic_size / 5, batch), seed);
  }
  if (d.split.train.count < batch)
    throw InputError("--batch " + std::to_string(batch) + " is larger than the training set (" +
                     std::to_string(d.split.train.count) + " images)");
  return d;
}
