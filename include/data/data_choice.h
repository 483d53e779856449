// Which data set a run uses, from --data and --data-dir: `auto` takes CIFAR-10 where `make data`
// put it (or where --data-dir holds its files), else Fashion-MNIST; `folder` reads an image folder
// (image_folder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
