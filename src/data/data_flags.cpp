// The rows of the shared data flags (data/data_flags.h).
#include "data/data_flags.h"

// One row per flag: a table, read row by row.
const std::vector<FlagRow<DataOptions>>& data_flag_rows() {
  using Row = FlagRow<DataOptions>;
  static const std::vector<Row> rows = {
      {"--data", "NAME", "data set: auto, cifar10, fashion-mnist or synthetic (auto: CIFAR-10 if `make data` fetched it, else Fashion-MNIST)",
       [](const DataOptions& o) { return o.data; },
       [](DataOptions& o, const std::string& v) {
         if (v != "auto" && v != "cifar10" && v != "fashion-mnist" && v != "synthetic")
           throw UsageError("--data: '" + v + "' is not one of auto, cifar10, fashion-mnist, synthetic");
         o.data = v;
       }},
      {"--data-dir", "DIR", "where the data set's files are", [](const DataOptions&) { return std::string("data/cifar-10-batches-bin, or $FASHION_MNIST_DIR, data/fashion-mnist, /usr/share/datasets/fashion-mnist"); },
       [](DataOptions& o, const std::string& v) { o.data_dir = v; }},
      {"--synthetic-size", "N", "training images of --data synthetic (the test set is a fifth)", [](const DataOptions& o) { return std::to_string(o.synthetic_size); },
       [](DataOptions& o, const std::string& v) { o.synthetic_size = (int)parse_long("--synthetic-size", v, 1, 10000000); }},
      {"--batch", "N", "images per step (per GPU when bin/train runs on several: --gpus, torchrun, mpirun, srun)", [](const DataOptions& o) { return std::to_string(o.batch); },
       [](DataOptions& o, const std::string& v) { o.batch = (int)parse_long("--batch", v, 2, 8192); }},
  };
  return rows;
}
