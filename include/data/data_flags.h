// The data flags every program takes (--data, --data-dir, --synthetic-size, --image-size,
// --skip-bad-images, --cache-decoded, --batch): one struct and one row per flag, shared by bin/train
// and bin/predict so that both read data the same way.
//
// A program's options struct derives from DataOptions and takes these rows into its own table
// (data_flag<Opts>(name)), in the place its --help lists them.
#pragma once

#include <string>
#include <vector>

#include "core/flags.h"

struct DataOptions {
  std::string data = "auto";        // auto | cifar10 | fashion-mnist | synthetic | folder
  std::string data_dir;             // "" = the data set's usual place
  int synthetic_size = 50000;       // training images of --data synthetic (test: a fifth)
  int image_size = 32;              // images are served at image_size x image_size (folder, synthetic, fashion-mnist)
  bool skip_bad_images = false;     // folder: leave out files that fail the header check or do not decode
  bool cache_decoded = false;       // folder: decode once into memory instead of every epoch
  int batch = 128;                  // images per step
};

// The rows, in the order bin/train lists them.
const std::vector<FlagRow<DataOptions>>& data_flag_rows();
// The rules between data flags, after parsing: UsageError for --data folder without --data-dir, and
// for an --image-size the data set is not served at: folder and synthetic data take multiples of 8,
// Fashion-MNIST 28 to 64 with an even border (its 28x28 images centred), CIFAR-10 (and --data auto,
// which may choose it) 32 only.
void check_data_options(const DataOptions& o);

// The row of one data flag ("--batch") as a row of Opts, a struct deriving from DataOptions.
template <class Opts>
FlagRow<Opts> data_flag(const std::string& name) {
  for (const FlagRow<DataOptions>& row : data_flag_rows())
    if (name == row.name) return lift_row<Opts>(row);
  throw std::logic_error("data_flag: no data flag " + name);
}
