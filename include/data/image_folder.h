// The user's own images: DIR/train/<class>/<files> and DIR/test/<class>/<files> (or DIR/val/...),
// with torchvision ImageFolder's conventions.
//
// Classes are the sorted subdirectory names of train/ (labels 0..K-1); test/ must have the same
// ones. A class's images are the files under its directory (subdirectories included, sorted) whose
// extension is .png .jpg .jpeg .bmp .tga .gif .ppm or .pgm in any case; hidden files and
// directories (names starting with '.') are skipped, other files ignored. An empty class, or no
// class at all, is an error.
//
// Before the GPU is touched, every file's header is read and checked (image_decode.h): a bad file
// is an InputError naming it and the reason, or with skip_bad it is left out and counted. The
// images are then either decoded once into memory (cache_decoded: uint8, side x side, after
// checking the size against MemAvailable) or decoded whenever a batch needs them
// (Dataset::decoded_on_demand), by the pinned loader's worker threads or, in the synchronous
// loader, on the main thread. With skip_bad every file is decoded once at start either way, so
// that a file that passes the header check but does not decode is left out too, whether or not the
// images are cached; without it such a file is an error when it is decoded (at start when cached or
// in the normalisation sample, else by the batch that holds it).
//
// The stored channels are 1 when every file is grey (the normalisation then replicates the grey
// channel, as for Fashion-MNIST), else 3: grey images are replicated at decoding. Alpha is dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_decode.h"

// How images are served (--image-size also sets the side of synthetic data and Fashion-MNIST's canvas).
struct ImageOptions {
  int side = kDefaultImageSide;   // --image-size
  bool skip_bad = false;          // --skip-bad-images
  bool cache_decoded = false;     // --cache-decoded
  int threads = 1;                // threads that decode at start (the header pass uses every core)
  std::string meminfo = "/proc/meminfo";  // where MemAvailable is read (tests point it elsewhere)
  // cache_decoded: called with the number of images once the header pass has kept them and their
  // size fits in memory, before any is decoded (minutes for a large folder): bin/train looks for its
  // GPU here, and starts its progress lines.
  std::function<void(int images)> before_decoding;
};

// What loading found, for the start-up lines.
struct FolderReport {
  std::string test_split;              // "test" or "val"
  int skipped = 0;                     // bad files left out (skip_bad)
  std::vector<std::string> skipped_examples;  // the first few, "path: reason"
  int ignored = 0;                     // files without an image extension
  uint64_t cache_bytes = 0;            // decoded images held in memory (cache_decoded)
  int decoded_images = 0;              // images decoded at start (cache_decoded or skip_bad; failed ones included)
  double decode_seconds = 0;           // time to decode them
  int decode_threads = 0;
};

struct FolderData {
  DataSplit split;
  FolderReport report;
};

FolderData load_image_folder(const std::string& dir, const ImageOptions& o);

// Images decoded so far by this process, into the cache or one at a time (image_pixels): what a
// long decoding's progress lines count.
long images_decoded();

// ---- the pieces, for the tests ----------------------------------------------------------------------
bool has_image_extension(const std::string& file_name);
// Sorted non-hidden subdirectories of `split_dir` (symlinks to directories count); InputError when
// there are none.
std::vector<std::string> find_classes(const std::string& split_dir);
struct FolderListing {
  std::vector<std::string> paths;
  std::vector<uint8_t> labels;
  int ignored = 0;  // files without an image extension
};
// The image files of each class in order; InputError naming a class that has none.
FolderListing list_images(const std::string& split_dir, const std::vector<std::string>& classes);
// The header check of one file from bounded reads of its start and end (the whole file only when
// its header lies deeper than kImageHeadBytes).
ImageCheck check_image_file(const std::string& path);
// InputError unless `need` bytes of decoded images fit in 3/4 of `available` (0: not known, no check).
void check_cache_fits(uint64_t need, uint64_t available, int images, int side);
