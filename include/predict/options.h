// Command-line options of bin/predict.
//
// The data flags (--data, --data-dir, --synthetic-size, --batch) are bin/train's own rows
// (data/data_flags.h), so both programs read data the same way. parse_predict_options() rejects an
// unknown flag, a missing or bad value, or flags that contradict each other with a UsageError
// (exit 2); predict_usage_text() is what --help prints.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/types.h"
#include "data/data_flags.h"

struct PredictOptions : DataOptions {
  std::string checkpoint;           // a bin/train checkpoint (--save FILE)
  std::string split = "test";       // test | train
  std::string out;                  // predictions CSV; "predictions.csv" unless --export
  int top_k = 5;                    // classes (and probabilities) per row (resolved_top_k)
  bool top_k_given = false;         // else a data set of fewer classes gets all of them
  std::string features;             // .npy of the pooled features; "" = none
  DType features_dtype = DType::F32;
  bool features_dtype_given = false;  // --features-dtype without --features is an error
  std::string export_path;          // safetensors of the weights: export instead of predicting
  int workers = -1;                 // output worker threads; -1 = min(cores - 1, 8)
  bool deterministic = false;       // cuDNN's heuristics, deterministic algorithms only (as bin/train's)
  unsigned no_fuse_patterns = 0;    // fused BN patterns that run plain (--no-fuse; model/fused_patterns.h)
  int warmup_batches = 5;           // batches before the timed (and profiled) window
  std::string trace;                // Chrome trace of the window through CUPTI
  bool json = false;                // one JSON line at the end
  bool help = false;
};

PredictOptions parse_predict_options(int argc, const char* const* argv);
// The files a run writes, flag and path ("" for one not given): --export alone where it is given;
// else --out, its confusion-matrix PNG, --features, --trace, and the autotune cache where it is
// written (autotuning builds without --deterministic: bin/train's default file).
std::vector<std::pair<std::string, std::string>> predict_output_files(const PredictOptions& o,
                                                                      bool autotune_cache_written);
// No two of those and --checkpoint may be one file: a UsageError naming both flags otherwise.
// parse_predict_options checks all but the cache, whose use only the predictor knows.
void check_predict_files_distinct(const PredictOptions& o, bool autotune_cache_written);
std::string predict_usage_text();
// The classes per row for a data set of `classes`: --top-k, which must not exceed them (a
// UsageError), or without it the default, 5, or all the classes where there are fewer.
int resolved_top_k(const PredictOptions& o, int classes, const std::string& data_name);
// Where the confusion-matrix PNG goes: beside the CSV, "predictions.csv" -> "predictions.confusion.png".
std::string confusion_png_path(const std::string& csv_path);
