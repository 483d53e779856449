// bin/predict's command line: defaults, every flag, the conflicts between flags (each a UsageError
// naming them), --help listing every flag with its default, and the data flags shared with bin/train
// (the same rows: the same help lines and the same errors).
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/fused_patterns.h"
#include "predict/options.h"
#include "support/test_files.h"  // EXPECT_HAS
#include "train/options.h"

namespace {

PredictOptions parse(std::vector<std::string> args) {
  std::vector<const char*> argv = {"predict"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_predict_options(static_cast<int>(argv.size()), argv.data());
}

std::string usage_error(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UsageError";
  return "";
}

std::vector<std::string> help_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.rfind("  --", 0) == 0) lines.push_back(l);
  return lines;
}

TEST(PredictOptions, Defaults) {
  const PredictOptions o = parse({"--checkpoint", "m.ckpt"});
  EXPECT_EQ(o.checkpoint, "m.ckpt");
  EXPECT_EQ(o.data, "auto");
  EXPECT_EQ(o.split, "test");
  EXPECT_EQ(o.batch, 128);
  EXPECT_EQ(o.out, "predictions.csv");
  EXPECT_EQ(o.top_k, 5);
  EXPECT_EQ(o.features, "");
  EXPECT_EQ(o.features_dtype, DType::F32);
  EXPECT_EQ(o.export_path, "");
  EXPECT_EQ(o.workers, -1);
  EXPECT_EQ(o.warmup_batches, 5);
  EXPECT_FALSE(o.json);
  EXPECT_FALSE(o.deterministic);
}

TEST(PredictOptions, EveryFlag) {
  const PredictOptions o = parse({"--checkpoint=a.ckpt", "--data", "synthetic", "--data-dir", "/d", "--synthetic-size", "640",
                                  "--skip-bad-images", "--cache-decoded", "--split", "train", "--batch", "256", "--out", "p.csv", "--top-k", "3", "--features",
                                  "f.npy", "--features-dtype", "float16", "--workers", "6", "--deterministic", "--warmup-batches", "0",
                                  "--trace", "t.json", "--json"});
  EXPECT_EQ(o.checkpoint, "a.ckpt");
  EXPECT_EQ(o.data, "synthetic");
  EXPECT_EQ(o.data_dir, "/d");
  EXPECT_EQ(o.synthetic_size, 640);
  EXPECT_TRUE(o.skip_bad_images);
  EXPECT_TRUE(o.cache_decoded);
  EXPECT_EQ(o.split, "train");
  EXPECT_EQ(o.batch, 256);
  EXPECT_EQ(o.out, "p.csv");
  EXPECT_EQ(o.top_k, 3);
  EXPECT_EQ(o.features, "f.npy");
  EXPECT_EQ(o.features_dtype, DType::F16);
  EXPECT_EQ(o.workers, 6);
  EXPECT_TRUE(o.deterministic);
  EXPECT_EQ(o.warmup_batches, 0);
  EXPECT_EQ(o.trace, "t.json");
  EXPECT_TRUE(o.json);
  const PredictOptions e = parse({"--checkpoint", "a.ckpt", "--export", "m.safetensors"});
  EXPECT_EQ(e.export_path, "m.safetensors");
  EXPECT_EQ(e.out, "") << "an export writes no predictions";
  EXPECT_TRUE(parse({"--help"}).help) << "--help needs no --checkpoint";
  EXPECT_EQ(parse({"--checkpoint", "a.ckpt"}).no_fuse_patterns, 0u);
  EXPECT_EQ(parse({"--checkpoint", "a.ckpt", "--no-fuse", "conv-bn-add-relu,conv-bn"}).no_fuse_patterns,
            fused_pattern_bit(FusedPattern::ConvBnAddRelu) | fused_pattern_bit(FusedPattern::ConvBn));
}

TEST(PredictOptions, UsageErrorsNameTheFlags) {
  EXPECT_HAS(usage_error({}), "--checkpoint");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--split", "val"}), "--split");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--features-dtype", "float64", "--features", "f"}), "--features-dtype");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--features-dtype", "float16"}), "needs --features");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--top-k", "0"}), "--top-k");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--workers", "0"}), "--workers");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--no-fuse", "conv-bn,relu"}), "--no-fuse: 'relu' is not a pattern");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--export", "m", "--out", "p.csv"}), "--export");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--export", "m", "--features", "f.npy"}), "--export");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--out", "x", "--features", "x"}), "name the same file");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--export", "m", "--features-dtype", "float16"}), "--export");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--out", "p.csv", "--features", "p.confusion.png"}), "PNG");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--json=1"}), "--json");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--bach", "8"}), "--bach");
}

// An output over the checkpoint it reads would replace the model (and its training state) for good.
TEST(PredictOptions, NoOutputMayNameTheCheckpoint) {
  EXPECT_EQ(usage_error({"--checkpoint", "m.ckpt", "--export", "./m.ckpt"}),
            "--checkpoint and --export name the same file, ./m.ckpt");
  EXPECT_EQ(usage_error({"--checkpoint", "m.ckpt", "--out", "m.ckpt"}), "--checkpoint and --out name the same file, m.ckpt");
  EXPECT_EQ(usage_error({"--checkpoint", "m.ckpt", "--features", "m.ckpt"}),
            "--checkpoint and --features name the same file, m.ckpt");
  EXPECT_EQ(usage_error({"--checkpoint", "m.ckpt", "--trace", "x/../m.ckpt"}),
            "--checkpoint and --trace name the same file, x/../m.ckpt");
  EXPECT_EQ(parse({"--checkpoint", "m.ckpt", "--export", "m.safetensors"}).export_path, "m.safetensors");
}

// bin/predict writes bin/train's autotune cache (autotune-cache.txt) where it measures conv
// algorithms: no output may be that file there; a build that never writes it may use the name.
TEST(PredictOptions, TheAutotuneCacheIsAnOutputWhereItIsWritten) {
  using Files = std::vector<std::pair<std::string, std::string>>;
  const PredictOptions o = parse({"--checkpoint", "m.ckpt", "--out", "autotune-cache.txt"});
  EXPECT_EQ(predict_output_files(o, false),
            (Files{{"--out", "autotune-cache.txt"}, {"--out's PNG", "autotune-cache.txt.confusion.png"},
                   {"--features", ""}, {"--trace", ""}, {"the autotune cache", ""}}));
  EXPECT_EQ(predict_output_files(o, true).back(),
            (std::pair<std::string, std::string>{"the autotune cache", "autotune-cache.txt"}));
  EXPECT_NO_THROW(check_predict_files_distinct(o, false));
  try {
    check_predict_files_distinct(o, true);
    ADD_FAILURE() << "--out over the autotune cache was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--out and the autotune cache name the same file, autotune-cache.txt");
  }
  EXPECT_THROW(check_predict_files_distinct(parse({"--checkpoint", "m.ckpt", "--features", "./autotune-cache.txt"}), true),
               UsageError);
  // --export builds no network: the model file is its only output.
  const PredictOptions exported = parse({"--checkpoint", "m.ckpt", "--export", "autotune-cache.txt"});
  EXPECT_EQ(predict_output_files(exported, true), (Files{{"--export", "autotune-cache.txt"}}));
}

// A model of 3 classes predicts without --top-k (all 3 per row); --top-k above the classes is named.
TEST(PredictOptions, TopKDefaultsToTheClassesWhereThereAreFewerThanFive) {
  const PredictOptions plain = parse({"--checkpoint", "a"});
  EXPECT_EQ(resolved_top_k(plain, 10, "fashion-mnist"), 5);
  EXPECT_EQ(resolved_top_k(plain, 3, "folder"), 3);
  EXPECT_EQ(resolved_top_k(plain, 1, "folder"), 1);
  EXPECT_EQ(resolved_top_k(parse({"--checkpoint", "a", "--top-k", "2"}), 3, "folder"), 2);
  EXPECT_EQ(resolved_top_k(parse({"--checkpoint", "a", "--top-k", "10"}), 10, "fashion-mnist"), 10);
  const PredictOptions five = parse({"--checkpoint", "a", "--top-k", "5"});
  try {
    resolved_top_k(five, 3, "folder");
    ADD_FAILURE() << "--top-k 5 of 3 classes was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--top-k 5 is more than the 3 classes of folder");
  }
}

TEST(PredictOptions, DataFlagsAreBinTrainsOwn) {
  // The same rows: the same help lines, the same checks, the same messages; --batch and --cache-decoded
  // with help of bin/predict's own (bin/train's speaks of ranks and epochs), the same checks.
  const std::vector<std::string> train = help_lines(usage_text()), predict = help_lines(predict_usage_text());
  for (const char* flag : {"--data ", "--data-dir ", "--synthetic-size "}) {
    std::string in_train, in_predict;
    for (const auto& l : train)
      if (l.rfind(std::string("  ") + flag, 0) == 0) in_train = l;
    for (const auto& l : predict)
      if (l.rfind(std::string("  ") + flag, 0) == 0) in_predict = l;
    EXPECT_FALSE(in_train.empty()) << flag;
    EXPECT_EQ(in_train, in_predict) << flag;
  }
  for (const auto& l : predict) {
    if (l.rfind("  --batch ", 0) == 0) {
      EXPECT_HAS(l, "images per forward pass [default: 128]");
    }
  }
  EXPECT_EQ(usage_error({"--checkpoint", "a", "--batch", "1"}), "--batch: 1 is out of range [2, 8192]");
  EXPECT_HAS(usage_error({"--checkpoint", "a", "--data", "imagenet"}), "not one of auto, cifar10");
}

TEST(PredictOptions, HelpListsEveryFlagWithItsDefault) {
  const std::vector<std::string> lines = help_lines(predict_usage_text());
  std::set<std::string> names;
  for (const auto& l : lines) {
    names.insert(l.substr(2, l.find(' ', 2) - 2));
    if (l.rfind("  --help", 0) != 0) {
      EXPECT_HAS(l, "[default: ");
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"--checkpoint", "--data", "--data-dir", "--synthetic-size", "--skip-bad-images",
                                          "--cache-decoded", "--split", "--batch",
                                          "--out", "--top-k", "--features", "--features-dtype", "--export", "--workers",
                                          "--deterministic", "--no-fuse", "--warmup-batches", "--trace", "--json", "--help"}));
}

TEST(PredictOptions, ConfusionPngBesideTheCsv) {
  EXPECT_EQ(confusion_png_path("predictions.csv"), "predictions.confusion.png");
  EXPECT_EQ(confusion_png_path("out/run 1.csv"), "out/run 1.confusion.png");
  EXPECT_EQ(confusion_png_path("rows"), "rows.confusion.png");
  EXPECT_EQ(confusion_png_path(".csv"), ".csv.confusion.png");
}

}  // namespace
