// Command-line parsing of bin/predict, and its --help text.
#include "predict/options.h"

#include <algorithm>

#include "model/fused_patterns.h"
#include "train/options.h"  // default_workers, the autotune cache bin/train and bin/predict share

namespace {

using Flag = FlagRow<PredictOptions>;
using P = PredictOptions;
const char* const kDefaultOut = "predictions.csv";

// A data flag shared with bin/train, with bin/predict's own help where bin/train's speaks of steps,
// epochs or ranks, which bin/predict does not have.
Flag predict_data_flag(const std::string& name, const char* help, const char* default_text = nullptr) {
  Flag f = data_flag<P>(name);
  f.help = help;
  if (default_text) f.show_default = [default_text](const P&) { return std::string(default_text); };
  return f;
}

// One row per flag, in --help order: a table, longer than a function should be, read row by row.
const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--checkpoint", "FILE", "the model: a checkpoint bin/train wrote (--save), of any build",
       [](const P&) { return std::string("required"); }, [](P& o, const std::string& v) { o.checkpoint = v; }},
      data_flag<P>("--data"),
      data_flag<P>("--data-dir"),
      data_flag<P>("--synthetic-size"),
      data_flag<P>("--skip-bad-images"),
      predict_data_flag("--cache-decoded", "--data folder: decode every image once at start into memory (N x N uint8)",
                        "decode as the batches are read, in the loader threads"),
      {"--split", "NAME", "which images of the data set: test or train", [](const P& o) { return o.split; },
       [](P& o, const std::string& v) {
         if (v != "test" && v != "train") throw UsageError("--split: '" + v + "' is not one of test, train");
         o.split = v;
       }},
      predict_data_flag("--batch", "images per forward pass"),
      {"--out", "FILE", "predictions, one CSV row per image; accuracy and the confusion matrix are printed, and drawn in FILE's name with .confusion.png",
       [](const P&) { return std::string(kDefaultOut); }, [](P& o, const std::string& v) { o.out = v; }},
      {"--top-k", "N", "classes and probabilities per row, most probable first",
       [](const P& o) { return std::to_string(o.top_k) + " (or all the classes, if fewer)"; },
       [](P& o, const std::string& v) {
         o.top_k = (int)parse_long("--top-k", v, 1, 1000);
         o.top_k_given = true;
       }},
      {"--features", "FILE", "also write every image's pooled 2048-d features as a NumPy .npy file", [](const P&) { return std::string("off"); },
       [](P& o, const std::string& v) { o.features = v; }},
      {"--features-dtype", "T", "element type of --features: float16 or float32", [](const P&) { return std::string("float32"); },
       [](P& o, const std::string& v) {
         if (v != "float16" && v != "float32") throw UsageError("--features-dtype: '" + v + "' is not one of float16, float32");
         o.features_dtype = v == "float16" ? DType::F16 : DType::F32;
         o.features_dtype_given = true;
       }},
      {"--export", "FILE", "instead of predicting, write the weights and BN statistics as safetensors under PyTorch's names (no GPU needed; the data set the checkpoint was trained on must be there, named by --data and --data-dir: the file keeps its classes and input normalisation)",
       [](const P&) { return std::string("off"); }, [](P& o, const std::string& v) { o.export_path = v; }},
      {"--workers", "N", "output worker threads (builds with the workers rung; the input loader has its own)",
       [](const P&) { return std::to_string(default_workers()) + " (min(cores - 1, 8))"; },
       [](P& o, const std::string& v) { o.workers = (int)parse_long("--workers", v, 1, 256); }},
      {"--deterministic", "", "deterministic cuDNN algorithms from the heuristics, as bin/train --deterministic: the same logits as its evaluation", [](const P&) { return std::string("off"); },
       [](P& o, const std::string&) { o.deterministic = true; }},
      {"--no-fuse", "LIST", kNoFuseHelp, [](const P&) { return std::string("none"); },
       [](P& o, const std::string& v) { o.no_fuse_patterns = parse_with("--no-fuse", v, parse_fused_pattern_list); }},
      {"--warmup-batches", "N", "batches before the timed window (images/s, cudaProfilerStart/Stop, --trace)", [](const P& o) { return std::to_string(o.warmup_batches); },
       [](P& o, const std::string& v) { o.warmup_batches = (int)parse_long("--warmup-batches", v, 0, 1000000); }},
      {"--trace", "FILE", "write a Chrome trace (Perfetto) of the window through CUPTI", [](const P&) { return std::string("off"); },
       [](P& o, const std::string& v) { o.trace = v; }},
      {"--json", "", "one JSON line at the end", [](const P&) { return std::string("off"); },
       [](P& o, const std::string&) { o.json = true; }},
      {"--help", "", "print this help, the build's egress rungs and its network settings", [](const P&) { return std::string(""); },
       [](P& o, const std::string&) { o.help = true; }},
  };
  return table;
}

}  // namespace

PredictOptions parse_predict_options(int argc, const char* const* argv) {
  PredictOptions o;
  parse_flags(flags(), argc, argv, o);
  if (o.help) return o;
  if (o.checkpoint.empty()) throw UsageError("--checkpoint FILE is required (a checkpoint bin/train wrote with --save)");
  check_data_options(o);
  if (!o.export_path.empty()) {
    if (!o.out.empty() || !o.features.empty() || o.features_dtype_given || !o.trace.empty())
      throw UsageError(
          "--export writes the model only; run bin/predict again without it for --out, --features, --features-dtype or "
          "--trace");
    check_predict_files_distinct(o, false);
    return o;
  }
  if (o.out.empty()) o.out = kDefaultOut;
  if (o.features_dtype_given && o.features.empty()) throw UsageError("--features-dtype needs --features FILE");
  check_predict_files_distinct(o, false);
  return o;
}

std::vector<std::pair<std::string, std::string>> predict_output_files(const PredictOptions& o,
                                                                      bool autotune_cache_written) {
  if (!o.export_path.empty()) return {{"--export", o.export_path}};
  return {{"--out", o.out},
          {"--out's PNG", confusion_png_path(o.out)},
          {"--features", o.features},
          {"--trace", o.trace},
          {"the autotune cache", autotune_cache_written ? Options{}.autotune_cache : ""}};
}

void check_predict_files_distinct(const PredictOptions& o, bool autotune_cache_written) {
  std::vector<std::pair<std::string, std::string>> files = {{"--checkpoint", o.checkpoint}};
  for (auto& f : predict_output_files(o, autotune_cache_written)) files.push_back(std::move(f));
  check_distinct_files(files);
}

std::string predict_usage_text() {
  return "usage: predict --checkpoint FILE [flags]\n"
         "Runs a ResNet-50 that bin/train trained over a data set: one CSV row per image, the accuracy and\n"
         "confusion matrix, optionally the pooled features as .npy; or exports the model for PyTorch.\n\nflags:\n" +
         flags_help(flags());
}

int resolved_top_k(const PredictOptions& o, int classes, const std::string& data_name) {
  if (!o.top_k_given) return std::min(o.top_k, classes);
  if (o.top_k > classes)
    throw UsageError("--top-k " + std::to_string(o.top_k) + " is more than the " + std::to_string(classes) +
                     " classes of " + data_name);
  return o.top_k;
}

std::string confusion_png_path(const std::string& csv_path) {
  const std::string ext = ".csv";
  const bool has_ext = csv_path.size() > ext.size() && csv_path.compare(csv_path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? csv_path.substr(0, csv_path.size() - ext.size()) : csv_path) + ".confusion.png";
}
