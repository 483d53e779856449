// Which data set a run uses, from --data and --data-dir: `auto` takes CIFAR-10 where `make data`
// put it (or where --data-dir holds its files), else Fashion-MNIST; `folder` reads an image folder
// (image_folder.h). Without --data-dir, `make data`'s data/ is looked for in the working directory,
// then in the program's repository (a program run by its full path from elsewhere).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "data/dataset.h"
#include "data/image_folder.h"  // ImageOptions

struct ChosenData {
  DataSplit split;
  std::string dir;  // where it was read from ("(generated)" for synthetic data)
  std::vector<std::string> notes;     // start-up lines about the data (an image folder's classes, its cache)
  std::vector<std::string> warnings;  // printed as "warning: ..." (skipped bad images)
};

// Loads the data set; InputError when none is found or the batch is larger than its training set.
ChosenData load_data_set(const std::string& which, const std::string& dir, int synthetic_size, int batch,
                         uint64_t seed, const ImageOptions& images = {});

// The repository `make` built this program in: the directory above the program's own bin/, when it
// holds the Makefile; "" for a program that lives elsewhere. (Inline: the options of both programs
// name the autotune cache by it, and their fuzz targets link no data set reader.)
inline std::string program_repository() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::string bin = parent_directory(std::string(exe, size_t(n)));
  const std::string repo = parent_directory(bin);
  struct stat st{};
  const bool in_bin = bin.size() > 4 && bin.compare(bin.size() - 4, 4, "/bin") == 0;
  return in_bin && stat((repo + "/Makefile").c_str(), &st) == 0 ? repo : "";
}

// `relative`, a path under the repository ("data/cifar-10-batches-bin", "autotune-cache.txt"), as
// this process reaches it: unchanged when the repository is the working directory (or unknown),
// else under the repository.
inline std::string in_program_repository(const std::string& relative) {
  const std::string repo = program_repository();
  return repo.empty() || same_file(repo, ".") ? relative : repo + "/" + relative;
}
