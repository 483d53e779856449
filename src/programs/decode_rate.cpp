// bin/decode_rate: how fast this machine decodes an image folder, on the CPU alone. It reads the
// folder with the project's own reader (data/image_folder.h), exactly as `bin/train --data folder
// --cache-decoded --workers W` does: every file's header checked, then every image decoded, resized
// and centre-cropped into memory on W threads; then it prints the line bin/train prints,
//   cache: decoded 70,000 images into 68.4 MiB in 5.00 s with 2 threads: 14,000 images/s (7,000 per thread)
// bench/folder_bench.py's decode table runs it: bin/train looks for its GPU before a long decode, so
// it measures nothing on a machine without one. Exit status: 0, 1 for a bad folder, 2 for a bad
// command line. It touches no GPU and links no CUDA library (the Makefile's DECODE_RATE_OBJ).
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/flags.h"
#include "core/format.h"
#include "data/data_choice.h"
#include "data/data_flags.h"
#include "data/image_folder.h"
#include "train/decode_progress.h"

namespace {

struct DecodeRateOptions : DataOptions {
  int workers = 1;  // threads that decode, as bin/train's --workers
  bool help = false;
};
using Row = FlagRow<DecodeRateOptions>;

const std::vector<Row>& flags() {
  static const std::vector<Row> table = {
      {"--data-dir", "DIR", "the image folder: DIR/train/<class>/<images>, DIR/test/<class>/<images> (or DIR/val/)",
       [](const DecodeRateOptions&) { return std::string("none: required"); },
       [](DecodeRateOptions& o, const std::string& v) { o.data_dir = v; }},
      {"--image-size", "N", "side the images are resized and centre-cropped to, a multiple of 8 from 8 to 1024 (bin/train's --image-size)",
       [](const DecodeRateOptions& o) { return std::to_string(o.image_size); },
       [](DecodeRateOptions& o, const std::string& v) { o.image_size = (int)parse_long("--image-size", v, 8, 1024); }},
      {"--workers", "N", "threads that decode (bin/train's --workers, which --cache-decoded decodes with)",
       [](const DecodeRateOptions& o) { return std::to_string(o.workers); },
       [](DecodeRateOptions& o, const std::string& v) { o.workers = (int)parse_long("--workers", v, 1, 256); }},
      data_flag<DecodeRateOptions>("--skip-bad-images"),
      {"--help", "", "print this help", [](const DecodeRateOptions&) { return std::string(""); },
       [](DecodeRateOptions& o, const std::string&) { o.help = true; }},
  };
  return table;
}

std::string usage_text() {
  return "usage: decode_rate --data-dir DIR [flags]\n"
         "Decodes an image folder into memory as `bin/train --data folder --cache-decoded` does (the same reader, "
         "on --workers threads), without a GPU, and prints the rate.\n\nflags:\n" +
         flags_help(flags());
}

DecodeRateOptions parse(int argc, const char* const* argv) {
  DecodeRateOptions o;
  parse_flags(flags(), argc, argv, o);
  if (o.help) return o;
  if (o.data_dir.empty())
    throw UsageError("--data-dir DIR is required (an image folder: DIR/train/<class>/..., DIR/test/<class>/...)");
  o.data = "folder";
  check_data_options(o);  // --image-size a multiple of 8, as bin/train takes it
  return o;
}

int run(const DecodeRateOptions& o) {
  std::unique_ptr<DecodeProgress> progress;  // lines while a long decode runs, as bin/train prints them
  ImageOptions images;
  images.side = o.image_size;
  images.skip_bad = o.skip_bad_images;
  images.cache_decoded = true;
  images.threads = o.workers;
  images.before_decoding = [&progress](int n) {
    const long before = images_decoded();
    progress = std::make_unique<DecodeProgress>("data: decoding into memory", n,
                                                [before] { return images_decoded() - before; });
  };
  const ChosenData d = load_data_set("folder", o.data_dir, o.synthetic_size, 1, 0, images);
  progress.reset();
  const Dataset& train = d.split.train;
  std::printf("data: folder %s: %s train, %s test images, %d classes, %dx%d, %s\n", d.dir.c_str(),
              with_commas(train.count).c_str(), with_commas(d.split.test.count).c_str(), train.classes(), train.side,
              train.side, train.channels == 1 ? "grey" : "3 channels");
  for (const std::string& note : d.notes) std::printf("%s\n", note.c_str());
  std::fflush(stdout);
  for (const std::string& w : d.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  DecodeRateOptions opt;
  try {
    opt = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::printf("%s", usage_text().c_str());
    return 0;
  }
  try {
    return run(opt);
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: out of host memory (an allocation failed); use a smaller --image-size\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
