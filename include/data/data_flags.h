// The data flags every program takes (--data, --data-dir, --synthetic-size, --batch): one struct
// and one row per flag, shared by bin/train and bin/predict so that both read data the same way.
//
// A program's options struct derives from DataOptions and takes these rows into its own table
// (data_flag<Opts>(name)), in the place its --help lists them.
#pragma once

#include <string>
#include <vector>

#include "core/flags.h"

struct DataOptions {
  std::string data = "auto";        // auto | cifar10 | fashion-mnist | synthetic
  std::string data_dir;             // "" = the data set's usual place
  int synthetic_size = 50000;       // training images of --data synthetic (test: a fifth)
  int batch = 128;                  // images per step
};

// The rows, in the order bin/train lists them.
const std::vector<FlagRow<DataOptions>>& data_flag_rows();

// The row of one data flag ("--batch") as a row of Opts, a struct deriving from DataOptions.
template <class Opts>
FlagRow<Opts> data_flag(const std::string& name) {
  for (const FlagRow<DataOptions>& row : data_flag_rows())
    if (name == row.name) return lift_row<Opts>(row);
  throw std::logic_error("data_flag: no data flag " + name);
}
