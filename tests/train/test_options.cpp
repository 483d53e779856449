// Command-line parsing: defaults, every flag, the --flag=value form, every kind of usage error (each
// message must name the flag at fault), and that --help lists exactly what the parser accepts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/data_choice.h"
#include "model/fused_patterns.h"
#include "train/options.h"
#include "support/test_files.h"  // EXPECT_HAS

namespace {

Options parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv = {"train"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

Options parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

// The message of the UsageError that parsing `args` must raise ("" and a failure naming the
// arguments otherwise).
std::string usage_error(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  std::string given;
  for (const auto& a : args) given += " '" + a + "'";
  ADD_FAILURE() << "expected a UsageError, but" << given << " was accepted";
  return "";
}

std::string usage_error(std::initializer_list<const char*> args) {
  return usage_error(std::vector<std::string>(args.begin(), args.end()));
}

// Every flag bin/train documents (the header's Options, one flag each).
const std::vector<std::string> kFlags = {
    "--data", "--data-dir", "--synthetic-size", "--image-size", "--skip-bad-images", "--cache-decoded",
    "--epochs", "--steps", "--batch", "--lr", "--min-lr", "--warmup-epochs", "--no-lr-scaling", "--warmup-cap",
    "--momentum", "--wd", "--no-nesterov", "--seed", "--no-eval", "--label-smoothing", "--ema", "--crop-pad", "--tta-flip",
    "--zero-init-residual", "--workers", "--workspace-mb", "--autotune-cache", "--no-tf32", "--deterministic",
    "--no-fuse", "--no-cuda-graph", "--loss-scale",
    "--loss-scale-window", "--warmup-steps", "--profile-steps", "--trace", "--progress-every", "--json",
    "--loss-log", "--sample-png", "--save", "--save-every", "--resume", "--gpus", "--bucket-mb",
    "--last-bucket-mb", "--allreduce-dtype", "--grad-compression", "--accumulate", "--dist-timeout", "--help"};

TEST(Options, DefaultsWithoutFlags) {
  const Options o = parse({}), d;
  EXPECT_EQ(o.data, "auto");
  EXPECT_EQ(o.data_dir, "");
  EXPECT_EQ(o.epochs, 15);
  EXPECT_EQ(o.batch, 128);
  EXPECT_EQ(o.steps, 0);
  EXPECT_DOUBLE_EQ(o.lr, 0.02);
  EXPECT_DOUBLE_EQ(o.min_lr, 0.0);
  EXPECT_DOUBLE_EQ(o.warmup_epochs, 1.0);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  EXPECT_DOUBLE_EQ(o.weight_decay, 5e-4);
  EXPECT_TRUE(o.nesterov);
  EXPECT_TRUE(o.eval);
  EXPECT_TRUE(o.tf32);
  EXPECT_FALSE(o.deterministic);
  EXPECT_TRUE(o.cuda_graph);
  EXPECT_FALSE(o.json);
  EXPECT_FALSE(o.help);
  EXPECT_EQ(o.workers, -1);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.save, "");
  EXPECT_EQ(o.resume, "");
  EXPECT_EQ(o.save_every, 0);
  EXPECT_EQ(o.synthetic_size, d.synthetic_size);
  EXPECT_EQ(o.image_size, 32);
  EXPECT_FALSE(o.skip_bad_images);
  EXPECT_FALSE(o.cache_decoded);
  EXPECT_DOUBLE_EQ(o.loss_scale, 65536.0);
  EXPECT_EQ(o.loss_scale_window, 1000);
  EXPECT_EQ(o.autotune_cache, d.autotune_cache);
}

TEST(Options, EveryFlagSetsItsField) {
  const Options o = parse({"--data", "synthetic", "--data-dir", "/d", "--synthetic-size", "640", "--image-size", "64",
                           "--skip-bad-images", "--cache-decoded", "--epochs", "3",
                           "--steps", "77", "--batch", "256", "--lr", "0.05", "--min-lr", "0.001",
                           "--warmup-epochs", "2.5", "--momentum", "0.8", "--wd", "1e-4", "--no-nesterov",
                           "--seed", "123456789012", "--no-eval", "--workers", "5", "--workspace-mb", "64",
                           "--autotune-cache", "c.txt", "--no-tf32", "--deterministic", "--no-cuda-graph", "--loss-scale", "1024",
                           "--loss-scale-window", "200", "--warmup-steps", "4", "--profile-steps", "9",
                           "--trace", "t.json", "--progress-every", "7", "--json", "--loss-log", "l.txt",
                           "--sample-png", "s.png", "--save", "ck.bin", "--save-every", "500", "--resume", "r.bin"});
  EXPECT_EQ(o.data, "synthetic");
  EXPECT_EQ(o.data_dir, "/d");
  EXPECT_EQ(o.synthetic_size, 640);
  EXPECT_EQ(o.image_size, 64);
  EXPECT_TRUE(o.skip_bad_images);
  EXPECT_TRUE(o.cache_decoded);
  EXPECT_EQ(o.epochs, 3);
  EXPECT_EQ(o.steps, 77);
  EXPECT_EQ(o.batch, 256);
  EXPECT_DOUBLE_EQ(o.lr, 0.05);
  EXPECT_DOUBLE_EQ(o.min_lr, 0.001);
  EXPECT_DOUBLE_EQ(o.warmup_epochs, 2.5);
  EXPECT_DOUBLE_EQ(o.momentum, 0.8);
  EXPECT_DOUBLE_EQ(o.weight_decay, 1e-4);
  EXPECT_FALSE(o.nesterov);
  EXPECT_EQ(o.seed, 123456789012u);
  EXPECT_FALSE(o.eval);
  EXPECT_EQ(o.workers, 5);
  EXPECT_EQ(o.workspace_mb, 64);
  EXPECT_EQ(o.autotune_cache, "c.txt");
  EXPECT_FALSE(o.tf32);
  EXPECT_TRUE(o.deterministic);
  EXPECT_FALSE(o.cuda_graph);
  EXPECT_DOUBLE_EQ(o.loss_scale, 1024.0);
  EXPECT_EQ(o.loss_scale_window, 200);
  EXPECT_EQ(o.warmup_steps, 4);
  EXPECT_EQ(o.profile_steps, 9);
  EXPECT_EQ(o.trace, "t.json");
  EXPECT_EQ(o.progress_every, 7);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.loss_log, "l.txt");
  EXPECT_EQ(o.sample_png, "s.png");
  EXPECT_EQ(o.save, "ck.bin");
  EXPECT_EQ(o.save_every, 500);
  EXPECT_EQ(o.resume, "r.bin");
  EXPECT_FALSE(o.help);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(Options, EqualsFormMatchesSeparateValue) {
  const Options a = parse({"--batch=256", "--lr=0.05", "--data=fashion-mnist", "--save=x=y.bin"});
  EXPECT_EQ(a.batch, 256);
  EXPECT_DOUBLE_EQ(a.lr, 0.05);
  EXPECT_EQ(a.data, "fashion-mnist");
  EXPECT_EQ(a.save, "x=y.bin") << "only the first '=' separates the value";
}

TEST(Options, AnEmptyValueIsNamedNotTakenForTheDefault) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--data-dir", ""}, {"--data-dir="}, {"--resume", ""}, {"--trace", ""}, {"--save="}, {"--loss-log", ""},
           {"--sample-png", ""}, {"--autotune-cache", ""}, {"--data", ""}, {"--batch", ""}}) {
    const std::string m = usage_error(args);
    EXPECT_HAS(m, args[0].substr(0, args[0].find('=')));
    EXPECT_HAS(m, "needs a value");
    EXPECT_HAS(m, "empty");
  }
}

TEST(Options, DashHIsHelp) {
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--batch", "64", "-h"}).help);
}

TEST(Options, ARepeatedFlagIsNamed) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--batch", "64", "--batch", "32"}, {"--batch=64", "--batch", "64"}, {"--json", "--json"},
           {"--help", "-h"}, {"--save", "a", "--epochs", "2", "--save=b"}}) {
    const std::string m = usage_error(args);
    EXPECT_HAS(m, args.back() == "-h" ? "--help" : args[0].substr(0, args[0].find('=')));
    EXPECT_HAS(m, "twice");
  }
}

TEST(Options, AFlagWhereAValueShouldBeIsNamed) {
  std::string m = usage_error({"--data-dir", "--epochs", "3"});
  EXPECT_EQ(m, "--data-dir needs a value (DIR), not the flag --epochs");
  EXPECT_HAS(usage_error({"--resume", "--save", "x"}), "not the flag --save");
  EXPECT_HAS(usage_error({"--save", "-h"}), "not the flag -h");
  EXPECT_EQ(parse({"--save=--odd-name"}).save, "--odd-name") << "the = form takes any value";
  EXPECT_HAS(usage_error({"--lr", "-1"}), "out of range") << "a negative number is a value, not a flag";
}

TEST(Options, UnknownFlagIsNamed) {
  EXPECT_HAS(usage_error({"--bach", "64"}), "--bach");
  EXPECT_HAS(usage_error({"-batch", "64"}), "-batch");
  EXPECT_HAS(usage_error({"stray"}), "stray");
  EXPECT_HAS(usage_error({"--bogus=1"}), "--bogus");
}

TEST(Options, MissingValueIsNamed) {
  const std::string m = usage_error({"--epochs", "3", "--batch"});
  EXPECT_HAS(m, "--batch");
  EXPECT_HAS(m, "needs a value");
  EXPECT_HAS(usage_error({"--save"}), "--save");
}

TEST(Options, NonNumbersAreNamed) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--batch", "12x"}, {"--batch", "1.5"}, {"--batch", ""}, {"--lr", "fast"}, {"--lr", "nan"},
           {"--lr", "inf"}, {"--lr", "0.1.2"}, {"--momentum", "0,9"}, {"--seed", "12345678901234567890x"}}) {
    const std::string m = usage_error(args);
    EXPECT_HAS(m, args[0]);
    EXPECT_HAS(m, "not a");
  }
}

TEST(Options, OutOfRangeValuesAreNamed) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--batch", "1"}, {"--batch", "9000"}, {"--epochs", "0"}, {"--lr", "-0.1"}, {"--momentum", "1"},
           {"--loss-scale", "0.5"}, {"--loss-scale", "1e9"}, {"--workers", "0"}, {"--seed", "-1"},
           {"--steps", "-5"}, {"--wd", "2"}, {"--loss-scale-window", "0"}, {"--synthetic-size", "0"},
           // beyond what a long holds: out of range, not "not an integer"
           {"--steps", "99999999999999999999999"}, {"--seed", "12345678901234567890"},
           {"--batch", "-99999999999999999999"}, {"--lr", "1e999"}}) {
    const std::string m = usage_error(args);
    EXPECT_HAS(m, args[0]);
    EXPECT_HAS(m, "out of range");
    EXPECT_HAS(m, "[");  // the range
  }
}

TEST(Options, FolderDataNeedsItsDirectory) {
  EXPECT_HAS(usage_error({"--data", "folder"}), "--data folder needs --data-dir");
  EXPECT_EQ(parse({"--data", "folder", "--data-dir", "imgs"}).data, "folder");
}

// --image-size: a multiple of 8 (every stage of the model at exactly half the side before it) for
// the data sets that can be served at any size (an image folder is resized, synthetic data generated
// at it).
TEST(Options, ImageSizeIsAMultipleOfEightForFolderOrSyntheticData) {
  EXPECT_EQ(parse({"--data", "folder", "--data-dir", "d", "--image-size", "224"}).image_size, 224);
  EXPECT_EQ(parse({"--data", "synthetic", "--image-size", "8"}).image_size, 8);
  EXPECT_HAS(usage_error({"--data", "folder", "--data-dir", "d", "--image-size", "100"}), "--image-size 100 is not a multiple of 8");
  EXPECT_HAS(usage_error({"--data", "synthetic", "--image-size", "28"}), "--image-size 28 is not a multiple of 8");
  EXPECT_HAS(usage_error({"--data", "synthetic", "--image-size", "0"}), "--image-size");
  EXPECT_HAS(usage_error({"--data", "synthetic", "--image-size", "1032"}), "out of range");
}

// Fashion-MNIST's 28x28 images are centred on a zero canvas of the side asked for: 28 (none) to 64,
// as many zero pixels on every edge.
TEST(Options, ImageSizeOfFashionMnistIsItsSidePlusAnEvenBorder) {
  for (const int n : {28, 30, 32, 64})
    EXPECT_EQ(parse({"--data", "fashion-mnist", "--image-size", std::to_string(n)}).image_size, n) << n;
  EXPECT_EQ(parse({"--data", "fashion-mnist"}).image_size, 32) << "the default: nothing changes unless asked";
  for (const char* n : {"27", "26", "8"})
    EXPECT_HAS(usage_error({"--data", "fashion-mnist", "--image-size", n}),
               "--image-size " + std::string(n) + ": Fashion-MNIST's images are 28x28 and are not cropped");
  for (const char* n : {"29", "31", "33"})
    EXPECT_HAS(usage_error({"--data", "fashion-mnist", "--image-size", n}), "give 28 plus an even number (28, 30, 32, ...)");
  EXPECT_HAS(usage_error({"--data", "fashion-mnist", "--image-size", "66"}), "served at most at 64x64");
}

// CIFAR-10 is 32x32 only; --data auto may choose it, so another side needs the data set named.
TEST(Options, ImageSizeOfCifar10IsThirtyTwo) {
  EXPECT_EQ(parse({"--data", "cifar10", "--image-size", "32"}).image_size, 32);
  EXPECT_HAS(usage_error({"--data", "cifar10", "--image-size", "64"}),
             "--image-size 64 applies to --data fashion-mnist, folder and synthetic: CIFAR-10 is 32x32");
  const std::string m = usage_error({"--image-size", "28"});
  EXPECT_HAS(m, "name the data set: --data auto may choose CIFAR-10");
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line";
}

TEST(Options, BadDataNameIsNamed) {
  const std::string m = usage_error({"--data", "imagenet"});
  EXPECT_HAS(m, "--data");
  EXPECT_HAS(m, "imagenet");
}

TEST(Options, SwitchGivenAValueIsNamed) {
  const std::string m = usage_error({"--no-eval=1"});
  EXPECT_HAS(m, "--no-eval");
  EXPECT_HAS(m, "no value");
  EXPECT_HAS(usage_error({"--json=true"}), "--json");
}

TEST(Options, SaveEveryNeedsSave) {
  EXPECT_HAS(usage_error({"--save-every", "100"}), "--save-every");
  EXPECT_EQ(parse({"--save-every", "100", "--save", "c.bin"}).save_every, 100);
  EXPECT_EQ(parse({"--save-every", "0"}).save_every, 0);
}

// An output over the checkpoint a run resumes from, or over another output, loses one of them;
// --save may replace the checkpoint it resumed from (written whole, at the end).
TEST(Options, NoTwoFlagsNameOneFileButSaveMayReplaceTheResumedCheckpoint) {
  EXPECT_EQ(usage_error({"--resume", "r.ckpt", "--loss-log", "r.ckpt"}), "--resume and --loss-log name the same file, r.ckpt");
  EXPECT_EQ(usage_error({"--save", "x", "--loss-log", "x"}), "--save and --loss-log name the same file, x");
  EXPECT_EQ(usage_error({"--sample-png", "s.png", "--trace", "s.png"}), "--sample-png and --trace name the same file, s.png");
  EXPECT_EQ(parse({"--resume", "r.ckpt", "--save", "r.ckpt"}).save, "r.ckpt");
}

// What Trainer::check_output_paths checks can be written: the flags' files, the cache only where used.
TEST(Options, OutputFilesAreTheWrittenOnes) {
  const Options o = parse({"--save", "s.ckpt", "--trace", "t.json"});
  using Files = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(output_files(o, false), (Files{{"--save", "s.ckpt"}, {"--loss-log", ""}, {"--sample-png", ""},
                                           {"--trace", "t.json"}, {"--autotune-cache", ""}}));
  EXPECT_EQ(output_files(o, true).back(), (std::pair<std::string, std::string>{"--autotune-cache", default_autotune_cache()}));
}

// The autotune cache only where it is written (the trainer knows: autotuning builds without
// --deterministic): a build that never writes it may use its name, the default one included.
TEST(Options, TheAutotuneCacheClashesOnlyWhereItIsWritten) {
  const Options resumed = parse({"--resume", "r.ckpt", "--autotune-cache", "./r.ckpt"});
  EXPECT_NO_THROW(check_files_distinct(resumed, false));
  try {
    check_files_distinct(resumed, true);
    ADD_FAILURE() << "--autotune-cache over --resume was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--resume and --autotune-cache name the same file, ./r.ckpt");
  }
  const Options saved = parse({"--save", default_autotune_cache()});  // the cache's default
  EXPECT_NO_THROW(check_files_distinct(saved, false));
  EXPECT_THROW(check_files_distinct(saved, true), UsageError);
}

// bin/train run by its full path from another directory finds the autotune cache of its repository
// (the directory above its bin/, holding the Makefile) as it does from there.
TEST(Options, TheAutotuneCacheDefaultsToTheProgramsRepository) {
  const std::string repo = program_repository();
  if (repo.empty()) GTEST_SKIP() << "bin/unit_tests does not sit in the bin/ of a repository";
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  test_files::TempDir elsewhere;
  ASSERT_EQ(chdir(elsewhere.path.c_str()), 0);
  const std::string away = default_autotune_cache();
  ASSERT_EQ(chdir(repo.c_str()), 0);
  const std::string home = default_autotune_cache();
  ASSERT_EQ(chdir(cwd), 0);
  EXPECT_EQ(away, repo + "/autotune-cache.txt");
  EXPECT_EQ(home, "autotune-cache.txt");
  EXPECT_EQ(Options{}.autotune_cache, default_autotune_cache());
}

TEST(Options, MinLrAboveLrIsNamed) {
  EXPECT_HAS(usage_error({"--lr", "0.01", "--min-lr", "0.02"}), "--min-lr");
  EXPECT_HAS(usage_error({"--min-lr", "0.05"}), "--min-lr");  // above the default peak 0.02
  EXPECT_DOUBLE_EQ(parse({"--lr", "0.02", "--min-lr", "0.02"}).min_lr, 0.02);
}

// The usage line of each flag: "  --flag VALUE   help ... [default: X]".
struct UsageRow {
  std::string value, default_text;
};
std::map<std::string, UsageRow> usage_rows(const std::string& usage) {
  std::map<std::string, UsageRow> rows;
  std::istringstream in(usage);
  std::string line, pending;
  const std::regex row(R"(^  (--[a-z0-9-]+)(?: ([A-Z]+))?(?:\s|$))");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) {
      pending = m[1];
      rows[pending].value = m[2];
    }
    // A long flag column wraps its help onto the next line; the default is at the end of the row.
    const size_t d = line.find("[default: ");
    if (d != std::string::npos && !pending.empty())
      rows[pending].default_text = line.substr(d + 10, line.find(']', d) - d - 10);
  }
  return rows;
}

TEST(Options, UsageListsEveryFlagAndEachListedFlagParses) {
  const std::string usage = usage_text();
  const std::map<std::string, UsageRow> rows = usage_rows(usage);
  // Every documented flag has a row ...
  for (const std::string& f : kFlags) EXPECT_EQ(rows.count(f), 1u) << f << " is not listed by --help";
  // ... every "--xyz" the text mentions (rows and help texts alike) is a flag with a row ...
  const std::regex token(R"(--[a-z0-9][a-z0-9-]*)");
  std::set<std::string> mentioned;
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), token); it != std::sregex_iterator(); ++it)
    mentioned.insert(it->str());
  EXPECT_GE(mentioned.size(), kFlags.size());
  for (const std::string& f : mentioned) {
    ASSERT_EQ(rows.count(f), 1u) << "the help mentions " << f << " but has no row for it";
    // ... and parses with its value; the shown default (first word) must itself be a valid value.
    const UsageRow& r = rows.at(f);
    std::vector<std::string> args = {f};
    if (!r.value.empty()) {
      std::string v = r.default_text.substr(0, r.default_text.find(' '));
      if (v.empty() || v.back() == ',') v = "x";  // descriptive defaults ("data/..., or ...") of paths
      args.push_back(v);
    }
    EXPECT_NO_THROW(parse(args)) << "'" << f << (args.size() > 1 ? " " + args[1] : "") << "' from the usage text";
  }
  for (const std::string& f : kFlags) EXPECT_EQ(mentioned.count(f), 1u) << f;
  EXPECT_EQ(rows.size(), kFlags.size()) << "the help lists a flag this test does not know";
}

TEST(Options, SeveralGpuFlags) {
  const Options d = parse({});
  EXPECT_EQ(d.gpus, 1);
  EXPECT_EQ(d.allreduce_dtype, "");  // the gradients' own type
  const Options o = parse({"--gpus", "4", "--bucket-mb", "50", "--allreduce-dtype=fp32", "--dist-timeout", "30"});
  EXPECT_EQ(o.gpus, 4);
  EXPECT_EQ(o.bucket_mb, 50);
  EXPECT_EQ(o.allreduce_dtype, "fp32");
  EXPECT_EQ(o.dist_timeout, 30);
  EXPECT_THROW(parse({"--allreduce-dtype", "bf16"}), UsageError);
  EXPECT_THROW(parse({"--gpus", "0"}), UsageError);
  EXPECT_THROW(parse({"--dist-timeout", "0.5"}), UsageError);
}

// The recipe's ingredients (issue 37): each off unless asked for.
TEST(Options, RecipeFlags) {
  const Options d = parse({});
  EXPECT_EQ(d.label_smoothing, 0.0);
  EXPECT_EQ(d.ema, 0.0);
  EXPECT_FALSE(d.tta_flip);
  EXPECT_FALSE(d.zero_init_residual);
  const Options o = parse({"--label-smoothing", "0.1", "--ema", "0.999", "--tta-flip", "--zero-init-residual"});
  EXPECT_DOUBLE_EQ(o.label_smoothing, 0.1);
  EXPECT_DOUBLE_EQ(o.ema, 0.999);
  EXPECT_TRUE(o.tta_flip);
  EXPECT_TRUE(o.zero_init_residual);
  for (const char* bad : {"-0.1", "1", "1.5"}) {
    EXPECT_HAS(usage_error({"--label-smoothing", bad}), "out of range");
    EXPECT_HAS(usage_error({"--ema", bad}), "--ema");
  }
  EXPECT_HAS(usage_error({"--tta-flip=1"}), "--tta-flip");
  EXPECT_HAS(usage_error({"--zero-init-residual=1"}), "--zero-init-residual");
}

// The random crop's shift: side / 8 unless given, from 0 (flips only) to half the side.
TEST(Options, CropPad) {
  EXPECT_EQ(parse({}).crop_pad, -1);
  EXPECT_EQ(parse({"--crop-pad", "0"}).crop_pad, 0);
  EXPECT_EQ(parse({"--crop-pad", "16"}).crop_pad, 16);
  EXPECT_EQ(parse({"--data", "synthetic", "--image-size", "64", "--crop-pad", "32"}).crop_pad, 32);
  EXPECT_HAS(usage_error({"--crop-pad", "17"}), "--crop-pad 17 is over half the image side (16 at --image-size 32)");
  EXPECT_HAS(usage_error({"--crop-pad", "-1"}), "--crop-pad");
}

// Several GPUs scale the learning rate with the global batch unless told not to (train/lr_scaling.h).
TEST(Options, LrScalingFlags) {
  const Options d = parse({});
  EXPECT_TRUE(d.lr_scaling);
  EXPECT_DOUBLE_EQ(d.warmup_cap, 2.0);
  const Options o = parse({"--no-lr-scaling", "--warmup-cap", "5"});
  EXPECT_FALSE(o.lr_scaling);
  EXPECT_DOUBLE_EQ(o.warmup_cap, 5.0);
  EXPECT_HAS(usage_error({"--warmup-cap", "-1"}), "--warmup-cap");
  EXPECT_HAS(usage_error({"--no-lr-scaling=yes"}), "--no-lr-scaling");
}

TEST(Options, CompressionAndAccumulation) {
  const Options d = parse({});
  EXPECT_EQ(d.grad_compression, "none");
  EXPECT_EQ(d.accumulate, 1);
  EXPECT_EQ(d.last_bucket_mb, 0);
  EXPECT_EQ(parse({"--last-bucket-mb", "1.5"}).last_bucket_mb, 1.5);
  EXPECT_THROW(parse({"--last-bucket-mb", "-1"}), UsageError);
  const Options o = parse({"--grad-compression", "int8", "--accumulate", "4"});
  EXPECT_EQ(o.grad_compression, "int8");
  EXPECT_EQ(o.accumulate, 4);
  EXPECT_THROW(parse({"--grad-compression", "powersgd"}), UsageError);
  EXPECT_THROW(parse({"--accumulate", "0"}), UsageError);
  EXPECT_THROW(parse({"--accumulate", "2.5"}), UsageError);
  // both choose what the weight gradients are reduced in
  try {
    parse({"--grad-compression", "int8", "--allreduce-dtype", "fp32"});
    FAIL() << "--grad-compression int8 with --allreduce-dtype fp32 was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--allreduce-dtype fp32 and --grad-compression int8 both choose what the weight gradients "
                           "are reduced in: give one");
  }
  EXPECT_NO_THROW(parse({"--grad-compression", "none", "--allreduce-dtype", "fp32"}));
}

const FusedPattern kEveryPattern[] = {
    FusedPattern::ConvStats, FusedPattern::SbrConvStats,  FusedPattern::SbrWgrad, FusedPattern::DgradDreluDbn,
    FusedPattern::OwnConvStats, FusedPattern::OwnJoinDgrad, FusedPattern::OwnDgradDbn, FusedPattern::OwnFinalize,
    FusedPattern::OwnPrologue, FusedPattern::StoredConvStats, FusedPattern::OwnStemConv, FusedPattern::OwnStemWgrad,
    FusedPattern::OwnStemJoin, FusedPattern::OwnJoinPrologue, FusedPattern::CompactShortcutDgrad,
    FusedPattern::LaggingWgrad, FusedPattern::OwnConv3x3, FusedPattern::OwnDgrad3x3, FusedPattern::LaneGemmWgrad,
    FusedPattern::ConvBn, FusedPattern::ConvBnRelu,
    FusedPattern::ConvBnAddRelu, FusedPattern::GemmBn, FusedPattern::GemmBnRelu, FusedPattern::GemmBnAddRelu};

// --no-fuse: which fused BN patterns run plain (model/fused_patterns.h), as bits and as the one
// text the ranks compare.
// Without --no-fuse, the fused weight gradient and our kernels' in-kernel finalize run plain where
// the weight gradients have their own stream (measured slower at the step there), and the joins in
// conv1's prologue everywhere (slower everywhere); every other pattern is planned.
TEST(Options, NoFuseDefaultsToThePlainWeightGradientBesideTheDataGradient) {
  const unsigned join = fused_pattern_bit(FusedPattern::OwnJoinPrologue);
  EXPECT_EQ(default_unfused_patterns(true),
            fused_pattern_bit(FusedPattern::SbrWgrad) | fused_pattern_bit(FusedPattern::OwnFinalize) | join);
  EXPECT_EQ(default_unfused_patterns(false), join) << "the joins in conv1 measured slower everywhere";
  EXPECT_EQ(fused_pattern_list_text(default_unfused_patterns(true)), "sbr-wgrad,own-finalize,own-join-prologue");
}

TEST(Options, NoFuseTakesPatternNamesOrAll) {
  const Options d = parse({});
  EXPECT_EQ(d.no_fuse_patterns, 0u);
  EXPECT_FALSE(d.no_fuse_given) << "the build's default applies";
  EXPECT_EQ(fused_pattern_list_text(d.no_fuse_patterns), "none");
  EXPECT_TRUE(parse({"--no-fuse", "none"}).no_fuse_given) << "none, given, fuses every pattern";
  const Options o = parse({"--no-fuse", "sbr-wgrad,conv-stats"});
  EXPECT_EQ(o.no_fuse_patterns, fused_pattern_bit(FusedPattern::SbrWgrad) | fused_pattern_bit(FusedPattern::ConvStats));
  EXPECT_EQ(fused_pattern_list_text(o.no_fuse_patterns), "conv-stats,sbr-wgrad") << "one spelling per set";
  EXPECT_EQ(parse({"--no-fuse=none"}).no_fuse_patterns, 0u);
  const unsigned all = parse({"--no-fuse", "all"}).no_fuse_patterns;
  for (FusedPattern p : kEveryPattern) EXPECT_TRUE(all & fused_pattern_bit(p)) << fused_pattern_slug(p);
  EXPECT_EQ(fused_pattern_list_text(all), "all");
  const std::string e = usage_error({"--no-fuse", "sbr-wgrad,wgrad"});
  EXPECT_NE(e.find("--no-fuse: 'wgrad' is not a pattern"), std::string::npos) << e;
  EXPECT_NE(e.find("dgrad-drelu-dbn"), std::string::npos) << "the names to choose from: " << e;
  EXPECT_NE(usage_error({"--no-fuse", "conv-stats,"}).find("an empty item"), std::string::npos);
  EXPECT_NE(usage_error({"--no-fuse", "none,conv-stats"}).find("'none' is not a pattern"), std::string::npos)
      << "none is the whole value or nothing";
}

// Slugs are the autotune cache's keys: each pattern has its own, and they parse back to it alone.
TEST(FusedPatterns, EachSlugParsesToItsOwnBit) {
  std::set<std::string> slugs;
  for (FusedPattern p : kEveryPattern) {
    EXPECT_TRUE(slugs.insert(fused_pattern_slug(p)).second) << fused_pattern_slug(p);
    EXPECT_EQ(parse_fused_pattern_list(fused_pattern_slug(p)), fused_pattern_bit(p)) << fused_pattern_slug(p);
    EXPECT_EQ(fused_pattern_list_text(fused_pattern_bit(p)), fused_pattern_slug(p)) << "the text parses back";
  }
  EXPECT_EQ(parse_fused_pattern_list("conv-bn,conv-bn"), fused_pattern_bit(FusedPattern::ConvBn));
  EXPECT_THROW(parse_fused_pattern_list(""), std::invalid_argument);
  EXPECT_THROW(parse_fused_pattern_list("Conv-Stats"), std::invalid_argument);
}

TEST(Options, DefaultWorkersIsBetweenOneAndEight) {
  EXPECT_GE(default_workers(), 1);
  EXPECT_LE(default_workers(), 8);
}

}  // namespace
