// Reporting and outputs of a run: the start line, the progress line, the epoch lines and the summary
// (reports.h prints them), the checkpoints (checkpointing.h decides where they go), the loss log
// and the sample PNG. Only rank 0 calls the writers (Ranks::writes()).
#pragma once

#include <string>
#include <vector>

#include "core/errors.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "train/build.h"
#include "train/checkpointing.h"
#include "train/options.h"
#include "train/reports.h"

// A file of the run's output (the loss log) could not be written: the weights are fine, so they are
// saved before the run stops (ending.h).
struct OutputFailed : Fatal {
  using Fatal::Fatal;
};

class RunOutputs {
 public:
  RunOutputs(const BuildSettings& b, const Options& o, int workers, bool tty, int ranks);
  Reporter& report() { return report_; }
  SaveKeeper& saves() { return saves_; }
  // Appends "step loss" lines for steps first_step, first_step + 1, ... (the first call of the
  // process starts the file afresh); OutputFailed when the file cannot be written.
  void write_loss_log(long first_step, const std::vector<float>& losses);
  // The first augmented batch of a pass (its batch `first`) as a PNG grid.
  void write_sample_png(const Dataset& train, const EpochPlan& plan, int first) const;

 private:
  const BuildSettings& build_;
  const Options& opt_;
  Reporter report_;
  SaveKeeper saves_;
  bool loss_log_started_ = false;
};
