// Choosing and loading the data set of a run.
#include "data/data_choice.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/errors.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/host_memory.h"
#include "data/image_folder.h"

namespace {

bool exists(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0;
}

// --data auto with --data-dir: what the directory holds decides. A directory that is missing, not
// readable or holds neither data set is said to be so (with what was looked for), rather than
// blamed on a data set the user did not ask for.
std::string resolve_auto_in(const std::string& dir) {
  struct stat st{};
  const std::string where = "--data-dir " + dir + ": ";
  if (stat(dir.c_str(), &st) != 0)
    throw InputError(where + (errno == ENOENT ? std::string("the directory does not exist") : std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) throw InputError(where + "not a directory");
  if (access(dir.c_str(), R_OK | X_OK) != 0)
    throw InputError(where + "the directory is not readable: " + std::strerror(errno));
  if (exists(dir + "/data_batch_1.bin")) return "cifar10";
  if (exists(dir + "/train-images-idx3-ubyte.gz") || exists(dir + "/train-images-idx3-ubyte")) return "fashion-mnist";
  const std::string neither = "holds neither CIFAR-10 (data_batch_1.bin) nor Fashion-MNIST (train-images-idx3-ubyte.gz "
                              "or train-images-idx3-ubyte)";
  if (exists(dir + "/train/."))  // what an image folder holds (image_folder.h)
    throw InputError(where + neither + " but a train/ directory: for a folder of your images (train/<class>/<images>), "
                     "add --data folder");
  throw InputError(where + neither + "; give the directory that holds those files, --data folder with a folder of "
                   "images (DIR/train/<class>/<images>), or --data synthetic");
}

// `dir` under the program's repository's data/ when that is not the working directory's and holds
// `file`; "" otherwise.
std::string in_repository_data(const std::string& dir, const std::string& file) {
  const std::string there = in_program_repository("data/" + dir);
  return there != "data/" + dir && exists(there + "/" + file) ? there : "";
}

// Where `make data` put CIFAR-10: data/ here, else in the program's repository.
std::string cifar10_dir() {
  const std::string here = find_cifar10_dir();
  return here.empty() ? in_repository_data("cifar-10-batches-bin", "data_batch_1.bin") : here;
}

// Where Fashion-MNIST is: $FASHION_MNIST_DIR, data/ here, the system's; else in the program's repository.
std::string fashion_mnist_dir() {
  const std::string found = find_fashion_mnist_dir();
  if (!found.empty()) return found;
  const std::string gz = in_repository_data("fashion-mnist", "train-images-idx3-ubyte.gz");
  return gz.empty() ? in_repository_data("fashion-mnist", "train-images-idx3-ubyte") : gz;
}

std::string resolve_auto(const std::string& dir) {
  if (!dir.empty()) return resolve_auto_in(dir);
  if (!cifar10_dir().empty()) return "cifar10";
  if (!fashion_mnist_dir().empty()) return "fashion-mnist";
  const std::string repo_data = in_program_repository("data");
  throw InputError("no data set found" + (repo_data == "data" ? "" : " in data/ (here) or " + repo_data + "/") +
                   ": run `make data` (fetches CIFAR-10, needs internet), install the Debian package "
                   "dataset-fashion-mnist, or use --data synthetic");
}

// Host memory a data set takes while it is read, from its format: CIFAR-10's six files held as
// images plus the one being read; synthetic data as generated. (Fashion-MNIST is bounded by the
// reader's per-file limit, a few hundred MiB at most.)
size_t host_bytes_needed(const std::string& which, long train_count, long test_count, int side) {
  if (which == "cifar10") return (6 + 1) * kCifarRecordBytes * kCifarRecordsPerFile;
  if (which == "synthetic") return size_t(train_count + test_count) * (size_t(kModelChannels) * side * side + 1);
  return 0;
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
  if (r.decoded_images > 0) {  // --cache-decoded, or --skip-bad-images finding files that do not decode
    char rate[160];
    const double per_s = r.decode_seconds > 0 ? r.decoded_images / r.decode_seconds : 0;
    std::snprintf(rate, sizeof(rate), " in %.2f s with %d thread%s: %s images/s (%s per thread)", r.decode_seconds,
                  r.decode_threads, r.decode_threads == 1 ? "" : "s", with_commas(std::llround(per_s)).c_str(),
                  with_commas(std::llround(per_s / std::max(1, r.decode_threads))).c_str());
    d.notes.push_back(images.cache_decoded
                          ? "cache: decoded " + with_commas(r.decoded_images) + " images into " + format_bytes(r.cache_bytes) + rate
                          : "--skip-bad-images: decoded " + with_commas(r.decoded_images) + " images to find those that do not decode" + rate);
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
  const int synthetic_test = std::max(synthetic_size / 5, batch);
  const size_t need = host_bytes_needed(which, synthetic_size, synthetic_test, images.side);
  if (which == "synthetic")
    require_host_memory(need, "--synthetic-size " + std::to_string(synthetic_size) + " (" +
                                  with_commas(synthetic_size + long(synthetic_test)) + " generated images)");
  else if (need > 0)
    require_host_memory(need, "the " + which + " data set");
  ChosenData d;
  if (which == "cifar10") {
    d.dir = dir.empty() ? cifar10_dir() : dir;
    if (d.dir.empty()) d.dir = "data/cifar-10-batches-bin";
    d.split = load_cifar10(d.dir);
  } else if (which == "fashion-mnist") {
    d.dir = dir.empty() ? fashion_mnist_dir() : dir;
    d.split = load_fashion_mnist(d.dir, images.side);
  } else if (which == "folder") {
    load_folder(dir, images, d);
  } else {
    d.dir = "(generated)";
    d.split = make_synthetic(synthetic_size, synthetic_test, seed, images.side);
  }
  if (d.split.train.count < batch)
    throw InputError("--batch " + std::to_string(batch) + " is larger than the training set (" +
                     std::to_string(d.split.train.count) + " images)");
  return d;
}
