// Command-line options of bin/train.
//
// parse_options() rejects an unknown flag, a missing value or an out-of-range number with a
// UsageError (main() prints it on one line and exits 2). Every flag and its default is listed by
// usage_text(), which is what --help prints.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/flags.h"
#include "data/data_flags.h"

// The default of --autotune-cache: autotune-cache.txt in the program's repository (data_choice.h), so
// that a run from any directory finds the algorithms measured before; from the repository itself it
// reads "autotune-cache.txt".
std::string default_autotune_cache();

// The data flags (data, data_dir, synthetic_size, image_size, skip_bad_images, cache_decoded, batch)
// come from DataOptions, shared with bin/predict.
struct Options : DataOptions {
  // training
  int epochs = 15;
  long steps = 0;                   // stop after this many steps in all (0 = run every epoch)
  double lr = 0.02;                 // peak learning rate (chosen by a sweep on Fashion-MNIST: docs/design.md)
  double min_lr = 0.0;              // at the end of the cosine
  double warmup_epochs = 1.0;       // linear warm-up from lr/warm-up-steps to lr
  bool lr_scaling = true;           // several GPUs: lr and warm-up follow the global batch (train/lr_scaling.h)
  double warmup_cap = 2.0;          // the most epochs that rule grows the warm-up to
  double momentum = 0.9;
  double weight_decay = 5e-4;
  bool nesterov = true;
  uint64_t seed = 0;
  bool eval = true;                 // evaluate on the test set after every epoch
  // recipe ingredients (issue 37), each off by default
  double label_smoothing = 0.0;     // of the training loss's target
  double ema = 0.0;                 // decay of the weight average evaluated and saved (0: none)
  bool tta_flip = false;            // evaluation scores each image with its horizontal mirror
  int crop_pad = -1;                // the random crop's shift, at most this many pixels (-1: side / 8)
  bool zero_init_residual = false;  // a fresh start's blocks begin as their shortcuts (last BN gamma 0)
  // performance
  int workers = -1;                 // loader threads; -1 = min(cores - 1, 8)
  long workspace_mb = 1024;         // cuDNN workspace limit
  std::string autotune_cache = default_autotune_cache();
  bool tf32 = true;                 // fp32 convs/GEMMs may use TF32 tensor cores
  bool deterministic = false;
  bool cuda_graph = true;           // replay the step as a CUDA graph (builds with cudagraph)
  unsigned no_fuse_patterns = 0;    // fused BN patterns that run plain (--no-fuse; model/fused_patterns.h)
  bool no_fuse_given = false;       // else the build's default (default_unfused_patterns)
  double loss_scale = 65536.0;      // initial dynamic loss scale (fp16 builds)
  int loss_scale_window = 1000;     // good steps before the scale doubles
  // measurement
  int warmup_steps = 30;            // steps before the steady-state window
  int profile_steps = 100;          // steps in the window (cudaProfilerStart/Stop, --trace)
  std::string trace;                // write a Chrome trace of the window here
  int progress_every = 50;          // steps between (asynchronous) progress reads
  bool json = false;
  std::string loss_log;             // every step's training loss, one "step loss" line each
  std::string sample_png;           // a grid of the first augmented training batch
  // checkpoints
  std::string save;                 // checkpoint file written at the end (and on SIGINT/SIGTERM)
  long save_every = 0;              // also every N steps (0 = never)
  std::string resume;
  // several GPUs (docs/multi-gpu.md): --batch is per GPU
  int gpus = 1;                     // ranks to start on this machine (bin/train --gpus N)
  double bucket_mb = 25;            // gradient bucket size (after a first bucket of 1 MB)
  double last_bucket_mb = 0;        // the last bucket's size (0: what is left over)
  std::string allreduce_dtype;      // fp16 | fp32; "" = the gradients' own type
  std::string grad_compression = "none";  // none | int8 (dist/grad_compression.h)
  int accumulate = 1;               // micro-batches of --batch per optimizer step (dist/grad_accumulation.h)
  double dist_timeout = 300;        // seconds before a missing, dead or hung rank stops the others

  bool help = false;
};

Options parse_options(int argc, const char* const* argv);
// The files a run writes, flag and path ("" for a flag not given): --save, --loss-log, --sample-png,
// --trace, and --autotune-cache where it is written (autotuning builds without --deterministic).
std::vector<std::pair<std::string, std::string>> output_files(const Options& o, bool autotune_cache_written);
// No two of those and --resume may be one file, except --resume and --save (the checkpoint resumed
// from is replaced whole, at the end); a UsageError naming both flags otherwise. parse_options
// checks all but the cache, whose use only the trainer knows.
void check_files_distinct(const Options& o, bool autotune_cache_written);
std::string usage_text();
// The default loader thread count for this machine: min(cores - 1, 8), at least 1.
int default_workers();
