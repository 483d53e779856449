// Which data set a run uses, from --data and --data-dir: `auto` takes CIFAR-10 where `make data`
// put it (or where --data-dir holds its files), else Fashion-MNIST.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

struct ChosenData {
  DataSplit split;
  std::string dir;  // where it was read from ("(generated)" for synthetic data)
};

// Loads the data set; InputError when none is found or the batch is larger than its training set.
ChosenData load_data_set(const std::string& which, const std::string& dir, int synthetic_size, int batch,
                         uint64_t seed);
