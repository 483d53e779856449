// Checkpoint files: everything needed to continue a run exactly where it stopped.
//
// Layout: the magic "RN50CKPT", a format version (u32), the length of a text header (u32), the
// header ("key=value" lines: build, model signature, step, seed, loss scale, learning-rate rule,
// ...), the float arrays (master weights, momentum, BN running statistics, and in version 2 the
// weight average where the header has ema_decay, each preceded by its u64 length), and a CRC-32 of
// everything before it. A checkpoint without a weight average is written as version 1, which every
// earlier build reads; one with it as version 2, which those refuse by its version. Writes are
// atomic (file_io.h): a crash during a save leaves the previous checkpoint as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/lr_scaling.h"

struct CheckpointMeta {
  // build and model: a resume needs the same ones
  std::string precision;       // "fp32" / "fp16"
  std::string layout;          // "NCHW" / "NHWC" (filters are stored in this layout)
  std::string model = "resnet50-cifar";
  uint64_t model_signature = 0;  // hash of every parameter's name and shape
  uint64_t params = 0, running = 0;
  // data: a resume needs the same image side and classes (older files lack both: 32, names unknown)
  int image_side = 32;
  std::vector<std::string> class_names;
  // run
  std::string data;
  int batch = 0, epochs = 0;
  uint64_t seed = 0;
  int64_t step = 0;            // steps done in all
  int epoch = 0;               // epoch of the next step (0-based)
  int step_in_epoch = 0;       // index of the next step within that epoch
  float loss_scale = 1.f;
  int good_steps = 0, skipped_steps = 0;
  // the learning-rate rule (train/lr_scaling.h): whether the run was scaled, from which reference
  // batch, and the schedule it used. Files written before the rule lack these: lr_recorded false, a
  // run that was not scaled; those written before the reference was recorded were scaled from 128.
  bool lr_recorded = false, lr_scaled = false;
  int lr_reference_batch = kLegacyReferenceBatch;
  double lr = 0, min_lr = 0, warmup_epochs = 0;
  double ema_decay = 0;        // the weight average's (--ema), where the file holds one
};

struct Checkpoint {
  CheckpointMeta meta;
  std::vector<float> master, momentum, running;
  std::vector<float> ema;      // the weight average (train/weight_average.h), or empty: none
};

std::vector<uint8_t> serialize_checkpoint(const Checkpoint& c);
// Any malformed, truncated or corrupt input is an InputError naming `file` and what is wrong:
// "truncated" when the file ends before what its (plausible) header describes, "corrupt" when the
// header or an array length is implausible or disagrees with the other, or the checksum fails, and
// "inconsistent header" when step, epoch and step_in_epoch cannot describe one position.
Checkpoint parse_checkpoint(const uint8_t* bytes, size_t size, const std::string& file);

void save_checkpoint(const std::string& path, const Checkpoint& c);
// Reads and parses `path`: only a regular file, and one larger than any checkpoint can be is refused
// before it is read.
Checkpoint load_checkpoint(const std::string& path);

// InputError explaining why a checkpoint cannot continue this run (other classes or image size,
// another model, precision, layout, batch size or data set).
void check_checkpoint_fits(const CheckpointMeta& file_meta, const CheckpointMeta& here, const std::string& file);

// InputError unless the checkpoint's step, epoch and step_in_epoch are a position of a run with
// `steps_per_epoch` steps per epoch (a training set of another size gives another number).
void check_checkpoint_position(const CheckpointMeta& m, int steps_per_epoch, const std::string& file);

// What differs between the model a checkpoint holds and the one built here, "X in the checkpoint, Y
// here" for each of model name, parameter count and BN statistics; where those agree, that the
// tensors' names or shapes differ (the signatures). "" when nothing differs.
std::string model_difference(const CheckpointMeta& file_meta, const CheckpointMeta& here);

// The model signature of a list of (name, shape) pairs.
uint64_t model_signature(const std::vector<std::pair<std::string, std::vector<int>>>& tensors);
