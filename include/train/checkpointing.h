// Saving and resuming a run: what a checkpoint of this run records, the network's state to and from
// a checkpoint, and which save --save FILE holds (periodic saves stay pending until proven good).
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "data/dataset.h"
#include "model/network.h"
#include "model/resnet50_spec.h"
#include "train/build.h"
#include "train/checkpoint.h"
#include "train/options.h"
#include "train/pending_save.h"
#include "train/weight_average.h"

// The build, model and run that a checkpoint of this run records; a resume must match it
// (check_checkpoint_fits). The model comes from its CPU listing (resnet50_params), so a resume is
// checked before the GPU is touched; the data set gives its name, image side and class names. The
// position and the loss scaler are filled in when saving.
CheckpointMeta run_meta(const BuildSettings& build, const ParamListing& params, const Dataset& train, const Options& o);

// The network's master weights, momentum and BN running statistics, with `meta`; and the weight
// average with its decay, where the run keeps one.
Checkpoint capture_checkpoint(const Network& net, const CheckpointMeta& meta, const WeightAverage* average = nullptr);
// Puts a checkpoint's state into the network (and refreshes its fp16 weight copy); a network built
// for inference takes the weights and BN statistics only.
void restore_checkpoint(Network& net, const Checkpoint& c, cudaStream_t stream);

// Where a checkpoint goes when its own path cannot be written (the disk filled up, the directory
// went away during the run): rescue-<pid>.ckpt in the working directory, else in $TMPDIR (or /tmp).
std::vector<std::string> default_rescue_dirs();

// Where saves go, and what --save FILE holds: a periodic save (--save-every) goes to FILE.pending
// and becomes FILE once a later counter read proves it good (pending_save.h); the end-of-run and
// signal saves are the result asked for and go to their path directly. A save that fails is written
// to the first rescue directory that takes it, and the run stops with a Fatal saying where it went
// and how to continue (or, if every rescue failed too, that this state is lost).
class SaveKeeper {
 public:
  explicit SaveKeeper(const Options& o, std::vector<std::string> rescue_dirs = default_rescue_dirs());
  // Whether a periodic save is due with `step` steps done.
  bool due(long step) const { return every_ > 0 && step % every_ == 0; }
  // `c` was captured after a counter read (on_read) at the same step. A pending save that the read
  // did not prove has had every step since skipped (or none run): it holds the same weights as `c`,
  // so dropping it loses nothing.
  void save(const Checkpoint& c, const std::string& to, bool periodic);
  // Every counter read comes here: it commits a pending save that it proves good.
  void on_read(long steps, long skipped, bool diverged);
  // After a divergence the pending save is unproven and goes; says what FILE holds now.
  std::string after_divergence(long first_step);

 private:
  std::string pending_path() const { return path_ + ".pending"; }
  void commit_pending();
  void write(const Checkpoint& c, const std::string& to) const;
  std::vector<std::string> rescue_dirs_;
  std::string path_, resume_;
  long every_;
  PendingSave pending_;
  long kept_step_ = -1;        // the step of the state this run made FILE; -1: none yet
  bool existed_ = false;       // FILE was there before this run
};
