// What the trainer prints: the start lines, the live progress line, one report per epoch and the
// summary, as text or (--json) as JSON lines with "event" "start", "first_step", "epoch" and "summary".
#pragma once

#include <chrono>
#include <string>

#include "dist/comm_stats.h"
#include "train/build.h"
#include "train/options.h"

struct EpochResult {
  int epoch = 0;                     // 0-based
  long step = 0;                     // steps done in all
  long images = 0;                   // training images of this epoch
  double train_loss = 0, train_acc = 0;
  double test_loss = 0, test_acc = 0;  // only with --eval
  double seconds = 0;                // wall clock, evaluation included
  double train_ms = 0, stall_ms = 0; // GPU time of the training steps, and their data stall
  double lr = 0;                     // the learning rate of its last step
  float loss_scale = 1;
  int skipped_steps = 0;
};

struct RunSummary {
  std::string gpu, data;
  long steps = 0;                    // run by this process
  long timed_steps = 0;              // in the steady-state window
  double window_ms = 0, window_stall_ms = 0, gpu_busy_pct = 0;
  long long window_start_unix_ms = 0, window_end_unix_ms = 0;  // its wall-clock bounds (SteadyStateWindow)
  double peak_gpu_mem_mb = 0;
  double final_train_loss = 0, final_train_acc = 0, final_test_loss = 0, final_test_acc = 0;
  unsigned long params = 0;
  double autotune_s = 0;
  int skipped_steps = 0;
  CommReport allreduce;              // several GPUs: the window's all-reduce, every rank (none: not measured)
};

class Reporter {
 public:
  // `ranks`: processes training together (images/s count all of them; --batch is per rank).
  Reporter(const BuildSettings& build, const Options& o, int workers, bool tty, int ranks = 1);
  void start() const;
  // The live progress line (a terminal only): restarts its rate measurement at `step`.
  void begin_progress(long step);
  void progress(int epoch, int k, int steps_per_epoch, long step, double loss, bool final) const;
  // --json: the line that says this process's first training step has run (step `step` done in all).
  void first_step(long step) const;
  void epoch(const EpochResult& r) const;
  void summary(const RunSummary& s) const;

 private:
  const BuildSettings& build_;
  const Options& opt_;
  int workers_;
  bool tty_;
  int ranks_;
  int step_images_;  // images per optimizer step: --batch x ranks x --accumulate
  std::chrono::steady_clock::time_point t0_;
  long step0_ = 0;
};
